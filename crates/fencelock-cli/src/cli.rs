//! Command-line definitions.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

/// Parses `500ms`, `30s`, `5m`, … (no negative or unit-less values).
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    fencelock::parse_duration(s)
}

/// Parses `--wait`: a duration, or `forever` (also `inf`, `infinity`).
pub(crate) fn wait(s: &str) -> Result<Duration, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "forever" | "inf" | "infinity" => Ok(Duration::MAX),
        _ => duration(s).map_err(|e| format!("{e}; or `forever` to wait without a limit")),
    }
}

/// Parses a TTL: a duration within fencelock's bounds.
pub(crate) fn ttl(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    fencelock::validate_ttl(d).map_err(|e| e.to_string())
}

/// `--value`: JSON when it parses as JSON, otherwise the text as a string.
fn value(s: &str) -> Result<serde_json::Value, String> {
    Ok(serde_json::from_str(s).unwrap_or_else(|_| serde_json::Value::String(s.to_owned())))
}

fn json(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not valid JSON: {e}"))
}

/// Distributed locks with fencing tokens, from the shell.
///
/// Runs commands under a lock that is renewed while they run, stops them if
/// the lock is lost, and passes them a fencing token. Also inspects and
/// manages the locks of any fencelock backend.
#[derive(Debug, Parser)]
#[command(
    name = "fencelock",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    /// Backend URL: sqlite:///path.db, postgres://…, mysql://…, redis://…, redlock://h1:p1,h2:p2,h3:p3, etcd://…, zk://…,
    /// sharded:///path/shards.toml
    /// [default: sqlite at $XDG_STATE_HOME/fencelock/locks.db, i.e.
    /// ~/.local/state/fencelock/locks.db]
    #[arg(long, env = "FENCELOCK_URL", global = true, hide_env_values = true)]
    pub url: Option<String>,

    /// Print machine-readable JSON on stdout.
    #[arg(long, global = true)]
    pub json: bool,

    /// Print nothing but errors on stderr.
    #[arg(long, short, global = true)]
    pub quiet: bool,

    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by the commands that take a lock.
#[derive(Debug, Args)]
pub struct LockArgs {
    /// The lock's key (1–255 bytes, no control characters).
    pub key: String,

    /// Lease length (at least 100ms). `run` renews it every third of it
    /// while the command runs; `acquire` never renews it (see `renew`).
    #[arg(
        long,
        short = 't',
        default_value = "30s",
        value_parser = ttl,
        allow_hyphen_values = true
    )]
    pub ttl: Duration,

    /// How long to wait for a held lock or an unreachable backend (0 = do
    /// not wait, `forever` = no limit).
    #[arg(
        long,
        short = 'w',
        default_value = "0s",
        value_parser = wait,
        allow_hyphen_values = true
    )]
    pub wait: Duration,

    /// Owner name [default: hostname:pid:random].
    #[arg(long)]
    pub owner: Option<String>,

    /// A label stored with the lease (e.g. workflow, node, resource).
    #[arg(long)]
    pub kind: Option<String>,

    /// JSON metadata stored with the lease.
    #[arg(long, value_parser = json)]
    pub data: Option<serde_json::Value>,

    /// Lock delay: keep KEY from others for at least this long after the
    /// grant, however early the command ends or the lock is released (at
    /// most --ttl). With `run`, an early end shortens the lease to what is
    /// left of the delay instead of deleting it; with `acquire` the lease
    /// lasts its TTL anyway, and only `fencelock release` frees it sooner.
    /// Not with --permits or --shared. See docs/lock-delay.md.
    #[arg(long, value_name = "DURATION", value_parser = duration, allow_hyphen_values = true)]
    pub hold_at_least: Option<Duration>,

    /// Take the reader's side of the read-write lock KEY: shared with other
    /// --shared holders, excluded by (and excluding) a plain holder of KEY.
    /// See docs/rwlock.md.
    #[arg(long)]
    pub shared: bool,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding a lock, a semaphore permit, or several
    /// locks.
    ///
    /// The command gets FENCELOCK_KEY, FENCELOCK_OWNER and FENCELOCK_TOKEN in
    /// its environment, and FENCELOCK_KEYS and FENCELOCK_TOKENS: every key
    /// held and its token, one a line, in the same sorted order. With
    /// several KEYs all are taken or none (in sorted order, within one
    /// --wait); FENCELOCK_KEY and FENCELOCK_TOKEN are then the first key
    /// sorted. With --permits N, KEY names a semaphore of N permits and
    /// FENCELOCK_KEY is the permit's own key,
    /// fencelock/semaphore/KEY/SLOT, which its token fences. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to
    /// it. If the lock is lost, the command gets SIGTERM, then SIGKILL after
    /// --kill-after, and fencelock exits 76. Otherwise the exit code is the
    /// command's (128+N if killed by signal N); 75 if the lock was not
    /// acquired within --wait.
    Run {
        #[command(flatten)]
        lock: LockArgs,

        /// More keys to hold at the same time as KEY (all or none).
        #[arg(value_name = "KEYS")]
        more_keys: Vec<String>,

        /// Take one permit of the semaphore KEY of N permits (1–10000)
        /// instead of the lock KEY; every holder must give the same N.
        #[arg(long, value_name = "N")]
        permits: Option<u32>,

        /// Grace period between SIGTERM and SIGKILL when the lock is lost.
        #[arg(long, default_value = "10s", value_parser = duration, allow_hyphen_values = true)]
        kill_after: Duration,

        /// Keep the command in fencelock's process group. By default it gets
        /// a group of its own, so that signals reach its children too; when
        /// fencelock runs in the foreground of a terminal, that group is the
        /// terminal's foreground group while the command runs, so that
        /// interactive commands read the terminal and get Ctrl-C.
        #[arg(long)]
        foreground: bool,

        /// The command and its arguments.
        #[arg(required = true, last = true, value_name = "CMD")]
        command: Vec<String>,
    },

    /// Acquire a lock and exit without renewing it; prints owner and token.
    ///
    /// Prints `acquired KEY token=T owner=O expires_in=D`, D being the lease
    /// the backend granted (etcd rounds short TTLs up). The lease lasts that
    /// long unless renewed (`fencelock renew`) or released (`fencelock
    /// release`) with the printed owner and token. Exit 0 if acquired, 75 if
    /// not. With --permits N, takes one permit of the semaphore KEY and
    /// prints the permit's own key (fencelock/semaphore/KEY/SLOT, the key
    /// `renew` and `release` take) and `permit=SLOT/N` too.
    Acquire {
        #[command(flatten)]
        lock: LockArgs,

        /// Take one permit of the semaphore KEY of N permits (1–10000).
        #[arg(long, value_name = "N")]
        permits: Option<u32>,
    },

    /// Extend a lease held by OWNER with TOKEN. Exit 1 if not held.
    Renew {
        /// The lock's key.
        key: String,
        /// The owner the lock was acquired as.
        #[arg(long)]
        owner: String,
        /// The fencing token of the lease.
        #[arg(long)]
        token: String,
        /// The lease is a reader's (`acquire --shared`).
        #[arg(long)]
        shared: bool,
        /// New lease length, from now. A backend rounds it up to what it can
        /// express (etcd: whole seconds, at least about 2 s); the length
        /// printed is the one the backend granted.
        #[arg(long, default_value = "30s", value_parser = ttl, allow_hyphen_values = true)]
        ttl: Duration,
    },

    /// Release a lease held by OWNER with TOKEN. Exit 1 if not held.
    Release {
        /// The lock's key.
        key: String,
        /// The owner the lock was acquired as.
        #[arg(long)]
        owner: String,
        /// The fencing token of the lease.
        #[arg(long)]
        token: String,
        /// The lease is a reader's (`acquire --shared`).
        #[arg(long)]
        shared: bool,
    },

    /// Show who holds a lock: its holder, or every reader of a read-write
    /// lock (JSON: the holder whose lease ends last, with `mode` and a
    /// `holders` array). Exit 0 if held, 1 if free.
    Inspect {
        /// The lock's key.
        key: String,
    },

    /// List held locks, optionally only those whose key starts with PREFIX.
    List {
        /// Literal key prefix (no wildcards).
        prefix: Option<String>,
        /// Show at most N locks, by key, and the key to pass to --after
        /// for the next page (--json: `{"locks": […], "next": KEY|null}`).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Only locks whose key sorts after KEY (a page's `next`).
        #[arg(long, value_name = "KEY", requires = "limit")]
        after: Option<String>,
    },

    /// Show statistics: held locks by kind and owner, hold times, expired
    /// records awaiting cleanup.
    Stats,

    /// Delete expired lease records (never needed for correctness).
    Cleanup,

    /// Measure the library on a backend, beside the engine's own limit.
    ///
    /// Prints ops/s, p50/p99/p99.9 latency and success rate (one JSON
    /// object with --json). --baseline also runs the backend's own
    /// statements, scripts or RPCs on a raw connection for the same
    /// operation and prints fencelock/limit. Reports; asserts nothing.
    #[cfg(feature = "lab")]
    Bench(fencelock_lab::bench::BenchArgs),

    /// Run a command while leader of election NAME; wait as a standby first.
    ///
    /// The leader holds the key fencelock/election/NAME. The command gets
    /// FENCELOCK_KEY, FENCELOCK_OWNER and FENCELOCK_TOKEN (the term, a
    /// fencing token greater than every earlier leader's) and is supervised
    /// as by `run`: if the leadership is lost, it gets SIGTERM, then SIGKILL
    /// after --kill-after, and fencelock exits 76. Otherwise the exit code is
    /// the command's; 75 if not elected within --wait. See docs/election.md.
    Elect {
        /// The election's name.
        name: String,

        /// The leader's lease length; a crashed leader is replaced at most
        /// this long after its last renewal.
        #[arg(long, short = 't', default_value = "30s", value_parser = ttl, allow_hyphen_values = true)]
        ttl: Duration,

        /// The value the leader publishes (JSON, or else a string), e.g. its
        /// address; `fencelock leader` shows it.
        #[arg(long, value_parser = value)]
        value: Option<serde_json::Value>,

        /// How long to wait as a standby (`forever` = no limit).
        #[arg(long, short = 'w', default_value = "forever", value_parser = wait, allow_hyphen_values = true)]
        wait: Duration,

        /// Owner name [default: hostname:pid:random].
        #[arg(long)]
        owner: Option<String>,

        /// Grace period between SIGTERM and SIGKILL when leadership is lost.
        #[arg(long, default_value = "10s", value_parser = duration, allow_hyphen_values = true)]
        kill_after: Duration,

        /// Keep the command in fencelock's process group (see `run`).
        #[arg(long)]
        foreground: bool,

        /// The command and its arguments.
        #[arg(required = true, last = true, value_name = "CMD")]
        command: Vec<String>,
    },

    /// Show the leader of election NAME: owner and term. Exit 1 if none.
    ///
    /// With --json: {"owner", "term", "value", "expires_in_ms"} (null when
    /// there is no leader). With --watch, prints the current leader and then
    /// one line (one JSON object, with "event": "elected" or "vacant") per
    /// change until interrupted; a vacancy says whether the leader resigned
    /// or its lease expired.
    Leader {
        /// The election's name.
        name: String,

        /// Follow the changes.
        #[arg(long)]
        watch: bool,
    },

    /// Serve the backend of --url as a lock service over HTTP: REST for any
    /// language, server-sent events, Prometheus /metrics (docs/http.md).
    /// Clients use it with --url http://HOST:PORT.
    Serve(crate::serve::ServeArgs),

    /// Remove a lock whoever holds it. Its holder notices at its next
    /// renewal. Exit 1 if it was not held.
    ForceRelease {
        /// The lock's key.
        key: String,
    },

    /// Fault injection: prove that no stale write gets through.
    ///
    /// Worker processes increment a fenced counter under one lock while a
    /// nemesis pauses them (SIGSTOP), cuts them off from the backend, delays
    /// and resets their connections, and kill -9s the server (--server), one
    /// node of a redlock set (--server redlock, which also pauses its first
    /// node), or the etcd or ZooKeeper leader, the Redis Cluster primary of
    /// the key or the Sentinel master (--server etcd-cluster,
    /// zookeeper-cluster, redis-cluster, redis-sentinel). A checker then
    /// reads the
    /// recorded history. Exit 0 if no stale write was admitted, no update
    /// lost and no token reissued; 3 on any violation. See docs/safety.md.
    #[cfg(feature = "lab")]
    Torture(fencelock_lab::torture::TortureArgs),

    /// Measure what one failed component costs patient clients.
    ///
    /// Starts throwaway servers for each deployment shape (service replicas
    /// with every address or behind HAProxy, Redis Sentinel, Redlock, etcd,
    /// ZooKeeper), holds locks with a lease of three times the shape's
    /// failover time, queues waiters and starts a new caller every 200 ms,
    /// then kills or stops one component (a replica, the master, a node,
    /// the leader). Prints per case the unnecessary losses, the failed
    /// calls, the longest stretch without a grant and the time to the first
    /// grant. Exit 0 unless a waiter got a token not above its holder's
    /// (3). See docs/faults.md.
    #[cfg(feature = "lab")]
    Scorecard(fencelock_lab::scorecard::ScorecardArgs),

    /// Print a shell completion script for SHELL on stdout.
    ///
    /// E.g. `fencelock completions bash > ~/.local/share/bash-completion/completions/fencelock`,
    /// `fencelock completions zsh > ~/.zfunc/_fencelock` (with ~/.zfunc in
    /// fpath), `fencelock completions fish > ~/.config/fish/completions/fencelock.fish`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },

    /// Print the man page (roff) on stdout, e.g. `fencelock man > fencelock.1`
    /// or `fencelock man | man -l -`; `fencelock man COMMAND` prints
    /// fencelock-COMMAND(1), the page of one command.
    Man {
        /// A command whose page to print instead of fencelock(1).
        command: Option<String>,
    },

    /// One torture worker, started by `fencelock torture`.
    #[cfg(feature = "lab")]
    #[command(hide = true)]
    TortureWorker(fencelock_lab::torture::WorkerArgs),
}

/// The default store: a SQLite file in the per-user state directory.
pub fn default_sqlite_path() -> Option<PathBuf> {
    dirs::state_dir()
        .or_else(dirs::data_local_dir)
        .map(|dir| dir.join("fencelock").join("locks.db"))
}
