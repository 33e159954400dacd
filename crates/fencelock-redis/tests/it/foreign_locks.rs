//! `layout=plain` against the real locks of other libraries on one
//! throwaway `redis-server`: redis-py's `Lock` (in the venv at
//! `$CARGO_TARGET_DIR/venv`) and node-redlock with ioredis (in
//! `$CARGO_TARGET_DIR/foreign-node`), both installed by `.ci/run`; a
//! missing one fails the test. Each runs as a child process driven line by
//! line (`tests/foreign/`).
//!
//! Over many rounds, in both orders: whoever holds the key, the other is
//! refused; fencelock sees the foreign holder as `foreign` with token 0 (it
//! carries none) and will not force-release it; a foreign release of a key
//! it does not hold leaves fencelock's lease alone; tokens keep growing
//! across the foreign holders; and a fencelock waiter is granted the key
//! when the foreign holder's lease ends.
//!
//! Time: a real server and real foreign processes, so no paused clock. A
//! [`Patience`] measured against the server at the start scales the
//! leases that must live through a round (a base of 30 s: each round waits
//! on the foreign process several times) and the waiter's wait for the
//! short foreign lease to end (a base of 20 s). That lease (500 ms) is
//! meant to end; nothing asserts how soon.

use std::{
    io::{BufRead, BufReader, Write},
    path::PathBuf,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, BackendAdmin, Error, FencingToken, LockClient, LockKey, Owner,
};
use fencelock_redis::RedisBackend;
use fencelock_testkit::{servers::redis::RedisServer, Patience, TestResult};

/// The shared cargo target, where `.ci/run` installs the foreign clients.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/foreign")
        .join(name)
}

/// A foreign client process and its line protocol.
struct Foreign {
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    version: String,
}

impl Foreign {
    fn start(name: &'static str, mut command: Command) -> TestResult<Self> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{name}: {e} (.ci/run installs it)"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut foreign = Self {
            name,
            child,
            stdin,
            stdout,
            version: String::new(),
        };
        let ready = foreign.line()?;
        foreign.version = ready
            .strip_prefix("ready ")
            .ok_or_else(|| format!("{name} did not start: {ready:?}"))?
            .to_owned();
        Ok(foreign)
    }

    fn redis_py(url: &str) -> TestResult<Self> {
        let python = target_dir().join("venv/bin/python");
        let mut command = Command::new(python);
        command.arg(script("redis_py_lock.py")).arg(url);
        Self::start("redis-py Lock", command)
    }

    fn node_redlock(url: &str) -> TestResult<Self> {
        let mut command = Command::new("node");
        command
            .arg(script("node_redlock.js"))
            .arg(url)
            .env("NODE_PATH", target_dir().join("foreign-node/node_modules"));
        Self::start("node-redlock", command)
    }

    fn line(&mut self) -> TestResult<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Err(format!("{} exited", self.name).into());
        }
        Ok(line.trim().to_owned())
    }

    fn ask(&mut self, request: &str) -> TestResult<String> {
        writeln!(self.stdin, "{request}")?;
        self.stdin.flush()?;
        self.line()
    }

    /// One try; whether it was granted.
    fn acquire(&mut self, key: &str, ttl: Duration) -> TestResult<bool> {
        match self
            .ask(&format!("acquire {key} {}", ttl.as_millis()))?
            .as_str()
        {
            "granted" => Ok(true),
            "held" => Ok(false),
            other => Err(format!("{}: acquire answered {other:?}", self.name).into()),
        }
    }

    /// Whether it held the key.
    fn release(&mut self, key: &str) -> TestResult<bool> {
        match self.ask(&format!("release {key}"))?.as_str() {
            "released" => Ok(true),
            "not-held" => Ok(false),
            other => Err(format!("{}: release answered {other:?}", self.name).into()),
        }
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ROUNDS: usize = 20;

async fn exclusion_both_ways(redis: &RedisServer, mut foreign: Foreign) -> TestResult {
    let url = format!("{}?layout=plain&prefix=interop", redis.url());
    let backend = RedisBackend::connect(&url).await?;
    let p = Patience::against(&backend).await;
    let ttl = p.ttl(Duration::from_secs(30));
    let key = LockKey::new(format!("jobs:{}", foreign.name.replace(' ', "-")))?;
    let owner = Owner::new("fencelock-holder")?;
    let request = AcquireRequest::new(key.clone(), owner.clone(), ttl);
    let mut last = FencingToken(0);
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            // fencelock first.
            let Acquire::Granted(grant) = backend.try_acquire(&request).await? else {
                return Err(format!("round {round}: fencelock was refused a free key").into());
            };
            if grant.token <= last {
                return Err(
                    format!("round {round}: token {:?} after {last:?}", grant.token).into(),
                );
            }
            last = grant.token;
            if foreign.acquire(key.as_str(), ttl)? {
                return Err(
                    format!("round {round}: {} took a key fencelock holds", foreign.name).into(),
                );
            }
            if foreign.release(key.as_str())? {
                return Err(
                    format!("round {round}: {} released fencelock's lease", foreign.name).into(),
                );
            }
            let info = backend
                .inspect(&key)
                .await?
                .ok_or_else(|| format!("round {round}: fencelock's lease is gone ({p})"))?;
            if info.owner != owner || info.token != grant.token {
                return Err(format!("round {round}: inspect shows {info:?}").into());
            }
            backend.release(&request.lease(grant.token)).await?;
            if !foreign.acquire(key.as_str(), ttl)? {
                return Err(
                    format!("round {round}: {} was refused a free key", foreign.name).into(),
                );
            }
            foreign.release(key.as_str())?;
        } else {
            // The foreign client first.
            if !foreign.acquire(key.as_str(), ttl)? {
                return Err(
                    format!("round {round}: {} was refused a free key", foreign.name).into(),
                );
            }
            let holder = match backend.try_acquire(&request).await? {
                Acquire::Held(Some(holder)) => holder,
                other => {
                    return Err(format!(
                        "round {round}: fencelock, with {} holding, got {other:?}",
                        foreign.name
                    )
                    .into())
                }
            };
            if holder.owner.as_str() != "foreign"
                || holder.token != FencingToken(0)
                || holder.kind.as_deref() != Some("foreign")
                || holder.expires_in > ttl
            {
                return Err(
                    format!("round {round}: the foreign holder shows as {holder:?}").into(),
                );
            }
            match backend.force_release(&key).await {
                Err(Error::InvalidArgument(_)) => {}
                other => {
                    return Err(format!(
                        "round {round}: force-release of a foreign holder: {other:?}"
                    )
                    .into())
                }
            }
            if !foreign.release(key.as_str())? {
                return Err(format!("round {round}: {} lost its lock ({p})", foreign.name).into());
            }
            let Acquire::Granted(grant) = backend.try_acquire(&request).await? else {
                return Err(format!("round {round}: fencelock was refused a freed key").into());
            };
            if grant.token <= last {
                return Err(
                    format!("round {round}: token {:?} after {last:?}", grant.token).into(),
                );
            }
            last = grant.token;
            backend.release(&request.lease(grant.token)).await?;
        }
    }

    // A fencelock waiter gets the key when the foreign lease ends.
    let short = Duration::from_millis(500);
    if !foreign.acquire(key.as_str(), short)? {
        return Err("the foreign client was refused a free key".into());
    }
    let client = LockClient::new(Arc::new(backend) as Arc<dyn Backend>);
    let guard = client
        .lock(key.as_str())
        .wait(p.bound(Duration::from_secs(20)))
        .acquire()
        .await
        .map_err(|e| format!("waiting for the foreign lease to end: {e} ({p})"))?;
    if guard.token() <= last {
        return Err(format!("token {:?} after {last:?}", guard.token()).into());
    }
    if foreign.release(key.as_str())? {
        return Err("the foreign client released a lease after it ended".into());
    }
    guard.release().await?;
    eprintln!(
        "{} {}: {ROUNDS} rounds of exclusion both ways",
        foreign.name, foreign.version
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_lock_and_fencelock_exclude_each_other() -> TestResult {
    let redis = tokio::task::spawn_blocking(RedisServer::start).await??;
    let foreign = Foreign::redis_py(&redis.url())?;
    exclusion_both_ways(&redis, foreign).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redlock_and_fencelock_exclude_each_other() -> TestResult {
    let redis = tokio::task::spawn_blocking(RedisServer::start).await??;
    let foreign = Foreign::node_redlock(&redis.url())?;
    exclusion_both_ways(&redis, foreign).await
}
