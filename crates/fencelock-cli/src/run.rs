//! `fencelock run`: hold a lock while a command runs; stop the command when
//! the lock is lost.

use std::{future::Future, io::IsTerminal, pin::Pin, process::ExitStatus, time::Duration};

use fencelock::{Error, FencingToken, LockClient, LockGuard, LockKey, LossReason, MultiGuard};
use nix::{
    sys::{
        signal::{kill, pthread_sigmask, SigSet, SigmaskHow, Signal},
        wait::{waitid, Id, WaitPidFlag, WaitStatus},
    },
    unistd::{getpgrp, tcgetpgrp, tcsetpgrp, Pid},
};
use tokio::{
    process::{Child, Command},
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};

use crate::{
    exit,
    output::{describe, Output},
};

/// Where signals for the command go: its own process group (so they reach
/// whatever it started, e.g. the children of `sh -c`), or just its pid.
#[derive(Clone, Copy)]
struct Target {
    pid: Pid,
    group: bool,
}

impl Target {
    fn send(self, sig: Signal) {
        let pid = if self.group {
            Pid::from_raw(-self.pid.as_raw())
        } else {
            self.pid
        };
        // ESRCH: everything already exited, which is what we wanted.
        let _ = kill(pid, sig);
    }
}

/// The terminal on stdin, lent to the command's process group while it runs.
///
/// A command in a process group of its own is in the background of the
/// terminal: its first read of it stops it with SIGTTIN, and Ctrl-C does not
/// reach it. When fencelock itself is the terminal's foreground group (not
/// when it was started with `&`), the command's group takes its place until
/// the command ends; dropping this hands the terminal back.
struct Terminal {
    ours: Pid,
}

impl Terminal {
    /// `Some` when stdin is a terminal whose foreground group is fencelock's.
    fn claim() -> Option<Self> {
        let stdin = std::io::stdin();
        let ours = getpgrp();
        (stdin.is_terminal() && tcgetpgrp(&stdin).ok()? == ours).then_some(Self { ours })
    }

    /// Makes `group` the foreground group. A command that read the terminal
    /// before this was already stopped by SIGTTIN: SIGCONT resumes it, as a
    /// shell's `fg` does.
    fn lend(&self, group: Pid) {
        set_foreground(group);
        let _ = kill(Pid::from_raw(-group.as_raw()), Signal::SIGCONT);
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        set_foreground(self.ours);
    }
}

/// `tcsetpgrp` on stdin. From a background group it raises SIGTTOU, which
/// would stop fencelock, unless the calling thread blocks it (tcsetpgrp(3)).
fn set_foreground(group: Pid) {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut before = SigSet::empty();
    if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut before)).is_err() {
        return;
    }
    if let Err(e) = tcsetpgrp(std::io::stdin(), group) {
        tracing::debug!(error = %e, "cannot set the terminal's foreground group");
    }
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
}

/// The signal that stopped `pid`, if it is stopped now. `WNOWAIT` leaves the
/// state for the child's own waiter.
fn stopped_by(pid: Pid) -> Option<Signal> {
    let flags = WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(pid), flags) {
        Ok(WaitStatus::Stopped(_, sig)) => Some(sig),
        _ => None,
    }
}

fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}

/// A loss of any lease of a [`Held`]: its key, token and reason.
type Lost = Pin<Box<dyn Future<Output = (LockKey, FencingToken, LossReason)> + Send>>;

/// What the command runs under: one lease (a lock or a semaphore permit)
/// or all of several keys.
pub enum Held {
    /// A lock, or a permit's guard.
    One(LockGuard),
    /// Every key of `fencelock run K1 K2 …`.
    All(MultiGuard),
}

impl Held {
    /// Every lease held, sorted by key.
    fn guards(&self) -> &[LockGuard] {
        match self {
            Held::One(guard) => std::slice::from_ref(guard),
            Held::All(all) => all.guards(),
        }
    }

    /// The environment the command gets: the first key's lease under the
    /// single-key names, and every key and token one a line (keys cannot
    /// contain newlines) under the plural ones.
    fn env(&self) -> Vec<(&'static str, String)> {
        let guards = self.guards();
        let lines =
            |f: fn(&LockGuard) -> String| guards.iter().map(f).collect::<Vec<_>>().join("\n");
        let mut env = vec![
            ("FENCELOCK_KEYS", lines(|g| g.key().to_string())),
            ("FENCELOCK_TOKENS", lines(|g| g.token().to_string())),
        ];
        if let Some(first) = guards.first() {
            env.push(("FENCELOCK_KEY", first.key().to_string()));
            env.push(("FENCELOCK_OWNER", first.owner().to_string()));
            env.push(("FENCELOCK_TOKEN", first.token().to_string()));
        }
        env
    }

    /// Completes when any lease is lost: which, and why.
    fn lost(&self) -> Lost {
        match self {
            Held::One(guard) => {
                let (key, token, lost) = (guard.key().clone(), guard.token(), guard.lost());
                Box::pin(async move { (key, token, lost.await) })
            }
            Held::All(all) => {
                let tokens = all.tokens();
                let lost = all.lost();
                Box::pin(async move {
                    let (key, reason) = lost.await;
                    let token = tokens
                        .iter()
                        .find(|(k, _)| *k == key)
                        .map_or(FencingToken(0), |(_, t)| *t);
                    (key, token, reason)
                })
            }
        }
    }

    /// The first lease already lost, if any.
    fn loss(&self) -> Option<(LockKey, FencingToken, LossReason)> {
        self.guards()
            .iter()
            .find_map(|g| g.loss_reason().map(|r| (g.key().clone(), g.token(), r)))
    }

    async fn release(self) -> Result<(), Error> {
        match self {
            Held::One(guard) => guard.release().await,
            Held::All(all) => all.release().await,
        }
    }
}

/// Runs `argv` under `held`; returns fencelock's exit code.
pub async fn run_child(
    held: Held,
    argv: &[String],
    kill_after: Duration,
    foreground: bool,
    out: Output,
) -> Result<u8, Error> {
    let Some((program, args)) = argv.split_first() else {
        return Err(Error::InvalidArgument("no command given".into()));
    };
    // Register handlers before the child exists, so no signal slips through
    // between its start and our first poll.
    let mut signals = forward_signals(foreground)?;
    let mut child_changed = signal(SignalKind::child())
        .map_err(|e| Error::Unsupported(format!("cannot install signal handlers: {e}")))?;
    let terminal = if foreground { None } else { Terminal::claim() };

    let mut command = Command::new(program);
    command.args(args).envs(held.env());
    if !foreground {
        command.process_group(0);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let reason = format!("cannot run {program:?}: {e}");
            eprintln!("fencelock: {reason}");
            out.fail("bad_request", &reason, serde_json::Value::Null);
            release(held, out).await;
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                exit::CANNOT_EXEC
            });
        }
    };
    let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) else {
        // The child exited and was reaped already; only its status is left.
        let status = child.wait().await.map_err(child_error)?;
        release(held, out).await;
        return Ok(status_code(status));
    };
    let target = Target {
        pid: Pid::from_raw(pid),
        group: !foreground,
    };
    if let Some(terminal) = &terminal {
        terminal.lend(target.pid);
    }
    let mut lost = held.lost();
    let mut stopped = false;
    loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                let status = status.map_err(child_error)?;
                // Lost at about the moment the command ended: whatever it
                // did last may have been done without the lock.
                if let Some((key, token, reason)) = held.loss() {
                    let reason =
                        format!("lost lock {key} (token {token}) as {program:?} exited: {reason}");
                    eprintln!("fencelock: {reason}");
                    out.fail("not_held", &reason, serde_json::Value::Null);
                    return Ok(exit::LOST);
                }
                release(held, out).await;
                return Ok(status_code(status));
            }
            (key, token, reason) = &mut lost => {
                let reason = format!("lost lock {key} (token {token}): {reason}");
                eprintln!("fencelock: {reason}; stopping {program:?}");
                stop(&mut child, target, kill_after).await;
                // Usually refused (the lease is gone), but after a deadline
                // loss the lease may still exist: free it for the next holder
                // if the backend answers quickly.
                let _ = tokio::time::timeout(Duration::from_secs(1), held.release()).await;
                // Last, after the command's own output: stdout is its too.
                out.fail("not_held", &reason, serde_json::Value::Null);
                return Ok(exit::LOST);
            }
            Some(sig) = signals.recv() => target.send(sig),
            Some(()) = child_changed.recv() => {
                // Renewing for a command that does nothing would hold the
                // lock in silence: say so once per stop.
                let now = stopped_by(target.pid);
                if let (Some(sig), false) = (now, stopped) {
                    let why = match sig {
                        Signal::SIGTTIN | Signal::SIGTTOU => {
                            " (it used the terminal from the background)"
                        }
                        _ => "",
                    };
                    eprintln!(
                        "fencelock: {program:?} (pid {pid}) is stopped by {}{why}; \
                         the lock is still held and renewed; resume it with kill -CONT {pid}",
                        sig.as_str()
                    );
                }
                stopped = now.is_some();
            }
        }
    }
}

/// Signals fencelock passes on to the command instead of dying of them.
const FORWARDED: [(SignalKind, Signal); 4] = [
    (SignalKind::terminate(), Signal::SIGTERM),
    (SignalKind::interrupt(), Signal::SIGINT),
    (SignalKind::hangup(), Signal::SIGHUP),
    (SignalKind::quit(), Signal::SIGQUIT),
];

/// One channel carrying every forwarded signal as it arrives.
///
/// In `--foreground` mode the command shares the terminal's foreground
/// process group, so the terminal's own SIGINT, SIGQUIT and SIGHUP reach it
/// directly; forwarding them too would deliver each twice (and a second
/// Ctrl-C means "force quit" to many programs). Only SIGTERM, which nobody
/// else sends it, is forwarded then; the others are still caught, so that
/// fencelock outlives the command and releases the lock.
fn forward_signals(foreground: bool) -> Result<mpsc::UnboundedReceiver<Signal>, Error> {
    let (tx, rx) = mpsc::unbounded_channel();
    for (kind, sig) in FORWARDED {
        let forward = !foreground || sig == Signal::SIGTERM;
        let mut stream = signal(kind)
            .map_err(|e| Error::Unsupported(format!("cannot install signal handlers: {e}")))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if forward && tx.send(sig).is_err() {
                    break;
                }
            }
        });
    }
    Ok(rx)
}

/// SIGTERM, then SIGKILL after `grace`; finally SIGKILL whatever is left of
/// the process group, since none of it holds the lock any more.
async fn stop(child: &mut Child, target: Target, grace: Duration) {
    target.send(Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        target.send(Signal::SIGKILL);
        let _ = child.wait().await;
    }
    if target.group {
        target.send(Signal::SIGKILL);
    }
}

async fn release(held: Held, out: Output) {
    let key = held.guards().first().map(|g| g.key().clone());
    let several = held.guards().len() > 1;
    if let Err(e) = held.release().await {
        match (key, several) {
            (Some(key), false) => out.note(format_args!("could not release {key}: {e}")),
            _ => out.note(format_args!("could not release every key: {e}")),
        }
    }
}

fn child_error(e: std::io::Error) -> Error {
    Error::Unsupported(format!("cannot wait for the command: {e}"))
}

/// While an acquisition waits, says once a second who holds the lock (only
/// when the holder changes), after the first second.
pub async fn report_holder(client: LockClient, key: String, out: Output) {
    let mut last = None;
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    loop {
        tick.tick().await;
        if let Ok(Some(info)) = client.inspect(&key).await {
            let who = (info.owner.clone(), info.token);
            if last.as_ref() != Some(&who) {
                out.note(format_args!("waiting: {}", describe(&info)));
                last = Some(who);
            }
        }
    }
}
