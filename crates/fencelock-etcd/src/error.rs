//! The one place where `etcd-client` errors become fencelock errors.

use std::{future::Future, time::Duration};

use etcd_client::Error as EtcdError;
use fencelock_core::{BackendError, Error};
use tonic::{Code, Status};

pub(crate) const NAME: &str = "etcd";

/// Whether the error says the lease does not exist (expired or revoked).
pub(crate) fn is_lease_not_found(e: &EtcdError) -> bool {
    match e {
        EtcdError::GRpcStatus(s) => {
            s.code() == Code::NotFound || s.message().contains("requested lease not found")
        }
        // The keep-alive stream reports an unknown lease this way.
        EtcdError::LeaseKeepAliveError(m) => m.contains("not found"),
        _ => false,
    }
}

/// Classifies a driver error: lost connections, missing or changing
/// leaders, timeouts and overload are transient; the rest permanent.
pub(crate) fn map(context: &str, e: EtcdError) -> Error {
    if matches!(&e, EtcdError::GRpcStatus(s) if s.code() == Code::DeadlineExceeded) {
        // The `timeout` option fired ([`bounded`], or the channel's own
        // request timeout): the request may or may not have taken effect.
        return BackendError::timeout(NAME, format!("{context} got no answer in time"))
            .with_source(e)
            .into();
    }
    let message = format!("{context} failed");
    if transient(&e) {
        BackendError::transient(NAME, message, e).into()
    } else {
        BackendError::permanent(NAME, message, e).into()
    }
}

/// Whether `e` is transient: lost connections, missing or changing
/// leaders, timeouts and overload.
fn transient(e: &EtcdError) -> bool {
    match e {
        EtcdError::IoError(_) | EtcdError::TransportError(_) => true,
        EtcdError::LeaseKeepAliveError(_) | EtcdError::WatchError(_) => true,
        EtcdError::GRpcStatus(s) => match s.code() {
            Code::Unavailable | Code::Aborted | Code::ResourceExhausted | Code::Cancelled => true,
            Code::Unknown | Code::Internal => {
                let m = s.message();
                m.contains("leader")
                    || m.contains("timed out")
                    || m.contains("timeout")
                    || m.contains("too many requests")
                    || m.contains("connection")
                    || m.contains("transport")
            }
            _ => false,
        },
        _ => false,
    }
}

/// A stored value this crate never writes: permanent.
pub(crate) fn bad_value(what: impl Into<String>) -> Error {
    BackendError::message(NAME, fencelock_core::ErrorStatus::Permanent, what).into()
}

/// Whether the request failed before reaching any server: the balanced
/// channel picked an endpoint it could not connect to (e.g. a killed
/// member). Sending it again is then safe even for non-idempotent requests.
pub(crate) fn never_sent(e: &EtcdError) -> bool {
    matches!(e, EtcdError::GRpcStatus(s)
        if s.code() == Code::Unavailable && s.message().contains("tcp connect error"))
}

/// How often a request that was never sent is sent again. The channel picks
/// endpoints at random, so with one member of three down a handful of
/// attempts reaches a live one with near certainty.
const UNSENT_RETRIES: usize = 6;

/// `fut`, or a `DeadlineExceeded` status (transient, see [`map`]) once
/// `timeout` has passed. The channel's own request timeout does not cover
/// everything: a request waiting for a connection that never becomes ready,
/// or the messages of a stream (keep-alive, watch), would otherwise wait
/// for the HTTP/2 keep-alive to give up.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<T, EtcdError>>,
) -> Result<T, EtcdError> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| Err(no_answer(timeout)))
}

/// The `DeadlineExceeded` status of a request unanswered after `timeout`.
fn no_answer(timeout: Duration) -> EtcdError {
    EtcdError::GRpcStatus(Status::deadline_exceeded(format!(
        "no answer within {timeout:?}"
    )))
}

/// How long an idempotent request waits for its answer before a copy is
/// sent beside it ([`hedged`]): far above a healthy member's round trip,
/// well inside the third of a lease the renewer gives a renewal.
pub(crate) const HEDGE_AFTER: Duration = Duration::from_millis(500);

/// Runs `op` — which must have the same effect once or twice (a
/// keep-alive, a read) — and, while no copy has answered, another copy
/// every [`HEDGE_AFTER`], `copies` in all, and one at once after each
/// copy whose connection broke (up to `copies` more); the first success
/// wins (or, once every copy has failed, the last failure), all bounded
/// by `timeout`.
///
/// A member that is stopped or wedged keeps its connections open and
/// answers nothing, so the channel goes on giving it requests, which wait
/// out their time-out, until the HTTP/2 keep-alive gives up on it seconds
/// later. The channel picks between two members at random (its connections
/// report no load), so each copy is likely to reach another member.
pub(crate) async fn hedged<T, F, Fut>(
    timeout: Duration,
    copies: usize,
    op: F,
) -> Result<T, EtcdError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, EtcdError>>,
{
    hedged_unless(timeout, copies, op, |_| false).await
}

/// [`hedged`], for a conditional write whose copies have one effect
/// together (a delete of one key incarnation: the copy that comes second
/// finds nothing left to delete), but whose answers differ: a copy that
/// answers `refused` (its condition failed) while another copy is still in
/// flight may only be the echo of that other copy's success, which the
/// silent member applied. Such an answer waits for the copies in flight and
/// is returned only if none of them succeeds (fails, or the time is up).
pub(crate) async fn hedged_unless<T, F, Fut>(
    timeout: Duration,
    copies: usize,
    op: F,
    refused: impl Fn(&T) -> bool,
) -> Result<T, EtcdError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, EtcdError>>,
{
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let deadline = tokio::time::Instant::now() + timeout;
    let mut flying = FuturesUnordered::new();
    flying.push(op());
    let mut sent = 1;
    let mut last = None;
    let mut held_back = None;
    loop {
        let next_copy = async {
            if sent < copies {
                tokio::time::sleep(HEDGE_AFTER).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            biased;
            answer = flying.next() => match answer {
                Some(Ok(value)) if refused(&value) && !flying.is_empty() => {
                    held_back = Some(value);
                }
                Some(Ok(value)) => return Ok(value),
                // A broken connection left the outcome unknown, and a
                // copy has the same effect: the next one goes at once, on
                // a new connection, up to as many again as the silence
                // allowed.
                Some(Err(e)) if transient(&e) && sent < 2 * copies && held_back.is_none() => {
                    last = Some(e);
                    flying.push(op());
                    sent += 1;
                }
                // An answer, if a failed one: copies are for silence.
                // Another copy still in flight may yet succeed.
                Some(Err(e)) => {
                    last = Some(e);
                    if flying.is_empty() {
                        break;
                    }
                }
                None => break,
            },
            () = next_copy, if held_back.is_none() => {
                flying.push(op());
                sent += 1;
            }
            () = tokio::time::sleep_until(deadline) => {
                last = Some(no_answer(timeout));
                break;
            }
        }
    }
    // A held-back refusal, else the last failure (the loop records one
    // before every break but an empty stream's, which cannot happen: a
    // copy is pushed before the first poll).
    held_back.map_or_else(|| Err(last.unwrap_or_else(|| no_answer(timeout))), Ok)
}

/// Runs `op`, sending it again while it fails with [`never_sent`], so a dead
/// endpoint costs a failed connect rather than a failed call; all attempts
/// together are [`bounded`] by `timeout`.
pub(crate) async fn failover<T, F, Fut>(timeout: Duration, mut op: F) -> Result<T, EtcdError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, EtcdError>>,
{
    bounded(timeout, async {
        let mut attempt = 0;
        loop {
            match op().await {
                Err(e) if attempt < UNSENT_RETRIES && never_sent(&e) => attempt += 1,
                other => return other,
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Copy 1 is held by a member that answers late; copy 2 (sent after
    /// [`HEDGE_AFTER`]) answers at once. `first` is copy 1's answer, if it
    /// gives one within `late`; copy 2 answers `false` (refused).
    async fn two_copies(first: Option<bool>, late: Duration) -> Result<bool, EtcdError> {
        let sent = AtomicUsize::new(0);
        hedged_unless(
            Duration::from_secs(5),
            2,
            || {
                let n = sent.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n > 0 {
                        return Ok(false);
                    }
                    tokio::time::sleep(late).await;
                    first.ok_or_else(|| EtcdError::GRpcStatus(Status::unavailable("reset")))
                }
            },
            |applied: &bool| !applied,
        )
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_waits_for_the_copy_still_in_flight() {
        // The first copy applied the delete: its late success wins over the
        // second copy's "nothing to delete".
        assert!(two_copies(Some(true), Duration::from_secs(2))
            .await
            .unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_stands_when_no_copy_in_flight_succeeds() {
        // The first copy fails, or never answers: the refusal is the answer.
        assert!(!two_copies(None, Duration::from_secs(2)).await.unwrap());
        assert!(!two_copies(Some(true), Duration::from_secs(60))
            .await
            .unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_connection_sends_the_next_copy_at_once() {
        let sent = AtomicUsize::new(0);
        let started = tokio::time::Instant::now();
        let answer = hedged_unless(
            Duration::from_secs(5),
            2,
            || {
                let n = sent.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        Err(EtcdError::GRpcStatus(Status::unavailable(
                            "connection reset",
                        )))
                    } else {
                        Ok(true)
                    }
                }
            },
            |applied: &bool| !applied,
        )
        .await;
        assert!(answer.unwrap());
        assert_eq!(started.elapsed(), Duration::ZERO, "the copy waited");
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_answers_at_once() {
        let started = tokio::time::Instant::now();
        let answer = hedged_unless(
            Duration::from_secs(5),
            2,
            || async { Ok::<_, EtcdError>(true) },
            |applied: &bool| !applied,
        )
        .await;
        assert!(answer.unwrap());
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
