//! The one place where driver errors become [`fencelock_core::Error`]s.

use fencelock_core::{BackendError, Error};

const BACKEND: &str = "postgres";

/// SQLSTATEs after which the same statement can succeed later: serialization
/// failure, deadlock, the server shutting down or starting up, too many
/// connections, a statement timeout, a read-only server (a standby during
/// failover), and the whole "connection exception" class.
fn transient_sqlstate(code: &str) -> bool {
    matches!(
        code,
        "40001" | "40P01" | "57P01" | "57P02" | "57P03" | "53300" | "55P03" | "57014" | "25006"
    ) || code.starts_with("08")
}

/// Whether `e` is `nextval` past the sequence's MAXVALUE (SQLSTATE 2200H,
/// `sequence_generator_limit_exceeded`).
pub(crate) fn sequence_ended(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("2200H"))
}

/// Whether a retry of what failed with `e` may succeed.
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| transient_sqlstate(&c)),
        other => fencelock_sql_common::transient_driver_error(other),
    }
}

/// Classifies a driver error: timed out (outcome unknown), transient
/// (retry may help) or permanent.
pub(crate) fn map(context: &'static str, e: sqlx::Error) -> Error {
    fencelock_sql_common::classify(BACKEND, context, e, is_transient)
}

/// A reply that does not have the shape the statement promises.
pub(crate) fn bad_reply(what: impl Into<String>) -> Error {
    BackendError::message(BACKEND, fencelock_core::ErrorStatus::Permanent, what).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_trouble_is_transient() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(map("x", io).is_transient());
        assert!(map("x", sqlx::Error::PoolTimedOut).is_transient());
        assert!(!map("x", sqlx::Error::RowNotFound).is_transient());
        assert!(transient_sqlstate("40P01") && transient_sqlstate("08006"));
        assert!(!transient_sqlstate("42P01"));
    }
}
