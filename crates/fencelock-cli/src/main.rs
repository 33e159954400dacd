//! `fencelock`: distributed locks with fencing tokens, from the shell.
//! See `fencelock --help` and the README for the commands and exit codes.

mod cli;
mod exit;
mod lab;
mod output;
mod run;
mod serve;

use std::{process::ExitCode, sync::Arc, time::Duration};

use clap::{error::ErrorKind, Parser};
use fencelock::{Backend, Error, FencingToken, LeaseId, LockClient, LockKey, LockRequest, Owner};
use serde_json::json;
use tokio::time::Instant;

use crate::{
    cli::{Cli, Command, LockArgs},
    output::{describe, human_duration, Output},
};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage_error(e)),
    };
    init_logging(cli.quiet);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // Two workers keep a command's footprint small on a big machine; tokio's
    // own TOKIO_WORKER_THREADS overrides that, e.g. for a replica given a
    // host of its own (docs/http.md, "Running it").
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        builder.worker_threads(2);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencelock: cannot start the async runtime: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let out = Output {
        json: cli.json,
        quiet: cli.quiet,
    };
    let code = runtime.block_on(async move {
        match dispatch(cli, out).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("fencelock: {e}");
                out.fail_with(&e);
                exit::code_for(&e)
            }
        }
    });
    // Every command awaits its own releases; this only bounds the wait for
    // blocking database threads still finishing a statement.
    runtime.shutdown_timeout(Duration::from_secs(2));
    ExitCode::from(code)
}

/// Help and version go to stdout with exit 0; every other parse error is
/// clap's whole message on stderr (what is wrong, which arguments are
/// missing, the closest subcommand to a typo, the usage) and exit 2 — but
/// `torture` or `bench` in a build without them is one line saying how to
/// get them.
///
/// With `--json` anywhere before a `--` (parsing failed, so the flag is
/// found by hand), a usage error is also one `{"error", "code":
/// "bad_request"}` object on stdout, as any other failure is.
fn usage_error(e: clap::Error) -> u8 {
    let json = std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    let out = Output { json, quiet: false };
    if let Some(hint) = lab::missing_command(&e) {
        eprintln!("{hint}");
        out.fail("bad_request", &hint, serde_json::Value::Null);
        return exit::USAGE;
    }
    let _ = e.print();
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => exit::OK,
        _ => {
            // clap's first line, e.g. "error: unexpected argument '--x' found".
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            let reason = first.strip_prefix("error: ").unwrap_or(first);
            out.fail("bad_request", reason, serde_json::Value::Null);
            exit::USAGE
        }
    }
}

/// Library warnings (failed renewals, failed releases) on stderr, each
/// stamped with the time in RFC 3339 UTC; `RUST_LOG` overrides the level.
fn init_logging(quiet: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::{filter::filter_fn, layer::SubscriberExt, util::SubscriberInitExt};
    let level = if quiet { "error" } else { "warn" };
    // The ZooKeeper driver warns on every failed session attempt, which it
    // retries itself; what matters reaches the user as the backend's error,
    // in one line (`RUST_LOG=zookeeper_client=warn` shows the attempts).
    let default = format!("{level},zookeeper_client=error");
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_timer(Rfc3339Utc)
        .with_target(false)
        .finish()
        .with(filter_fn(|meta| !announces_loss(meta)))
        .try_init();
}

/// The library's own "lock lost" warning: `run` reports a loss itself, in
/// one line that also says what it does about it, so the library's would
/// repeat it.
fn announces_loss(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_event() && meta.target() == fencelock::LOSS_LOG_TARGET
}

/// Log timestamps such as `2026-11-22T21:04:05.123Z`.
struct Rfc3339Utc;

impl tracing_subscriber::fmt::time::FormatTime for Rfc3339Utc {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let now = chrono::Utc::now();
        write!(
            w,
            "{}",
            now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )
    }
}

/// `--url`, or the per-user SQLite file.
fn resolve_url(url: Option<String>) -> Result<String, Error> {
    if let Some(url) = url {
        return Ok(url);
    }
    let path = cli::default_sqlite_path().ok_or_else(|| {
        Error::InvalidUrl(
            "no home or state directory to keep the default store in; pass --url".into(),
        )
    })?;
    // The SQLite backend creates the file's missing directories itself.
    Ok(format!("sqlite://{}", path.display()))
}

/// `url` for a command that only reads (`inspect`, `list`, `stats`,
/// `leader`): a SQLite store is opened with `create=false`, so that a
/// mistyped path (or a store never used) is an error, exit 69, instead of
/// a new empty database and "no locks held". The server backends are left
/// as they are: their schema (tables, ZooKeeper directories) lives in a
/// server someone provisioned, and creating it is what connecting does for
/// every command (README, CLI). A `create=` the user wrote is kept.
fn read_only(url: &str) -> String {
    let sqlite = url
        .get(..9)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("sqlite://"));
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let chosen = query
        .split('&')
        .any(|pair| pair.split('=').next() == Some("create"));
    if !sqlite || chosen {
        return url.to_owned();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}create=false")
}

/// `fencelock completions SHELL`.
fn print_completions(shell: clap_complete::Shell) -> u8 {
    use clap::CommandFactory;
    // Into memory first: the generator panics on a failed write (a reader
    // such as `head` that closed the pipe).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "fencelock", &mut script);
    print_all(&script, "completion script")
}

/// `fencelock man [COMMAND]`: the roff page, built from the same
/// definitions as `--help`.
fn print_man(command: Option<&str>) -> Result<u8, Error> {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    cli.build();
    let page_of = match command {
        None => cli,
        Some(name) => {
            let Some(sub) = cli.find_subcommand(name).filter(|c| !c.is_hide_set()) else {
                return Err(Error::InvalidArgument(format!(
                    "no command {name:?}; `fencelock --help` lists them"
                )));
            };
            // Built, so its display name is fencelock-acquire, as git's
            // pages are named, and its usage says `fencelock acquire`.
            sub.clone()
        }
    };
    let mut page = Vec::new();
    if let Err(e) = clap_mangen::Man::new(page_of).render(&mut page) {
        eprintln!("fencelock: cannot render the man page: {e}");
        return Ok(exit::UNAVAILABLE);
    }
    Ok(print_all(&page, "man page"))
}

/// Writes `bytes` to stdout. A reader that stopped reading (`| head`) is
/// not an error: it had what it wanted.
fn print_all(bytes: &[u8], what: &str) -> u8 {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => exit::OK,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::OK,
        Err(e) => {
            eprintln!("fencelock: cannot write the {what}: {e}");
            exit::UNAVAILABLE
        }
    }
}

/// When a command that waits stops waiting; `None` for `--wait forever`.
#[derive(Clone, Copy, Debug)]
struct Deadline(Option<Instant>);

impl Deadline {
    /// For commands that make one attempt.
    fn now() -> Self {
        Self(Some(Instant::now()))
    }

    /// `wait` from now.
    fn after(wait: Duration) -> Self {
        Self(Instant::now().checked_add(wait))
    }

    /// The wait left; `Duration::MAX` (forever, to the client) without a
    /// deadline.
    fn remaining(self) -> Duration {
        self.0.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        })
    }
}

/// Opens the backend, retrying failures the backend calls transient (no
/// answer, connection refused, too many connections) until `deadline`. Each
/// attempt is bounded by the backend's own connect timeout, so a command
/// ends within its `--wait` plus that timeout even if the server never
/// answers.
async fn open(url: &str, deadline: Deadline) -> Result<Arc<dyn Backend>, Error> {
    fencelock::open_backend_within(url, deadline.remaining()).await
}

async fn client(url: &str, owner: Option<&str>, deadline: Deadline) -> Result<LockClient, Error> {
    let backend = open(url, deadline).await?;
    let mut builder = LockClient::builder(backend);
    if let Some(owner) = owner {
        builder = builder.owner(Owner::new(owner)?);
    }
    builder.build()
}

/// The request `lock` describes, waiting until `deadline`.
fn request<'a>(client: &'a LockClient, lock: &LockArgs, deadline: Deadline) -> LockRequest<'a> {
    let mut request = client
        .lock(lock.key.as_str())
        .shared(lock.shared)
        .ttl(lock.ttl)
        .wait(deadline.remaining());
    if let Some(kind) = &lock.kind {
        request = request.kind(kind.as_str());
    }
    if let Some(data) = &lock.data {
        request = request.data(data.clone());
    }
    if let Some(delay) = lock.hold_at_least {
        request = request.hold_at_least(delay);
    }
    request
}

/// Acquires, reporting the holder while waiting; `Ok(None)` = not acquired
/// (already reported).
async fn acquire(
    client: &LockClient,
    lock: &LockArgs,
    deadline: Deadline,
    auto_renew: bool,
    out: Output,
) -> Result<Option<fencelock::LockGuard>, Error> {
    let reporter = (!lock.wait.is_zero() && !out.quiet)
        .then(|| tokio::spawn(run::report_holder(client.clone(), lock.key.clone(), out)));
    let result = request(client, lock, deadline)
        .auto_renew(auto_renew)
        .acquire()
        .await;
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    match result {
        Ok(guard) => {
            note_granted(&guard, lock, out);
            Ok(Some(guard))
        }
        Err(Error::Timeout { .. }) => {
            not_acquired(client, lock, &lock.key, out).await;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Says so when the backend granted other than --ttl: more (etcd rounds
/// up) or less (ZooKeeper's `layout=curator` grants at most half its
/// session timeout; the lock is renewed in step).
fn note_granted(guard: &fencelock::GuardHandle, lock: &LockArgs, out: Output) {
    let granted = guard.granted_ttl();
    let why = match granted.cmp(&lock.ttl) {
        std::cmp::Ordering::Greater => "its minimum",
        std::cmp::Ordering::Less => "its most; renewed in step",
        std::cmp::Ordering::Equal => return,
    };
    out.note(format_args!(
        "the backend granted {} for --ttl {} ({why})",
        human_duration(granted),
        human_duration(lock.ttl)
    ));
}

/// The user's --wait, including any time spent reaching the backend.
fn waited(lock: &LockArgs) -> String {
    if lock.wait.is_zero() {
        String::new()
    } else {
        format!(" within {}", human_duration(lock.wait))
    }
}

/// Reports who holds `key`, which kept the acquisition from succeeding
/// (with `--json`, also as a `held` error with the `holder`, as the REST
/// API's 409 has it).
async fn not_acquired(client: &LockClient, lock: &LockArgs, key: &str, out: Output) {
    let waited = waited(lock);
    let holder = client.inspect(key).await.ok().flatten();
    let reason = match &holder {
        Some(info) => format!("not acquired{waited}: {}", describe(info)),
        None => format!("not acquired{waited}: {key} was held"),
    };
    out.note(&reason);
    let extra = holder.map_or(serde_json::Value::Null, |h| json!({ "holder": h }));
    out.fail("held", &reason, extra);
}

/// `--permits` names one semaphore: refused beside more keys; `--shared`
/// names one read-write lock: refused beside either; a lock delay is
/// refused beside `--permits`.
fn check_permits(
    more_keys: &[String],
    permits: Option<u32>,
    shared: bool,
    hold_at_least: bool,
) -> Result<(), Error> {
    if permits.is_some() && !more_keys.is_empty() {
        return Err(Error::InvalidArgument(
            "--permits takes one semaphore name, not several keys".into(),
        ));
    }
    if hold_at_least && permits.is_some() {
        return Err(Error::InvalidArgument(
            "--hold-at-least applies to locks, not semaphore permits".into(),
        ));
    }
    if shared && (permits.is_some() || !more_keys.is_empty()) {
        return Err(Error::InvalidArgument(
            "--shared takes one read-write lock, not a semaphore or several keys".into(),
        ));
    }
    Ok(())
}

/// Takes a permit of the semaphore `lock.key`; `Ok(None)` = every permit
/// was held (already reported).
async fn take_permit(
    client: &LockClient,
    lock: &LockArgs,
    permits: u32,
    deadline: Deadline,
    out: Output,
) -> Result<Option<fencelock::Permit>, Error> {
    let mut request = client
        .semaphore(lock.key.as_str(), permits)
        .ttl(lock.ttl)
        .wait(deadline.remaining());
    if let Some(kind) = &lock.kind {
        request = request.kind(kind.as_str());
    }
    if let Some(data) = &lock.data {
        request = request.data(data.clone());
    }
    match request.acquire().await {
        Ok(permit) => {
            note_granted(&permit, lock, out);
            Ok(Some(permit))
        }
        Err(Error::Timeout { .. }) => {
            let reason = format!(
                "not acquired{}: all {permits} permits of {} were held",
                waited(lock),
                lock.key
            );
            out.note(&reason);
            out.fail("held", &reason, serde_json::Value::Null);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Takes KEY and every one of `more_keys`, or none; `Ok(None)` = some key
/// was held elsewhere until the deadline (already reported).
async fn take_all(
    client: &LockClient,
    lock: &LockArgs,
    more_keys: &[String],
    deadline: Deadline,
    out: Output,
) -> Result<Option<fencelock::MultiGuard>, Error> {
    let keys = std::iter::once(&lock.key).chain(more_keys).cloned();
    let mut request = client
        .lock_all(keys)
        .ttl(lock.ttl)
        .wait(deadline.remaining());
    if let Some(kind) = &lock.kind {
        request = request.kind(kind.as_str());
    }
    if let Some(data) = &lock.data {
        request = request.data(data.clone());
    }
    if let Some(delay) = lock.hold_at_least {
        request = request.hold_at_least(delay);
    }
    match request.acquire().await {
        Ok(all) => {
            if let Some(first) = all.guards().first() {
                note_granted(first, lock, out);
            }
            Ok(Some(all))
        }
        Err(Error::Timeout { key, .. }) => {
            not_acquired(client, lock, key.as_str(), out).await;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

async fn dispatch(cli: Cli, out: Output) -> Result<u8, Error> {
    // Torture never falls back to the default store.
    #[cfg(feature = "lab")]
    let command = match cli.command {
        Command::Torture(args) => {
            let verdict = fencelock_lab::torture::run(cli.url, args, lab::output(out)).await?;
            return Ok(exit::for_verdict(verdict));
        }
        Command::TortureWorker(args) => {
            let verdict = fencelock_lab::torture::run_worker(cli.url, args).await?;
            return Ok(exit::for_verdict(verdict));
        }
        // A lab starts its own servers: no store.
        Command::Bench(args) if args.topology.is_some() => {
            if cli.url.is_some() {
                return Err(Error::InvalidArgument(
                    "bench --topology starts its own servers: --url (or FENCELOCK_URL) does not apply".into(),
                ));
            }
            let verdict = fencelock_lab::bench::run_in_lab(args, lab::output(out)).await?;
            return Ok(exit::for_verdict(verdict));
        }
        // It starts the servers it scores: no store.
        Command::Scorecard(args) => {
            let verdict = fencelock_lab::scorecard::run(args, lab::output(out)).await?;
            return Ok(exit::for_verdict(verdict));
        }
        command => command,
    };
    #[cfg(not(feature = "lab"))]
    let command = cli.command;
    // Neither needs a store, nor may fail for want of one.
    match command {
        Command::Completions { shell } => return Ok(print_completions(shell)),
        Command::Man { command } => return print_man(command.as_deref()),
        _ => {}
    }
    let url = resolve_url(cli.url)?;
    match command {
        Command::Run {
            lock,
            more_keys,
            permits,
            kill_after,
            foreground,
            command,
        } => {
            check_permits(
                &more_keys,
                permits,
                lock.shared,
                lock.hold_at_least.is_some(),
            )?;
            // --wait covers reaching the backend as well as the lock.
            let deadline = Deadline::after(lock.wait);
            let client = client(&url, lock.owner.as_deref(), deadline).await?;
            let held = match permits {
                Some(n) => take_permit(&client, &lock, n, deadline, out)
                    .await?
                    .map(|permit| run::Held::One(permit.into_guard())),
                None if more_keys.is_empty() => acquire(&client, &lock, deadline, true, out)
                    .await?
                    .map(run::Held::One),
                None => take_all(&client, &lock, &more_keys, deadline, out)
                    .await?
                    .map(run::Held::All),
            };
            match held {
                Some(held) => run::run_child(held, &command, kill_after, foreground, out).await,
                None => Ok(exit::NOT_ACQUIRED),
            }
        }
        Command::Acquire { lock, permits } => {
            check_permits(&[], permits, lock.shared, lock.hold_at_least.is_some())?;
            let deadline = Deadline::after(lock.wait);
            let client = client(&url, lock.owner.as_deref(), deadline).await?;
            // The lease would go with this process's session as it exits,
            // leaving a printed token that nothing holds.
            if client.backend().capabilities().session_bound {
                return Err(Error::Unsupported(
                    "acquire: this backend's leases end with the process that took them \
                     (ZooKeeper layout=curator); hold the lock with `fencelock run` instead"
                        .into(),
                ));
            }
            let (guard, permit) = match permits {
                Some(n) => match take_permit(&client, &lock, n, deadline, out).await? {
                    Some(permit) => {
                        let slot = permit.slot();
                        (permit.into_guard(), Some((slot, n)))
                    }
                    None => return Ok(exit::NOT_ACQUIRED),
                },
                None => match acquire(&client, &lock, deadline, false, out).await? {
                    Some(guard) => (guard, None),
                    None => return Ok(exit::NOT_ACQUIRED),
                },
            };
            let granted = guard.granted_ttl();
            let mut shown = json!({
                "key": guard.key(), "owner": guard.owner(), "token": guard.token(),
                "expires_at": guard.expires_at(), "ttl_ms": millis(granted),
                "mode": guard.mode(),
            });
            if let Some((slot, n)) = permit {
                shown["semaphore"] = json!(lock.key);
                shown["permit"] = json!(slot);
                shown["permits"] = json!(n);
            }
            if out.json {
                println!("{shown}");
            } else {
                // Even with --quiet: it is the result, and `renew` and
                // `release` need both the owner and the token. One line of
                // name=value fields that scripts can pick apart.
                let mut permit = permit
                    .map(|(slot, n)| format!(" permit={slot}/{n}"))
                    .unwrap_or_default();
                if lock.shared {
                    permit.push_str(" mode=shared");
                }
                println!(
                    "acquired {} token={} owner={} expires_in={}{permit}",
                    guard.key(),
                    guard.token(),
                    guard.owner(),
                    human_duration(granted)
                );
            }
            guard.detach();
            Ok(exit::OK)
        }
        Command::Renew {
            key,
            owner,
            token,
            ttl,
            shared,
        } => {
            let lease = lease_id(&key, &owner, &token)?.with_mode(mode_of(shared));
            let backend = open(&url, Deadline::now()).await?;
            match backend.renew(&lease, ttl).await {
                Ok(grant) => {
                    let LeaseId {
                        key, owner, token, ..
                    } = &lease;
                    out.emit(
                        &json!({
                            "key": key, "owner": owner, "token": token,
                            "expires_at": grant.expires_at, "ttl_ms": millis(grant.ttl),
                        }),
                        || {
                            format!(
                                "renewed {key} (token {token}) for {}",
                                human_duration(grant.ttl)
                            )
                        },
                    );
                    Ok(exit::OK)
                }
                Err(Error::NotHeld { .. }) => not_held(&lease, out),
                Err(e) => Err(e),
            }
        }
        Command::Release {
            key,
            owner,
            token,
            shared,
        } => {
            let lease = lease_id(&key, &owner, &token)?.with_mode(mode_of(shared));
            let backend = open(&url, Deadline::now()).await?;
            match backend.release(&lease).await {
                Ok(()) => {
                    out.emit(&json!({"key": lease.key, "released": true}), || {
                        format!("released {}", lease.key)
                    });
                    Ok(exit::OK)
                }
                Err(Error::NotHeld { .. }) => not_held(&lease, out),
                Err(e) => Err(e),
            }
        }
        Command::Inspect { key } => {
            let client = client(&read_only(&url), None, Deadline::now()).await?;
            match client.inspect(&key).await? {
                Some(info) if info.mode == fencelock::LockMode::Shared => {
                    // Every reader, not only the one inspect reports.
                    let holders = client.holders(&key).await?;
                    let mut shown = json!(info);
                    shown["holders"] = json!(holders);
                    out.emit(&shown, || {
                        holders.iter().map(describe).collect::<Vec<_>>().join("\n")
                    });
                    Ok(exit::OK)
                }
                Some(info) => {
                    out.emit(&info, || describe(&info));
                    Ok(exit::OK)
                }
                None => {
                    out.emit(&serde_json::Value::Null, || format!("{key} is free"));
                    Ok(exit::NOT_HELD)
                }
            }
        }
        Command::List {
            prefix,
            limit,
            after,
        } => {
            let client = client(&read_only(&url), None, Deadline::now()).await?;
            let mut leases = client.list(prefix.as_deref()).await?;
            let Some(limit) = limit else {
                out.emit(&leases, || output::table(&leases));
                return Ok(exit::OK);
            };
            if limit == 0 {
                return Err(Error::InvalidArgument("--limit must be at least 1".into()));
            }
            // A page of the listing, as `GET /v1/locks?limit=&after=` gives
            // one (docs/http.md).
            leases.sort_by(|a, b| a.key.cmp(&b.key));
            let (leases, next) =
                fencelock::page_by_key(leases, |l| l.key.as_str(), after.as_deref(), limit);
            out.emit(&json!({"locks": leases, "next": next}), || {
                let mut text = output::table(&leases);
                if let Some(next) = &next {
                    text.push_str(&format!("\nmore: --after {next}"));
                }
                text
            });
            Ok(exit::OK)
        }
        Command::Stats => {
            let stats = client(&read_only(&url), None, Deadline::now())
                .await?
                .stats()
                .await?;
            out.emit(&stats, || output::stats(&stats));
            Ok(exit::OK)
        }
        Command::Cleanup => {
            let removed = client(&url, None, Deadline::now()).await?.cleanup().await?;
            out.emit(&json!({"removed": removed}), || {
                format!("removed {removed} expired lease record(s)")
            });
            Ok(exit::OK)
        }
        #[cfg(feature = "lab")]
        Command::Bench(args) => {
            let verdict = fencelock_lab::bench::run(&url, args, lab::output(out)).await?;
            Ok(exit::for_verdict(verdict))
        }
        Command::ForceRelease { key } => {
            let client = client(&url, None, Deadline::now()).await?;
            match client.force_release(&key).await? {
                Some(info) => {
                    out.emit(&info, || {
                        format!(
                            "force-released {key} (was held by {}, token {})",
                            info.owner, info.token
                        )
                    });
                    Ok(exit::OK)
                }
                None => {
                    out.emit(&serde_json::Value::Null, || format!("{key} was not held"));
                    Ok(exit::NOT_HELD)
                }
            }
        }
        Command::Elect {
            name,
            ttl,
            value,
            wait,
            owner,
            kill_after,
            foreground,
            command,
        } => {
            let deadline = Deadline::after(wait);
            let client = client(&url, owner.as_deref(), deadline).await?;
            let mut election = client.election(name.as_str()).ttl(ttl);
            if let Some(value) = value {
                election = election.value(value);
            }
            match election.campaign_for(deadline.remaining()).await {
                Ok(leadership) => {
                    let guard = leadership.into_guard();
                    run::run_child(run::Held::One(guard), &command, kill_after, foreground, out)
                        .await
                }
                Err(Error::Timeout { .. }) => {
                    let leader = election.leader().await.ok().flatten();
                    let reason = match &leader {
                        Some(l) => format!(
                            "not elected within {}: {name} is led by {} (term {})",
                            human_duration(wait),
                            l.owner,
                            l.term
                        ),
                        None => format!("not elected within {}", human_duration(wait)),
                    };
                    out.note(&reason);
                    let extra = leader.map_or(serde_json::Value::Null, |l| json!({ "leader": l }));
                    out.fail("held", &reason, extra);
                    Ok(exit::NOT_ACQUIRED)
                }
                Err(e) => Err(e),
            }
        }
        Command::Leader { name, watch } => {
            let client = client(&read_only(&url), None, Deadline::now()).await?;
            let election = client.election(name.as_str());
            if watch {
                let mut changes = election.observe().await?;
                while let Some(change) = changes.next().await {
                    output::leader_change(out, &name, &change?);
                }
                return Ok(exit::UNAVAILABLE);
            }
            match election.leader().await? {
                Some(leader) => {
                    out.emit(&leader, || output::leader(&name, &leader));
                    Ok(exit::OK)
                }
                None => {
                    out.emit(&serde_json::Value::Null, || format!("{name} has no leader"));
                    Ok(exit::NOT_HELD)
                }
            }
        }
        Command::Serve(args) => serve::run(&url, args, out).await,
        Command::Completions { .. } | Command::Man { .. } => unreachable!("dispatched above"),
        #[cfg(feature = "lab")]
        Command::Torture(_) | Command::TortureWorker(_) | Command::Scorecard(_) => {
            unreachable!("dispatched above")
        }
    }
}

/// A duration in whole milliseconds, for JSON.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The side of a key `--shared` names.
fn mode_of(shared: bool) -> fencelock::LockMode {
    if shared {
        fencelock::LockMode::Shared
    } else {
        fencelock::LockMode::Exclusive
    }
}

fn lease_id(key: &str, owner: &str, token: &str) -> Result<LeaseId, Error> {
    Ok(LeaseId::new(
        LockKey::new(key)?,
        Owner::new(owner)?,
        token.parse::<FencingToken>()?,
    ))
}

fn not_held(lease: &LeaseId, out: Output) -> Result<u8, Error> {
    let reason = format!(
        "{} is not held by {} with token {} (it expired, was released, or was taken over)",
        lease.key, lease.owner, lease.token
    );
    eprintln!("fencelock: {reason}");
    out.fail("not_held", &reason, serde_json::Value::Null);
    Ok(exit::NOT_HELD)
}
