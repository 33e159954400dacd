//! The one place where SQLite failures become fencelock errors.

use fencelock_core::{BackendError, Error};

pub(crate) const NAME: &str = "sqlite";

/// Busy and locked databases pass (another process holds the write lock past
/// the busy timeout); I/O hiccups may pass; everything else (a corrupt file,
/// a read-only directory, a schema someone else changed) needs a person.
pub(crate) fn map(e: rusqlite::Error) -> Error {
    use rusqlite::ErrorCode::*;
    let transient = match &e {
        rusqlite::Error::SqliteFailure(f, _) => {
            matches!(
                f.code,
                DatabaseBusy | DatabaseLocked | SystemIoFailure | OutOfMemory
            )
        }
        _ => false,
    };
    if transient {
        BackendError::transient(NAME, "database busy or unavailable", e).into()
    } else {
        BackendError::permanent(NAME, "query failed", e).into()
    }
}

pub(crate) fn clock(e: nix::Error) -> Error {
    BackendError::permanent(NAME, "cannot read the host's boot-time clock", e).into()
}

pub(crate) fn task(e: tokio::task::JoinError) -> Error {
    BackendError::permanent(NAME, "database task failed", e).into()
}

pub(crate) fn corrupt(what: String) -> Error {
    BackendError::message(
        NAME,
        fencelock_core::ErrorStatus::Permanent,
        format!("unexpected data in the lock table: {what}"),
    )
    .into()
}
