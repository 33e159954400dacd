//! What the PostgreSQL and MySQL fences share beyond their admission
//! statements: what an admission's read-back means ([`admission`]) and
//! forgetting a resource ([`fencelock_core::Fence::reset`]).

use fencelock_core::{Admission, FencingToken, LockMode};
use sqlx::{Connection, Database, Encode, Executor, FromRow, IntoArguments, Type};

/// What an admission statement read back decides. Both engines' upserts
/// store `max(stored, presented)`, so for a writer the statement reads back
/// the highest token now stored, which is the presented one exactly when it
/// was admitted; for a reader it reads back the highest writer token, which
/// the reader's token had to reach (`None`, only a reader's: no writer yet).
pub fn admission(
    read_back: Option<FencingToken>,
    token: FencingToken,
    mode: LockMode,
) -> Admission {
    let Some(current) = read_back else {
        return Admission::Admitted;
    };
    let admitted = match mode {
        LockMode::Exclusive => current == token,
        LockMode::Shared => current <= token,
    };
    if admitted {
        Admission::Admitted
    } else {
        Admission::Stale { current }
    }
}

/// The transaction that resets a fence kept, as both engines keep it, in a
/// table `fences` (a row per resource with its highest `token`) and a table
/// `values` (a row per resource with the value stored by a writer's
/// admission), each keyed by `resource`.
#[derive(Clone, Debug)]
pub struct FenceReset {
    /// Reads the resource's highest token and locks its fence row.
    lock: String,
    /// Delete the resource's value and its fence row.
    forget: [String; 2],
}

impl FenceReset {
    /// The statements over the tables named `fences` and `values`, with
    /// `param` the engine's placeholder for the resource (`$1`, `?`) and
    /// `token` how the engine selects the highest token (e.g. as text).
    pub fn new(fences: &str, values: &str, param: &str, token: &str) -> Self {
        Self {
            lock: format!("SELECT {token} FROM {fences} WHERE resource = {param} FOR UPDATE"),
            forget: [values, fences].map(|t| format!("DELETE FROM {t} WHERE resource = {param}")),
        }
    }

    /// Forgets `resource` in one transaction on `conn` and answers its
    /// highest token, as the `token` expression selects it; `None` when it
    /// had no fence row.
    ///
    /// The fence row is read `FOR UPDATE` before anything is deleted. Every
    /// admission upserts that row first and stores its value while it
    /// holds the row's lock, so no admission can land between the read and
    /// the deletes: the token answered is the one forgotten, and the value
    /// goes with it. A resource without a row has nothing to forget, and
    /// the deletes are skipped: an admission committed meanwhile is not
    /// ordered by any lock this transaction holds (PostgreSQL locks no
    /// absent row), and deleting would erase half of it.
    pub async fn run<DB, T>(
        &self,
        conn: &mut DB::Connection,
        resource: &str,
    ) -> Result<Option<T>, sqlx::Error>
    where
        DB: Database,
        for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
        for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
        for<'q> &'q str: Encode<'q, DB> + Type<DB>,
        T: Send + Unpin,
        (T,): Send + Unpin + for<'r> FromRow<'r, DB::Row>,
    {
        let mut tx = conn.begin().await?;
        let had = sqlx::query_scalar::<DB, T>(&self.lock)
            .bind(resource)
            .fetch_optional(&mut *tx)
            .await?;
        if had.is_some() {
            for sql in &self.forget {
                sqlx::query::<DB>(sql)
                    .bind(resource)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(had)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_back_decides_by_mode() {
        let t = FencingToken;
        let stale = |c| Admission::Stale { current: t(c) };
        let cases = [
            (LockMode::Exclusive, Some(t(5)), t(5), Admission::Admitted),
            (LockMode::Exclusive, Some(t(7)), t(5), stale(7)),
            (LockMode::Shared, None, t(1), Admission::Admitted),
            (LockMode::Shared, Some(t(5)), t(5), Admission::Admitted),
            (LockMode::Shared, Some(t(3)), t(5), Admission::Admitted),
            (LockMode::Shared, Some(t(7)), t(5), stale(7)),
        ];
        for (mode, read_back, token, expected) in cases {
            assert_eq!(
                admission(read_back, token, mode),
                expected,
                "{mode:?} {read_back:?} {token}"
            );
        }
    }
}
