//! The one place where driver errors become [`fencelock_core::Error`]s.

use fencelock_core::{BackendError, Error, LockKey};
use sqlx::mysql::MySqlDatabaseError;

const BACKEND: &str = "mysql";

/// Server error numbers after which the same statement can succeed later:
/// deadlock, lock wait timeout, too many connections (for the server, 1040,
/// or for the user, 1203), server shutting down,
/// connection killed, server gone away or lost, read-only during failover.
fn transient_number(n: u16) -> bool {
    matches!(
        n,
        1205 | 1213 | 1040 | 1203 | 1053 | 1927 | 2006 | 2013 | 1290 | 1836 | 4031
    )
}

fn server_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// Whether a retry of what failed with `e` may succeed.
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    match server_number(e) {
        Some(n) => transient_number(n),
        None => fencelock_sql_common::transient_driver_error(e),
    }
}

/// Classifies a driver error: timed out (outcome unknown), transient
/// (retry may help) or permanent.
pub(crate) fn map(context: &'static str, e: sqlx::Error) -> Error {
    fencelock_sql_common::classify(BACKEND, context, e, is_transient)
}

/// `map`, for a statement that draws tokens for `key`: the counter's end
/// (the draw's deliberate `BIGINT UNSIGNED` overflow, server error 1690,
/// see `crate::backend::draw_expr`) is [`Error::TokensExhausted`].
pub(crate) fn map_grant(context: &'static str, key: &LockKey, e: sqlx::Error) -> Error {
    if server_number(&e) == Some(1690) {
        Error::TokensExhausted { key: key.clone() }
    } else {
        map(context, e)
    }
}

/// InnoDB chose the statement as a deadlock victim and rolled it back whole.
pub(crate) fn is_deadlock(e: &sqlx::Error) -> bool {
    server_number(e) == Some(1213)
}

/// How often a transaction chosen as an InnoDB deadlock victim is retried
/// before the (transient) error reaches the caller.
pub(crate) const DEADLOCK_RETRIES: u32 = 3;

/// Runs `attempt` again, up to [`DEADLOCK_RETRIES`] times, while InnoDB
/// chooses it as a deadlock victim: the victim was rolled back whole, so
/// trying again is safe (and what MySQL asks of applications). An attempt
/// takes a session of its own; one that failed is dropped, and closed with
/// it whatever it held.
pub(crate) async fn retry_deadlocks<T, Fut>(
    mut attempt: impl FnMut() -> Fut,
) -> Result<T, sqlx::Error>
where
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut deadlocks = 0;
    loop {
        match attempt().await {
            Err(e) if is_deadlock(&e) && deadlocks < DEADLOCK_RETRIES => deadlocks += 1,
            answer => return answer,
        }
    }
}

/// A reply that does not have the shape the statement promises.
pub(crate) fn bad_reply(what: impl Into<String>) -> Error {
    BackendError::message(BACKEND, fencelock_core::ErrorStatus::Permanent, what).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert!(transient_number(1213) && transient_number(2013));
        assert!(transient_number(1040) && transient_number(1203));
        assert!(!transient_number(1146));
        assert!(map("x", sqlx::Error::PoolTimedOut).is_transient());
        assert!(!map("x", sqlx::Error::RowNotFound).is_transient());
    }
}
