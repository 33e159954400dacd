//! MariaDB-specific tests beyond the conformance suite, against one
//! throwaway server: concurrent schema creation, the in-transaction fence,
//! token draws serialised per key, and password-free URL errors. (Racing
//! acquirers are the conformance suite's and the CLI tests' job.)
//!
//! Time: the tests run against a real server (or, for connect timeouts, a
//! real socket that never answers), so none can run on tokio's paused
//! clock. Each measures a [`Patience`] first (scheduling delay and, where
//! there is a server, a `SELECT 1` round trip) and takes every short TTL,
//! pool and statement timeout in its URLs, wait and deadline from a base
//! figure (the floor) times its factor; failures name the patience. TTLs
//! of 30 s or more that only have to outlive a few statements are left as
//! they are: a stall that long is not a busy machine. Waits for a short
//! lease to end are lower bounds (its scaled TTL and a margin), which a
//! busy machine only lengthens.

use std::{sync::Arc, time::Duration};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, Driver, Error, Fence, FencingToken, LeaseId, LockKey,
    LockMode, Owner, Renewal,
};
use fencelock_mysql::{MySqlBackend, MySqlFence};
use fencelock_testkit::{
    patience::ms, servers::mariadb::MariaDbServer, sql, timeouts, txfence, Patience, TestResult,
};

/// The budget of the tests against the server at `base`: the machine's
/// scheduling delay and the worst `SELECT 1` round trip.
async fn patience(base: &str) -> TestResult<Patience> {
    let pool = sqlx::MySqlPool::connect(base).await?;
    Ok(Patience::with_round_trip(|| async {
        // A failed statement is a round trip too.
        let _ = sqlx::query("SELECT 1").execute(&pool).await;
    })
    .await)
}

fn request(key: &str, owner: &str, ttl: Duration) -> TestResult<AcquireRequest> {
    Ok(AcquireRequest::new(
        LockKey::new(key)?,
        Owner::new(owner)?,
        ttl,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_specific() -> TestResult {
    let server = tokio::task::spawn_blocking(MariaDbServer::start).await??;
    let base = server.url("mysql");
    let result = async {
        let p = patience(&base).await?;
        concurrent_schema_creation(&base).await?;
        fence_in_transaction(&base).await?;
        a_token_drawn_while_waiting_for_the_key_is_overtaken(&base, p).await?;
        a_clients_time_zone_does_not_move_leases(&base).await?;
        a_batch_on_one_session_answers_each_renewal_for_itself(&base, p).await?;
        a_floor_raises_the_counter_and_never_lowers_it(&base).await?;
        the_counters_end_is_a_typed_error_on_the_key(&base).await?;
        a_waiting_statement_times_out_and_the_pool_recovers(&base, p).await?;
        tables_from_before_read_write_locks_are_upgraded(&base).await
    }
    .await;
    tokio::task::spawn_blocking(move || drop(server)).await?;
    result
}

/// Granted token of `key` for `owner`.
async fn grant(backend: &MySqlBackend, key: &str, owner: &str, ttl: Duration) -> TestResult<u64> {
    match backend.try_acquire(&request(key, owner, ttl)?).await? {
        Acquire::Granted(g) => Ok(g.token.get()),
        held => Err(format!("{key} not granted: {held:?}").into()),
    }
}

/// At `FencingToken::MAX` the counter ends with a typed error on the key
/// asked for (`fencelock_testkit::sql`). It used to run on to `u64::MAX`
/// and then fail every acquisition with an overflow.
async fn the_counters_end_is_a_typed_error_on_the_key(base: &str) -> TestResult {
    let backend = MySqlBackend::connect(&format!("{base}?table_prefix=end_")).await?;
    let others = &sqlx::MySqlPool::connect(base).await?;
    sql::the_counters_end_is_a_typed_error(
        &backend,
        |last| async move {
            sqlx::query("UPDATE end_counter SET v = ?")
                .bind(last)
                .execute(others)
                .await?;
            Ok(())
        },
        || async move {
            Ok(sqlx::query_scalar("SELECT v FROM end_counter")
                .fetch_one(others)
                .await?)
        },
    )
    .await
}

/// Batches on one session (a pool of one): the stamp the first batch left
/// in the session does not make a later batch's expired lease read as
/// renewed; a lease named twice is extended once and answered twice; a
/// lease of another key is untouched. The short leases (a base of 600 ms)
/// must live from their grant to the batch that renews them, and end
/// before the waits (the TTL and a margin) that follow.
async fn a_batch_on_one_session_answers_each_renewal_for_itself(
    base: &str,
    p: Patience,
) -> TestResult {
    let url = format!("{base}?table_prefix=batch_&pool_max=1");
    let backend = MySqlBackend::connect(&url).await?;
    let short = p.ttl(Duration::from_millis(600));
    let past_short = short + p.bound(Duration::from_millis(300));
    let long = Duration::from_secs(600);
    let t = grant(&backend, "short", "o", short).await?;
    let short_lease = LeaseId::new(LockKey::new("short")?, Owner::new("o")?, FencingToken(t));
    let first = backend
        .renew_many(&[Renewal::new(short_lease.clone(), short)])
        .await?;
    assert!(
        first.iter().all(Result::is_ok),
        "a {short:?} lease renewed at once: {first:?} ({p})"
    );
    tokio::time::sleep(past_short).await;
    let again = backend
        .renew_many(&[Renewal::new(short_lease.clone(), long)])
        .await?;
    assert!(
        matches!(again.as_slice(), [Err(Error::NotHeld { .. })]),
        "an expired lease renewed: {again:?}"
    );
    let t = grant(&backend, "twice", "o", short).await?;
    let other = grant(&backend, "other", "x", short).await?;
    let twice = LeaseId::new(LockKey::new("twice")?, Owner::new("o")?, FencingToken(t));
    let answers = backend
        .renew_many(&[
            Renewal::new(twice.clone(), long),
            Renewal::new(short_lease, long),
            Renewal::new(twice, long),
        ])
        .await?;
    assert!(
        matches!(
            answers.as_slice(),
            [Ok(_), Err(Error::NotHeld { .. }), Ok(_)]
        ),
        "{answers:?} ({p})"
    );
    tokio::time::sleep(past_short).await;
    let twice_info = backend.inspect(&LockKey::new("twice")?).await?;
    assert!(
        twice_info.is_some_and(|i| i.token.get() == t),
        "twice not extended"
    );
    let other_info = backend.inspect(&LockKey::new("other")?).await?;
    assert!(
        other_info.is_none(),
        "other was extended: {other_info:?} ({other})"
    );
    Ok(())
}

/// A floor above the counter raises it; a floor below it changes nothing
/// (the draw is `GREATEST(v, floor) + 1`), so the next token of any key is
/// above both, for writers and readers alike.
async fn a_floor_raises_the_counter_and_never_lowers_it(base: &str) -> TestResult {
    let url = format!("{base}?table_prefix=floors_");
    let backend = MySqlBackend::connect(&url).await?;
    let ttl = Duration::from_secs(60);
    let high = backend
        .try_acquire(&request("a", "o", ttl)?.with_min_token(Some(FencingToken(5_000_000))))
        .await?;
    let Acquire::Granted(high) = high else {
        return Err(format!("a not granted: {high:?}").into());
    };
    assert!(high.token.get() > 5_000_000, "{high:?}");
    let low = backend
        .try_acquire(&request("b", "o", ttl)?.with_min_token(Some(FencingToken(10))))
        .await?;
    let Acquire::Granted(low) = low else {
        return Err(format!("b not granted: {low:?}").into());
    };
    assert!(
        low.token > high.token,
        "a low floor lowered the sequence: {low:?}"
    );
    let plain = grant(&backend, "c", "o", ttl).await?;
    assert!(plain > low.token.get(), "{plain} after {low:?}");
    let reader = backend
        .try_acquire(
            &request("e", "o", ttl)?
                .with_min_token(Some(FencingToken(9_000_000)))
                .with_mode(LockMode::Shared),
        )
        .await?;
    let Acquire::Granted(reader) = reader else {
        return Err(format!("e not granted: {reader:?}").into());
    };
    assert!(reader.token.get() > 9_000_000, "{reader:?}");
    let after = grant(&backend, "f", "o", ttl).await?;
    assert!(after > reader.token.get(), "{after} after {reader:?}");
    let refused = backend
        .try_acquire(&request("d", "o", ttl)?.with_min_token(Some(FencingToken(u64::MAX))))
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    Ok(())
}

/// An acquisition draws its token only once it holds the key's turn (a
/// named lock kept until the previous acquisition committed), so a token
/// drawn by someone else meanwhile is always below the one it gets (I2).
async fn a_token_drawn_while_waiting_for_the_key_is_overtaken(
    base: &str,
    p: Patience,
) -> TestResult {
    use sqlx::{Acquire as _, Row as _};
    let url = format!("{base}?table_prefix=turn_");
    let backend = Arc::new(MySqlBackend::connect(&url).await?);
    let slow = sqlx::MySqlPool::connect(base).await?;
    let mut slow = slow.acquire().await?;
    let slow = slow.acquire().await?;
    // Stand in for an acquisition of `k` that holds its turn.
    let turn = "CONCAT('fencelock:', MD5(CONCAT('turn_locks', CHAR(0), 'k')))";
    let got: i64 = sqlx::query_scalar(&format!("SELECT GET_LOCK({turn}, 5)"))
        .fetch_one(&mut *slow)
        .await?;
    assert_eq!(got, 1);
    let rival = {
        let backend = Arc::clone(&backend);
        tokio::spawn(async move {
            backend
                .try_acquire(&request("k", "rival", Duration::from_secs(30))?)
                .await
                .map_err(Into::into)
        })
    };
    let deadline = tokio::time::Instant::now() + p.bound(Duration::from_secs(10));
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'",
        )
        .fetch_one(&mut *slow)
        .await?;
        if waiting > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rival never waited for the key's turn ({p})"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sqlx::query("UPDATE turn_counter SET v = LAST_INSERT_ID(v + 1) WHERE id = 1")
        .execute(&mut *slow)
        .await?;
    let drawn_meanwhile: u64 = sqlx::query("SELECT LAST_INSERT_ID() AS t")
        .fetch_one(&mut *slow)
        .await?
        .try_get("t")?;
    sqlx::query(&format!("DO RELEASE_LOCK({turn})"))
        .execute(&mut *slow)
        .await?;
    let granted: TestResult<Acquire> = rival.await?;
    match granted? {
        Acquire::Granted(g) => assert!(
            g.token.get() > drawn_meanwhile,
            "{} <= {drawn_meanwhile}",
            g.token
        ),
        held => panic!("the free key was not granted: {held:?}"),
    }
    Ok(())
}

/// Leases compare DATETIME(6) values with NOW(6), which follow the session's
/// time zone: a client asking for another zone in its URL must still see
/// and respect a lease taken by a client in the default zone.
async fn a_clients_time_zone_does_not_move_leases(base: &str) -> TestResult {
    let default = MySqlBackend::connect(&format!("{base}?table_prefix=tz_")).await?;
    let shifted =
        MySqlBackend::connect(&format!("{base}?table_prefix=tz_&timezone=-02:00")).await?;
    let taken = shifted
        .try_acquire(&request("k", "shifted", Duration::from_secs(60))?)
        .await?;
    assert!(matches!(taken, Acquire::Granted(_)), "{taken:?}");
    let rival = default
        .try_acquire(&request("k", "default", Duration::from_secs(60))?)
        .await?;
    assert!(
        matches!(rival, Acquire::Held(_)),
        "a 60 s lease from another time zone was taken: {rival:?}"
    );
    Ok(())
}

/// Tables made before read-write locks (no readers table, no reader or
/// intent columns, a fence without a writer token) and tokens from a
/// MariaDB sequence (before the counter) are upgraded on connect: a live
/// lease stays a writer that keeps readers out, an admitted fence token
/// counts as a writer's, the sequence is retired (a process of the old
/// version fails instead of drawing from it) and the counter goes on above
/// every value it issued.
async fn tables_from_before_read_write_locks_are_upgraded(base: &str) -> TestResult {
    let text = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin";
    let others = sqlx::MySqlPool::connect(base).await?;
    for ddl in [
        "CREATE SEQUENCE rw2_tokens ENGINE=InnoDB".to_owned(),
        // Issued up to 1000 already; a token left in no table.
        "SELECT SETVAL(rw2_tokens, 1000)".to_owned(),
        format!(
            "CREATE TABLE rw2_locks (`key` {text} NOT NULL PRIMARY KEY, owner {text} NOT NULL,
               token BIGINT UNSIGNED NOT NULL, kind {text} NULL, data JSON NULL,
               acquired_at DATETIME(6) NOT NULL, expires_at DATETIME(6) NOT NULL,
               updated_at DATETIME(6) NOT NULL) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE rw2_fences (resource {text} NOT NULL PRIMARY KEY,
               token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
        ),
        "INSERT INTO rw2_locks VALUES ('old', 'someone', NEXTVAL(rw2_tokens), NULL, NULL,
           NOW(6), NOW(6) + INTERVAL 1 MINUTE, NOW(6))"
            .to_owned(),
        "INSERT INTO rw2_fences VALUES ('orders', 7)".to_owned(),
    ] {
        sqlx::query(&ddl).execute(&others).await?;
    }
    let url = format!("{base}?table_prefix=rw2_");
    let backend = MySqlBackend::connect(&url).await?;
    let reader = request("old", "reader", Duration::from_secs(60))?;
    match backend
        .try_acquire(&reader.clone().with_mode(LockMode::Shared))
        .await?
    {
        Acquire::Held(Some(writer)) => assert_eq!(writer.owner.as_str(), "someone"),
        other => return Err(format!("a reader beside the old lease: {other:?}").into()),
    }
    let reader = request("fresh", "reader", Duration::from_secs(60))?;
    assert!(matches!(
        backend.try_acquire(&reader.clone().with_mode(LockMode::Shared)).await?,
        Acquire::Granted(g) if g.token.get() > 1001
    ));
    assert!(grant(&backend, "new", "o", Duration::from_secs(60)).await? > 1001);
    let old_version = sqlx::query("SELECT NEXTVAL(rw2_tokens)")
        .execute(&others)
        .await;
    assert!(old_version.is_err(), "the sequence still issues tokens");
    let fence = MySqlFence::connect(&url).await?;
    assert_eq!(fence.highest_writer("orders").await?, Some(FencingToken(7)));
    let stale = fence
        .admit_shared("orders", FencingToken(6), LockMode::Shared)
        .await;
    assert!(matches!(stale, Err(Error::Stale { current, .. }) if current == FencingToken(7)));
    fence
        .admit_shared("orders", FencingToken(8), LockMode::Shared)
        .await?;
    assert_eq!(fence.highest_writer("orders").await?, Some(FencingToken(7)));
    assert_eq!(fence.highest("orders").await?, Some(FencingToken(8)));
    Ok(())
}

async fn concurrent_schema_creation(base: &str) -> TestResult {
    sql::concurrent_schema_creation(
        base,
        |url| async move { MySqlBackend::connect(&url).await },
        |url| async move { MySqlFence::connect(&url).await },
    )
    .await
}

/// A statement kept waiting on a row lock gives up after `op_timeout`, and
/// the abandoned connection does not stay in the pool (of one).
async fn a_waiting_statement_times_out_and_the_pool_recovers(
    base: &str,
    p: Patience,
) -> TestResult {
    let op_timeout = p.bound(Duration::from_secs(1));
    let backend = MySqlBackend::connect(&format!(
        "{base}?table_prefix=tmo_&pool_max=1&acquire_timeout={0}&op_timeout={0}",
        ms(op_timeout)
    ))
    .await?;
    let others = sqlx::MySqlPool::connect(base).await?;
    let hold: timeouts::HoldRow = Box::new(move |key| {
        Box::pin(async move {
            let mut tx = others.begin().await?;
            sqlx::query("SELECT 1 FROM tmo_locks WHERE `key` = ? FOR UPDATE")
                .bind(key)
                .execute(&mut *tx)
                .await?;
            Ok(Box::new(tx) as Box<dyn Send>)
        })
    });
    timeouts::a_waiting_statement_times_out_and_the_pool_recovers(&backend, op_timeout, hold)
        .await
        .map_err(|e| format!("{e} ({p})").into())
}

/// An unknown user (1045, SQLSTATE 28000) is `unauthorized` at once, and
/// an unknown host fails as soon as the resolver says so
/// (`fencelock_testkit::refusals`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_answered_at_once() -> TestResult {
    let server = tokio::task::spawn_blocking(MariaDbServer::start).await??;
    let port = server.port();
    // The test kit's server skips the grant tables; this loads them, so
    // that passwords are checked from now on.
    sqlx::query("FLUSH PRIVILEGES")
        .execute(&sqlx::MySqlPool::connect(&server.url("mysql")).await?)
        .await?;
    let open = |url: String| async move { MySqlBackend::connect(&url).await };
    fencelock_testkit::refusals::refused_credentials_are_unauthorized_at_once(
        &[
            (
                "unknown user",
                format!("mysql://nobody:secret-pw@127.0.0.1:{port}/mysql"),
            ),
            (
                "wrong password",
                format!("mysql://root:secret-pw@127.0.0.1:{port}/mysql"),
            ),
        ],
        &["secret-pw"],
        open,
    )
    .await?;
    fencelock_testkit::refusals::an_unknown_host_fails_when_the_resolver_answers(
        |host| format!("mysql://u@{host}:3306/db"),
        open,
    )
    .await
}

/// Connecting to a server that accepts and never answers gives up after
/// `connect_timeout` (a base of 1 s).
#[tokio::test]
async fn connecting_to_a_silent_server_gives_up_in_time() -> TestResult {
    let p = Patience::measure().await;
    let limit = p.bound(Duration::from_secs(1));
    timeouts::connecting_to_a_silent_server_fails_in_time(
        limit,
        |port| {
            format!(
                "mysql://u@127.0.0.1:{port}/db?connect_timeout={}",
                ms(limit)
            )
        },
        |url| async move { MySqlBackend::connect(&url).await },
    )
    .await
    .map_err(|e| format!("{e} ({p})").into())
}

/// The in-transaction fence, through the testkit's one test of it.
async fn fence_in_transaction(base: &str) -> TestResult {
    let url = format!("{base}?table_prefix=txfence_");
    let fence = MySqlFence::connect(&url).await?;
    txfence::fence_in_transaction(&Transactions {
        pool: sqlx::MySqlPool::connect(base).await?,
        fence,
    })
    .await
}

// `SET TRANSACTION` without `SESSION` applies to the next transaction only,
// so pooled connections keep the server's default.
fencelock_testkit::sqlx_transactional_fence!(
    Transactions,
    sqlx::MySql,
    MySqlFence,
    [
        (
            "repeatable read",
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION"
        ),
        (
            "read committed",
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION"
        ),
        (
            "read uncommitted",
            "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED; START TRANSACTION"
        ),
        (
            "serializable",
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; START TRANSACTION"
        ),
    ]
);

#[tokio::test]
async fn malformed_urls_hide_the_password() -> TestResult {
    sql::malformed_urls_hide_the_password(
        &[
            "mysql://u:hunter2@localhost/db?table_prefix=Bad-Name",
            "mariadb://u:hunter2@localhost/db?pool_max=-1",
            "postgres://u:hunter2@localhost/db",
            "mysql://u:hunter2@[::1/db",
        ],
        "hunter2",
        |url| async move { fencelock_mysql::MySqlDriver.open_backend(&url).await },
    )
    .await
}
