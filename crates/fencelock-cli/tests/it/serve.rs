//! `fencelock serve` and the CLI through it: `--url http://…` runs commands
//! under locks the service grants, tokens are required and never echoed,
//! and SIGTERM shuts the service down cleanly.
//!
//! Time: real processes. A lease that must outlast the test's later
//! commands (a restart of the service included) gets a TTL scaled from
//! [`LEASE`], and the wait for a `serve` to refuse is scaled from 20 s, by
//! a [`Patience`](fencelock_testkit::Patience) measured first; a failure
//! names the budget.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use crate::support;

use std::{process::Command, time::Duration};

use fencelock_testkit::Patience;
use support::{code, ms, patience, stderr, stdout, LockService, BIN};

/// The base of a lease that must outlast the test's later commands.
const LEASE: Duration = Duration::from_secs(60);

const ADMIN: &str = "admin-secret-0123456789";
const CLIENT: &str = "client-secret-0123456789";

/// The binary with `--url URL` and no other configuration.
fn through(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .env_remove("FENCELOCK_URL")
        .env_remove("FENCELOCK_HTTP_TOKEN")
        .env_remove("RUST_LOG")
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .unwrap()
}

fn with_token(url: &str, token: &str) -> String {
    url.replacen("http://", &format!("http://:{token}@"), 1)
}

#[test]
fn the_cli_runs_commands_under_locks_of_the_service() {
    let tokens = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tokens.path(), format!("admin {ADMIN}\nclient {CLIENT}\n")).unwrap();
    let service = LockService::start(&["--token-file", tokens.path().to_str().unwrap()]);
    let url = with_token(&service.url, CLIENT);

    let out = through(
        &url,
        &[
            "run",
            "job:1",
            "--",
            "sh",
            "-c",
            "echo $FENCELOCK_KEY $FENCELOCK_TOKEN",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let line = stdout(&out);
    assert!(line.starts_with("job:1 "), "{line}");
    let first: u64 = line["job:1 ".len()..].parse().unwrap();

    // A lock held through the service is held for everyone.
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    let held = through(&url, &["acquire", "job:1", "--owner", "w1", "--ttl", &ttl]);
    assert_eq!(code(&held), 0, "{}", stderr(&held));
    let blocked = through(&url, &["run", "job:1", "--", "true"]);
    assert_eq!(code(&blocked), 75, "{} [{p}]", stderr(&blocked));
    let inspect = through(&url, &["--json", "inspect", "job:1"]);
    let info: serde_json::Value = serde_json::from_str(&stdout(&inspect)).unwrap();
    assert_eq!(info["owner"], "w1");
    assert!(info["token"].as_u64().unwrap() > first);

    // Force-release needs the admin token.
    let refused = through(&url, &["force-release", "job:1"]);
    assert_ne!(code(&refused), 0);
    assert!(stderr(&refused).contains("admin"), "{}", stderr(&refused));
    let admin = with_token(&service.url, ADMIN);
    let removed = through(&admin, &["force-release", "job:1"]);
    assert_eq!(code(&removed), 0, "{} [{p}]", stderr(&removed));

    // A wrong token is refused, and no token is ever printed.
    let wrong = with_token(&service.url, "wrong-secret-0123456789");
    let out = through(&wrong, &["list"]);
    assert_ne!(code(&out), 0);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(text.contains("401"), "{text}");
    assert!(!text.contains("wrong-secret"), "{text}");
}

#[test]
fn sigterm_shuts_the_service_down_cleanly() {
    let mut service = LockService::start(&[]);
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    let out = through(&service.url, &["acquire", "k", "--ttl", &ttl]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(service.child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = service.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    // The leases live in the backend, not in the service.
    let again = LockService::start_on(&service.store, &[]);
    let out = through(&again.url, &["--json", "inspect", "k"]);
    assert_eq!(code(&out), 0, "{} [{p}]", stderr(&out));
}

#[test]
fn bad_token_files_are_usage_errors_that_hide_tokens() {
    let tokens = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tokens.path(), "admin short-secret\n").unwrap();
    let store = support::Store::new();
    let out = store.run(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        tokens.path().to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("line 1"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("short-secret"), "{}", stderr(&out));
}

/// `serve` over `mem://` is refused (exit 2, saying why) unless told
/// `--ephemeral`: a restarted service would grant held keys again with
/// tokens from 1. `--listen` takes a host name.
#[test]
fn serving_a_backend_that_forgets_needs_ephemeral() {
    let refused = through("mem://", &["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(code(&refused), 2, "{}", stderr(&refused));
    let why = stderr(&refused);
    assert!(
        why.contains("--ephemeral") && why.contains("tokens"),
        "{why}"
    );

    // A host name is resolved, as a newcomer would write it.
    let line = first_line(
        Command::new(BIN)
            .env_remove("FENCELOCK_URL")
            .args(["--url", "mem://", "serve", "--ephemeral"])
            .args(["--listen", "localhost:0"]),
    );
    assert!(
        line.starts_with("listening on http://127.0.0.1:")
            || line.starts_with("listening on http://[::1]:"),
        "{line}"
    );
}

/// Starts `command`, reads the first line it prints on stdout (`serve`'s
/// `listening on URL`), and stops it.
fn first_line(command: &mut Command) -> String {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    line
}

/// `serve --config FILE` takes the flags' options from TOML; a flag given
/// as well wins; an unknown key is a usage error that names it.
#[test]
fn serve_reads_its_options_from_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:1\"\nephemeral = true\nevents_interval = \"250ms\"\n",
    )
    .unwrap();
    let line = first_line(
        Command::new(BIN)
            .env_remove("FENCELOCK_URL")
            .args(["--url", "mem://", "serve", "--config"])
            .arg(&config)
            // The flag wins over the file's port 1.
            .args(["--listen", "127.0.0.1:0"]),
    );
    assert!(line.starts_with("listening on http://127.0.0.1:"), "{line}");
    assert!(!line.trim_end().ends_with(":1"), "{line}");

    std::fs::write(&config, "listen = \"127.0.0.1:0\"\nlisten_on = 1\n").unwrap();
    let refused = Command::new(BIN)
        .env_remove("FENCELOCK_URL")
        .args(["--url", "mem://", "serve", "--ephemeral", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(code(&refused), 2, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("listen_on"),
        "{}",
        stderr(&refused)
    );

    // A client with no turn at all could never reach the backend.
    let refused = Command::new(BIN)
        .env_remove("FENCELOCK_URL")
        .args([
            "--url",
            "mem://",
            "serve",
            "--ephemeral",
            "--client-concurrency",
            "0",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&refused), 2, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("client-concurrency"),
        "{}",
        stderr(&refused)
    );
}

/// Safe defaults (docs/http.md, "Threat model"): an address other than
/// loopback without a token file is refused unless told
/// `--allow-anonymous`, and so is a token file others may read; both exit 2
/// saying why, without printing a token.
#[test]
fn serve_refuses_a_public_address_without_tokens_and_a_readable_token_file() {
    use std::os::unix::fs::PermissionsExt;
    let p = patience();
    let public = refusal(
        Command::new(BIN).env_remove("FENCELOCK_URL").args([
            "--url",
            "mem://",
            "serve",
            "--ephemeral",
            "--listen",
            "0.0.0.0:0",
        ]),
        &p,
    );
    assert_eq!(code(&public), 2, "{}", stderr(&public));
    let why = stderr(&public);
    assert!(
        why.contains("--token-file") && why.contains("--allow-anonymous"),
        "{why}"
    );
    let line = first_line(
        Command::new(BIN)
            .env_remove("FENCELOCK_URL")
            .args([
                "--url",
                "mem://",
                "serve",
                "--ephemeral",
                "--allow-anonymous",
            ])
            .args(["--listen", "0.0.0.0:0"]),
    );
    assert!(line.starts_with("listening on http://0.0.0.0:"), "{line}");

    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("admin {ADMIN}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o644)).unwrap();
    let readable = refusal(
        Command::new(BIN)
            .env_remove("FENCELOCK_URL")
            .args([
                "--url",
                "mem://",
                "serve",
                "--ephemeral",
                "--listen",
                "127.0.0.1:0",
            ])
            .arg("--token-file")
            .arg(&tokens),
        &p,
    );
    assert_eq!(code(&readable), 2, "{}", stderr(&readable));
    let why = stderr(&readable);
    assert!(why.contains("0644") && why.contains("chmod 600"), "{why}");
    assert!(!why.contains(ADMIN), "{why}");
    // Its owner's alone, it serves, on any address.
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let line = first_line(
        Command::new(BIN)
            .env_remove("FENCELOCK_URL")
            .args([
                "--url",
                "mem://",
                "serve",
                "--ephemeral",
                "--listen",
                "0.0.0.0:0",
            ])
            .arg("--token-file")
            .arg(&tokens),
    );
    assert!(line.starts_with("listening on http://0.0.0.0:"), "{line}");
}

/// Runs a `serve` that must refuse to start: its output once it exited, or
/// a failure if it still runs after `p.bound(20 s)` (it served instead).
fn refusal(command: &mut Command, p: &Patience) -> std::process::Output {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + p.bound(Duration::from_secs(20));
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("served instead of refusing [{p}]: {}", stdout(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `list --limit N [--after KEY]` pages the listing as `GET /v1/locks`
/// does: every lock once, in key order, and `next` null on the last page.
#[test]
fn list_comes_in_pages() {
    let service = LockService::start(&[]);
    // Every lock is still held when the last page is read.
    let p = patience();
    let ttl = ms(p.ttl(LEASE));
    for i in 0..5 {
        let out = through(
            &service.url,
            &["acquire", &format!("page:{i}"), "--ttl", &ttl],
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["--json", "list", "page:", "--limit", "2"];
        if let Some(key) = &after {
            args.extend(["--after", key.as_str()]);
        }
        let out = through(&service.url, &args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let page: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        let locks = page["locks"].as_array().unwrap();
        assert!(locks.len() <= 2, "{page}");
        seen.extend(locks.iter().map(|l| l["key"].as_str().unwrap().to_owned()));
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(
        seen,
        ["page:0", "page:1", "page:2", "page:3", "page:4"],
        "[{p}]"
    );
}
