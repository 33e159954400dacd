//! `fencelock`: distributed locks with fencing tokens, from the shell.
//! See `fencelock --help` and the README for the commands and exit codes.

mod bench;
mod cli;
mod exit;
mod output;
mod run;
mod torture;

use std::{process::ExitCode, time::Duration};

use clap::{error::ErrorKind, Parser};
use fencelock::{Error, FencingToken, LockClient, LockKey, LockRequest, Owner};
use serde_json::json;

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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
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
                exit::code_for(&e)
            }
        }
    });
    // Every command awaits its own releases; this only bounds the wait for
    // blocking database threads still finishing a statement.
    runtime.shutdown_timeout(Duration::from_secs(2));
    ExitCode::from(code)
}

/// Help and version go to stdout with exit 0; every other parse error is one
/// line on stderr and exit 2.
fn usage_error(e: clap::Error) -> u8 {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            exit::OK
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            exit::USAGE
        }
        _ => {
            let text = e.render().to_string();
            let line = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments");
            eprintln!("fencelock: {line}");
            exit::USAGE
        }
    }
}

/// Library warnings (failed renewals, lost locks) on stderr; `RUST_LOG`
/// overrides the level.
fn init_logging(quiet: bool) {
    let default = if quiet { "error" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .with_target(false)
        .try_init();
}

/// `--url`, or the per-user SQLite file (its directory created if missing).
fn resolve_url(url: Option<String>) -> Result<String, Error> {
    if let Some(url) = url {
        return Ok(url);
    }
    let path = cli::default_sqlite_path().ok_or_else(|| {
        Error::InvalidUrl(
            "no home or state directory to keep the default store in; pass --url".into(),
        )
    })?;
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::InvalidUrl(format!("cannot create {}: {e}", dir.display())))?;
    }
    Ok(format!("sqlite://{}", path.display()))
}

async fn client(url: &str, owner: Option<&str>) -> Result<LockClient, Error> {
    let backend = fencelock::open_backend(url).await?;
    let mut builder = LockClient::builder(backend);
    if let Some(owner) = owner {
        builder = builder.owner(Owner::new(owner)?);
    }
    builder.build()
}

fn request<'a>(client: &'a LockClient, lock: &LockArgs) -> LockRequest<'a> {
    let mut request = client.lock(lock.key.as_str()).ttl(lock.ttl).wait(lock.wait);
    if let Some(kind) = &lock.kind {
        request = request.kind(kind.as_str());
    }
    if let Some(data) = &lock.data {
        request = request.data(data.clone());
    }
    request
}

/// Acquires, reporting the holder while waiting; `Ok(None)` = not acquired
/// (already reported).
async fn acquire(
    client: &LockClient,
    lock: &LockArgs,
    auto_renew: bool,
    out: Output,
) -> Result<Option<fencelock::LockGuard>, Error> {
    let reporter = (!lock.wait.is_zero() && !out.quiet)
        .then(|| tokio::spawn(run::report_holder(client.clone(), lock.key.clone(), out)));
    let result = request(client, lock).auto_renew(auto_renew).acquire().await;
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    match result {
        Ok(guard) => Ok(Some(guard)),
        Err(Error::Timeout { waited, .. }) => {
            let holder = client.inspect(&lock.key).await.ok().flatten();
            let waited = if waited.is_zero() {
                String::new()
            } else {
                format!(" within {}", human_duration(waited))
            };
            match holder {
                Some(info) => out.note(format_args!("not acquired{waited}: {}", describe(&info))),
                None => out.note(format_args!("not acquired{waited}: {} was held", lock.key)),
            }
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

async fn dispatch(cli: Cli, out: Output) -> Result<u8, Error> {
    // Torture never falls back to the default store.
    let command = match cli.command {
        Command::Torture(args) => return torture::run(cli.url, args, out).await,
        Command::TortureWorker(args) => return torture::run_worker(cli.url, args).await,
        command => command,
    };
    let url = resolve_url(cli.url)?;
    match command {
        Command::Run {
            lock,
            kill_after,
            foreground,
            command,
        } => {
            let client = client(&url, lock.owner.as_deref()).await?;
            match acquire(&client, &lock, true, out).await? {
                Some(guard) => run::run_child(guard, &command, kill_after, foreground, out).await,
                None => Ok(exit::NOT_ACQUIRED),
            }
        }
        Command::Acquire { lock } => {
            let client = client(&url, lock.owner.as_deref()).await?;
            let Some(guard) = acquire(&client, &lock, false, out).await? else {
                return Ok(exit::NOT_ACQUIRED);
            };
            let shown = json!({
                "key": guard.key(), "owner": guard.owner(), "token": guard.token(),
                "expires_at": guard.expires_at(),
            });
            if out.json {
                println!("{shown}");
            } else {
                // The bare token, so that `T=$(fencelock acquire k)` works.
                println!("{}", guard.token());
            }
            guard.detach();
            Ok(exit::OK)
        }
        Command::Renew {
            key,
            owner,
            token,
            ttl,
        } => {
            let (key, owner, token) = lease_id(&key, &owner, &token)?;
            let backend = fencelock::open_backend(&url).await?;
            match backend.renew(&key, &owner, token, ttl).await {
                Ok(grant) => {
                    out.emit(
                        &json!({"key": key, "owner": owner, "token": token, "expires_at": grant.expires_at}),
                        || format!("renewed {key} (token {token}) for {}", human_duration(grant.ttl)),
                    );
                    Ok(exit::OK)
                }
                Err(Error::NotHeld { .. }) => not_held(&key, &owner, token),
                Err(e) => Err(e),
            }
        }
        Command::Release { key, owner, token } => {
            let (key, owner, token) = lease_id(&key, &owner, &token)?;
            let backend = fencelock::open_backend(&url).await?;
            if backend.release(&key, &owner, token).await? {
                out.emit(&json!({"key": key, "released": true}), || {
                    format!("released {key}")
                });
                Ok(exit::OK)
            } else {
                not_held(&key, &owner, token)
            }
        }
        Command::Inspect { key } => {
            let client = client(&url, None).await?;
            match client.inspect(&key).await? {
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
        Command::List { prefix } => {
            let client = client(&url, None).await?;
            let leases = client.list(prefix.as_deref()).await?;
            out.emit(&leases, || output::table(&leases));
            Ok(exit::OK)
        }
        Command::Stats => {
            let stats = client(&url, None).await?.stats().await?;
            out.emit(&stats, || output::stats(&stats));
            Ok(exit::OK)
        }
        Command::Cleanup => {
            let removed = client(&url, None).await?.cleanup().await?;
            out.emit(&json!({"removed": removed}), || {
                format!("removed {removed} expired lease record(s)")
            });
            Ok(exit::OK)
        }
        Command::Bench(args) => bench::run(&url, args, out).await,
        Command::ForceRelease { key } => {
            let client = client(&url, None).await?;
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
        Command::Torture(_) | Command::TortureWorker(_) => unreachable!("dispatched above"),
    }
}

fn lease_id(key: &str, owner: &str, token: &str) -> Result<(LockKey, Owner, FencingToken), Error> {
    Ok((LockKey::new(key)?, Owner::new(owner)?, token.parse()?))
}

fn not_held(key: &LockKey, owner: &Owner, token: FencingToken) -> Result<u8, Error> {
    eprintln!(
        "fencelock: {key} is not held by {owner} with token {token} \
         (it expired, was released, or was taken over)"
    );
    Ok(exit::NOT_HELD)
}
