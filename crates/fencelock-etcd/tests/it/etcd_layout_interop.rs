//! `layout=etcd` against etcd's own clients: Debian's `etcdctl lock` and
//! `etcdctl elect`, and Go's `concurrency.Mutex` / `concurrency.Election`
//! (the program in `interop/`, built here with `go build`). Every test
//! starts its own etcd.
//!
//! Critical sections are checked by etcd itself, the same way on both
//! sides (`interop/main.go`, [`enter`]): entering puts a marker key only if
//! no one is inside *and* the entrant's token (its key's create revision)
//! is above the last one admitted, in one Txn. A refused entry is a
//! violation of exclusion or of token order.
//!
//! Time: a real etcd and real foreign processes. Each test measures a
//! [`Patience`] against its etcd first and scales from it fencelock's
//! leases (10 s), its waits (60 s) and every bound on a foreign process
//! (base [`WAKE`], 120 s for a whole run); a failure names the budget. The
//! 300 ms in which a waiter must print nothing while the other side holds
//! is a check that nothing happens, which load cannot make fail, and keeps
//! its figure.

use std::{
    io::{BufRead, BufReader, Write},
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Arc, OnceLock},
    time::Duration,
};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use fencelock_core::{Backend, Error, LockClient, Owner};
use fencelock_etcd::EtcdLayoutBackend;
use fencelock_testkit::{servers::etcd::EtcdCluster, Patience, TestResult};
use tokio::sync::mpsc;

const MARKER: &str = "interop/inside";
const LAST: &str = "interop/last";
/// The base of how long a woken waiter may take to report its grant.
const WAKE: Duration = Duration::from_secs(15);
/// The base of fencelock's leases.
const TTL: Duration = Duration::from_secs(10);
/// The base of fencelock's waits for the other side's turn.
const WAIT: Duration = Duration::from_secs(60);

/// The Go program, built once per test binary.
fn go_helper() -> TestResult<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| manifest.join("../../target"), PathBuf::from);
            let out = target.join("etcd-interop");
            let path = format!(
                "/usr/local/go/bin:{}",
                std::env::var("PATH").unwrap_or_default()
            );
            let status = Command::new("go")
                .args(["build", "-o"])
                .arg(&out)
                .arg(".")
                .current_dir(manifest.join("interop"))
                .env("PATH", path)
                .status()
                .map_err(|e| format!("go (Go at /usr/local/go/bin) could not run: {e}"))?;
            if !status.success() {
                return Err(format!("go build of interop/ failed: {status}"));
            }
            Ok(out)
        })
        .clone()
        .map_err(Into::into)
}

/// A foreign client process whose stdout lines arrive on a channel.
struct Foreign {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Foreign {
    fn spawn(mut command: Command) -> TestResult<Self> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{command:?} could not start: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Ok(Self {
            child,
            stdin,
            lines,
        })
    }

    /// The next line, within `within`.
    async fn line(&mut self, within: Duration) -> TestResult<String> {
        match tokio::time::timeout(within, self.lines.recv()).await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => Err(format!("the process ended: {:?}", self.child.wait()?).into()),
            Err(_) => Err(format!("no line within {within:?}").into()),
        }
    }

    /// Whether a line arrives within `within` (it must not, while the
    /// other side holds).
    async fn quiet_for(&mut self, within: Duration) -> TestResult {
        match tokio::time::timeout(within, self.lines.recv()).await {
            Err(_) => Ok(()),
            Ok(line) => Err(format!("printed {line:?} while the other side held").into()),
        }
    }

    fn say(&mut self, line: &str) -> TestResult {
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    fn interrupt(&self) -> TestResult {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT)?;
        Ok(())
    }

    fn finish(mut self) -> TestResult {
        drop(self.stdin.take());
        let status = self.child.wait()?;
        if !status.success() {
            return Err(format!("the foreign client failed: {status}").into());
        }
        Ok(())
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn endpoint(etcd: &EtcdCluster) -> String {
    etcd.url().trim_start_matches("etcd://").to_owned()
}

fn go(etcd: &EtcdCluster, mode: &str, args: &[&str]) -> TestResult<Command> {
    let mut command = Command::new(go_helper()?);
    command
        .arg(mode)
        .args(["-endpoints", &endpoint(etcd)])
        .args(args);
    Ok(command)
}

fn etcdctl(etcd: &EtcdCluster, args: &[&str]) -> TestResult<Command> {
    let binary = fencelock_testkit::servers::find_binary("etcdctl", &[], "etcd-client")?;
    let mut command = Command::new(binary);
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoint(etcd)))
        .args(args);
    Ok(command)
}

async fn backend(etcd: &EtcdCluster) -> TestResult<Arc<dyn Backend>> {
    let url = format!("{}?layout=etcd", etcd.url());
    Ok(Arc::new(EtcdLayoutBackend::connect(&url).await?))
}

fn client(backend: &Arc<dyn Backend>, owner: &str, p: &Patience) -> TestResult<LockClient> {
    Ok(LockClient::builder(Arc::clone(backend))
        .owner(Owner::new(owner)?)
        .ttl(p.ttl(TTL))
        .build()?)
}

/// `LAST` starts below every token.
async fn start_sections(etcd: &EtcdCluster) -> TestResult<Client> {
    let mut c = Client::connect([etcd.url().replace("etcd://", "http://")], None).await?;
    c.put(LAST, format!("{:020}", 0), None).await?;
    Ok(c)
}

/// fencelock's side of a checked critical section (see the module docs).
async fn enter_and_leave(c: &mut Client, who: &str, token: u64) -> TestResult {
    let padded = format!("{token:020}");
    let enter = Txn::new()
        .when([
            Compare::create_revision(MARKER, CompareOp::Equal, 0),
            Compare::value(LAST, CompareOp::Less, padded.clone()),
        ])
        .and_then([
            TxnOp::put(MARKER, who, None),
            TxnOp::put(LAST, padded, None),
        ])
        .or_else([TxnOp::get(MARKER, None), TxnOp::get(LAST, None)]);
    let resp = c.txn(enter).await?;
    if !resp.succeeded() {
        return Err(format!("VIOLATION {who} with token {token}: {resp:?}").into());
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    let leave = Txn::new()
        .when([Compare::value(MARKER, CompareOp::Equal, who)])
        .and_then([TxnOp::delete(MARKER, None)]);
    c.txn(leave).await?;
    Ok(())
}

/// Waits until `key`'s queue shows an entry whose owner satisfies `is`,
/// for at most `p.bound(WAKE)`.
async fn queued(
    backend: &Arc<dyn Backend>,
    key: &str,
    is: impl Fn(&str) -> bool,
    p: &Patience,
) -> TestResult {
    let key = fencelock_core::LockKey::new(key)?;
    let deadline = tokio::time::Instant::now() + p.bound(WAKE);
    loop {
        if backend
            .fair_queue()
            .ok_or_else(|| fencelock_core::Error::unsupported("test", "queue"))?
            .queue(&key)
            .await?
            .iter()
            .any(|e| is(e.owner.as_str()))
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("no such waiter queued on {key} [{p}]").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn foreign(owner: &str) -> bool {
    owner.starts_with("etcd:")
}

/// The token in a `LOCKED key token` / `LEADER key token` line.
fn token_in(line: &str) -> TestResult<u64> {
    Ok(line
        .split_whitespace()
        .nth(2)
        .ok_or_else(|| format!("no token in {line:?}"))?
        .parse()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn go_mutex_etcdctl_lock_and_fencelock_exclude_each_other_over_many_rounds() -> TestResult {
    let etcd = tokio::task::spawn_blocking(EtcdCluster::start).await??;
    let mut sections = start_sections(&etcd).await?;
    let b = backend(&etcd).await?;
    let p = Patience::against(&*b).await;
    // Shown with any failure below.
    eprintln!("time budget: {p}");
    let (wake, wait) = (p.bound(WAKE), p.bound(WAIT));
    let fencelock = client(&b, "fencelock-rounds", &p)?;
    const ROUNDS: usize = 40;
    // The most a whole run of rounds may take.
    let run_bound = p.bound(Duration::from_secs(120));
    let name = "jobs/nightly";

    let mut go_rounds = Foreign::spawn(go(
        &etcd,
        "mutex",
        &[
            "-name", name, "-rounds", "40", "-marker", MARKER, "-last", LAST, "-who", "go",
        ],
    )?)?;
    let critical = go_helper()?;
    let endpoints = endpoint(&etcd);
    let stuck_after = run_bound.as_secs().to_string();
    let etcdctl_rounds = {
        let binary = fencelock_testkit::servers::find_binary("etcdctl", &[], "etcd-client")?;
        tokio::task::spawn_blocking(move || -> TestResult<Vec<u64>> {
            // etcdctl lock runs the critical section with ETCD_LOCK_KEY set;
            // a stuck etcdctl must fail the test, not hang it.
            let round = || {
                let mut command = Command::new("timeout");
                command
                    .arg(&stuck_after)
                    .arg(&binary)
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={endpoints}"))
                    .args(["lock", name, "--"])
                    .arg(&critical)
                    .args([
                        "critical",
                        "-endpoints",
                        &endpoints,
                        "-marker",
                        MARKER,
                        "-last",
                        LAST,
                        "-who",
                        "etcdctl",
                    ]);
                command
            };
            let mut tokens = Vec::new();
            for _ in 0..10 {
                let out = round().output()?;
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                if !out.status.success() {
                    return Err(format!(
                        "etcdctl lock: {}: {text}{}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    )
                    .into());
                }
                let line = text
                    .lines()
                    .find(|l| l.starts_with("CRITICAL "))
                    .ok_or_else(|| format!("no critical section in {text:?}"))?;
                tokens.push(line.trim_start_matches("CRITICAL ").parse()?);
            }
            Ok(tokens)
        })
    };

    // Both sides run their rounds at once, so that grants alternate
    // between them through the one queue.
    assert_eq!(go_rounds.line(wake).await?, "READY");
    let mut ours = Vec::new();
    for _ in 0..ROUNDS {
        let guard = fencelock
            .lock(name)
            .wait(wait)
            .acquire()
            .await
            .map_err(|e| format!("{e} [{p}]"))?;
        enter_and_leave(&mut sections, "fencelock", guard.token().get()).await?;
        ours.push(guard.token().get());
        guard.release().await?;
    }
    let mut theirs = Vec::new();
    for _ in 0..ROUNDS {
        let line = go_rounds
            .line(run_bound)
            .await
            .map_err(|e| format!("{e} [{p}]"))?;
        let token: u64 = line
            .split_whitespace()
            .nth(2)
            .ok_or_else(|| format!("bad line {line:?}"))?
            .parse()?;
        theirs.push(token);
    }
    go_rounds.finish()?;
    let etcdctl_tokens = etcdctl_rounds.await??;

    // Both orders happened: a Go grant between two of ours, and one of
    // ours between two of Go's.
    let between = |a: &[u64], b: &[u64]| {
        b.iter()
            .any(|t| a.iter().any(|x| x < t) && a.iter().any(|x| x > t))
    };
    assert!(
        between(&ours, &theirs),
        "no Go grant came between two of fencelock's: {ours:?} {theirs:?}"
    );
    assert!(
        between(&theirs, &ours),
        "no fencelock grant came between two of Go's: {ours:?} {theirs:?}"
    );
    println!(
        "rounds: fencelock {}, Go concurrency.Mutex {}, etcdctl lock {}; every section admitted in token order",
        ours.len(),
        theirs.len(),
        etcdctl_tokens.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_of_each_kind_is_woken_by_the_others_release() -> TestResult {
    let etcd = tokio::task::spawn_blocking(EtcdCluster::start).await??;
    let b = backend(&etcd).await?;
    let p = Patience::against(&*b).await;
    // Shown with any failure below.
    eprintln!("time budget: {p}");
    let (wake, wait) = (p.bound(WAKE), p.bound(WAIT));
    let fencelock = client(&b, "fencelock-waiter", &p)?;
    let name = "reports";
    let key = fencelock_core::LockKey::new(name)?;

    // fencelock holds; Go waits, queued behind it, and is woken by the
    // release.
    let guard = fencelock.lock(name).acquire().await?;
    let mut go_waiter = Foreign::spawn(go(&etcd, "hold", &["-name", name])?)?;
    assert_eq!(go_waiter.line(wake).await?, "WAITING");
    queued(&b, name, foreign, &p).await?;
    go_waiter.quiet_for(Duration::from_millis(300)).await?;
    let fencelock_token = guard.token().get();
    guard.release().await?;
    let locked = go_waiter.line(wake).await?;
    let go_token = token_in(&locked)?;
    assert!(
        go_token > fencelock_token,
        "{locked} after {fencelock_token}"
    );

    // Go holds: inspect shows it, force-release is refused; fencelock
    // waits and is woken by Go's unlock.
    let holder = b.inspect(&key).await?.ok_or("Go's holder is not shown")?;
    assert!(foreign(holder.owner.as_str()), "{holder:?}");
    assert_eq!(holder.token.get(), go_token);
    assert!(b
        .administer()?
        .list(Some("rep"))
        .await?
        .iter()
        .any(|l| l.token.get() == go_token));
    match b.administer()?.force_release(&key).await {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("concurrency"), "{msg}"),
        other => return Err(format!("force-release of a Go holder: {other:?}").into()),
    }
    let waiting = {
        let fencelock = fencelock.clone();
        tokio::spawn(async move {
            let guard = fencelock.lock(name).wait(wait).acquire().await?;
            let token = guard.token().get();
            guard.release().await?;
            fencelock_core::Result::<u64>::Ok(token)
        })
    };
    queued(&b, name, |o| o == "fencelock-waiter", &p).await?;
    assert!(!waiting.is_finished(), "fencelock took the lock Go holds");
    go_waiter.say("release")?;
    assert_eq!(go_waiter.line(wake).await?, "UNLOCKED");
    let woken = tokio::time::timeout(wake, waiting)
        .await
        .map_err(|_| format!("fencelock's waiter not woken within {wake:?} [{p}]"))???;
    assert!(woken > go_token);
    go_waiter.finish()?;

    // The same with etcdctl lock, which holds until interrupted.
    let guard = fencelock.lock(name).acquire().await?;
    let mut etcdctl_waiter = Foreign::spawn(etcdctl(&etcd, &["lock", name])?)?;
    queued(&b, name, foreign, &p).await?;
    etcdctl_waiter.quiet_for(Duration::from_millis(300)).await?;
    let before = guard.token().get();
    guard.release().await?;
    let held_key = etcdctl_waiter.line(wake).await?;
    assert!(held_key.starts_with("reports/"), "{held_key}");
    let holder = b
        .inspect(&key)
        .await?
        .ok_or("etcdctl's holder is not shown")?;
    assert!(foreign(holder.owner.as_str()) && holder.token.get() > before);
    let waiting = {
        let fencelock = fencelock.clone();
        tokio::spawn(async move {
            let guard = fencelock.lock(name).wait(wait).acquire().await?;
            let token = guard.token().get();
            guard.release().await?;
            fencelock_core::Result::<u64>::Ok(token)
        })
    };
    queued(&b, name, |o| o == "fencelock-waiter", &p).await?;
    assert!(
        !waiting.is_finished(),
        "fencelock took the lock etcdctl holds"
    );
    etcdctl_waiter.interrupt()?;
    let woken = tokio::time::timeout(wake, waiting)
        .await
        .map_err(|_| format!("fencelock's waiter not woken within {wake:?} [{p}]"))???;
    assert!(woken > holder.token.get());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcdctl_elect_go_election_and_fencelock_elect_see_one_leader() -> TestResult {
    let etcd = tokio::task::spawn_blocking(EtcdCluster::start).await??;
    let b = backend(&etcd).await?;
    let p = Patience::against(&*b).await;
    // Shown with any failure below.
    eprintln!("time budget: {p}");
    let wake = p.bound(WAKE);
    let fencelock = client(&b, "fencelock-candidate", &p)?;
    let name = "scheduler";
    let election = fencelock.election(name).ttl(p.ttl(TTL));

    // etcdctl leads: fencelock sees it, and its candidate waits.
    let mut etcdctl_leader = Foreign::spawn(etcdctl(&etcd, &["elect", name, "etcdctl-proposal"])?)?;
    let leader_key = etcdctl_leader.line(wake).await?;
    assert!(leader_key.starts_with("scheduler/"), "{leader_key}");
    assert_eq!(etcdctl_leader.line(wake).await?, "etcdctl-proposal");
    let seen = election.leader().await?.ok_or("fencelock sees no leader")?;
    assert!(foreign(seen.owner.as_str()), "{seen:?}");
    assert_eq!(
        seen.value,
        Some(serde_json::json!({ "etcd_value": "etcdctl-proposal" }))
    );
    let campaign = {
        let election = election.clone();
        tokio::spawn(async move {
            let leadership = election.campaign().await?;
            fencelock_core::Result::<fencelock_core::Leadership>::Ok(leadership)
        })
    };
    queued(&b, name, |o| o == "fencelock-candidate", &p).await?;
    assert!(!campaign.is_finished(), "fencelock leads beside etcdctl");
    etcdctl_leader.interrupt()?;
    let leadership = tokio::time::timeout(wake, campaign)
        .await
        .map_err(|_| format!("fencelock not elected within {wake:?} [{p}]"))???;
    assert!(leadership.term() > seen.term);

    // fencelock leads: Go's Leader and `etcdctl elect -l` see it, and a Go
    // candidate waits until fencelock resigns.
    let go_leader = go(&etcd, "leader", &["-name", name])?.output()?;
    let line = String::from_utf8_lossy(&go_leader.stdout).into_owned();
    assert_eq!(token_in(&line)?, leadership.term().get(), "{line}");
    assert!(line.contains("fencelock-candidate"), "{line}");
    let mut observer = Foreign::spawn(etcdctl(&etcd, &["elect", "-l", name])?)?;
    let observed = observer.line(wake).await?;
    assert!(observed.starts_with("scheduler/"), "{observed}");
    assert!(observer.line(wake).await?.contains("fencelock-candidate"));
    drop(observer);
    let mut go_candidate =
        Foreign::spawn(go(&etcd, "campaign", &["-name", name, "-value", "go"])?)?;
    assert_eq!(go_candidate.line(wake).await?, "CAMPAIGNING");
    queued(&b, name, foreign, &p).await?;
    go_candidate.quiet_for(Duration::from_millis(300)).await?;
    let term = leadership.term().get();
    leadership.resign().await?;
    let led = go_candidate.line(wake).await?;
    assert!(token_in(&led)? > term, "{led} after term {term}");
    let seen = election.leader().await?.ok_or("no leader after Go won")?;
    assert_eq!(seen.value, Some(serde_json::json!({ "etcd_value": "go" })));
    go_candidate.say("resign")?;
    assert_eq!(go_candidate.line(wake).await?, "RESIGNED");
    go_candidate.finish()?;
    Ok(())
}
