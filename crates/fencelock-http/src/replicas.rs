//! Which replica of the service a request goes to, and when a client stops
//! waiting for one.
//!
//! A replica that refuses connections is the easy failure: the request never
//! reached it, so it goes to the next one at once. The hard one is a replica
//! that accepts and never answers — a stopped or wedged process, whose
//! kernel still completes TCP handshakes — because nothing fails: the
//! request just waits. Waiting out a whole request timeout there costs a
//! holder its lock (its renewals are bounded by a third of the lease) and a
//! new command tens of seconds. So every request at a replica is watched:
//!
//! - **A request that may be sent twice** (a read, a renewal, a release:
//!   each has the same effect once or twice) that has no answer after its
//!   *patience* is sent again, to the next replica, and the first answer
//!   wins — unless it is a refusal ("not held", "not found") while another
//!   copy is still in flight: that copy may be the one that took effect (a
//!   release that went through on a hung replica, whose resend found
//!   nothing left to release), so its answer is awaited and wins. With one
//!   address (a balancer in front of the replicas) up to two copies go to
//!   the same address on other connections, which the balancer may send
//!   elsewhere.
//! - **Any other request** (an acquisition, which may long-poll for as long
//!   as its wait) is left to run, but once its replica has been silent for
//!   the patience, the replica is asked something trivial (`GET /v1/info`,
//!   which does not touch the backend). A replica that does not answer that
//!   within the patience either is taken to be hung: the request is
//!   abandoned and sent to the next replica. Abandoning it is what a
//!   timed-out request is anyway: if the hung replica wakes and grants it,
//!   the orphaned lease ends with its TTL (docs/faults.md, case 3).
//!
//! A replica left behind like that, or whose request the caller stopped
//! waiting for while it was silent, is *avoided* for a while: requests go
//! to the others first. Any answer at all (an error status included) proves
//! a replica is alive.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use futures_util::{
    future::{BoxFuture, FutureExt, Shared},
    stream::{FuturesUnordered, StreamExt},
};
use tokio::time::Instant;

/// A liveness check: `true` if the replica answered in time.
type Probe = Shared<BoxFuture<'static, bool>>;

/// How long a replica left behind is avoided.
pub(crate) const AVOID_FOR: Duration = Duration::from_secs(10);

/// Whether a request may be sent again while its first copy may still be
/// in flight (see the module's comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resend {
    /// The same effect once or twice: sent again, elsewhere, after this
    /// long without an answer.
    After(Duration),
    /// Sent to one replica at a time; the replica is checked when silent.
    Never,
}

/// One replica's address and what the client has seen of it.
#[derive(Debug)]
pub(crate) struct Replica {
    pub(crate) host: String,
    pub(crate) port: Option<u16>,
    state: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// When it last answered anything.
    heard: Option<Instant>,
    /// Requests go to the others first until then.
    avoid_until: Option<Instant>,
    /// The liveness check in flight, shared by every request waiting on
    /// this replica, and when it started.
    probe: Option<(Instant, Probe)>,
}

impl Replica {
    pub(crate) fn new(host: String, port: Option<u16>) -> Self {
        Self {
            host,
            port,
            state: Mutex::new(Seen::default()),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The replicas of one connection and the one requests go to.
#[derive(Debug)]
pub(crate) struct Replicas {
    list: Box<[Replica]>,
    current: AtomicUsize,
    /// How long a replica may stay silent before it is checked, and how
    /// long the check may take (the URL's `replica_timeout`).
    pub(crate) patience: Duration,
}

/// What became of a request sent by [`Replicas::send`].
#[derive(Debug)]
pub(crate) enum Sent<R, E> {
    /// A replica answered (any status).
    Answer(R),
    /// The transport failed at the last replica tried.
    Failed(E),
    /// No replica answered in time (every one tried was silent).
    Silent,
}

impl Replicas {
    pub(crate) fn new(list: Vec<Replica>, patience: Duration) -> Self {
        Self {
            list: list.into(),
            current: AtomicUsize::new(0),
            patience,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    pub(crate) fn get(&self, at: usize) -> &Replica {
        &self.list[at]
    }

    /// The replica the next request goes to: the current one unless it is
    /// avoided and another is not.
    fn pick(&self, busy: &[usize]) -> usize {
        let now = Instant::now();
        let n = self.list.len();
        let current = self.current.load(Ordering::Relaxed) % n;
        let free = |at: &usize| !busy.contains(at);
        let order = (0..n).map(|k| (current + k) % n);
        let chosen = order
            .clone()
            .filter(free)
            .find(|&at| self.list[at].seen().avoid_until.is_none_or(|t| t <= now))
            .or_else(|| order.clone().find(free))
            .unwrap_or(current);
        if chosen != current && busy.is_empty() {
            self.move_on(current, chosen);
        }
        chosen
    }

    /// Moves requests from `from` to `to`, unless another request already
    /// moved them.
    fn move_on(&self, from: usize, to: usize) {
        let _ = self
            .current
            .compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed);
    }

    fn heard(&self, at: usize) {
        let mut seen = self.list[at].seen();
        seen.heard = Some(Instant::now());
        seen.avoid_until = None;
    }

    fn heard_since(&self, at: usize, since: Instant) -> bool {
        self.list[at].seen().heard.is_some_and(|t| t >= since)
    }

    /// Leaves `at` behind: requests go elsewhere for [`AVOID_FOR`].
    fn avoid(&self, at: usize) {
        if self.list.len() > 1 {
            self.list[at].seen().avoid_until = Some(Instant::now() + AVOID_FOR);
            self.move_on(at, (at + 1) % self.list.len());
        }
    }

    /// A refused connection or other transport failure at `at`.
    fn failed(&self, at: usize) {
        if self.list.len() > 1 {
            self.move_on(at, (at + 1) % self.list.len());
        }
    }

    /// Sends what `attempt(at)` sends to replica `at`, watching it as the
    /// module's comment says. `probe(at)` is the liveness check;
    /// `refusal(answer)` says whether an answer is one that another copy
    /// in flight may contradict.
    pub(crate) async fn send<R, E>(
        self: &Arc<Self>,
        resend: Resend,
        attempt: impl Fn(usize) -> BoxFuture<'static, Result<R, E>>,
        probe: impl Fn(usize) -> BoxFuture<'static, bool>,
        refused: impl Fn(&E) -> bool,
        refusal: impl Fn(&R) -> bool,
    ) -> Sent<R, E>
    where
        R: Send + 'static,
        E: Send + 'static,
    {
        let n = self.list.len();
        // Copies in flight, each with the watch that leaves its replica
        // behind if the caller gives up on it while it is silent.
        let mut flying = FuturesUnordered::new();
        let mut busy: Vec<usize> = Vec::new();
        let mut tries = 0;
        // One address is a balancer, which picks a replica per request:
        // each copy may reach a healthy one.
        let most = match resend {
            Resend::After(_) => n.max(3),
            Resend::Never => n,
        };
        let mut last_error = None;
        // A refusal answered while another copy was still in flight.
        let mut held_back = None;
        loop {
            if flying.is_empty() {
                if let Some(answer) = held_back.take() {
                    return Sent::Answer(answer);
                }
                if tries == most {
                    return last_error.map_or(Sent::Silent, Sent::Failed);
                }
                let at = self.pick(&busy);
                tries += 1;
                busy.push(at);
                flying.push(self.watched(at, attempt(at)));
            }
            let patience = match resend {
                Resend::After(p) => p,
                Resend::Never => self.patience,
            };
            // The timer restarts with every turn of the loop, so it measures
            // the silence of the copy sent last.
            let newest = busy.last().copied().unwrap_or(0);
            // An answer is in hand: the copies in flight are awaited, not
            // multiplied.
            let answered = held_back.is_some();
            let silent = async {
                match resend {
                    _ if answered => std::future::pending().await,
                    Resend::After(p) if tries < most => tokio::time::sleep(p).await,
                    Resend::Never if n > 1 => {
                        self.until_silent(newest, patience, &probe).await;
                    }
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                Some((at, outcome)) = flying.next() => match outcome {
                    Ok(answer) if refusal(&answer) && !flying.is_empty() => {
                        held_back.get_or_insert(answer);
                    }
                    Ok(answer) => return Sent::Answer(answer),
                    Err(e) => {
                        self.failed(at);
                        busy.retain(|&b| b != at);
                        // A request that may be sent twice is sent again
                        // after any failure: a replica killed mid-request
                        // closes its connection without an answer, and
                        // behind a balancer the next connection reaches a
                        // live one. Any other request only after a refused
                        // connection, which is known not to have reached
                        // the replica: another failure may have taken
                        // effect, so it is the answer, unless a copy is
                        // still in flight (then the copy's is).
                        let again = match resend {
                            Resend::After(_) => tries < most,
                            Resend::Never => refused(&e) && tries < n,
                        };
                        last_error = Some(e);
                        if flying.is_empty() && !again && held_back.is_none() {
                            return last_error.map_or(Sent::Silent, Sent::Failed);
                        }
                    }
                },
                () = silent => {
                    tracing::debug!(
                        replica = newest,
                        "lock service replica silent for {patience:?}; trying another"
                    );
                    self.avoid(newest);
                    if resend == Resend::Never {
                        // Abandoned: dropping it cancels the request.
                        flying.clear();
                        busy.clear();
                        if tries == most {
                            return Sent::Silent;
                        }
                    }
                    let at = self.pick(&busy);
                    tries += 1;
                    busy.push(at);
                    flying.push(self.watched(at, attempt(at)));
                }
            }
        }
    }

    /// `request` at replica `at`, recording an answer; if it is dropped
    /// unanswered after the replica stayed silent for the patience, the
    /// replica is avoided (the caller's own deadline found it hung).
    fn watched<R, E>(
        self: &Arc<Self>,
        at: usize,
        request: BoxFuture<'static, Result<R, E>>,
    ) -> impl std::future::Future<Output = (usize, Result<R, E>)> {
        let watch = Unanswered {
            replicas: Arc::clone(self),
            at,
            sent: Instant::now(),
            answered: false,
        };
        async move {
            let mut watch = watch;
            let outcome = request.await;
            watch.answered = true;
            if outcome.is_ok() {
                watch.replicas.heard(at);
            }
            (at, outcome)
        }
    }

    /// Ends once replica `at` is found hung: silent for `patience`, then
    /// not answering a liveness check within `patience` either.
    async fn until_silent(
        &self,
        at: usize,
        patience: Duration,
        probe: &impl Fn(usize) -> BoxFuture<'static, bool>,
    ) {
        loop {
            let since = Instant::now();
            tokio::time::sleep(patience).await;
            if self.heard_since(at, since) {
                continue;
            }
            let check = {
                let mut seen = self.list[at].seen();
                // A check whose every waiter gave up is only taken over
                // while it is still running: once its time is up it would
                // say "silent" about a moment long past.
                if seen
                    .probe
                    .as_ref()
                    .is_some_and(|(t, _)| t.elapsed() >= patience)
                {
                    seen.probe = None;
                }
                let (_, check) = seen.probe.get_or_insert_with(|| {
                    let check = tokio::time::timeout(patience, probe(at))
                        .map(|answered| answered.unwrap_or(false))
                        .boxed()
                        .shared();
                    (Instant::now(), check)
                });
                check.clone()
            };
            let alive = check.await;
            self.list[at].seen().probe = None;
            if alive {
                self.heard(at);
            } else if !self.heard_since(at, since) {
                return;
            }
        }
    }
}

/// Avoids a replica whose request is dropped while it is silent.
struct Unanswered {
    replicas: Arc<Replicas>,
    at: usize,
    sent: Instant,
    answered: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        let replicas = &self.replicas;
        let lately = Instant::now().checked_sub(replicas.patience);
        if !self.answered
            && self.sent.elapsed() >= replicas.patience
            && lately.is_some_and(|t| !replicas.heard_since(self.at, t))
        {
            replicas.avoid(self.at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each try of [`Replicas::send`] answers, in order: `Ok` an
    /// answer, `Err(true)` a refused connection, `Err(false)` a connection
    /// closed without an answer.
    async fn send(
        replicas: usize,
        resend: Resend,
        answers: Vec<Result<u32, bool>>,
    ) -> (Sent<u32, bool>, usize) {
        let list = (0..replicas)
            .map(|i| Replica::new(format!("h{i}"), Some(1)))
            .collect();
        let replicas = Arc::new(Replicas::new(list, Duration::from_secs(60)));
        let answers = Arc::new(Mutex::new(answers.into_iter()));
        let tries = Arc::new(AtomicUsize::new(0));
        let attempt = |_at| {
            tries.fetch_add(1, Ordering::SeqCst);
            let next = answers.lock().ok().and_then(|mut a| a.next());
            async move { next.unwrap_or(Err(false)) }.boxed()
        };
        let sent = replicas
            .send(
                resend,
                attempt,
                |_| async { true }.boxed(),
                |refused| *refused,
                |_| false,
            )
            .await;
        (sent, tries.load(Ordering::SeqCst))
    }

    /// A release answered "not held" by its resend, while the first copy,
    /// on a replica that stalled, is still in flight: that copy took
    /// effect, and its answer (0 here; 409 is the refusal) wins, whether it
    /// comes before or after the resend's. Without a copy left in flight,
    /// or once it fails, the refusal is the answer.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_waits_for_a_copy_still_in_flight() {
        let patience = Duration::from_millis(100);
        // What each try answers, after how long.
        let run = |plan: Vec<(u64, Result<u32, bool>)>| async move {
            let list = (0..3)
                .map(|i| Replica::new(format!("h{i}"), Some(1)))
                .collect();
            let replicas = Arc::new(Replicas::new(list, patience));
            let plan = Arc::new(Mutex::new(plan.into_iter()));
            let attempt = |_at| {
                let (after, answer) = plan
                    .lock()
                    .ok()
                    .and_then(|mut p| p.next())
                    .unwrap_or((0, Err(false)));
                async move {
                    tokio::time::sleep(Duration::from_millis(after)).await;
                    answer
                }
                .boxed()
            };
            replicas
                .send(
                    Resend::After(patience),
                    attempt,
                    |_| async { true }.boxed(),
                    |refused| *refused,
                    |answer| *answer == 409,
                )
                .await
        };
        // The stalled first copy answers after the resend's refusal.
        let sent = run(vec![(500, Ok(0)), (0, Ok(409))]).await;
        assert!(matches!(sent, Sent::Answer(0)), "{sent:?}");
        // It fails: the refusal stands.
        let sent = run(vec![(500, Err(false)), (0, Ok(409))]).await;
        assert!(matches!(sent, Sent::Answer(409)), "{sent:?}");
        // A refusal with nothing else in flight is the answer at once.
        let sent = run(vec![(0, Ok(409))]).await;
        assert!(matches!(sent, Sent::Answer(409)), "{sent:?}");
    }

    #[tokio::test]
    async fn a_request_that_may_be_sent_twice_survives_a_closed_connection() {
        let resend = Resend::After(Duration::from_secs(60));
        // Behind a balancer (one address), and with every replica listed.
        for replicas in [1, 3] {
            let (sent, tries) = send(replicas, resend, vec![Err(false), Ok(7)]).await;
            assert!(matches!(sent, Sent::Answer(7)), "{replicas} replicas");
            assert_eq!(tries, 2);
        }
        // Bounded: three tries behind a balancer, then the last failure.
        let (sent, tries) = send(1, resend, vec![Err(false); 5]).await;
        assert!(matches!(sent, Sent::Failed(false)));
        assert_eq!(tries, 3);
    }

    #[tokio::test]
    async fn any_other_request_is_sent_again_only_after_a_refused_connection() {
        let (sent, tries) = send(3, Resend::Never, vec![Err(false), Ok(7)]).await;
        assert!(matches!(sent, Sent::Failed(false)));
        assert_eq!(tries, 1);
        let (sent, tries) = send(3, Resend::Never, vec![Err(true), Ok(7)]).await;
        assert!(matches!(sent, Sent::Answer(7)));
        assert_eq!(tries, 2);
    }
}
