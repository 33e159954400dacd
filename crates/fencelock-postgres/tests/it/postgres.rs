//! PostgreSQL-specific tests beyond the conformance suite, against one
//! throwaway server: concurrent schema creation, the in-transaction fence,
//! token draws serialised per key, and password-free URL errors. (Racing
//! acquirers are the conformance suite's and the CLI tests' job.)
//!
//! Time: the tests run against a real server (or, for connect timeouts, a
//! real socket that never answers), so none can run on tokio's paused
//! clock. Each measures a [`Patience`] first (scheduling delay and, where
//! there is a server, a `SELECT 1` round trip) and takes every pool and
//! statement timeout in its URLs, wait and deadline from a base figure (the
//! floor) times its factor; failures name the patience. TTLs of 30 s or
//! more that only have to outlive a few statements are left as they are:
//! a stall that long is not a busy machine. The 500 ms during which b's
//! waiter must stay asleep only asserts that nothing happens, which a busy
//! machine cannot make fail.

use std::{sync::Arc, time::Duration};

use fencelock_core::{
    Acquire, AcquireRequest, Backend, Driver, Error, Fence, FencingToken, LeaseId, LockKey,
    LockMode, Owner,
};
use fencelock_postgres::{PostgresBackend, PostgresFence};
use fencelock_testkit::{
    patience::ms, servers::postgres::PostgresServer, sql, timeouts, txfence, Patience, TestResult,
};

/// The budget of the tests against the server at `base`: the machine's
/// scheduling delay and the worst `SELECT 1` round trip.
async fn patience(base: &str) -> TestResult<Patience> {
    let pool = sqlx::PgPool::connect(base).await?;
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
async fn postgres_specific() -> TestResult {
    let server = tokio::task::spawn_blocking(PostgresServer::start).await??;
    let base = server.url("postgres");
    let result = async {
        let p = patience(&base).await?;
        concurrent_schema_creation(&base).await?;
        fence_in_transaction(&base).await?;
        tokens_are_drawn_only_when_the_key_is_ours_to_take(&base, p).await?;
        a_pool_of_one_still_works_and_wakes_waiters(&base, p).await?;
        closing_many_leases_does_not_queue_them_past_the_pools_timeout(&base, p).await?;
        a_release_wakes_the_waiters_of_its_key_only(&base, p).await?;
        floors_and_plain_draws_racing_keep_tokens_unique_and_growing(&base).await?;
        a_waiting_statement_times_out_and_the_pool_recovers(&base, p).await?;
        a_new_client_does_not_queue_behind_a_transaction_on_the_locks_table(&base, p).await?;
        a_schema_with_jsonb_data_is_upgraded(&base).await?;
        a_schema_from_before_read_write_locks_is_upgraded(&base).await?;
        the_sequences_end_is_a_typed_error_on_the_key(&base).await
    }
    .await;
    tokio::task::spawn_blocking(move || drop(server)).await?;
    result
}

/// Two backends initialising the same fresh prefix at once both succeed.
async fn concurrent_schema_creation(base: &str) -> TestResult {
    sql::concurrent_schema_creation(
        base,
        |url| async move { PostgresBackend::connect(&url).await },
        |url| async move { PostgresFence::connect(&url).await },
    )
    .await
}

/// An acquisition draws its token only after it holds the key's advisory
/// lock, which the acquisition before it keeps until it commits. Otherwise a
/// token drawn before the row exists could be overtaken by a rival's whole
/// acquire-and-release, and the insert that follows would carry a token
/// lower than one already issued (I2).
async fn tokens_are_drawn_only_when_the_key_is_ours_to_take(base: &str, p: Patience) -> TestResult {
    let url = format!("{base}?table_prefix=order_");
    let backend = Arc::new(PostgresBackend::connect(&url).await?);
    let pool = sqlx::PgPool::connect(base).await?;
    let last_value = || async {
        sqlx::query_scalar::<_, i64>("SELECT last_value FROM order_tokens")
            .fetch_one(&pool)
            .await
    };
    // Stand in for a slow acquisition of `k` that is between its draw and
    // its commit.
    let mut slow = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('order_locks'), hashtext('k'))")
        .execute(&mut *slow)
        .await?;
    let before = last_value().await?;
    let rival = {
        let backend = Arc::clone(&backend);
        tokio::spawn(async move {
            backend
                .try_acquire(&request("k", "rival", Duration::from_secs(30))?)
                .await
                .map_err(Into::into)
        })
    };
    // Wait (bounded) until the rival is queued on the advisory lock.
    let deadline = tokio::time::Instant::now() + p.bound(Duration::from_secs(10));
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        )
        .fetch_one(&pool)
        .await?;
        if waiting > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rival never waited for the key's lock ({p})"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        last_value().await?,
        before,
        "the rival drew a token before it could take the key"
    );
    slow.commit().await?;
    let granted: TestResult<Acquire> = rival.await?;
    assert!(matches!(granted?, Acquire::Granted(_)));
    Ok(())
}

/// The LISTEN session has a connection of its own: a backend whose pool has
/// a single connection still runs lock statements and wakes its waiters.
async fn a_pool_of_one_still_works_and_wakes_waiters(base: &str, p: Patience) -> TestResult {
    let url = format!(
        "{base}?table_prefix=one_&pool_max=1&acquire_timeout={}",
        ms(p.bound(Duration::from_secs(2)))
    );
    let backend: Arc<dyn Backend> = Arc::new(PostgresBackend::connect(&url).await?);
    let holder = fencelock_core::LockClient::builder(Arc::clone(&backend))
        .owner(Owner::new("holder")?)
        .build()?;
    let waiter = fencelock_core::LockClient::builder(backend)
        .owner(Owner::new("waiter")?)
        .build()?;
    let held = holder
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await?;
    held.renew().await?;
    let waiting = tokio::spawn(async move {
        waiter
            .lock("k")
            .ttl(Duration::from_secs(30))
            .wait(p.bound(Duration::from_secs(20)))
            .acquire()
            .await
    });
    held.release().await?;
    let next = waiting
        .await?
        .map_err(|e| format!("the waiter behind the release: {e} ({p})"))?;
    next.release().await?;
    Ok(())
}

/// `LockClient::close` frees thousands of leases through a pool of two
/// connections whose checkout gives up after a second (a base figure): the
/// releases must not all wait for a connection at once (each would spend
/// its checkout time in the queue), so every one succeeds and no lease is
/// left. The releases slow down on a busy machine by about the factor the
/// timeouts grow by, so queueing them all still overruns the checkout.
async fn closing_many_leases_does_not_queue_them_past_the_pools_timeout(
    base: &str,
    p: Patience,
) -> TestResult {
    const LEASES: usize = 2_000;
    let timeout = ms(p.bound(Duration::from_secs(1)));
    let url = format!(
        "{base}?table_prefix=close_&pool_max=2&acquire_timeout={timeout}&op_timeout={timeout}"
    );
    let backend: Arc<dyn Backend> = Arc::new(PostgresBackend::connect(&url).await?);
    let client = fencelock_core::LockClient::builder(Arc::clone(&backend))
        .owner(Owner::new("closer")?)
        .build()?;
    let mut guards = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        let lock = client
            .lock(format!("close-{i}"))
            .ttl(Duration::from_secs(60));
        guards.push(lock.acquire().await?);
    }
    client
        .close()
        .await
        .map_err(|e| format!("closing {LEASES} leases: {e} ({p})"))?;
    let left = backend.administer()?.list(Some("close-")).await?;
    assert!(
        left.is_empty(),
        "{} leases left after close ({p})",
        left.len()
    );
    Ok(())
}

/// Takes and releases `key` once as `owner`; returns the token.
async fn cycle(
    backend: &PostgresBackend,
    key: &str,
    owner: &str,
    floor: Option<u64>,
) -> TestResult<u64> {
    let request =
        request(key, owner, Duration::from_secs(60))?.with_min_token(floor.map(FencingToken));
    let Acquire::Granted(grant) = backend.try_acquire(&request).await? else {
        return Err(format!("{key} not granted").into());
    };
    backend
        .release(&LeaseId::new(
            LockKey::new(key)?,
            Owner::new(owner)?,
            grant.token,
        ))
        .await?;
    Ok(grant.token.get())
}

/// Releases of one key do not wake the waiters of another (each key has its
/// own channel), and do wake the waiters of their own.
async fn a_release_wakes_the_waiters_of_its_key_only(base: &str, p: Patience) -> TestResult {
    let url = format!("{base}?table_prefix=wake_");
    let waiter = PostgresBackend::connect(&url).await?;
    let releaser = PostgresBackend::connect(&url).await?;
    let (a, b) = (LockKey::new("a")?, LockKey::new("b")?);
    let mut on_a = waiter.subscribe(&a).await?.ok_or("no subscription on a")?;
    let mut on_b = waiter.subscribe(&b).await?.ok_or("no subscription on b")?;
    for _ in 0..20 {
        cycle(&releaser, "a", "o", None).await?;
    }
    let woken_a = tokio::time::timeout(p.bound(Duration::from_secs(10)), on_a.woken()).await;
    assert!(matches!(woken_a, Ok(true)), "a's waiter: {woken_a:?} ({p})");
    // a's waiter was woken, so a's notices have been read; b's waiter has
    // had every chance to see one by mistake.
    let woken_b = tokio::time::timeout(Duration::from_millis(500), on_b.woken()).await;
    assert!(
        woken_b.is_err(),
        "a's releases woke b's waiter: {woken_b:?}"
    );
    Ok(())
}

/// Acquirers of different keys, some with floors, race: every token is
/// above its floor, no two grants share a token (the sequence only moves
/// forward), and each key's tokens grow (I2).
async fn floors_and_plain_draws_racing_keep_tokens_unique_and_growing(base: &str) -> TestResult {
    let url = format!("{base}?table_prefix=floor_");
    let backend = Arc::new(PostgresBackend::connect(&url).await?);
    let tasks: Vec<_> = (0..4u64)
        .map(|n| {
            let backend = Arc::clone(&backend);
            tokio::spawn(async move {
                let key = format!("k{n}");
                let mut tokens = Vec::new();
                for round in 0..25u64 {
                    // Even tasks raise the floor now and then, in steps.
                    let floor = (n % 2 == 0 && round % 5 == 0).then_some(1_000 * (round + 1) + n);
                    let token = cycle(&backend, &key, "o", floor).await?;
                    if let Some(floor) = floor {
                        assert!(token > floor, "{key}: token {token} under floor {floor}");
                    }
                    tokens.push(token);
                }
                TestResult::Ok(tokens)
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        let tokens = task.await??;
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        all.extend(tokens);
    }
    let count = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), count, "a token was issued twice");
    Ok(())
}

/// A statement kept waiting on a row lock gives up after `op_timeout`, and
/// the abandoned connection does not stay in the pool (of one).
async fn a_waiting_statement_times_out_and_the_pool_recovers(
    base: &str,
    p: Patience,
) -> TestResult {
    let op_timeout = p.bound(Duration::from_secs(1));
    let backend = PostgresBackend::connect(&format!(
        "{base}?table_prefix=tmo_&pool_max=1&acquire_timeout={0}&op_timeout={0}",
        ms(op_timeout)
    ))
    .await?;
    let others = sqlx::PgPool::connect(base).await?;
    let hold: timeouts::HoldRow = Box::new(move |key| {
        Box::pin(async move {
            let mut tx = others.begin().await?;
            sqlx::query("SELECT 1 FROM tmo_locks WHERE key = $1 FOR UPDATE")
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

/// Connecting runs no DDL when the schema is current: even a no-op `CREATE
/// INDEX IF NOT EXISTS` queues a SHARE lock behind any open writer of the
/// locks table, and every renewal then queues behind that request.
async fn a_new_client_does_not_queue_behind_a_transaction_on_the_locks_table(
    base: &str,
    p: Patience,
) -> TestResult {
    let url = format!("{base}?table_prefix=ddl_");
    let holder = PostgresBackend::connect(&url).await?;
    let owner = Owner::new("holder")?;
    let Acquire::Granted(grant) = holder
        .try_acquire(&request("k", "holder", Duration::from_secs(60))?)
        .await?
    else {
        panic!("a free key was refused");
    };
    let others = sqlx::PgPool::connect(base).await?;
    let mut writer = others.begin().await?;
    sqlx::query("LOCK TABLE ddl_locks IN ROW EXCLUSIVE MODE")
        .execute(&mut *writer)
        .await?;
    let bound = p.bound(Duration::from_secs(10));
    let newcomer = tokio::spawn({
        let url = url.clone();
        async move { PostgresBackend::connect(&url).await }
    });
    // Until the newcomer is connected or waits for a lock on the table.
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks
              WHERE relation = 'ddl_locks'::regclass AND NOT granted",
        )
        .fetch_one(&others)
        .await?;
        if waiting > 0 || newcomer.is_finished() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let renewed = tokio::time::timeout(
        bound,
        holder.renew(
            &LeaseId::new(LockKey::new("k")?, owner.clone(), grant.token),
            Duration::from_secs(60),
        ),
    )
    .await;
    let connected = tokio::time::timeout(bound, newcomer).await;
    writer.rollback().await?;
    renewed.map_err(|_| {
        format!("a renewal queued behind a new client's schema setup for {bound:?} ({p})")
    })??;
    connected.map_err(|_| {
        format!("a new client queued behind a transaction on the locks table for {bound:?} ({p})")
    })???;
    Ok(())
}

/// Tables made by a version that stored data as `jsonb` (which refuses
/// `"\u0000"`) are migrated to `json` on connect, keeping their leases.
async fn a_schema_with_jsonb_data_is_upgraded(base: &str) -> TestResult {
    let others = sqlx::PgPool::connect(base).await?;
    for ddl in [
        "CREATE SEQUENCE mig_tokens AS bigint",
        "CREATE TABLE mig_locks (key text COLLATE \"C\" PRIMARY KEY, owner text NOT NULL,
           token bigint NOT NULL, kind text, data jsonb, acquired_at timestamptz NOT NULL,
           expires_at timestamptz NOT NULL, updated_at timestamptz NOT NULL)",
        "CREATE INDEX mig_locks_owner_idx ON mig_locks (owner)",
        "CREATE INDEX mig_locks_expires_idx ON mig_locks (expires_at)",
        "CREATE TABLE mig_fences (resource text PRIMARY KEY, token numeric(20, 0) NOT NULL)",
        "INSERT INTO mig_locks VALUES ('old', 'someone', nextval('mig_tokens'), NULL,
           '{\"kept\": [1, 2]}', now(), now() + interval '1 minute', now())",
    ] {
        sqlx::query(ddl).execute(&others).await?;
    }
    let backend = PostgresBackend::connect(&format!("{base}?table_prefix=mig_")).await?;
    let old = backend
        .inspect(&LockKey::new("old")?)
        .await?
        .ok_or("the old lease was lost")?;
    assert_eq!(old.data, Some(serde_json::json!({"kept": [1, 2]})));
    let data = serde_json::json!({"a": "\u{0000}"});
    let mut nul = request("new", "me", Duration::from_secs(60))?;
    nul.data = Some(data.clone());
    assert!(matches!(
        backend.try_acquire(&nul).await?,
        Acquire::Granted(_)
    ));
    let seen = backend.inspect(&LockKey::new("new")?).await?;
    assert_eq!(seen.and_then(|l| l.data), Some(data));
    Ok(())
}

/// Tables of schema 2 (before read-write locks) gain the readers table,
/// the reader horizon, the intent and the fence's writer token on connect:
/// a live lease stays a writer that keeps readers out, and an admitted
/// fence token counts as a writer's.
async fn a_schema_from_before_read_write_locks_is_upgraded(base: &str) -> TestResult {
    let others = sqlx::PgPool::connect(base).await?;
    for ddl in [
        "CREATE SEQUENCE rw2_tokens AS bigint",
        "CREATE TABLE rw2_locks (key text COLLATE \"C\" PRIMARY KEY, owner text NOT NULL,
           token bigint NOT NULL, kind text, data json, acquired_at timestamptz NOT NULL,
           expires_at timestamptz NOT NULL, updated_at timestamptz NOT NULL)",
        "CREATE INDEX rw2_locks_owner_idx ON rw2_locks (owner)",
        "CREATE INDEX rw2_locks_expires_idx ON rw2_locks (expires_at)",
        "CREATE TABLE rw2_fences (resource text PRIMARY KEY, token numeric(20, 0) NOT NULL)",
        "COMMENT ON TABLE rw2_locks IS 'fencelock schema 2'",
        "INSERT INTO rw2_locks VALUES ('old', 'someone', nextval('rw2_tokens'), NULL, NULL,
           now(), now() + interval '1 minute', now())",
        "INSERT INTO rw2_fences VALUES ('orders', 7)",
    ] {
        sqlx::query(ddl).execute(&others).await?;
    }
    let url = format!("{base}?table_prefix=rw2_");
    let backend = PostgresBackend::connect(&url).await?;
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
        backend
            .try_acquire(&reader.clone().with_mode(LockMode::Shared))
            .await?,
        Acquire::Granted(_)
    ));
    let fence = PostgresFence::connect(&url).await?;
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
    // Schema 4: the old sequence now ends at the last token.
    let end: i64 = sqlx::query_scalar(
        "SELECT seqmax FROM pg_sequence WHERE seqrelid = 'rw2_tokens'::regclass",
    )
    .fetch_one(&others)
    .await?;
    assert_eq!(end as u64, FencingToken::MAX.get());
    Ok(())
}

/// At `FencingToken::MAX` the sequence ends with a typed error on the key
/// asked for (`fencelock_testkit::sql`), where it used to run on to
/// `i64::MAX` and then fail every acquisition with a backend error.
async fn the_sequences_end_is_a_typed_error_on_the_key(base: &str) -> TestResult {
    let backend = PostgresBackend::connect(&format!("{base}?table_prefix=end_")).await?;
    let others = &sqlx::PgPool::connect(base).await?;
    sql::the_counters_end_is_a_typed_error(
        &backend,
        |last| async move {
            sqlx::query("SELECT setval('end_tokens', $1)")
                .bind(i64::try_from(last)?)
                .execute(others)
                .await?;
            Ok(())
        },
        || async move {
            let last: i64 = sqlx::query_scalar("SELECT last_value FROM end_tokens")
                .fetch_one(others)
                .await?;
            Ok(u64::try_from(last)?)
        },
    )
    .await
}

/// An unknown role (SQLSTATE 28000) is `unauthorized` at once, and an
/// unknown host fails as soon as the resolver says so
/// (`fencelock_testkit::refusals`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_answered_at_once() -> TestResult {
    let server = tokio::task::spawn_blocking(PostgresServer::start).await??;
    let port = server.port();
    let open = |url: String| async move { PostgresBackend::connect(&url).await };
    fencelock_testkit::refusals::refused_credentials_are_unauthorized_at_once(
        &[(
            "unknown role",
            format!("postgres://nobody:secret-pw@127.0.0.1:{port}/postgres"),
        )],
        &["secret-pw"],
        open,
    )
    .await?;
    fencelock_testkit::refusals::an_unknown_host_fails_when_the_resolver_answers(
        |host| format!("postgres://u@{host}:5432/db"),
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
                "postgres://u@127.0.0.1:{port}/db?connect_timeout={}",
                ms(limit)
            )
        },
        |url| async move { PostgresBackend::connect(&url).await },
    )
    .await
    .map_err(|e| format!("{e} ({p})").into())
}

/// The in-transaction fence, through the testkit's one test of it.
async fn fence_in_transaction(base: &str) -> TestResult {
    let url = format!("{base}?table_prefix=txfence_");
    let fence = PostgresFence::connect(&url).await?;
    txfence::fence_in_transaction(&Transactions {
        pool: sqlx::PgPool::connect(base).await?,
        fence,
    })
    .await
}

fencelock_testkit::sqlx_transactional_fence!(
    Transactions,
    sqlx::Postgres,
    PostgresFence,
    [
        ("read committed", "BEGIN ISOLATION LEVEL READ COMMITTED"),
        ("repeatable read", "BEGIN ISOLATION LEVEL REPEATABLE READ"),
        ("serializable", "BEGIN ISOLATION LEVEL SERIALIZABLE"),
    ]
);

#[tokio::test]
async fn malformed_urls_hide_the_password() -> TestResult {
    sql::malformed_urls_hide_the_password(
        &[
            "postgres://u:hunter2@localhost/db?table_prefix=Bad-Name",
            "postgres://u:hunter2@localhost/db?synchronous_commit=maybe",
            "mysql://u:hunter2@localhost/db",
            "postgres://u:hunter2@[::1/db",
            "postgres://u@localhost/db?password=hunter2&table_prefix=Bad-Name",
        ],
        "hunter2",
        |url| async move { fencelock_postgres::PostgresDriver.open_backend(&url).await },
    )
    .await?;
    sql::malformed_urls_hide_the_password(
        &["postgres://u:hunt/er2@localhost/db?table_prefix=Bad-Name"],
        "hunt/er2",
        |url| async move { fencelock_postgres::PostgresDriver.open_backend(&url).await },
    )
    .await?;
    let options =
        fencelock_postgres::PostgresOptions::from_url("postgres://u@h/db?password=hunter2")?;
    assert!(!format!("{options:?}").contains("hunter2"), "{options:?}");
    Ok(())
}
