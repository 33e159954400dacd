//! `layout=curator` against the real foreign clients, each a peer process
//! driven line by line (`interop/curator`: Apache Curator's
//! `InterProcessMutex` and `LeaderLatch`, built here with Maven;
//! `interop/kazoo/peer.py`: kazoo's `Lock`, from the venv `.ci/run`
//! makes at `${CARGO_TARGET_DIR:-target}/venv`). A missing `mvn`, Java or
//! venv fails these tests.
//!
//! Exclusion is checked the way it can fail: with the other side's node
//! already queued behind the holder (seen in the key's children), the
//! waiter must not get the lock until the holder lets go, and must get it
//! then.
//!
//! Time: a real server and real peer processes, so no paused clock. Each
//! test measures a patience against the server first ([`setup`]) and takes
//! from base figures, scaled by it: every step's bound ([`STEP`]), the
//! promptness a `LeaderLatch` must show ([`PROMPT`]), the sessions of the
//! peers and of fencelock's holders ([`SESSION`], at most the server's
//! longest, 40 s) with the bounds that follow them, and every lease that
//! must not end before the test lets it go. A lease that is meant to end
//! stays longer than the bound it is told apart by (a crashed holder's
//! TTL against its session's expiry). [`QUIET`], how long a waiter is
//! watched for a wrong answer, is left: it only asserts that nothing
//! happens, which a busy machine cannot make fail. Where the layout caps
//! a TTL at half the session, the test asks for the longest session, so
//! that the scaled TTL is granted as asked, up to 20 s.

use std::{
    io::{BufRead, BufReader, Write},
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Arc, OnceLock},
    time::Duration,
};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, BackendAdmin, Error, FairQueue, LockClient, LockGuard,
    LockKey, Owner,
};
use fencelock_testkit::{servers::zookeeper::ZkServer, Patience, TestResult};
use fencelock_zookeeper::ZkBackend;
use tokio::sync::mpsc;
use zookeeper_client as zk;

/// The session timeout of every peer, as a base figure: the shortest the
/// test server allows (2 × its `tickTime`), so that a killed holder's
/// session ends soon.
const SESSION: Duration = Duration::from_secs(4);

/// The longest session timeout the test server allows (20 × its
/// `tickTime`).
const LONGEST_SESSION: Duration = Duration::from_secs(40);

/// How long any expected step may take (a JVM peer starting on a loaded
/// machine, a session expiring), as a base figure.
const STEP: Duration = Duration::from_secs(60);

/// How soon a `LeaderLatch` must lead once the contender it queued behind
/// has gone: it watches that node, so a round trip or two; far below
/// anything that would let it recover otherwise (a reconnection). A base
/// figure.
const PROMPT: Duration = Duration::from_secs(10);

/// How long a waiter that must stay waiting is watched for a wrong
/// answer: it has seen the holder's node by then (its own is queued
/// behind it), so a peer that ignored it would answer at once.
const QUIET: Duration = Duration::from_millis(500);

/// The peers' and holders' session timeout on this machine now.
fn session_for(p: Patience) -> Duration {
    p.ttl(SESSION).min(LONGEST_SESSION)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

fn interop_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("interop")
}

/// The Curator peer's class path, built once per test binary.
fn curator_classpath() -> TestResult<String> {
    static BUILT: OnceLock<Result<String, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = target_dir().join("curator-peer");
            let status = Command::new("mvn")
                .args(["-q", "-B", "package"])
                .arg(format!("-Dinterop.out={}", out.display()))
                .arg("-f")
                .arg(interop_dir().join("curator/pom.xml"))
                .status()
                .map_err(|e| format!("running mvn (Maven builds the Curator peer): {e}"))?;
            if !status.success() {
                return Err(format!("mvn package of interop/curator: {status}"));
            }
            Ok(format!(
                "{}:{}/*",
                out.join("classes").display(),
                out.join("lib").display()
            ))
        })
        .clone()
        .map_err(Into::into)
}

/// A foreign client process speaking the peers' line protocol.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<String>,
    /// The test's budget, which its steps' bounds are scaled by.
    p: Patience,
}

impl Peer {
    async fn start(mut command: Command, p: Patience) -> TestResult<Self> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command
            .spawn()
            .map_err(|e| format!("starting {command:?}: {e}"))?;
        let stdin = child.stdin.take().ok_or("the peer has no stdin")?;
        let stdout = child.stdout.take().ok_or("the peer has no stdout")?;
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut peer = Self {
            child,
            stdin,
            lines,
            p,
        };
        peer.expect("ready").await?;
        Ok(peer)
    }

    async fn curator(server: &ZkServer, p: Patience) -> TestResult<Self> {
        let classpath = tokio::task::spawn_blocking(curator_classpath).await??;
        let mut java = Command::new("java");
        java.args(["-cp", &classpath, "fencelock.interop.Peer"])
            .arg(connect_string(server))
            .arg(session_for(p).as_millis().to_string());
        Self::start(java, p).await
    }

    async fn kazoo(server: &ZkServer, p: Patience) -> TestResult<Self> {
        let python = target_dir().join("venv/bin/python");
        if !python.exists() {
            return Err(format!(
                "{} is missing: .ci/run makes the venv and installs kazoo into it",
                python.display()
            )
            .into());
        }
        let mut command = Command::new(python);
        command
            .arg(interop_dir().join("kazoo/peer.py"))
            .arg(connect_string(server))
            .arg(session_for(p).as_millis().to_string());
        Self::start(command, p).await
    }

    fn send(&mut self, command: &str) -> TestResult {
        writeln!(self.stdin, "{command}")?;
        self.stdin.flush()?;
        Ok(())
    }

    /// The peer's next line, which must be `line`.
    async fn expect(&mut self, line: &str) -> TestResult {
        self.expect_within(line, self.p.bound(STEP)).await
    }

    /// The peer's next line, which must be `line` and come within `limit`
    /// (scaled already).
    async fn expect_within(&mut self, line: &str, limit: Duration) -> TestResult {
        let p = self.p;
        match tokio::time::timeout(limit, self.lines.recv()).await {
            Ok(Some(got)) if got == line => Ok(()),
            Ok(Some(got)) => Err(format!("the peer said {got:?}, not {line:?}").into()),
            Ok(None) => Err(format!("the peer exited before saying {line:?}").into()),
            Err(_) => Err(format!("the peer did not say {line:?} within {limit:?} ({p})").into()),
        }
    }

    /// Checks that the peer says nothing for [`QUIET`].
    async fn stays_quiet(&mut self, why: &str) -> TestResult {
        match tokio::time::timeout(QUIET, self.lines.recv()).await {
            Err(_) => Ok(()),
            Ok(line) => Err(format!("{why}, but the peer said {line:?}").into()),
        }
    }

    /// Kills the process: its session is left to expire on the server.
    fn kill(&mut self) -> TestResult {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect_string(server: &ZkServer) -> String {
    server.url().trim_start_matches("zk://").to_owned()
}

/// A ZooKeeper server, the `layout=curator` URL on it, a plain session to
/// look at the key's children with, and the test's budget, measured
/// against the server.
async fn setup() -> TestResult<(ZkServer, String, zk::Client, Patience)> {
    let server = tokio::task::spawn_blocking(ZkServer::start).await??;
    let url = format!("{}?layout=curator", server.url());
    let look = zk::Client::connect(&connect_string(&server)).await?;
    let p = crate::patience(&server.url()).await?;
    Ok((server, url, look, p))
}

async fn client(url: &str, owner: &str) -> TestResult<LockClient> {
    let backend: Arc<dyn Backend> = Arc::new(ZkBackend::connect(url).await?);
    Ok(LockClient::builder(backend)
        .owner(Owner::new(owner)?)
        .ttl(Duration::from_secs(10))
        .build()?)
}

/// Waits (on child watches, no polling) until `path` has `n` children.
async fn contenders(
    look: &zk::Client,
    path: &str,
    n: usize,
    p: Patience,
) -> TestResult<Vec<String>> {
    children_until(look, path, &format!("{n} children"), |c| c >= n, p).await
}

/// Waits (on child watches, no polling) until the number of `path`'s
/// children satisfies `done` (described by `what`).
async fn children_until(
    look: &zk::Client,
    path: &str,
    what: &str,
    done: impl Fn(usize) -> bool,
    p: Patience,
) -> TestResult<Vec<String>> {
    let wait = async {
        loop {
            match look.get_and_watch_children(path).await {
                Ok((children, _, _)) if done(children.len()) => return Ok(children),
                Ok((_, _, watcher)) => {
                    watcher.changed().await;
                }
                Err(zk::Error::NoNode) => {
                    let (_, watcher) = look.check_and_watch_stat(path).await?;
                    watcher.changed().await;
                }
                Err(e) => return Err(e),
            }
        }
    };
    let children = tokio::time::timeout(p.bound(STEP), wait)
        .await
        .map_err(|_| format!("{path} never had {what} ({p})"))??;
    Ok(children)
}

/// A fencelock acquisition of `key` waiting in a task of its own.
fn waiting(
    client: &LockClient,
    key: &str,
    p: Patience,
) -> tokio::task::JoinHandle<fencelock_core::Result<LockGuard>> {
    let (client, key) = (client.clone(), key.to_owned());
    tokio::spawn(async move { client.lock(key).wait(p.bound(STEP)).acquire().await })
}

/// Rounds of a foreign lock (`lock NAME PATH` / `unlock NAME`) and
/// fencelock on one path, each round both ways: the foreign holder keeps
/// fencelock waiting until it unlocks, then fencelock keeps the foreign
/// waiter waiting until it releases. Tokens of the two sides come from one
/// counter (creation zxids). `inspect` and `list` show the foreign holder
/// as `kind`.
async fn exclusion_both_ways(
    peer: &mut Peer,
    kind: &str,
    client: &LockClient,
    look: &zk::Client,
    p: Patience,
) -> TestResult {
    let path = "/locks/nightly";
    let mut last = 0;
    for round in 0..3 {
        let theirs = format!("f{round}");
        peer.send(&format!("lock {theirs} {path}"))?;
        peer.expect(&format!("{theirs} acquired")).await?;
        let holder = client
            .inspect(path)
            .await?
            .ok_or("fencelock sees no holder while the foreign client holds")?;
        assert!(
            holder.owner.as_str().starts_with("zk-session:")
                && holder.kind.as_deref() == Some(kind),
            "{holder:?}"
        );
        let listed = client.list(Some("/locks/")).await?;
        assert!(
            listed.len() == 1
                && listed[0].key.as_str() == "locks/nightly"
                && listed[0].owner == holder.owner,
            "{listed:?}"
        );
        assert!(
            holder.token.0 > last,
            "token {} after {last}",
            holder.token.0
        );
        assert!(client.try_lock(path).await?.is_none(), "both held {path}");
        let mine = waiting(client, path, p);
        contenders(look, path, 2, p).await?;
        assert!(
            !mine.is_finished(),
            "fencelock was granted beside {holder:?}"
        );
        peer.send(&format!("unlock {theirs}"))?;
        peer.expect(&format!("{theirs} released")).await?;
        let guard = mine.await??;
        assert!(guard.token() > holder.token, "{guard:?} after {holder:?}");
        last = guard.token().0;

        let next = format!("n{round}");
        peer.send(&format!("lock {next} {path}"))?;
        contenders(look, path, 2, p).await?;
        peer.stays_quiet("fencelock holds the lock").await?;
        guard.release().await?;
        peer.expect(&format!("{next} acquired")).await?;
        peer.send(&format!("unlock {next}"))?;
        peer.expect(&format!("{next} released")).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_mutex_and_fencelock_exclude_each_other() -> TestResult {
    let (server, url, look, p) = setup().await?;
    let mut curator = Peer::curator(&server, p).await?;
    let client = client(&url, "fl").await?;
    exclusion_both_ways(&mut curator, "curator", &client, &look, p).await?;
    // Curator's node is named as Curator names it, and so is fencelock's.
    curator.send("lock last /locks/nightly")?;
    curator.expect("last acquired").await?;
    let names = contenders(&look, "/locks/nightly", 1, p).await?;
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("_c_") && n.contains("-lock-")),
        "{names:?}"
    );
    // fencelock never deletes a node it did not create.
    match client.force_release("/locks/nightly").await {
        Err(Error::Unsupported(_)) => {}
        other => panic!("force-release of Curator's holder: {other:?}"),
    }
    assert_eq!(contenders(&look, "/locks/nightly", 1, p).await?, names);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_lock_and_fencelock_exclude_each_other() -> TestResult {
    let (server, url, look, p) = setup().await?;
    let mut kazoo = Peer::kazoo(&server, p).await?;
    let client = client(&url, "fl").await?;
    exclusion_both_ways(&mut kazoo, "kazoo", &client, &look, p).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_latch_and_fencelock_elect_one_leader() -> TestResult {
    let (server, url, look, p) = setup().await?;
    let mut curator = Peer::curator(&server, p).await?;
    let client = client(&url, "fl").await?;
    let path = "/services/scheduler";
    // The election `services/scheduler` is LeaderLatch's path.
    let election = client.election("services/scheduler");

    curator.send(&format!("latch l1 {path}"))?;
    curator.expect("l1 leader").await?;
    let leader = election.leader().await?.ok_or("no leader while l1 leads")?;
    assert!(
        leader.owner.as_str().starts_with("zk-session:"),
        "{leader:?}"
    );
    let campaign = {
        let election = election.clone();
        tokio::spawn(async move { election.campaign_for(p.bound(STEP)).await })
    };
    let names = contenders(&look, path, 2, p).await?;
    assert!(names.iter().all(|n| n.contains("-latch-")), "{names:?}");
    assert!(!campaign.is_finished(), "fencelock elected beside l1");
    curator.send("unlatch l1")?;
    curator.expect("l1 closed").await?;
    let leadership = campaign.await??;
    assert!(leadership.term() > leader.term);

    curator.send(&format!("latch l2 {path}"))?;
    contenders(&look, path, 2, p).await?;
    curator.stays_quiet("fencelock leads").await?;
    leadership.resign().await?;
    curator.expect("l2 leader").await?;
    let leader = election.leader().await?.ok_or("no leader while l2 leads")?;
    assert!(
        leader.owner.as_str().starts_with("zk-session:"),
        "{leader:?}"
    );
    Ok(())
}

/// A foreign holder dies (its session expires on the server): the next
/// contender in line gets the lock, fencelock, then the foreign waiter
/// queued after it.
async fn session_expiry_hands_over_in_order(kazoo: bool) -> TestResult {
    let (server, url, look, p) = setup().await?;
    let path = "/locks/expiry";
    let start = || async {
        match kazoo {
            true => Peer::kazoo(&server, p).await,
            false => Peer::curator(&server, p).await,
        }
    };
    let mut holder = start().await?;
    let mut next = start().await?;
    let client = client(&url, "fl").await?;
    holder.send(&format!("lock h {path}"))?;
    holder.expect("h acquired").await?;
    let mine = waiting(&client, path, p);
    contenders(&look, path, 2, p).await?;
    next.send(&format!("lock n {path}"))?;
    contenders(&look, path, 3, p).await?;
    holder.kill()?;
    let guard = mine
        .await?
        .map_err(|e| format!("fencelock after the holder's session expired: {e} ({p})"))?;
    next.stays_quiet("fencelock was next in line").await?;
    guard.release().await?;
    next.expect("n acquired").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_holders_session_expiry_hands_over_in_order() -> TestResult {
    session_expiry_hands_over_in_order(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_holders_session_expiry_hands_over_in_order() -> TestResult {
    session_expiry_hands_over_in_order(true).await
}

/// A fencelock holder stops renewing: once its lease has ended, the next
/// fencelock contender deletes its node, which hands the lock to the
/// Curator waiter queued before that contender, then to the contender.
/// The lease (a base of 3 s) must last until both have queued behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencelock_lease_expiry_hands_over_in_order() -> TestResult {
    let (server, url, look, p) = setup().await?;
    let path = "/locks/lease";
    let mut curator = Peer::curator(&server, p).await?;
    // The longest session, so that the lease is granted as long as asked.
    let dead = ZkBackend::connect(&format!(
        "{url}&session_timeout={}ms",
        LONGEST_SESSION.as_millis()
    ))
    .await?;
    let ttl = p.ttl(Duration::from_secs(3)).min(LONGEST_SESSION / 2);
    let request = AcquireRequest::new(LockKey::new(path)?, Owner::new("dies")?, ttl);
    let Acquire::Granted(grant) = dead.try_acquire(&request).await? else {
        panic!("{path} was not free");
    };
    curator.send(&format!("lock w {path}"))?;
    contenders(&look, path, 2, p).await?;
    let client = client(&url, "next").await?;
    let mine = waiting(&client, path, p);
    contenders(&look, path, 3, p).await?;
    curator.expect("w acquired").await?;
    assert!(!mine.is_finished(), "fencelock was granted beside Curator");
    let lease = request.lease(grant.token);
    assert!(matches!(
        dead.renew(&lease, ttl).await,
        Err(Error::NotHeld { .. })
    ));
    curator.send("unlock w")?;
    curator.expect("w released").await?;
    let guard = mine
        .await?
        .map_err(|e| format!("fencelock after Curator: {e} ({p})"))?;
    assert!(guard.token() > grant.token);
    Ok(())
}

/// The contenders' names in `names` in their queue's order (by the
/// sequence ZooKeeper appended, as every recipe orders them).
fn in_line(mut names: Vec<String>) -> Vec<String> {
    names.sort_by_key(|n| n[n.len().saturating_sub(10)..].to_owned());
    names
}

/// Checks that fencelock's contender `name` under `path` was never
/// written after its creation, so that a `LeaderLatch` watching it has
/// not had its one-shot watch used up.
async fn never_written(look: &zk::Client, path: &str, name: &str) -> TestResult {
    let (_, stat) = look.get_data(&format!("{path}/{name}")).await?;
    assert_eq!(stat.version, 0, "{path}/{name} was written: {stat:?}");
    Ok(())
}

/// A `LeaderLatch` queued directly behind a fencelock leader that renews
/// its lease leads as soon as fencelock resigns. The latch re-checks only
/// when the node it watches is deleted, and a change of that node's data
/// uses up its watch: a renewal written to the node would leave the latch
/// a follower of nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_latch_behind_a_renewed_fencelock_leader_leads_when_it_resigns() -> TestResult {
    let (server, url, look, p) = setup().await?;
    let mut curator = Peer::curator(&server, p).await?;
    // The longest session, so that the lease, which must last from the
    // grant to the first renewal (the latch queues in between), is granted
    // as long as asked.
    let backend = ZkBackend::connect(&format!(
        "{url}&session_timeout={}ms",
        LONGEST_SESSION.as_millis()
    ))
    .await?;
    let path = "/services/renewed";
    let ttl = p.ttl(Duration::from_secs(10)).min(LONGEST_SESSION / 2);
    let request = AcquireRequest::new(
        LockKey::new(format!(
            "{}services/renewed",
            fencelock_core::ELECTION_PREFIX
        ))?,
        Owner::new("fl")?,
        ttl,
    );
    let Acquire::Granted(grant) = backend.try_acquire(&request).await? else {
        panic!("{path} was not free");
    };
    let lease = request.lease(grant.token);
    curator.send(&format!("latch l {path}"))?;
    let names = in_line(contenders(&look, path, 2, p).await?);
    // Meanwhile the latch watches fencelock's node.
    curator.stays_quiet("fencelock leads").await?;
    let first = backend
        .renew(&lease, ttl)
        .await
        .map_err(|e| format!("renewing a {ttl:?} lease: {e} ({p})"))?;
    let second = backend.renew(&lease, ttl).await?;
    assert!(
        second.expires_at > grant.expires_at && first.expires_at > grant.expires_at,
        "{grant:?}, then {first:?} and {second:?}"
    );
    // `proclaim` replaces the leader's data: a write too.
    backend
        .set_data(&lease, Some(serde_json::json!({"url": "http://a"})))
        .await?;
    never_written(&look, path, &names[0]).await?;
    curator.stays_quiet("fencelock still leads").await?;
    backend.release(&lease).await?;
    curator.expect_within("l leader", p.bound(PROMPT)).await?;
    Ok(())
}

/// The same for a fencelock waiter: a `LeaderLatch` queued behind a
/// fencelock waiter whose queue entry was refreshed, and then granted,
/// leads as soon as that waiter, now the leader, resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_latch_behind_a_refreshed_fencelock_waiter_leads_when_it_resigns() -> TestResult {
    let (server, url, look, p) = setup().await?;
    let mut curator = Peer::curator(&server, p).await?;
    // A session long enough (the server's longest, 20 × `tickTime`) that
    // the entries below (bases of 10 s and 20 s) are granted as asked, not
    // capped at half the session timeout, so the second attempt rewrites
    // the entry. The longer is that half already: the server's cap leaves
    // no room to scale it, only the shorter grows (and stays shorter).
    let backend = ZkBackend::connect(&format!(
        "{url}&session_timeout={}ms",
        LONGEST_SESSION.as_millis()
    ))
    .await?;
    let path = "/services/queued";
    let key = LockKey::new(format!(
        "{}services/queued",
        fencelock_core::ELECTION_PREFIX
    ))?;
    let longer = p.ttl(Duration::from_secs(20)).min(LONGEST_SESSION / 2);
    let shorter = p
        .ttl(Duration::from_secs(10))
        .min(longer - Duration::from_secs(1));
    let attempt = |ttl: Duration| {
        let mut request = AcquireRequest::new(key.clone(), Owner::new("fl")?, ttl);
        request.queue = true;
        TestResult::Ok(request)
    };
    curator.send(&format!("latch l0 {path}"))?;
    curator.expect("l0 leader").await?;
    assert!(matches!(
        backend.try_acquire(&attempt(shorter)?).await?,
        Acquire::Held(Some(_))
    ));
    let entry = backend.queue(&key).await?;
    curator.send(&format!("latch l1 {path}"))?;
    let names = in_line(contenders(&look, path, 3, p).await?);
    // Meanwhile l1 watches fencelock's entry.
    curator.stays_quiet("l0 leads").await?;
    // A longer TTL: the attempt rewrites the entry, whose lease now ends
    // later.
    assert!(matches!(
        backend.try_acquire(&attempt(longer)?).await?,
        Acquire::Held(Some(_))
    ));
    let refreshed = backend.queue(&key).await?;
    assert!(
        entry.len() == 1 && refreshed.len() == 1 && refreshed[0].expires_at > entry[0].expires_at,
        "{entry:?}, then {refreshed:?} ({p})"
    );
    curator.send("unlatch l0")?;
    curator.expect("l0 closed").await?;
    // Curator deletes a closed latch's node in the background.
    children_until(&look, path, "2 children", |n| n == 2, p).await?;
    let request = attempt(shorter)?;
    let Acquire::Granted(grant) = backend.try_acquire(&request).await? else {
        panic!("the waiter queued next was not granted {path} ({p})");
    };
    assert_eq!(grant.token, refreshed[0].token);
    never_written(&look, path, &names[1]).await?;
    curator.stays_quiet("fencelock leads").await?;
    backend.release(&request.lease(grant.token)).await?;
    curator.expect_within("l1 leader", p.bound(PROMPT)).await?;
    Ok(())
}

/// The environment variables that make [`crash_holder`] hold a lock: the
/// `layout=curator` URL, the key and the TTL it asks for (ms).
const HOLDER_URL: &str = "FENCELOCK_ZK_CRASH_HOLDER_URL";
const HOLDER_KEY: &str = "FENCELOCK_ZK_CRASH_HOLDER_KEY";
const HOLDER_TTL_MS: &str = "FENCELOCK_ZK_CRASH_HOLDER_TTL_MS";

/// The TTL [`crash_holder`] asks for, as a base figure: well above the
/// session timeout, since the old layout kept the node this long after the
/// crash.
const HOLDER_TTL: Duration = Duration::from_secs(30);

/// Not a test: the fencelock holder that
/// [`a_crashed_fencelock_holders_node_goes_with_its_session`] starts in a
/// process of its own (this test binary, run again) and kills. It takes
/// the lock, says `held`, and renews it until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a holder process that a_crashed_fencelock_holders_node_goes_with_its_session starts"]
async fn crash_holder() -> TestResult {
    let (Ok(url), Ok(key)) = (std::env::var(HOLDER_URL), std::env::var(HOLDER_KEY)) else {
        // Run alone (`--include-ignored`) it has nothing to hold: it checks
        // nothing by itself.
        eprintln!("{HOLDER_URL} and {HOLDER_KEY} name the lock to hold; not set");
        return Ok(());
    };
    // A TTL well above the session timeout: the old layout kept the node
    // this long after the crash. The test that starts this process scales
    // it with its own patience.
    let ttl = match std::env::var(HOLDER_TTL_MS) {
        Ok(ms) => Duration::from_millis(
            ms.parse()
                .map_err(|e| format!("{HOLDER_TTL_MS}={ms:?}: {e}"))?,
        ),
        Err(_) => HOLDER_TTL,
    };
    let backend: Arc<dyn Backend> = Arc::new(ZkBackend::connect(&url).await?);
    let client = LockClient::builder(backend)
        .owner(Owner::new("crashes")?)
        .ttl(ttl)
        .build()?;
    let guard = client.lock(key).acquire().await?;
    println!("held {}", guard.token().0);
    guard.lost().await;
    Err("the holder lost its lock before it was killed".into())
}

/// What queues behind the crashed fencelock holder.
#[derive(Clone, Copy)]
enum Waiter {
    CuratorMutex,
    LeaderLatch,
    Kazoo,
}

/// A fencelock holder in another process is killed (SIGKILL): its node
/// goes when its session expires on the server, so the foreign waiter
/// queued behind it gets the lock within about a session timeout of the
/// kill, with no fencelock process left to delete the node (a fencelock
/// waiter would take over the expired lease, sooner); then a fencelock
/// waiter queues behind the foreign holder and gets the lock next. The
/// bound on the hand-over (two sessions) and the holder's TTL scale
/// together, so the bound still ends before a node kept for the TTL would
/// go.
async fn crashed_holder_hands_over(waiter: Waiter) -> TestResult {
    let (server, url, look, p) = setup().await?;
    let session = session_for(p);
    let (path, key) = match waiter {
        Waiter::LeaderLatch => (
            "/services/crash",
            format!("{}services/crash", fencelock_core::ELECTION_PREFIX),
        ),
        _ => ("/locks/crash", "/locks/crash".to_owned()),
    };
    let holder_url = format!("{url}&session_timeout={}ms", session.as_millis());
    let mut holder = Command::new(std::env::current_exe()?);
    holder
        .args([
            "--exact",
            "interop::crash_holder",
            "--ignored",
            "--nocapture",
        ])
        .env(HOLDER_URL, &holder_url)
        .env(HOLDER_KEY, &key)
        .env(HOLDER_TTL_MS, p.ttl(HOLDER_TTL).as_millis().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut holder = holder.spawn()?;
    let out = holder.stdout.take().ok_or("the holder has no stdout")?;
    let held = tokio::task::spawn_blocking(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.starts_with("held "))
    });
    let held = tokio::time::timeout(p.bound(STEP), held)
        .await
        .map_err(|_| format!("the holder process never held the lock ({p})"))??;
    let killer = scopeguard(holder);
    assert!(held.is_some(), "the holder process exited without the lock");

    let mut peer = match waiter {
        Waiter::Kazoo => Peer::kazoo(&server, p).await?,
        _ => Peer::curator(&server, p).await?,
    };
    let (command, granted) = match waiter {
        Waiter::LeaderLatch => (format!("latch w {path}"), "w leader"),
        _ => (format!("lock w {path}"), "w acquired"),
    };
    peer.send(&command)?;
    contenders(&look, path, 2, p).await?;
    peer.stays_quiet("the fencelock holder is alive").await?;

    let killed = std::time::Instant::now();
    killer.kill()?;
    // The server expires a session between one and one and a half session
    // timeouts (its `tickTime`, half of the base one) after it last heard
    // from the client; the rest is the waiter's watch.
    peer.expect_within(granted, 2 * session).await?;
    let waited = killed.elapsed();
    let client = client(&url, "next").await?;
    let mine = {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move { client.lock(key).wait(p.bound(STEP)).acquire().await })
    };
    contenders(&look, path, 2, p).await?;
    peer.stays_quiet("the foreign waiter holds the lock")
        .await?;
    assert!(
        !mine.is_finished(),
        "fencelock was granted beside {granted}"
    );
    match waiter {
        Waiter::LeaderLatch => peer.send("unlatch w")?,
        _ => peer.send("unlock w")?,
    }
    let guard = tokio::time::timeout(p.bound(STEP), mine)
        .await
        .map_err(|_| format!("fencelock was not granted after {granted} ({p})"))???;
    eprintln!("the foreign waiter got the lock {waited:?} after the holder was killed");
    guard.release().await?;
    Ok(())
}

/// Kills the holder process when dropped, so that a failing test leaves
/// no process behind.
struct Killer(std::sync::Mutex<Child>);

fn scopeguard(child: Child) -> Killer {
    Killer(std::sync::Mutex::new(child))
}

impl Killer {
    /// SIGKILL: the process gets no chance to release anything.
    fn kill(&self) -> TestResult {
        let mut child = self.0.lock().map_err(|_| "poisoned")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }
}

impl Drop for Killer {
    fn drop(&mut self) {
        if let Ok(child) = self.0.get_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_fencelock_holders_node_goes_with_its_session() -> TestResult {
    crashed_holder_hands_over(Waiter::CuratorMutex).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_fencelock_leader_hands_over_to_a_leader_latch() -> TestResult {
    crashed_holder_hands_over(Waiter::LeaderLatch).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_fencelock_holder_hands_over_to_a_kazoo_waiter() -> TestResult {
    crashed_holder_hands_over(Waiter::Kazoo).await
}

/// A lease in this layout lives in a node of the backend's session, which
/// the server may end one session timeout after it last heard from it
/// (less the delays of an ensemble): the TTL granted is at most half the
/// session timeout, so the guard's trust (counted from before a request
/// the server answered) ends first; a guard asking for more is renewed in
/// step with what it was granted, not lost; and a lease whose session
/// expired is not held any more, not re-created. Its record left behind
/// is removed by `cleanup`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_never_outlives_its_session() -> TestResult {
    let (server, url, look, p) = setup().await?;
    let session = session_for(p);
    let proxied = fencelock_testkit::proxy::ProxiedUrl::start(&server.url()).await?;
    let through = format!(
        "{}?layout=curator&session_timeout={}ms",
        proxied.url(),
        session.as_millis()
    );
    let backend = ZkBackend::connect(&through).await?;
    let request = AcquireRequest::new(
        LockKey::new("/locks/session")?,
        Owner::new("fl")?,
        3 * session,
    );
    let Acquire::Granted(grant) = backend.try_acquire(&request).await? else {
        panic!("/locks/session was not free");
    };
    assert!(
        grant.ttl <= session / 2,
        "granted {grant:?} on a {session:?} session"
    );
    let lease = request.lease(grant.token);
    let renewed = backend.renew(&lease, 3 * session).await?;
    assert!(
        renewed.ttl <= session / 2,
        "renewed {renewed:?} on a {session:?} session"
    );
    let info = backend
        .inspect(&request.key)
        .await?
        .ok_or("the lease is not shown")?;
    assert!(info.expires_in <= session / 2, "{info:?}");

    // A guard asking for three session timeouts is granted half of one,
    // and renewed often enough for that: held over several grants.
    let direct: Arc<dyn Backend> = Arc::new(
        ZkBackend::connect(&format!("{url}&session_timeout={}ms", session.as_millis())).await?,
    );
    let guards = LockClient::builder(direct)
        .owner(Owner::new("guard")?)
        .ttl(3 * session)
        .build()?;
    let guard = guards.lock("/locks/guarded").acquire().await?;
    assert!(guard.granted_ttl() <= session / 2, "{guard:?}");
    let lost = tokio::time::timeout(2 * session, guard.lost()).await;
    assert!(
        lost.is_err(),
        "a guard granted {:?} was lost ({p})",
        guard.granted_ttl()
    );
    guard.release().await?;

    // Cut off from the server, the session expires there: the node goes.
    let names = contenders(&look, "/locks/session", 1, p).await?;
    let node = format!("/locks/session/{}", names.first().ok_or("no contender")?);
    let (stat, gone) = look.check_and_watch_stat(&node).await?;
    assert!(stat.is_some(), "{node} is missing");
    proxied.partition();
    let event = tokio::time::timeout(p.bound(STEP), gone.changed())
        .await
        .map_err(|_| format!("{node} outlived its session ({p})"))?;
    assert_eq!(event.event_type, zk::EventType::NodeDeleted);
    proxied.heal();
    // The client learns of the expiry when it reconnects; until then a
    // renewal fails as a transient error.
    let answer = tokio::time::timeout(p.bound(STEP), async {
        loop {
            match backend.renew(&lease, 3 * session).await {
                Err(e) if e.is_transient() => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    })
    .await
    .map_err(|_| format!("the backend never reconnected ({p})"))?;
    assert!(
        matches!(answer, Err(Error::NotHeld { .. })),
        "a lease whose session expired was renewed: {answer:?}"
    );
    assert!(backend.inspect(&request.key).await?.is_none());
    // The key's container may have been reaped already.
    match look.list_children("/locks/session").await {
        Ok(left) => assert!(left.is_empty(), "{left:?}"),
        Err(zk::Error::NoNode) => {}
        Err(e) => return Err(e.into()),
    }
    // The lease's record outlived its node; cleanup removes it.
    let records = || async { look.list_children("/fencelock/leases").await };
    assert!(
        !records().await?.is_empty(),
        "the renewed lease left no record"
    );
    backend.cleanup_expired().await?;
    assert_eq!(records().await?, Vec::<String>::new());
    Ok(())
}

/// Only the session that owns a lease's node renews it (a renewal through
/// it proves that session alive; another session's cannot): a renewal
/// through another backend is `NotHeld`, while its `set_data`, which
/// extends nothing, is taken. (`resume` through another backend, batches
/// and a dropped waiter's entry are conformance cases: the layout claims
/// `Capabilities::session_bound`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_renewed_only_through_its_session() -> TestResult {
    let (_server, url, _, p) = setup().await?;
    // The longest session, so that the lease, which must last until the
    // last renewal, is granted as long as asked.
    let owner = ZkBackend::connect(&format!(
        "{url}&session_timeout={}ms",
        LONGEST_SESSION.as_millis()
    ))
    .await?;
    let other = ZkBackend::connect(&url).await?;
    let ttl = p.ttl(Duration::from_secs(3)).min(LONGEST_SESSION / 2);
    let request = AcquireRequest::new(LockKey::new("/locks/a")?, Owner::new("fl")?, ttl);
    let Acquire::Granted(grant) = owner.try_acquire(&request).await? else {
        panic!("/locks/a was not free");
    };
    let lease = request.lease(grant.token);
    let renewed = other.renew(&lease, ttl).await;
    assert!(
        matches!(renewed, Err(Error::NotHeld { .. })),
        "renewed through another session: {renewed:?}"
    );
    other
        .set_data(&lease, Some(serde_json::json!({"by": "other"})))
        .await?;
    // Untouched by the refusal: still renewed through its own session.
    let renewed = owner
        .renew(&lease, ttl)
        .await
        .map_err(|e| format!("renewing a {ttl:?} lease through its session: {e} ({p})"))?;
    assert_eq!(renewed.token, grant.token);
    let info = owner
        .inspect(&lease.key)
        .await?
        .ok_or("the lease is gone")?;
    assert_eq!(info.data, Some(serde_json::json!({"by": "other"})));
    Ok(())
}
