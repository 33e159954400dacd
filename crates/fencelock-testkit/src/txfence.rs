//! The one test of the SQL fences' in-transaction form (`admit_in`, I7 in
//! `docs/semantics.md`): the admission commits and rolls back with the
//! caller's own write, a stale token is refused before the write runs, the
//! same holder may write repeatedly, admitting before the read prevents the
//! lost update, and a transaction whose snapshot predates a newer admission
//! still cannot admit a stale token, at every isolation level the backend
//! allows — played out in the caller's transactions on a table of its own.
//!
//! Each SQL backend's tests implement [`TransactionalFence`] over their
//! driver (a few lines of glue: begin, `admit_in`, execute, commit) and call
//! [`fence_in_transaction`].

use std::sync::Arc;

use async_trait::async_trait;
use fencelock_core::{Error, Fence, FencingToken};

use crate::{cases::ensure, TestResult};

/// A transaction of the caller's own on a database with a fence table.
#[async_trait]
pub trait FenceTransaction: Send {
    /// The fence's in-transaction admission (`admit_in`) in this
    /// transaction.
    async fn admit(&mut self, resource: &str, token: FencingToken) -> fencelock_core::Result<()>;
    /// Runs one statement of the caller's own.
    async fn execute(&mut self, sql: &str) -> TestResult;
    /// Runs a query that returns one integer.
    async fn fetch_i64(&mut self, sql: &str) -> TestResult<i64>;
    /// Commits.
    async fn commit(self: Box<Self>) -> TestResult;
    /// Rolls back.
    async fn rollback(self: Box<Self>) -> TestResult;
}

/// A database whose fence has an in-transaction form.
#[async_trait]
pub trait TransactionalFence: Send + Sync {
    /// Starts a transaction of the caller's kind.
    async fn begin(&self) -> TestResult<Box<dyn FenceTransaction>>;
    /// Every transaction kind (isolation level) the backend's docs allow
    /// around `admit_in` in which another connection can commit an
    /// admission after this transaction has read, by the names
    /// [`TransactionalFence::begin_at`] takes.
    fn isolation_levels(&self) -> Vec<&'static str>;
    /// Starts a transaction of kind `level`, one of
    /// [`TransactionalFence::isolation_levels`].
    async fn begin_at(&self, level: &str) -> TestResult<Box<dyn FenceTransaction>>;
    /// The standalone fence over the same fence table.
    fn fence(&self) -> Arc<dyn Fence>;
}

const RESOURCE: &str = "accounts";
const BALANCE: &str = "SELECT balance FROM fenced_accounts WHERE id = 1";

/// What one holder's transaction did: admitted (and then read the balance
/// after its write), or refused.
async fn transaction(
    db: &dyn TransactionalFence,
    token: u64,
    write: Option<String>,
    commit: bool,
) -> TestResult<Result<i64, Error>> {
    let mut tx = db.begin().await?;
    if let Err(e) = tx.admit(RESOURCE, FencingToken(token)).await {
        tx.rollback().await?;
        return Ok(Err(e));
    }
    if let Some(sql) = write {
        tx.execute(&sql).await?;
    }
    let balance = tx.fetch_i64(BALANCE).await?;
    if commit {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(Ok(balance))
}

fn set_balance(value: i64) -> Option<String> {
    Some(format!(
        "UPDATE fenced_accounts SET balance = {value} WHERE id = 1"
    ))
}

async fn committed_balance(db: &dyn TransactionalFence) -> TestResult<i64> {
    let mut tx = db.begin().await?;
    let balance = tx.fetch_i64(BALANCE).await?;
    tx.rollback().await?;
    Ok(balance)
}

fn ensure_stale(result: Result<i64, Error>, presented: u64, current: u64) -> TestResult {
    match result {
        Err(Error::Stale {
            presented: p,
            current: c,
            ..
        }) if p == FencingToken(presented) && c == FencingToken(current) => Ok(()),
        other => Err(format!(
            "token {presented} after {current} was admitted gave {other:?}, expected Stale"
        )
        .into()),
    }
}

/// A transaction that read anything before another holder's admission may
/// see the database as it was then (a snapshot). Its `admit_in` must still
/// judge by the latest admitted token: refuse the stale token, or fail the
/// transaction (a serialization error), but never admit it.
async fn stale_token_after_the_snapshot(db: &dyn TransactionalFence, level: &str) -> TestResult {
    let fence = db.fence();
    let resource = format!("snapshot {level}");
    fence.admit(&resource, FencingToken(6)).await?;
    let mut tx = db.begin_at(level).await?;
    // Any read takes the snapshot (REPEATABLE READ, SERIALIZABLE, SQLite's
    // deferred transactions).
    tx.fetch_i64("SELECT COUNT(*) FROM fenced_accounts").await?;
    fence.admit(&resource, FencingToken(7)).await?;
    let verdict = tx.admit(&resource, FencingToken(6)).await;
    tx.rollback().await?;
    match verdict {
        Err(Error::Stale {
            presented, current, ..
        }) if presented == FencingToken(6) && current == FencingToken(7) => {}
        Err(Error::Backend(_)) => {}
        other => {
            return Err(format!(
                "{level}: token 6 after 7 was admitted by another holder gave {other:?}, \
                 expected Stale or a backend error"
            )
            .into())
        }
    }
    ensure!(
        fence.highest(&resource).await? == Some(FencingToken(7)),
        "{level}: highest {:?}, expected 7",
        fence.highest(&resource).await?
    );
    Ok(())
}

/// See the module docs. Creates the table `fenced_accounts` in `db`.
pub async fn fence_in_transaction(db: &dyn TransactionalFence) -> TestResult {
    let fence = db.fence();
    let mut setup = db.begin().await?;
    setup
        .execute("CREATE TABLE fenced_accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)")
        .await?;
    setup
        .execute("INSERT INTO fenced_accounts (id, balance) VALUES (1, 100)")
        .await?;
    setup.commit().await?;

    // A rolled-back first admission leaves the resource without a token.
    transaction(db, 3, set_balance(0), false).await??;
    ensure!(
        fence.highest(RESOURCE).await?.is_none(),
        "a rolled-back admission stayed: {:?}",
        fence.highest(RESOURCE).await?
    );

    // Admitted and written together; the same holder writes again.
    ensure!(
        transaction(db, 5, set_balance(150), true).await?? == 150,
        "the first write did not land"
    );
    ensure!(
        transaction(db, 5, set_balance(160), true).await?? == 160,
        "the same token could not write twice"
    );
    ensure!(
        fence.highest(RESOURCE).await? == Some(FencingToken(5)),
        "highest after commit: {:?}",
        fence.highest(RESOURCE).await?
    );

    // Rolled back: neither the admission nor the write happened.
    transaction(db, 9, set_balance(0), false).await??;
    ensure!(
        fence.highest(RESOURCE).await? == Some(FencingToken(5)),
        "a rolled-back admission stayed: {:?}",
        fence.highest(RESOURCE).await?
    );
    ensure!(
        committed_balance(db).await? == 160,
        "a rolled-back write stayed"
    );

    // A stale holder is refused before its write runs.
    ensure_stale(transaction(db, 4, set_balance(0), true).await?, 4, 5)?;
    ensure!(committed_balance(db).await? == 160, "a stale write landed");

    // The lost update of `docs/semantics.md` (I7): A reads, B takes over and reads, A
    // writes its stale increment, B writes its own. Admitting before the
    // read (in the reading transaction) is what makes A's write fail.
    let a_read = transaction(db, 10, None, true).await??;
    let b_read = transaction(db, 11, None, true).await??;
    ensure_stale(
        transaction(db, 10, set_balance(a_read + 1), true).await?,
        10,
        11,
    )?;
    transaction(db, 11, set_balance(b_read + 1), true).await??;
    let balance = committed_balance(db).await?;
    ensure!(balance == 161, "balance {balance}, expected 161");
    ensure!(
        fence.highest(RESOURCE).await? == Some(FencingToken(11)),
        "highest at the end: {:?}",
        fence.highest(RESOURCE).await?
    );

    // The standalone fence and the in-transaction form share one rule.
    ensure_stale(
        fence.admit(RESOURCE, FencingToken(10)).await.map(|()| 0),
        10,
        11,
    )?;

    for level in db.isolation_levels() {
        stale_token_after_the_snapshot(db, level).await?;
    }
    Ok(())
}

/// Defines `struct $name { pool: sqlx::Pool<$db>, fence: $fence }` and
/// implements [`TransactionalFence`] for it with plain SQL transactions on
/// pooled connections, for the SQL backends built on sqlx (`$fence` is
/// `Clone` and has `admit_in(&self, &mut <$db as sqlx::Database>::Connection,
/// &str, FencingToken)`). Each `(level, begin)` pair names an isolation level
/// and the SQL that starts a transaction at it; the first is the default. A
/// macro rather than generic code so that the testkit does not depend on
/// sqlx; it expands in the backend's tests, which do.
///
/// ```ignore
/// fencelock_testkit::sqlx_transactional_fence!(
///     Transactions, sqlx::Postgres, PostgresFence,
///     [("read committed", "BEGIN ISOLATION LEVEL READ COMMITTED")]
/// );
/// txfence::fence_in_transaction(&Transactions { pool, fence }).await?;
/// ```
#[macro_export]
macro_rules! sqlx_transactional_fence {
    ($name:ident, $db:ty, $fence:ty, [$(($level:literal, $begin:literal)),+ $(,)?]) => {
        /// Transactions on one pool, with the fence's `admit_in`.
        struct $name {
            pool: sqlx::Pool<$db>,
            fence: $fence,
        }

        const _: () = {
            const LEVELS: &[(&str, &str)] = &[$(($level, $begin)),+];

            /// A transaction on a pooled connection; a connection left
            /// inside a transaction (a failed test step) is closed, not
            /// handed to the next step.
            struct Transaction {
                conn: sqlx::pool::PoolConnection<$db>,
                fence: $fence,
                open: bool,
            }

            impl Drop for Transaction {
                fn drop(&mut self) {
                    if self.open {
                        self.conn.close_on_drop();
                    }
                }
            }

            impl Transaction {
                async fn end(mut self: Box<Self>, sql: &str) -> $crate::TestResult {
                    sqlx::Executor::execute(&mut *self.conn, sql).await?;
                    self.open = false;
                    Ok(())
                }
            }

            #[$crate::async_trait]
            impl $crate::txfence::TransactionalFence for $name {
                async fn begin(
                    &self,
                ) -> $crate::TestResult<Box<dyn $crate::txfence::FenceTransaction>> {
                    self.begin_at(LEVELS[0].0).await
                }
                fn isolation_levels(&self) -> Vec<&'static str> {
                    LEVELS.iter().map(|(level, _)| *level).collect()
                }
                async fn begin_at(
                    &self,
                    level: &str,
                ) -> $crate::TestResult<Box<dyn $crate::txfence::FenceTransaction>> {
                    let (_, begin) = LEVELS
                        .iter()
                        .find(|(name, _)| *name == level)
                        .ok_or_else(|| format!("unknown isolation level {level:?}"))?;
                    let mut conn = self.pool.acquire().await?;
                    // Text, not a prepared statement: `begin` may be two statements.
                    sqlx::Executor::execute(&mut *conn, *begin).await?;
                    Ok(Box::new(Transaction {
                        conn,
                        fence: self.fence.clone(),
                        open: true,
                    }))
                }
                fn fence(&self) -> std::sync::Arc<dyn fencelock_core::Fence> {
                    std::sync::Arc::new(self.fence.clone())
                }
            }

            #[$crate::async_trait]
            impl $crate::txfence::FenceTransaction for Transaction {
                async fn admit(
                    &mut self,
                    resource: &str,
                    token: fencelock_core::FencingToken,
                ) -> fencelock_core::Result<()> {
                    self.fence.admit_in(&mut self.conn, resource, token).await
                }
                async fn execute(&mut self, sql: &str) -> $crate::TestResult {
                    sqlx::query(sql).execute(&mut *self.conn).await?;
                    Ok(())
                }
                async fn fetch_i64(&mut self, sql: &str) -> $crate::TestResult<i64> {
                    Ok(sqlx::query_scalar(sql).fetch_one(&mut *self.conn).await?)
                }
                async fn commit(self: Box<Self>) -> $crate::TestResult {
                    self.end("COMMIT").await
                }
                async fn rollback(self: Box<Self>) -> $crate::TestResult {
                    self.end("ROLLBACK").await
                }
            }
        };
    };
}
