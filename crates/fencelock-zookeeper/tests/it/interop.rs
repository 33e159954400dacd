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

use std::{
    io::{BufRead, BufReader, Write},
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Arc, OnceLock},
    time::Duration,
};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, Error, LockClient, LockGuard, LockKey, Owner,
};
use fencelock_testkit::{servers::zookeeper::ZkServer, TestResult};
use fencelock_zookeeper::ZkBackend;
use tokio::sync::mpsc;
use zookeeper_client as zk;

/// The session timeout of every peer: the shortest the test server allows
/// (2 × its `tickTime`), so that a killed holder's session ends soon.
const SESSION_MS: u64 = 4000;

/// How long any expected step may take (a JVM peer starting on a loaded
/// machine, a session expiring).
const STEP: Duration = Duration::from_secs(60);

/// How soon a `LeaderLatch` must lead once the contender it queued behind
/// has gone: it watches that node, so a round trip or two; far below
/// anything that would let it recover otherwise (a reconnection).
const PROMPT: Duration = Duration::from_secs(10);

/// How long a waiter that must stay waiting is watched for a wrong
/// answer: it has seen the holder's node by then (its own is queued
/// behind it), so a peer that ignored it would answer at once.
const QUIET: Duration = Duration::from_millis(500);

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
}

impl Peer {
    async fn start(mut command: Command) -> TestResult<Self> {
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
        };
        peer.expect("ready").await?;
        Ok(peer)
    }

    async fn curator(server: &ZkServer) -> TestResult<Self> {
        let classpath = tokio::task::spawn_blocking(curator_classpath).await??;
        let mut java = Command::new("java");
        java.args(["-cp", &classpath, "fencelock.interop.Peer"])
            .arg(connect_string(server))
            .arg(SESSION_MS.to_string());
        Self::start(java).await
    }

    async fn kazoo(server: &ZkServer) -> TestResult<Self> {
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
            .arg(SESSION_MS.to_string());
        Self::start(command).await
    }

    fn send(&mut self, command: &str) -> TestResult {
        writeln!(self.stdin, "{command}")?;
        self.stdin.flush()?;
        Ok(())
    }

    /// The peer's next line, which must be `line`.
    async fn expect(&mut self, line: &str) -> TestResult {
        self.expect_within(line, STEP).await
    }

    /// The peer's next line, which must be `line` and come within `limit`.
    async fn expect_within(&mut self, line: &str, limit: Duration) -> TestResult {
        match tokio::time::timeout(limit, self.lines.recv()).await {
            Ok(Some(got)) if got == line => Ok(()),
            Ok(Some(got)) => Err(format!("the peer said {got:?}, not {line:?}").into()),
            Ok(None) => Err(format!("the peer exited before saying {line:?}").into()),
            Err(_) => Err(format!("the peer did not say {line:?} within {limit:?}").into()),
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

/// A ZooKeeper server, the `layout=curator` URL on it, and a plain
/// session to look at the key's children with.
async fn setup() -> TestResult<(ZkServer, String, zk::Client)> {
    let server = tokio::task::spawn_blocking(ZkServer::start).await??;
    let url = format!("{}?layout=curator", server.url());
    let look = zk::Client::connect(&connect_string(&server)).await?;
    Ok((server, url, look))
}

async fn client(url: &str, owner: &str) -> TestResult<LockClient> {
    let backend: Arc<dyn Backend> = Arc::new(ZkBackend::connect(url).await?);
    Ok(LockClient::builder(backend)
        .owner(Owner::new(owner)?)
        .ttl(Duration::from_secs(10))
        .build()?)
}

/// Waits (on child watches, no polling) until `path` has `n` children.
async fn contenders(look: &zk::Client, path: &str, n: usize) -> TestResult<Vec<String>> {
    children_until(look, path, &format!("{n} children"), |c| c >= n).await
}

/// Waits (on child watches, no polling) until the number of `path`'s
/// children satisfies `done` (described by `what`).
async fn children_until(
    look: &zk::Client,
    path: &str,
    what: &str,
    done: impl Fn(usize) -> bool,
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
    let children = tokio::time::timeout(STEP, wait)
        .await
        .map_err(|_| format!("{path} never had {what}"))??;
    Ok(children)
}

/// A fencelock acquisition of `key` waiting in a task of its own.
fn waiting(
    client: &LockClient,
    key: &str,
) -> tokio::task::JoinHandle<fencelock_core::Result<LockGuard>> {
    let (client, key) = (client.clone(), key.to_owned());
    tokio::spawn(async move { client.lock(key).wait(STEP).acquire().await })
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
        let mine = waiting(client, path);
        contenders(look, path, 2).await?;
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
        contenders(look, path, 2).await?;
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
    let (server, url, look) = setup().await?;
    let mut curator = Peer::curator(&server).await?;
    let client = client(&url, "fl").await?;
    exclusion_both_ways(&mut curator, "curator", &client, &look).await?;
    // Curator's node is named as Curator names it, and so is fencelock's.
    curator.send("lock last /locks/nightly")?;
    curator.expect("last acquired").await?;
    let names = contenders(&look, "/locks/nightly", 1).await?;
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
    assert_eq!(contenders(&look, "/locks/nightly", 1).await?, names);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_lock_and_fencelock_exclude_each_other() -> TestResult {
    let (server, url, look) = setup().await?;
    let mut kazoo = Peer::kazoo(&server).await?;
    let client = client(&url, "fl").await?;
    exclusion_both_ways(&mut kazoo, "kazoo", &client, &look).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_latch_and_fencelock_elect_one_leader() -> TestResult {
    let (server, url, look) = setup().await?;
    let mut curator = Peer::curator(&server).await?;
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
        tokio::spawn(async move { election.campaign_for(STEP).await })
    };
    let names = contenders(&look, path, 2).await?;
    assert!(names.iter().all(|n| n.contains("-latch-")), "{names:?}");
    assert!(!campaign.is_finished(), "fencelock elected beside l1");
    curator.send("unlatch l1")?;
    curator.expect("l1 closed").await?;
    let leadership = campaign.await??;
    assert!(leadership.term() > leader.term);

    curator.send(&format!("latch l2 {path}"))?;
    contenders(&look, path, 2).await?;
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
    let (server, url, look) = setup().await?;
    let path = "/locks/expiry";
    let start = || async {
        match kazoo {
            true => Peer::kazoo(&server).await,
            false => Peer::curator(&server).await,
        }
    };
    let mut holder = start().await?;
    let mut next = start().await?;
    let client = client(&url, "fl").await?;
    holder.send(&format!("lock h {path}"))?;
    holder.expect("h acquired").await?;
    let mine = waiting(&client, path);
    contenders(&look, path, 2).await?;
    next.send(&format!("lock n {path}"))?;
    contenders(&look, path, 3).await?;
    holder.kill()?;
    let guard = mine.await??;
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencelock_lease_expiry_hands_over_in_order() -> TestResult {
    let (server, url, look) = setup().await?;
    let path = "/locks/lease";
    let mut curator = Peer::curator(&server).await?;
    let dead = ZkBackend::connect(&url).await?;
    let request = AcquireRequest::new(
        LockKey::new(path)?,
        Owner::new("dies")?,
        Duration::from_secs(3),
    );
    let Acquire::Granted(grant) = dead.try_acquire(&request).await? else {
        panic!("{path} was not free");
    };
    curator.send(&format!("lock w {path}"))?;
    contenders(&look, path, 2).await?;
    let client = client(&url, "next").await?;
    let mine = waiting(&client, path);
    contenders(&look, path, 3).await?;
    curator.expect("w acquired").await?;
    assert!(!mine.is_finished(), "fencelock was granted beside Curator");
    let lease = request.lease(grant.token);
    assert!(matches!(
        dead.renew(&lease, Duration::from_secs(3)).await,
        Err(Error::NotHeld { .. })
    ));
    curator.send("unlock w")?;
    curator.expect("w released").await?;
    let guard = mine.await??;
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
    let (server, url, look) = setup().await?;
    let mut curator = Peer::curator(&server).await?;
    let backend = ZkBackend::connect(&url).await?;
    let path = "/services/renewed";
    let ttl = Duration::from_secs(10);
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
    let names = in_line(contenders(&look, path, 2).await?);
    // Meanwhile the latch watches fencelock's node.
    curator.stays_quiet("fencelock leads").await?;
    let first = backend.renew(&lease, ttl).await?;
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
    curator.expect_within("l leader", PROMPT).await?;
    Ok(())
}

/// The same for a fencelock waiter: a `LeaderLatch` queued behind a
/// fencelock waiter whose queue entry was refreshed, and then granted,
/// leads as soon as that waiter, now the leader, resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_latch_behind_a_refreshed_fencelock_waiter_leads_when_it_resigns() -> TestResult {
    let (server, url, look) = setup().await?;
    let mut curator = Peer::curator(&server).await?;
    let backend = ZkBackend::connect(&url).await?;
    let path = "/services/queued";
    let key = LockKey::new(format!(
        "{}services/queued",
        fencelock_core::ELECTION_PREFIX
    ))?;
    let attempt = |ttl: u64| {
        let mut request =
            AcquireRequest::new(key.clone(), Owner::new("fl")?, Duration::from_secs(ttl));
        request.queue = true;
        TestResult::Ok(request)
    };
    curator.send(&format!("latch l0 {path}"))?;
    curator.expect("l0 leader").await?;
    assert!(matches!(
        backend.try_acquire(&attempt(10)?).await?,
        Acquire::Held(Some(_))
    ));
    let entry = backend.queue(&key).await?;
    curator.send(&format!("latch l1 {path}"))?;
    let names = in_line(contenders(&look, path, 3).await?);
    // Meanwhile l1 watches fencelock's entry.
    curator.stays_quiet("l0 leads").await?;
    // A longer TTL: the attempt rewrites the entry, whose lease now ends
    // later.
    assert!(matches!(
        backend.try_acquire(&attempt(20)?).await?,
        Acquire::Held(Some(_))
    ));
    let refreshed = backend.queue(&key).await?;
    assert!(
        entry.len() == 1 && refreshed.len() == 1 && refreshed[0].expires_at > entry[0].expires_at,
        "{entry:?}, then {refreshed:?}"
    );
    curator.send("unlatch l0")?;
    curator.expect("l0 closed").await?;
    // Curator deletes a closed latch's node in the background.
    children_until(&look, path, "2 children", |n| n == 2).await?;
    let request = attempt(10)?;
    let Acquire::Granted(grant) = backend.try_acquire(&request).await? else {
        panic!("the waiter queued next was not granted {path}");
    };
    assert_eq!(grant.token, refreshed[0].token);
    never_written(&look, path, &names[1]).await?;
    curator.stays_quiet("fencelock leads").await?;
    backend.release(&request.lease(grant.token)).await?;
    curator.expect_within("l1 leader", PROMPT).await?;
    Ok(())
}
