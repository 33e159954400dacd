//! The one test of the SQL fences' in-transaction form (`admit_in`,
//! DESIGN §5): the admission commits and rolls back with the caller's own
//! write, a stale token is refused before the write runs, the same holder
//! may write repeatedly, and admitting before the read prevents the lost
//! update — played out in the caller's transactions on a table of its own.
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

    // The lost update of DESIGN §5: A reads, B takes over and reads, A
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
    Ok(())
}

/// Defines `struct $name { pool: sqlx::Pool<$db>, fence: $fence }` and
/// implements [`TransactionalFence`] for it with sqlx transactions, for the
/// SQL backends built on sqlx (`$fence` is `Clone` and has
/// `admit_in(&self, &mut <$db as sqlx::Database>::Connection, &str,
/// FencingToken)`). A macro rather than generic code so that the testkit
/// does not depend on sqlx; it expands in the backend's tests, which do.
///
/// ```ignore
/// fencelock_testkit::sqlx_transactional_fence!(Transactions, sqlx::Postgres, PostgresFence);
/// txfence::fence_in_transaction(&Transactions { pool, fence }).await?;
/// ```
#[macro_export]
macro_rules! sqlx_transactional_fence {
    ($name:ident, $db:ty, $fence:ty) => {
        /// sqlx transactions on one pool, with the fence's `admit_in`.
        struct $name {
            pool: sqlx::Pool<$db>,
            fence: $fence,
        }

        const _: () = {
            struct Transaction {
                tx: sqlx::Transaction<'static, $db>,
                fence: $fence,
            }

            #[$crate::async_trait]
            impl $crate::txfence::TransactionalFence for $name {
                async fn begin(
                    &self,
                ) -> $crate::TestResult<Box<dyn $crate::txfence::FenceTransaction>> {
                    Ok(Box::new(Transaction {
                        tx: self.pool.begin().await?,
                        fence: self.fence.clone(),
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
                    self.fence.admit_in(&mut self.tx, resource, token).await
                }
                async fn execute(&mut self, sql: &str) -> $crate::TestResult {
                    sqlx::query(sql).execute(&mut *self.tx).await?;
                    Ok(())
                }
                async fn fetch_i64(&mut self, sql: &str) -> $crate::TestResult<i64> {
                    Ok(sqlx::query_scalar(sql).fetch_one(&mut *self.tx).await?)
                }
                async fn commit(self: Box<Self>) -> $crate::TestResult {
                    Ok(self.tx.commit().await?)
                }
                async fn rollback(self: Box<Self>) -> $crate::TestResult {
                    Ok(self.tx.rollback().await?)
                }
            }
        };
    };
}
