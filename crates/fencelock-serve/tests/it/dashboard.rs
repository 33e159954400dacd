//! The dashboard in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`; a missing one fails the test, naming the package).
//!
//! The service runs in-process on a random loopback port over a SQLite file,
//! with a client and an admin token. Every wait is for what the page shows,
//! polled within a deadline that only bounds a failure.
//!
//! Time: a real browser and service. Each fixture measures a
//! [`Patience`] when it starts, and every wait for the page is bounded by
//! [`WAIT`] scaled from it ([`wait`]); a failure names the budget. The
//! leases the tests take (a minute) outlive the page's few seconds by far
//! and keep their figures, which the page shows; the traffic's 100 ms pace
//! is the plots' input, not a bound.

use std::{sync::Arc, time::Duration};

use fencelock_core::{LockClient, LockKey, MemoryFence, ELECTION_PREFIX};
use fencelock_serve::{Server, ServerHandle, Service, Tokens};
use fencelock_sqlite::SqliteBackend;
use fencelock_testkit::{browser::Browser, patience, Patience, TestResult};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tempfile::TempDir;

const ADMIN: &str = "admin-0123456789abcdef";
const CLIENT: &str = "client-0123456789abcdef";
/// The base of each wait for the page; reached only when the page is
/// wrong.
const WAIT: Duration = Duration::from_secs(30);

/// [`WAIT`] scaled by the budget the fixture measured.
fn wait() -> Duration {
    patience::current().bound(WAIT)
}

/// The service over a SQLite file, and a library client of the same file.
struct Fixture {
    server: ServerHandle,
    client: LockClient,
    http: reqwest::Client,
    _dir: TempDir,
}

impl Fixture {
    async fn start() -> TestResult<Self> {
        // The budget every wait of the test takes its bound from, shown with
        // any failure.
        let p = Patience::measure().await;
        eprintln!("time budget: {p}");
        let dir = tempfile::tempdir()?;
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        let client = LockClient::new(Arc::new(SqliteBackend::connect(&url).await?));
        let tokens = Tokens::parse(&format!("admin {ADMIN}\nclient {CLIENT}\n"))?;
        let service = Service::builder(client.clone())
            .tokens(tokens)
            .fence(Arc::new(MemoryFence::new()))
            .build();
        let server = Server::bind("127.0.0.1:0".parse()?, service).await?.spawn();
        let http = reqwest::Client::new();
        Ok(Self {
            server,
            client,
            http,
            _dir: dir,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.local_addr())
    }

    /// One REST call with the client token: status and JSON body.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Value,
    ) -> TestResult<(StatusCode, Value)> {
        let mut request = self
            .http
            .request(method, self.url(path))
            .bearer_auth(CLIENT);
        if !body.is_null() {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status();
        let bytes = response.bytes().await?;
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)?
        };
        Ok((status, json))
    }

    /// One REST call with the admin token: status and JSON body.
    async fn call_as_admin(&self, method: Method, path: &str) -> TestResult<(StatusCode, Value)> {
        let response = self
            .http
            .request(method, self.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await?;
        let status = response.status();
        Ok((status, response.json().await?))
    }

    /// Starts a long-polling acquisition of `key` by `owner` (up to 60 s)
    /// with `token` in the background (with the admin token, `owner` is
    /// shown as written to every token); it ends with its grant or its
    /// refusal.
    fn wait_for_key(
        &self,
        key: &str,
        owner: &str,
        token: &str,
    ) -> tokio::task::JoinHandle<TestResult<Value>> {
        let request = self
            .http
            .post(self.url(&format!("/v1/locks/{}/acquire", encode(key))))
            .bearer_auth(token)
            .json(&json!({"owner": owner, "ttl_ms": 60_000, "wait_ms": 60_000}));
        tokio::spawn(async move { Ok(request.send().await?.json().await?) })
    }

    /// Acquires `key` through the REST API; returns the grant.
    async fn acquire(&self, key: &str, body: Value) -> TestResult<Value> {
        let (status, grant) = self
            .call(
                Method::POST,
                &format!("/v1/locks/{}/acquire", encode(key)),
                body,
            )
            .await?;
        assert_eq!(status, StatusCode::OK, "acquire {key}: {grant}");
        Ok(grant)
    }
}

/// Percent-encodes a key for a path segment (every byte outside the
/// unreserved set).
fn encode(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Opens the page at `path`, which asks for a token, enters `token` and
/// waits until the event stream is live.
async fn open_page(browser: &Browser, fixture: &Fixture, path: &str, token: &str) -> TestResult {
    browser.client().goto(&fixture.url(path)).await?;
    // Without a token the service answers 401 and the page asks for one.
    browser
        .wait_for(
            "the page to ask for a token",
            wait(),
            "return document.getElementById('status').dataset.state === 'auth';",
            vec![],
        )
        .await?;
    // Locks may well be held: the tables say why they show none.
    browser
        .wait_for(
            "the tables to say that a token is needed",
            wait(),
            "return ['locks', 'elections', 'semaphores'].every(id => { \
               const p = document.getElementById(id + '-empty'); \
               return !p.hidden && p.textContent.includes('needs a token'); });",
            vec![],
        )
        .await?;
    use_token(browser, token).await?;
    browser
        .wait_for(
            "the event stream to be live",
            wait(),
            "return document.getElementById('status').dataset.state === 'live';",
            vec![],
        )
        .await?;
    Ok(())
}

/// Types `token` into the page's token field and submits it.
async fn use_token(browser: &Browser, token: &str) -> TestResult {
    browser
        .on_element("#token", wait(), |field| async move {
            field.clear().await?;
            field.send_keys(token).await
        })
        .await?;
    browser
        .on_element(
            "#token-form button[type=submit]",
            wait(),
            |button| async move { button.click().await },
        )
        .await?;
    browser
        .wait_for(
            "the page to keep the token",
            wait(),
            "return sessionStorage.getItem('fencelock.token') === arguments[0];",
            vec![json!(token)],
        )
        .await?;
    Ok(())
}

/// Clicks the force-release button of `key` in `table` and accepts the
/// confirmation; returns its question.
async fn force_release(browser: &Browser, table: &str, key: &str) -> TestResult<String> {
    browser
        .on_element(&release_button(table, key), wait(), |button| async move {
            button.click().await
        })
        .await?;
    browser.accept_dialog(wait()).await
}

/// The cells' text of the row of `key` in table `arguments[0]` once it shows
/// token `arguments[2]`, else null.
const ROW: &str = r#"
    const row = Array.from(document.querySelectorAll('#' + arguments[0] + ' tbody tr'))
        .find((r) => r.dataset.key === arguments[1]);
    if (!row) return null;
    const cells = Array.from(row.children).map((c) => c.textContent);
    return cells.includes(String(arguments[2])) ? cells : null;
"#;

const NO_ROW: &str = r#"
    return !Array.from(document.querySelectorAll('#' + arguments[0] + ' tbody tr'))
        .some((r) => r.dataset.key === arguments[1]);
"#;

/// Whether the event log has an event of `type` for `key`.
const LOGGED: &str = r#"
    return Array.from(document.querySelectorAll('#events li.event-' + arguments[0]))
        .some((li) => li.querySelector('.key').textContent === arguments[1]);
"#;

/// Waits until table `table` shows `key` with `token`; returns its cells.
async fn row(browser: &Browser, table: &str, key: &str, token: u64) -> TestResult<Vec<String>> {
    let found = browser
        .wait_for(
            &format!("{key} with token {token} in #{table}"),
            wait(),
            ROW,
            vec![json!(table), json!(key), json!(token)],
        )
        .await?;
    let cells = found.as_array().ok_or("the cells are an array")?;
    Ok(cells
        .iter()
        .map(|c| c.as_str().unwrap_or_default().to_owned())
        .collect())
}

/// Waits until the locks, elections and semaphores tables show `counts`
/// rows.
async fn shown(browser: &Browser, filter: &str, counts: [u64; 3]) -> TestResult {
    browser
        .wait_for(
            &format!("{counts:?} rows with filter {filter}"),
            wait(),
            "return ['locks', 'elections', 'semaphores']
                 .map((t) => document.querySelectorAll('#' + t + ' tbody tr').length)
                 .every((n, i) => n === arguments[0][i]);",
            vec![json!(counts)],
        )
        .await?;
    Ok(())
}

/// The CSS selector of the force-release button of `key`'s row.
fn release_button(table: &str, key: &str) -> String {
    let quoted = key.replace('\\', "\\\\").replace('"', "\\\"");
    format!("#{table} tbody tr[data-key=\"{quoted}\"] button")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_follows_locks_and_force_releases_them() -> TestResult {
    let fixture = Fixture::start().await?;
    // An election leader and a semaphore permit, taken by a library client
    // of the same database before the page opens: the page's first
    // snapshot shows them. (Changes made beside the service reach the page
    // by the service's periodic listing, which this test does not time.)
    let leadership = fixture.client.election("scheduler").campaign().await?;
    let permit = fixture
        .client
        .semaphore("encoders", 3)
        .data(json!({"job": 7}))
        .acquire()
        .await?;
    let browser = Browser::launch(1280, 1000).await?;
    // Without periodic re-reads of the list, only the event stream can
    // update the page between the steps below.
    open_page(&browser, &fixture, "/?refresh=0", CLIENT).await?;

    // A lock acquired through the API appears, its data shown as text.
    let key = "orders:42 <b>&</b>";
    let first = fixture
        .acquire(
            key,
            json!({"owner": "worker-1", "ttl_ms": 60_000, "kind": "workflow",
                   "data": {"note": "<img src=x onerror=alert(1)>"}}),
        )
        .await?;
    let first_token = first["token"].as_u64().ok_or("token")?;
    let cells = row(&browser, "locks", key, first_token).await?;
    assert_eq!(cells[0], key);
    assert_eq!(cells[1], "workflow");
    assert_eq!(cells[2], "worker-1");
    assert!(
        cells[8].contains("<img src=x onerror=alert(1)>"),
        "{cells:?}"
    );
    let markup = browser
        .client()
        .execute(
            "return document.querySelectorAll('#locks tbody img, #locks tbody b').length;",
            vec![],
        )
        .await?;
    assert_eq!(markup, json!(0), "data reached the page as markup");

    // The filters narrow every lease section.
    type_prefix(&browser, "fencelock/").await?;
    shown(&browser, "prefix fencelock/", [0, 1, 1]).await?;
    browser
        .on_element("#filter-prefix", wait(), |field| async move {
            field.clear().await
        })
        .await?;
    // Clearing by WebDriver fires no input event: type into it instead.
    type_prefix(&browser, "o").await?;
    shown(&browser, "prefix o", [1, 0, 0]).await?;
    type_prefix(&browser, "\u{E003}").await?;
    shown(&browser, "no prefix", [1, 1, 1]).await?;
    select_kind(&browser, "workflow").await?;
    shown(&browser, "kind workflow", [1, 0, 0]).await?;
    select_kind(&browser, "").await?;
    shown(&browser, "all kinds", [1, 1, 1]).await?;

    // Released through the API: the row goes, the log says so.
    let (status, body) = fixture
        .call(
            Method::POST,
            &format!("/v1/locks/{}/release", encode(key)),
            json!({"owner": "worker-1", "token": first_token}),
        )
        .await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    browser
        .wait_for(
            "the released lock to go",
            wait(),
            NO_ROW,
            vec![json!("locks"), json!(key)],
        )
        .await?;
    browser
        .wait_for(
            "a released event",
            wait(),
            LOGGED,
            vec![json!("released"), json!(key)],
        )
        .await?;

    // The leader and the permit taken before the page opened show in their
    // own sections only.
    let election_key = format!("{ELECTION_PREFIX}scheduler");
    let cells = row(
        &browser,
        "elections",
        &election_key,
        leadership.term().get(),
    )
    .await?;
    assert_eq!(cells[0], "scheduler");
    let permit_key = permit.key().as_str().to_owned();
    let cells = row(&browser, "semaphores", &permit_key, permit.token().get()).await?;
    assert_eq!(cells[0], "encoders");
    assert_eq!(cells[1], format!("{} of 3", permit.slot()));
    assert_eq!(cells[8], r#"{"job":7}"#);
    for hidden in [&election_key, &permit_key] {
        let absent = browser
            .client()
            .execute(NO_ROW, vec![json!("locks"), json!(hidden)])
            .await?;
        assert_eq!(absent, json!(true), "{hidden} is listed among the locks");
    }

    // Acquired again, then force-released from the page's button.
    let second = fixture
        .acquire(key, json!({"owner": "worker-2", "ttl_ms": 60_000}))
        .await?;
    let second_token = second["token"].as_u64().ok_or("token")?;
    assert!(second_token > first_token);
    row(&browser, "locks", key, second_token).await?;
    // With the client token the service refuses, and the page says so.
    let question = force_release(&browser, "locks", key).await?;
    assert!(question.contains(key), "{question}");
    assert!(question.contains("worker-2"), "{question}");
    browser
        .wait_for(
            "the page to report the refusal",
            wait(),
            "return document.getElementById('notice').textContent.includes('admin token');",
            vec![],
        )
        .await?;
    row(&browser, "locks", key, second_token).await?;
    assert!(
        fixture
            .client
            .backend()
            .inspect(&LockKey::new(key)?)
            .await?
            .is_some(),
        "a client token force-released a lock"
    );
    // With the admin token it goes.
    use_token(&browser, ADMIN).await?;
    force_release(&browser, "locks", key).await?;
    browser
        .wait_for(
            "the force-released lock to go",
            wait(),
            NO_ROW,
            vec![json!("locks"), json!(key)],
        )
        .await?;
    browser
        .wait_for(
            "a lost event",
            wait(),
            LOGGED,
            vec![json!("lost"), json!(key)],
        )
        .await?;
    let held = fixture
        .client
        .backend()
        .inspect(&LockKey::new(key)?)
        .await?;
    assert!(held.is_none(), "still held after force-release: {held:?}");
    let (status, _) = fixture
        .call(
            Method::GET,
            &format!("/v1/locks/{}", encode(key)),
            Value::Null,
        )
        .await?;
    assert_eq!(status, StatusCode::NOT_FOUND);

    permit.release().await?;
    leadership.resign().await?;
    browser.close().await?;
    fixture.server.shutdown().await;
    Ok(())
}

/// The text of the cell of column `arguments[2]` (its header's text) in the
/// row of `arguments[1]` in table `arguments[0]`, else null.
const CELL: &str = r#"
    const table = document.getElementById(arguments[0]);
    const column = Array.from(table.querySelectorAll('thead th'))
        .findIndex((th) => th.textContent === arguments[2]);
    const row = Array.from(table.querySelectorAll('tbody tr'))
        .find((r) => r.dataset.key === arguments[1]);
    return row && column >= 0 ? row.children[column].textContent : null;
"#;

/// Waits until the cell of `column` in `key`'s row of `table` satisfies
/// the JavaScript condition `test` on `text`; returns the text.
async fn cell_until(
    browser: &Browser,
    table: &str,
    key: &str,
    column: &str,
    test: &str,
) -> TestResult<String> {
    let script = format!(
        "const text = (() => {{ {CELL} }})(); return text !== null && ({test}) ? text : null;"
    );
    let found = browser
        .wait_for(
            &format!("{column} of {key} in #{table} to satisfy {test}"),
            wait(),
            &script,
            vec![json!(table), json!(key), json!(column)],
        )
        .await?;
    Ok(found.as_str().unwrap_or_default().to_owned())
}

/// The keys of the events the log shows now.
const EVENT_KEYS: &str =
    "return Array.from(document.querySelectorAll('#events li .key')).map((k) => k.textContent);";

/// Whether the "Held" figure equals the rows of the three lease tables,
/// and is `arguments[0]` (or any number with null).
const HELD_MATCHES_ROWS: &str = r#"
    const rows = document.querySelectorAll('#locks tbody tr, #elections tbody tr, #semaphores tbody tr').length;
    const held = document.getElementById('stat-held').textContent;
    return held === String(rows) && (arguments[0] === null || rows === arguments[0]);
"#;

/// Types `text` into the prefix filter after clearing it (with key presses,
/// which fire the input events the page listens to).
async fn set_prefix(browser: &Browser, text: &str) -> TestResult {
    browser
        .on_element("#filter-prefix", wait(), |field| async move {
            let current = field.prop("value").await?.unwrap_or_default();
            field
                .send_keys(&"\u{E003}".repeat(current.chars().count()))
                .await?;
            if !text.is_empty() {
                field.send_keys(text).await?;
            }
            Ok(())
        })
        .await
}

/// Types `keys` into the prefix filter as it stands.
async fn type_prefix(browser: &Browser, keys: &str) -> TestResult {
    browser
        .on_element("#filter-prefix", wait(), |field| async move {
            field.send_keys(keys).await
        })
        .await
}

/// Chooses `kind` in the kind filter (whose options the page rebuilds when
/// the kinds it shows change).
async fn select_kind(browser: &Browser, kind: &str) -> TestResult {
    browser
        .on_element("#filter-kind", wait(), |select| async move {
            select.select_by_value(kind).await.map(drop)
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_waiters_standbys_renewals_losses_and_plots() -> TestResult {
    let fixture = Fixture::start().await?;
    let browser = Browser::launch(1280, 1000).await?;
    // Only the event stream and the activity reads update the page.
    open_page(&browser, &fixture, "/?refresh=0&activity=0.5", CLIENT).await?;

    // Waiters per key: two long polls on a held key, longest first.
    let held = fixture
        .acquire(
            "queue:1",
            json!({"owner": "holder", "ttl_ms": 60_000, "kind": "batch"}),
        )
        .await?;
    let first = fixture.wait_for_key("queue:1", "waiter-1", CLIENT);
    if let Err(e) = cell_until(&browser, "waiters", "queue:1", "Waiting", "text === '1'").await {
        let ended = tokio::time::timeout(Duration::from_secs(1), first).await;
        return Err(format!("{e}: the long poll: {ended:?}").into());
    }
    let second = fixture.wait_for_key("queue:1", "waiter-2", CLIENT);
    cell_until(&browser, "waiters", "queue:1", "Waiting", "text === '2'").await?;
    // "Waiting here" comes from the same reading as the table.
    browser
        .wait_for(
            "Waiting here to say 2 with the table",
            wait(),
            "return document.getElementById('stat-waiters').textContent === '2' \
               && document.getElementById('waiters-count').textContent === '(2)';",
            vec![],
        )
        .await?;
    let owners = cell_until(
        &browser,
        "waiters",
        "queue:1",
        "Waiters (longest first)",
        "true",
    )
    .await?;
    assert_eq!(owners, "waiter-1, waiter-2");
    cell_until(
        &browser,
        "waiters",
        "queue:1",
        "Longest wait",
        "/^\\d+ s$/.test(text)",
    )
    .await?;

    // An election leader and a standby waiting through the service.
    let election = format!("{ELECTION_PREFIX}sched");
    fixture
        .acquire(&election, json!({"owner": "leader-a", "ttl_ms": 60_000}))
        .await?;
    let standby = fixture.wait_for_key(&election, "standby-b", CLIENT);
    cell_until(
        &browser,
        "elections",
        &election,
        "Standbys",
        "text.startsWith('standby-b (')",
    )
    .await?;

    // Each lease's length and last renewal.
    let token = held["token"].as_u64().ok_or("token")?;
    cell_until(
        &browser,
        "locks",
        "queue:1",
        "Length",
        "text === '1 min 00 s'",
    )
    .await?;
    cell_until(
        &browser,
        "locks",
        "queue:1",
        "Last renewal",
        "text === 'never'",
    )
    .await?;
    let (status, body) = fixture
        .call(
            Method::POST,
            "/v1/locks/queue%3A1/renew",
            json!({"owner": "holder", "token": token, "ttl_ms": 90_000}),
        )
        .await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    cell_until(
        &browser,
        "locks",
        "queue:1",
        "Length",
        "text === '1 min 30 s'",
    )
    .await?;
    cell_until(
        &browser,
        "locks",
        "queue:1",
        "Last renewal",
        "/^\\d+ s ago$/.test(text)",
    )
    .await?;

    // "Held" counts the rows shown, with and without a filter.
    browser
        .wait_for(
            "Held to equal 2 rows",
            wait(),
            HELD_MATCHES_ROWS,
            vec![json!(2)],
        )
        .await?;
    set_prefix(&browser, "queue").await?;
    browser
        .wait_for(
            "Held to equal 1 row",
            wait(),
            HELD_MATCHES_ROWS,
            vec![json!(1)],
        )
        .await?;
    set_prefix(&browser, "").await?;

    // Events follow the same prefix and kind filters as the tables.
    let mut tokens = Vec::new();
    for (key, kind) in [("alpha:1", "alpha"), ("beta:1", "beta")] {
        let grant = fixture
            .acquire(key, json!({"owner": "f", "ttl_ms": 60_000, "kind": kind}))
            .await?;
        let token = grant["token"].as_u64().ok_or("token")?;
        row(&browser, "locks", key, token).await?;
        browser
            .wait_for(
                &format!("the acquisition of {key} in the log"),
                wait(),
                LOGGED,
                vec![json!("acquired"), json!(key)],
            )
            .await?;
        tokens.push(token);
    }
    set_prefix(&browser, "alpha:").await?;
    browser
        .wait_for(
            "only alpha: events",
            wait(),
            "const keys = (() => { EVENT_KEYS })(); return keys.length > 0 && keys.every((k) => k.startsWith('alpha:'));"
                .replace("EVENT_KEYS", EVENT_KEYS)
                .as_str(),
            vec![],
        )
        .await?;
    set_prefix(&browser, "").await?;
    select_kind(&browser, "beta").await?;
    browser
        .wait_for(
            "only the beta lease's events",
            wait(),
            "const keys = (() => { EVENT_KEYS })(); return keys.length > 0 && keys.every((k) => k === 'beta:1');"
                .replace("EVENT_KEYS", EVENT_KEYS)
                .as_str(),
            vec![],
        )
        .await?;
    select_kind(&browser, "").await?;
    browser
        .wait_for(
            "every event again",
            wait(),
            "const keys = (() => { EVENT_KEYS })(); return keys.includes('alpha:1') && keys.includes('beta:1') && keys.includes('queue:1');"
                .replace("EVENT_KEYS", EVENT_KEYS)
                .as_str(),
            vec![],
        )
        .await?;

    // Plots: the acquisitions so far are in the per-second plot and the
    // wait distribution; more acquisitions move them.
    const PLOT_TOTAL: &str =
        "const t = Number(document.querySelector(arguments[0]).getAttribute('data-total')); \
         return t >= arguments[1] ? t : null;";
    let acquired = browser
        .wait_for(
            "the acquisitions in the rate plot",
            wait(),
            PLOT_TOTAL,
            vec![json!("#plot-rates polyline.series-acquired"), json!(4)],
        )
        .await?
        .as_u64()
        .ok_or("a total")?;
    let waited = browser
        .wait_for(
            "the waits in the wait plot",
            wait(),
            PLOT_TOTAL,
            vec![json!("#plot-wait"), json!(4)],
        )
        .await?
        .as_u64()
        .ok_or("a total")?;
    let grant = fixture
        .acquire("plot:1", json!({"owner": "p", "ttl_ms": 60_000}))
        .await?;
    fixture
        .call(
            Method::POST,
            "/v1/locks/plot%3A1/release",
            json!({"owner": "p", "token": grant["token"]}),
        )
        .await?;
    browser
        .wait_for(
            "the rate plot to count one more acquisition",
            wait(),
            PLOT_TOTAL,
            vec![
                json!("#plot-rates polyline.series-acquired"),
                json!(acquired + 1),
            ],
        )
        .await?;
    browser
        .wait_for(
            "the wait plot to count one more wait",
            wait(),
            PLOT_TOTAL,
            vec![json!("#plot-wait"), json!(waited + 1)],
        )
        .await?;
    browser
        .wait_for(
            "the hold plot to count the release",
            wait(),
            PLOT_TOTAL,
            vec![json!("#plot-hold"), json!(1)],
        )
        .await?;
    let bars = browser
        .client()
        .execute(
            "return document.querySelectorAll('#plot-wait rect.bar, #plot-hold rect.bar').length;",
            vec![],
        )
        .await?;
    assert_eq!(bars, json!(34), "17 buckets in each histogram");

    // A loss and a fenced-out write land in the persistent list, which
    // a reload does not empty (unlike the page's own event log).
    let (status, body) = fixture
        .call_as_admin(Method::DELETE, "/v1/locks/alpha%3A1")
        .await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    for token in [9, 4] {
        fixture
            .call(
                Method::POST,
                "/v1/fences/calendar_db/admit",
                json!({"token": token}),
            )
            .await?;
    }
    const INCIDENTS: &str = r#"
        const rows = Array.from(document.querySelectorAll('#incidents tbody tr'))
            .map((r) => [r.className, r.children[2].textContent, r.children[4].textContent]);
        return rows.length >= 2 ? rows : null;
    "#;
    let before = browser
        .wait_for(
            "the loss and the fenced-out write",
            wait(),
            INCIDENTS,
            vec![],
        )
        .await?;
    assert_eq!(
        before,
        json!([
            ["incident-fenced_out", "calendar_db", "4"],
            ["incident-lost", "alpha:1", tokens[0].to_string()]
        ])
    );
    browser.client().refresh().await?;
    browser
        .wait_for(
            "the event stream to be live after the reload",
            wait(),
            "return document.getElementById('status').dataset.state === 'live';",
            vec![],
        )
        .await?;
    let after = browser
        .wait_for("the list after the reload", wait(), INCIDENTS, vec![])
        .await?;
    assert_eq!(after, before);
    let logged = browser
        .client()
        .execute(
            "return document.querySelectorAll('#events li.event-lost, #events li.event-fenced-out').length;",
            vec![],
        )
        .await?;
    assert_eq!(logged, json!(0), "the page's own log starts empty");

    // Released: one waiter is granted (SQLite promises no order), the
    // other still waits; then the waits end and the section empties.
    fixture
        .call(
            Method::POST,
            "/v1/locks/queue%3A1/release",
            json!({"owner": "holder", "token": token}),
        )
        .await?;
    cell_until(&browser, "waiters", "queue:1", "Waiting", "text === '1'").await?;
    let holder = fixture
        .client
        .backend()
        .inspect(&LockKey::new("queue:1")?)
        .await?
        .ok_or("queue:1 is held by a waiter")?;
    assert!(
        holder.owner.as_str().ends_with("waiter-1") || holder.owner.as_str().ends_with("waiter-2"),
        "{holder:?}"
    );
    for waiter in [first, second, standby] {
        waiter.abort();
    }
    browser
        .wait_for(
            "no waiter left",
            wait(),
            "return document.querySelectorAll('#waiters tbody tr').length === 0 \
               && !document.getElementById('waiters-empty').hidden;",
            vec![],
        )
        .await?;

    browser.close().await?;
    fixture.server.shutdown().await;
    Ok(())
}

/// Makes `docs/images/dashboard.png` and `docs/images/dashboard-losses.png`:
/// `cargo test -p fencelock-serve --test it -- --ignored dashboard::screenshot`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes docs/images/dashboard*.png; run by hand after changing the page"]
async fn screenshot() -> TestResult {
    let fixture = Fixture::start().await?;
    let browser = Browser::launch(1280, 1500).await?;
    open_page(&browser, &fixture, "/?activity=1", ADMIN).await?;

    traffic(&fixture).await?;

    let mut expected = 0;
    let mut renewed = None;
    for (key, owner, kind, data) in [
        (
            "workflow:8841",
            "api-7f9c:4411",
            "workflow",
            json!({"tenant": "acme"}),
        ),
        (
            "node:8841:fetch-calendars",
            "worker-3:1207",
            "node",
            json!({"attempt": 2}),
        ),
        (
            "resource:database:calendar_db",
            "migrator:88",
            "resource",
            json!(null),
        ),
        (
            "report:nightly",
            "cron-1:5120",
            "job",
            json!({"date": "2026-11-22"}),
        ),
    ] {
        let mut body = json!({"owner": owner, "ttl_ms": 120_000, "kind": kind});
        if !data.is_null() {
            body["data"] = data;
        }
        let grant = fixture.acquire(key, body).await?;
        renewed.get_or_insert((key, owner, grant["token"].clone()));
        expected += 1;
    }
    if let Some((key, owner, token)) = renewed {
        fixture
            .call(
                Method::POST,
                &format!("/v1/locks/{}/renew", encode(key)),
                json!({"owner": owner, "token": token, "ttl_ms": 90_000}),
            )
            .await?;
    }
    let leadership = fixture
        .client
        .election("scheduler")
        .value(json!({"addr": "10.0.0.7:8080"}))
        .campaign()
        .await?;
    let permits = [
        fixture.client.semaphore("encoders", 3).acquire().await?,
        fixture.client.semaphore("encoders", 3).acquire().await?,
    ];
    expected += 3;
    let seen = browser
        .wait_for(
            "every lease on the page",
            wait(),
            HELD_MATCHES_ROWS,
            vec![json!(expected)],
        )
        .await
        .map_err(|e| format!("{e}"));
    if let Err(e) = seen {
        let rows = browser
            .client()
            .execute("return Array.from(document.querySelectorAll('tbody tr')).map((r) => r.dataset.key + ' ' + r.textContent);", vec![])
            .await?;
        return Err(format!("{e}: {rows}").into());
    }
    // Started last: a long poll ends after a minute.
    let waiters = [
        fixture.wait_for_key("resource:database:calendar_db", "migrator:91", CLIENT),
        fixture.wait_for_key("resource:database:calendar_db", "migrator:95", CLIENT),
        fixture.wait_for_key("report:nightly", "cron-2:6001", CLIENT),
    ];
    let standby = fixture.wait_for_key(
        &format!("{ELECTION_PREFIX}scheduler"),
        "node-b:7781",
        CLIENT,
    );
    let seen = browser
        .wait_for(
            "the waiters and the standby",
            wait(),
            "const rows = document.querySelectorAll('#waiters tbody tr').length; \
             const standbys = document.querySelector('#elections [data-standbys]'); \
             const text = standbys ? standbys.textContent : null; \
             return rows === 3 && text !== null && text.includes('node-b') \
               ? true : (window.lastSeen = [rows, text], false);",
            vec![],
        )
        .await
        .map_err(|e| format!("{e}"));
    if let Err(e) = seen {
        let last = browser
            .client()
            .execute("return [window.lastSeen, activity === null ? null : activity.waiters.length, activityAt, performance.now()];", vec![])
            .await?;
        let (_, api) = fixture.call_as_admin(Method::GET, "/v1/activity").await?;
        let [first, ..] = waiters;
        let ended = tokio::time::timeout(Duration::from_secs(1), first).await;
        return Err(format!(
            "{e}: {last} / {} / {} / the first long poll: {ended:?}",
            api["waiters"], api["elections"]
        )
        .into());
    }
    browser
        .wait_for(
            "the fenced-out writes in the kept list",
            wait(),
            "return document.querySelector('#incidents tbody tr.incident-fenced_out') !== null;",
            vec![],
        )
        .await?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/images");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("dashboard.png"),
        browser.client().screenshot().await?,
    )?;
    browser
        .client()
        .execute(
            "document.getElementById('semaphores-title').scrollIntoView();",
            vec![],
        )
        .await?;
    browser
        .wait_for(
            "the page to scroll",
            wait(),
            "return window.scrollY > 0;",
            vec![],
        )
        .await?;
    std::fs::write(
        dir.join("dashboard-losses.png"),
        browser.client().screenshot().await?,
    )?;

    for waiter in waiters {
        waiter.abort();
    }
    standby.abort();
    for permit in permits {
        permit.release().await?;
    }
    leadership.resign().await?;
    browser.close().await?;
    fixture.server.shutdown().await;
    Ok(())
}

/// Half a minute of traffic for the plots of the screenshot: an
/// acquisition every 100 ms, held 0 to 4 s, some taken after a wait, a few
/// force-released and a few stale tokens refused by a fence. Paced by a
/// timer because the plots count per second; nothing waits on it for a
/// result.
async fn traffic(fixture: &Fixture) -> TestResult {
    let mut held: std::collections::VecDeque<(u64, String, Value)> = Default::default();
    let mut waits = Vec::new();
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    for tick in 0..300u64 {
        pace.tick().await;
        let key = format!("task:{tick}");
        let owner = format!("worker-{}", tick % 5);
        let grant = fixture
            .acquire(
                &key,
                json!({"owner": owner, "ttl_ms": 60_000, "kind": "task"}),
            )
            .await?;
        held.push_back((tick + (tick * 7919) % 40, key.clone(), grant));
        if tick % 9 == 0 {
            waits.push(fixture.wait_for_key(&key, &format!("worker-{}", tick % 3 + 5), CLIENT));
        }
        if tick % 60 == 30 {
            fixture
                .call_as_admin(Method::DELETE, &format!("/v1/locks/{}", encode(&key)))
                .await?;
        }
        if tick % 45 == 0 {
            for token in [tick + 100, tick + 50] {
                fixture
                    .call(
                        Method::POST,
                        "/v1/fences/calendar_db/admit",
                        json!({"token": token}),
                    )
                    .await?;
            }
        }
        let mut due: Vec<_> = Vec::new();
        held.retain(|h| {
            if h.0 <= tick {
                due.push(h.clone());
                false
            } else {
                true
            }
        });
        for (_, key, grant) in due {
            release(fixture, &key, &grant).await?;
        }
    }
    for (_, key, grant) in held {
        release(fixture, &key, &grant).await?;
    }
    for wait in waits {
        let grant = wait.await??;
        if let Some(key) = grant["key"].as_str() {
            release(fixture, key, &grant).await?;
        }
    }
    Ok(())
}

/// Releases `grant` of `key` through the REST API (already gone is fine).
async fn release(fixture: &Fixture, key: &str, grant: &Value) -> TestResult {
    fixture
        .call(
            Method::POST,
            &format!("/v1/locks/{}/release", encode(key)),
            json!({"owner": grant["owner"], "token": grant["token"]}),
        )
        .await?;
    Ok(())
}

/// The page's own logic, run in the browser: the event-stream parser across
/// chunk boundaries, and the merge of a late snapshot with the events that
/// overtook it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_parses_split_events_and_merges_late_snapshots() -> TestResult {
    let fixture = Fixture::start().await?;
    let browser = Browser::launch(800, 600).await?;
    browser.client().goto(&fixture.url("/?refresh=0")).await?;
    // Without a token the page's first reads end at once; then nothing of
    // its own runs beside the scripts below.
    browser
        .wait_for(
            "the page's first reads to end",
            wait(),
            "return document.getElementById('status').dataset.state === 'auth' && snapshotsInFlight === 0;",
            vec![],
        )
        .await?;

    let parsed = browser
        .client()
        .execute(
            r#"return (async () => {
                const seen = [];
                const original = handleEvent;
                handleEvent = (name, data) => seen.push([name, data]);
                const chunks = ["event: acq", "uired\r", "\ndata: {\"key\":\"a\",", "\"token\":1}\r\n\r",
                                "\n: keep-alive\n\nevent: released\ndata: {\"key\":\"a\",\"token\":1}\n\n"];
                const encoder = new TextEncoder();
                const body = new ReadableStream({
                    start(c) { for (const chunk of chunks) c.enqueue(encoder.encode(chunk)); c.close(); },
                });
                try { await readEvents(body); } finally { handleEvent = original; }
                return seen;
            })();"#,
            vec![],
        )
        .await?;
    assert_eq!(
        parsed,
        json!([["acquired", {"key": "a", "token": 1}], ["released", {"key": "a", "token": 1}]])
    );

    let merged = browser
        .client()
        .execute(
            r#"
            const lease = { key: "k", owner: "o", token: 5, acquired_at: "2026-01-01T00:00:00Z",
                            expires_at: "2026-01-01T00:00:10Z", expires_in_ms: 9000 };
            // A release event arrives while a snapshot that still lists the lease is on its way.
            const since = journal.length;
            snapshotsInFlight += 1;
            forget("k", 5);
            applySnapshot([lease], since);
            snapshotsInFlight -= 1;
            if (snapshotsInFlight === 0) journal = [];
            const staleSnapshotIgnored = !locks.has("k");
            // A release of an old token leaves the newer lease of the key.
            applySnapshot([Object.assign({}, lease, { token: 6 })], 0);
            forget("k", 5);
            const newerLeaseKept = locks.has("k") && locks.get("k").info.token === 6;
            return [staleSnapshotIgnored, newerLeaseKept];
            "#,
            vec![],
        )
        .await?;
    assert_eq!(merged, json!([true, true]));

    browser.close().await?;
    fixture.server.shutdown().await;
    Ok(())
}
