//! The SQLite fence, standalone and inside the caller's own transaction.

use async_trait::async_trait;
use fencelock_core::{Admission, Fence, FencedValue, FencingToken, LockMode, Result};
use rusqlite::{named_params, Connection, OptionalExtension, TransactionBehavior};

use crate::{connection::Db, error, options::SqliteOptions};

/// Fence tokens are stored as 20-digit zero-padded text so that SQLite's
/// text comparison orders the whole `u64` range correctly.
fn encode(token: FencingToken) -> String {
    format!("{:020}", token.0)
}

fn decode(text: &str) -> Result<FencingToken> {
    text.parse()
        .map_err(|_| error::corrupt(format!("fence token {text:?}")))
}

/// `writer_token` of a row whose resource has admitted readers only: below
/// every padded token in text order. (NULL is a row from before read-write
/// locks, whose highest token was a writer's.)
const NO_WRITER: &str = "";

/// The highest writer token of a row, as SQL.
const WRITER: &str = "COALESCE(fencelock_fences.writer_token, fencelock_fences.token)";

/// Applies the fence rule for a lease held in `mode` in `conn`'s current
/// transaction, if any (`docs/rwlock.md`): a writer's token must reach the
/// highest admitted in either mode and becomes the highest writer token; a
/// reader's must reach the highest writer token and raises the highest.
/// Otherwise reports the floor it missed.
///
/// This is the building block of [`SqliteFence::admit_in`] and
/// [`SqliteFence::admit_shared_in`]. It does not validate `resource`.
fn try_admit_in(
    conn: &Connection,
    resource: &str,
    token: FencingToken,
    mode: LockMode,
) -> Result<Admission> {
    let (statement, floor) = match mode {
        LockMode::Exclusive => (
            "INSERT INTO fencelock_fences (resource, token, writer_token) \
             VALUES (:resource, :token, :token) \
             ON CONFLICT (resource) DO UPDATE SET token = excluded.token, \
                 writer_token = excluded.token \
             WHERE excluded.token >= fencelock_fences.token"
                .to_owned(),
            "token",
        ),
        LockMode::Shared => (
            format!(
                "INSERT INTO fencelock_fences (resource, token, writer_token) \
                 VALUES (:resource, :token, '{NO_WRITER}') \
                 ON CONFLICT (resource) DO UPDATE \
                     SET token = max(fencelock_fences.token, excluded.token) \
                 WHERE excluded.token >= {WRITER}"
            ),
            WRITER,
        ),
    };
    let admitted = conn
        .execute(
            &statement,
            named_params! {":resource": resource, ":token": encode(token)},
        )
        .map_err(error::map)?;
    if admitted == 1 {
        return Ok(Admission::Admitted);
    }
    let current: String = conn
        .query_row(
            &format!("SELECT {floor} FROM fencelock_fences WHERE resource = ?1"),
            [resource],
            |r| r.get(0),
        )
        .map_err(error::map)?;
    Ok(Admission::Stale {
        current: decode(&current)?,
    })
}

/// A fence kept in a SQLite database: table `fencelock_fences(resource,
/// token)`, and `fencelock_fence_values(resource, token, value)` for its
/// fenced values, written in the admission's transaction.
///
/// Two ways to use it:
///
/// - standalone, through the [`Fence`] trait, when the protected resource is
///   elsewhere;
/// - **inside your own transaction** with [`SqliteFence::admit_in`], when the
///   protected data lives in the same SQLite database: the fence check and
///   your write then commit (or roll back) together.
///
/// ```
/// use fencelock_core::FencingToken;
/// use fencelock_sqlite::{ensure_schema, SqliteFence};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = rusqlite::Connection::open_in_memory()?;
/// ensure_schema(&conn)?;
/// conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT)")?;
///
/// let token = FencingToken(42); // from guard.token()
/// let tx = conn.transaction()?;
/// SqliteFence::admit_in(&tx, "orders", token)?; // before reading
/// tx.execute("INSERT INTO orders (id, status) VALUES (123, 'paid')", [])?;
/// tx.commit()?;
/// # Ok(())
/// # }
/// ```
///
/// For a fence per row rather than per resource, keep the token in a column
/// of your own table and make every write conditional on it:
/// `UPDATE orders SET status = ?, fence = ?t WHERE id = ? AND fence <= ?t`;
/// zero changed rows means a newer holder has written.
#[derive(Clone, Debug)]
pub struct SqliteFence {
    db: Db,
}

impl SqliteFence {
    /// Opens (and if needed creates) the fence tables in the database of a
    /// `sqlite://PATH` URL.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(SqliteOptions::from_url(url)?).await
    }

    /// Opens (and if needed creates) the fence tables in the database.
    pub async fn connect_with(options: SqliteOptions) -> Result<Self> {
        Ok(Self {
            db: Db::open(&options).await?,
        })
    }

    /// Admits `token` for `resource` inside the transaction open on `conn`
    /// (a `rusqlite::Transaction` derefs to a `Connection`), or fails with
    /// [`fencelock_core::Error::Stale`]. Call [`crate::ensure_schema`] on the
    /// database once beforehand.
    pub fn admit_in(conn: &Connection, resource: &str, token: FencingToken) -> Result<()> {
        Self::admit_shared_in(conn, resource, token, LockMode::Exclusive)
    }

    /// Admits `token` of a lease held in `mode` (a read-write lock's reader
    /// or writer, see [`Fence::admit_shared`]) inside the transaction open
    /// on `conn`, or fails with [`fencelock_core::Error::Stale`].
    pub fn admit_shared_in(
        conn: &Connection,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<()> {
        fencelock_core::LockKey::new(resource)?;
        try_admit_in(conn, resource, token, mode)?.into_result("sqlite", resource, token)
    }
}

#[async_trait]
impl Fence for SqliteFence {
    fn name(&self) -> &'static str {
        error::NAME
    }

    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission> {
        self.try_admit_as(resource, token, LockMode::Exclusive)
            .await
    }

    fn shared(&self) -> bool {
        true
    }

    async fn highest_writer(&self, resource: &str) -> Result<Option<FencingToken>> {
        let resource = resource.to_owned();
        self.db
            .call(move |conn| {
                conn.query_row(
                    &format!("SELECT {WRITER} FROM fencelock_fences WHERE resource = ?1"),
                    [&resource],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(error::map)?
                .filter(|t| t != NO_WRITER)
                .map(|t| decode(&t))
                .transpose()
            })
            .await
    }

    async fn try_admit_as(
        &self,
        resource: &str,
        token: FencingToken,
        mode: LockMode,
    ) -> Result<Admission> {
        let resource = resource.to_owned();
        self.db
            .call(move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(error::map)?;
                let admission = try_admit_in(&tx, &resource, token, mode)?;
                tx.commit().map_err(error::map)?;
                Ok(admission)
            })
            .await
    }

    fn values(&self) -> bool {
        true
    }

    async fn try_admit_value(
        &self,
        resource: &str,
        token: FencingToken,
        value: &[u8],
    ) -> Result<Admission> {
        let (resource, value) = (resource.to_owned(), value.to_vec());
        self.db
            .call(move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(error::map)?;
                let admission = try_admit_in(&tx, &resource, token, LockMode::Exclusive)?;
                if admission == Admission::Admitted {
                    tx.execute(
                        "INSERT OR REPLACE INTO fencelock_fence_values (resource, token, value) \
                         VALUES (:resource, :token, :value)",
                        named_params! {
                            ":resource": resource, ":token": encode(token), ":value": value
                        },
                    )
                    .map_err(error::map)?;
                }
                tx.commit().map_err(error::map)?;
                Ok(admission)
            })
            .await
    }

    async fn reset(&self, resource: &str) -> Result<Option<FencingToken>> {
        let resource = resource.to_owned();
        self.db
            .call(move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(error::map)?;
                let had = highest_in(&tx, &resource)?;
                for table in ["fencelock_fences", "fencelock_fence_values"] {
                    tx.execute(
                        &format!("DELETE FROM {table} WHERE resource = ?1"),
                        [&resource],
                    )
                    .map_err(error::map)?;
                }
                tx.commit().map_err(error::map)?;
                Ok(had)
            })
            .await
    }

    async fn read_value(&self, resource: &str) -> Result<Option<FencedValue>> {
        let resource = resource.to_owned();
        self.db
            .call(move |conn| {
                conn.query_row(
                    "SELECT token, value FROM fencelock_fence_values WHERE resource = ?1",
                    [&resource],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?)),
                )
                .optional()
                .map_err(error::map)?
                .map(|(token, value)| Ok(FencedValue::new(decode(&token)?, value)))
                .transpose()
            })
            .await
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        let resource = resource.to_owned();
        self.db.call(move |conn| highest_in(conn, &resource)).await
    }
}

/// The highest token `resource`'s fence has admitted, read on `conn` (a
/// transaction's too).
fn highest_in(conn: &rusqlite::Connection, resource: &str) -> Result<Option<FencingToken>> {
    conn.query_row(
        "SELECT token FROM fencelock_fences WHERE resource = ?1",
        [resource],
        |r| r.get::<_, String>(0),
    )
    .optional()
    .map_err(error::map)?
    .map(|t| decode(&t))
    .transpose()
}
