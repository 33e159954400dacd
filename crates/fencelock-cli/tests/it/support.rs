//! What the CLI tests share: the binary on a SQLite file of their own,
//! reading its output, a `fencelock serve` process, and the measured time
//! budget ([`patience`]) from which a test takes the TTLs, waits and bounds
//! it gives the processes it starts.

#![allow(dead_code)] // each test file uses part of it

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use fencelock_testkit::Patience;

pub const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

/// The machine's time budget now (`fencelock_testkit::patience`), for a
/// test that is no async function: measured on a runtime of its own. The
/// processes a test starts share the machine it measures, so their TTLs
/// and the test's bounds take their figures from it.
pub fn patience() -> Patience {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(Patience::measure())
}

pub use fencelock_testkit::patience::ms;

/// `d` rounded up to whole seconds: for a TTL whose server has a
/// one-second resolution (etcd), so that the lease granted is the one the
/// test asked for.
pub fn whole_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// A temporary directory holding the test's lock file.
pub struct Store {
    pub dir: tempfile::TempDir,
    pub db: PathBuf,
}

impl Store {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = dir.path().join("locks.db");
        Self { dir, db }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        fencelock(&self.db, args)
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("fencelock runs")
    }

    /// Waits until `path` exists and is not empty, for at most
    /// `patience.bound(20 s)`.
    pub fn wait_for_file(&self, path: &Path, patience: &Patience) {
        let bound = patience.bound(Duration::from_secs(20));
        let deadline = Instant::now() + bound;
        while std::fs::read_to_string(path).map_or(true, |s| s.trim().is_empty()) {
            assert!(
                Instant::now() < deadline,
                "{} never appeared within {bound:?} [{patience}]",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn fencelock(db: &Path, args: &[&str]) -> Command {
    fencelock_at(&format!("sqlite://{}", db.display()), args)
}

/// The binary on the store at `url` (through `FENCELOCK_URL`).
pub fn fencelock_at(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("FENCELOCK_URL", url)
        .env_remove("RUST_LOG")
        .args(args);
    cmd
}

pub fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One `name=value` field of `acquire`'s human line.
pub fn field(out: &Output, name: &str) -> String {
    assert_eq!(code(out), 0, "acquire failed: {}", stderr(out));
    let line = stdout(out);
    let prefix = format!("{name}=");
    line.split(' ')
        .find_map(|f| f.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
        .to_owned()
}

/// The key `acquire` printed (the word after `acquired`).
pub fn acquired_key(out: &Output) -> String {
    assert_eq!(code(out), 0, "acquire failed: {}", stderr(out));
    stdout(out)
        .split(' ')
        .nth(1)
        .expect("acquire prints the key")
        .to_owned()
}

/// A `fencelock serve` process over a SQLite file of its own, on a free
/// loopback port; killed when dropped.
pub struct LockService {
    pub child: std::process::Child,
    /// `http://127.0.0.1:PORT`, as the service printed it.
    pub url: String,
    pub store: Store,
}

impl LockService {
    /// Starts `fencelock serve --listen 127.0.0.1:0 ARGS…` and reads the
    /// address it prints.
    pub fn start(args: &[&str]) -> Self {
        let store = Store::new();
        let (child, url) = Self::spawn_on(&store.db, args);
        Self { child, url, store }
    }

    /// Another service over the lock file of `store`.
    pub fn start_on(store: &Store, args: &[&str]) -> Self {
        let own = Store::new();
        let (child, url) = Self::spawn_on(&store.db, args);
        Self {
            child,
            url,
            store: own,
        }
    }

    fn spawn_on(db: &Path, args: &[&str]) -> (std::process::Child, String) {
        use std::io::BufRead;
        let mut child = fencelock(db, &["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("fencelock serve starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("the address line");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        (child, url)
    }
}

impl Drop for LockService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
