//! The SQLite fence, standalone and inside the caller's own transaction.

use async_trait::async_trait;
use fencelock_core::{Admission, Fence, FencingToken, Result};
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

/// Applies the I7 rule in `conn`'s current transaction, if any: admits
/// `token` for `resource` when it is at least the highest admitted and
/// records it; otherwise reports the highest.
///
/// This is the building block of [`SqliteFence::admit_in`]. It does not
/// validate `resource`; use `admit_in` unless you already have.
fn try_admit_in(conn: &Connection, resource: &str, token: FencingToken) -> Result<Admission> {
    let admitted = conn
        .execute(
            "INSERT INTO fencelock_fences (resource, token) VALUES (:resource, :token) \
             ON CONFLICT (resource) DO UPDATE SET token = excluded.token \
             WHERE excluded.token >= fencelock_fences.token",
            named_params! {":resource": resource, ":token": encode(token)},
        )
        .map_err(error::map)?;
    if admitted == 1 {
        return Ok(Admission::Admitted);
    }
    let current: String = conn
        .query_row(
            "SELECT token FROM fencelock_fences WHERE resource = ?1",
            [resource],
            |r| r.get(0),
        )
        .map_err(error::map)?;
    Ok(Admission::Stale {
        current: decode(&current)?,
    })
}

/// A fence kept in a SQLite database: table `fencelock_fences(resource,
/// token)`.
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
        fencelock_core::LockKey::new(resource)?;
        try_admit_in(conn, resource, token)?.into_result("sqlite", resource, token)
    }
}

#[async_trait]
impl Fence for SqliteFence {
    fn name(&self) -> &'static str {
        error::NAME
    }

    async fn try_admit(&self, resource: &str, token: FencingToken) -> Result<Admission> {
        let resource = resource.to_owned();
        self.db
            .call(move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(error::map)?;
                let admission = try_admit_in(&tx, &resource, token)?;
                tx.commit().map_err(error::map)?;
                Ok(admission)
            })
            .await
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        let resource = resource.to_owned();
        self.db
            .call(move |conn| {
                conn.query_row(
                    "SELECT token FROM fencelock_fences WHERE resource = ?1",
                    [&resource],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(error::map)?
                .map(|t| decode(&t))
                .transpose()
            })
            .await
    }
}
