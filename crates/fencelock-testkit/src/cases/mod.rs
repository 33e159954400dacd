//! The conformance cases. Each takes a fresh [`Store`] and returns an error
//! describing the first violated expectation.
//!
//! Cases never assert wall-clock figures. Where they must wait for a lease to
//! end they wait for the TTL the backend *granted* (etcd rounds small TTLs
//! up), then poll with a bound. Every TTL and bound is a base figure scaled
//! by the case's measured budget ([`crate::patience`]), so a busy machine
//! gets longer leases and bounds, never a false failure.

mod admin;
mod atomic;
mod capabilities;
mod delay;
mod election;
mod exclusion;
mod fair;
mod faults;
mod fence;
mod guard;
mod input;
mod multi;
mod ownership;
mod resume;
mod rwlock;
mod semaphore;
mod tokens;
mod values;

use std::{sync::Arc, time::Duration};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, Error, FencingToken, Grant, LeaseId, LockKey, Owner,
};
use futures_util::future::BoxFuture;

use crate::suite::{Needs, Store, TestResult};

/// One conformance case.
pub struct Case {
    /// `module::function`, e.g. `exclusion::i1_race_on_free_key`.
    pub name: &'static str,
    /// Capabilities it needs.
    pub needs: Needs,
    /// The case.
    pub run: for<'a> fn(&'a dyn Store) -> BoxFuture<'a, TestResult>,
}

macro_rules! case {
    ($module:ident :: $f:ident) => {
        case!($module::$f, NONE)
    };
    ($module:ident :: $f:ident, $needs:expr) => {
        Case {
            name: concat!(stringify!($module), "::", stringify!($f)),
            needs: $needs,
            run: |store| Box::pin($module::$f(store)),
        }
    };
}

const NONE: Needs = Needs {
    restart: false,
    fence: false,
    network: false,
};
const RESTART: Needs = Needs {
    restart: true,
    fence: false,
    network: false,
};
const FENCE: Needs = Needs {
    restart: false,
    fence: true,
    network: false,
};
const NETWORK: Needs = Needs {
    restart: false,
    fence: false,
    network: true,
};
const NETWORK_FENCE: Needs = Needs {
    restart: false,
    fence: true,
    network: true,
};

/// Every case, in the order they are listed.
pub static CASES: &[Case] = &[
    case!(exclusion::i1_race_on_free_key),
    case!(exclusion::i1_race_on_expired_key),
    case!(exclusion::held_key_refuses_everyone),
    case!(tokens::i2_grow_across_release),
    case!(tokens::i2_grow_across_expiry_and_takeover),
    case!(tokens::i2_grow_across_cleanup),
    case!(tokens::i2_grow_across_reconnect),
    case!(tokens::i2_grow_across_restart, RESTART),
    case!(tokens::renewal_keeps_token),
    case!(tokens::floors_are_bounded_and_tokens_never_repeat),
    case!(ownership::i3_stranger_cannot_renew_or_release),
    case!(ownership::i3_stale_holder_cannot_touch_successor),
    case!(ownership::release_after_expiry_is_not_held),
    case!(ownership::i4_i6_expiry_needs_no_cleanup),
    case!(admin::inspect_reports_the_lease),
    case!(admin::list_filters_by_literal_prefix),
    case!(admin::stats_count_kinds_owners_and_expired),
    case!(admin::release_all_releases_only_that_owner),
    case!(admin::force_release_removes_any_holder),
    case!(admin::waiter_gets_lock_after_release),
    case!(admin::wait_times_out_while_held),
    case!(input::bad_keys_are_typed_errors),
    case!(input::bad_ttls_are_typed_errors),
    case!(input::odd_but_valid_keys_round_trip),
    case!(input::any_json_data_round_trips),
    case!(guard::renewal_outlives_the_ttl),
    case!(guard::force_release_is_noticed_as_loss),
    case!(guard::with_lock_cancels_closure_on_loss),
    case!(guard::dropped_guard_releases_in_background),
    case!(guard::restart_keeps_or_loses_lock_honestly, RESTART),
    case!(fence::i7_fence_rule, FENCE),
    case!(fence::i7_admit_before_read_prevents_lost_update, FENCE),
    case!(fence::i7_concurrent_admits_keep_the_maximum, FENCE),
    case!(fence::reset_forgets_the_tokens_and_the_value, FENCE),
    case!(
        fence::resets_racing_writers_leave_token_and_value_agreeing,
        FENCE
    ),
    case!(values::write_then_read, FENCE),
    case!(values::stale_write_is_refused, FENCE),
    case!(values::value_survives_a_new_connection, FENCE),
    case!(
        values::concurrent_writers_leave_the_highest_tokens_value,
        FENCE
    ),
    case!(values::oversize_value_is_invalid, FENCE),
    case!(faults::paused_holder_write_is_refused, NETWORK_FENCE),
    case!(faults::waiter_never_gets_an_expired_lease),
    case!(
        faults::waiter_never_gets_an_expired_lease_under_latency,
        NETWORK
    ),
    case!(faults::ambiguous_acquire_is_resolved, NETWORK),
    case!(faults::renewal_under_latency_loses_before_expiry, NETWORK),
    case!(faults::expired_holder_release_has_no_effect),
    case!(capabilities::renew_many_answers_each_lease),
    case!(capabilities::min_token_floor_is_honoured_or_refused),
    case!(capabilities::watch_reports_acquire_release_and_expiry),
    case!(capabilities::wakeups_claim_holds),
    case!(capabilities::close_releases_every_lease),
    case!(semaphore::never_more_than_n_holders),
    case!(semaphore::expired_permit_comes_back),
    case!(semaphore::permits_mismatch_is_an_error),
    case!(semaphore::permits_mismatch_is_found_off_the_path),
    case!(semaphore::sizes_never_hold_together),
    case!(semaphore::wait_times_out_when_full),
    case!(semaphore::release_frees_a_permit_for_a_waiter),
    case!(semaphore::holders_and_count_agree),
    case!(semaphore::permit_tokens_fence_their_slot, FENCE),
    case!(multi::opposite_orders_never_deadlock),
    case!(multi::partial_failure_leaves_nothing_held),
    case!(multi::loss_of_one_part_is_signalled),
    case!(multi::tokens_per_key_match_inspect),
    case!(atomic::claim_holds),
    case!(atomic::all_or_nothing_under_contention),
    case!(atomic::racing_overlapping_sets_never_double_grant),
    case!(atomic::tokens_per_key_above_earlier_grants),
    case!(delay::early_release_keeps_the_key_for_the_delay),
    case!(delay::release_after_the_delay_frees_at_once),
    case!(delay::bad_delays_are_refused),
    case!(capabilities::set_data_replaces_the_holders_data_or_is_refused),
    case!(capabilities::client_watch_sees_acquire_release_and_expiry),
    case!(election::one_leader_among_racing_candidates),
    case!(election::standby_takes_over_after_resignation),
    case!(election::standby_takes_over_after_leader_expiry, FENCE),
    case!(resume::validate_is_true_only_for_the_current_token),
    case!(resume::resume_reattaches_to_the_exact_lease),
    case!(rwlock::readers_share_and_exclude_writers),
    case!(rwlock::tokens_increase_across_modes),
    case!(rwlock::writer_intent_blocks_new_readers_and_expires),
    case!(rwlock::reader_expiry_frees_the_writer),
    case!(rwlock::reader_lease_ownership_is_exact),
    case!(rwlock::admin_accounts_for_readers),
    case!(rwlock::race_of_readers_and_writers),
    case!(rwlock::fence_admits_readers_and_writers, FENCE),
    case!(rwlock::restart_keeps_readers_and_tokens, RESTART),
    case!(fair::waiters_are_granted_in_arrival_order),
    case!(fair::a_single_try_leaves_nothing_and_never_overtakes),
    case!(fair::abandoned_waits_do_not_delay_the_next),
    case!(fair::a_crashed_waiters_entry_blocks_at_most_its_ttl),
];

/// Fails the case with a formatted message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!("{} (at {}:{})", format!($($msg)+), file!(), line!()).into());
        }
    };
}
pub(crate) use ensure;

// Every TTL, wait and bound of a case is a base figure (what a quiet
// machine needs, with the margins the case always had) scaled by the
// case's measured budget (`crate::patience`): the harness measures one
// against the case's store and runs the case in its scope.

/// A lease long enough never to expire during a case. Not scaled: a
/// minute outlasts any case's steps, and it is the longest lease some
/// layouts grant (Redlock's `max_ttl`, a restarted node's quarantine).
pub(crate) fn long_ttl() -> Duration {
    Duration::from_secs(60)
}
/// The base of [`short_ttl`]: what a quiet machine needs.
pub(crate) const SHORT_TTL_BASE: Duration = Duration::from_millis(400);
/// A lease a case waits out. Backends may grant more (etcd: about 2 s).
pub(crate) fn short_ttl() -> Duration {
    patient(SHORT_TTL_BASE)
}
/// A renewed lease: short enough that renewal matters within a case, long
/// enough that a slow disk cannot delay a renewal past the trusted window.
pub(crate) fn guard_ttl() -> Duration {
    patient(Duration::from_secs(2))
}
/// How long past its TTL a lease may take to end before a case calls it
/// stuck: far more than any backend needs, far less than "never".
pub(crate) fn expiry_slack() -> Duration {
    patient(Duration::from_secs(5))
}

/// `base` scaled by the case's budget.
pub(crate) fn patient(base: Duration) -> Duration {
    crate::patience::current().bound(base)
}

pub(crate) fn key(name: &str) -> LockKey {
    LockKey::new(name).expect("case keys are valid")
}

pub(crate) fn owner(name: &str) -> Owner {
    Owner::new(name).expect("case owners are valid")
}

pub(crate) fn request(key: &LockKey, owner: &Owner, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(key.clone(), owner.clone(), ttl)
}

/// The lease of `owner` on `key` with `token`.
pub(crate) fn lease(key: &LockKey, owner: &Owner, token: FencingToken) -> LeaseId {
    LeaseId::new(key.clone(), owner.clone(), token)
}

/// Releases through the backend: `Ok(false)` when it answers
/// [`Error::NotHeld`], the one way every backend says so.
pub(crate) async fn released(
    backend: &dyn Backend,
    key: &LockKey,
    owner: &Owner,
    token: FencingToken,
) -> fencelock_core::Result<bool> {
    match backend.release(&lease(key, owner, token)).await {
        Ok(()) => Ok(true),
        Err(Error::NotHeld { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `try_acquire` that must be granted.
pub(crate) async fn grant(
    backend: &dyn Backend,
    key: &LockKey,
    owner: &Owner,
    ttl: Duration,
) -> TestResult<Grant> {
    match backend.try_acquire(&request(key, owner, ttl)).await? {
        Acquire::Granted(grant) => Ok(grant),
        Acquire::Held(holder) => {
            Err(format!("{key} should be free for {owner}, but is held: {holder:?}").into())
        }
    }
}

/// The store's fence; cases that call this need [`FENCE`].
pub(crate) async fn fence_of(store: &dyn Store) -> TestResult<Arc<dyn fencelock_core::Fence>> {
    store
        .fence()
        .await?
        .ok_or_else(|| "this store has no fence".into())
}

/// Waits until the lease granted as `grant` has ended on the backend: first
/// the granted TTL, then polling `inspect` for at most a few seconds.
pub(crate) async fn wait_out(backend: &dyn Backend, key: &LockKey, grant: &Grant) -> TestResult {
    tokio::time::sleep(grant.ttl).await;
    let bound = tokio::time::Instant::now() + expiry_slack();
    loop {
        match backend.inspect(key).await? {
            Some(lease) if lease.token == grant.token => {}
            _ => return Ok(()),
        }
        ensure!(
            tokio::time::Instant::now() < bound,
            "lease {} on {key} outlived its {:?} TTL by more than {:?}",
            grant.token,
            grant.ttl,
            expiry_slack()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `op` until it answers anything but a transient error, for at most
/// `bound`: right after a restart a server may refuse or drop requests for a
/// while (a cluster re-forming, a primary failed over to its replica and
/// back), and the cases that restart check what survived, not how soon the
/// server answers again.
pub(crate) async fn through_restart<T, F>(
    bound: Duration,
    mut op: impl FnMut() -> F,
) -> TestResult<T>
where
    F: std::future::Future<Output = Result<T, fencelock_core::Error>>,
{
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        match op().await {
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return Ok(other?),
        }
    }
}

/// A client on a new connection to `store`, taking locks as `name`.
pub(crate) async fn client(
    store: &dyn Store,
    name: &str,
) -> TestResult<fencelock_core::LockClient> {
    Ok(fencelock_core::LockClient::builder(store.connect().await?)
        .owner(owner(name))
        .build()?)
}

/// `n` connections to `store`, to spread racers over.
pub(crate) async fn connections(store: &dyn Store, n: usize) -> TestResult<Vec<Arc<dyn Backend>>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(store.connect().await?);
    }
    Ok(conns)
}
