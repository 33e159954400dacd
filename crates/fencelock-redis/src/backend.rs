//! [`RedisBackend`]: the `Backend` implementation.

use std::{fmt, sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use fencelock_core::{
    renew_alone, renew_each_mode, Acquire, AcquireAll, AcquireRequest, Backend, BackendError,
    Capabilities, ChangeFeed, Error, FencingToken, Grant, LeaseId, LockInfo, LockKey, LockMode,
    Owner, Renewal, Result, WakeSubscription, WriteIntents,
};

use redis::{
    aio::{ConnectionManager, ConnectionManagerConfig},
    Client, Script, Value,
};

use crate::{
    cluster::ClusterNodes,
    conn::{timed_out, BoundedConnection},
    error::{bad_reply, map},
    keys::Keys,
    options::RedisOptions,
    scripts::{Call, Scripts},
    sentinel::Sentinels,
    wakeups::{NodeClients, Wakeups},
};

mod admin;
mod shared;

/// Locks in Redis. Cheap to clone; clones share the connection and the
/// wake-up subscriber, which stops when the last clone is dropped.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
    /// Every request's bound, when not the `timeout` option's
    /// ([`RedisBackend::bounded_by`]).
    bound: Option<Duration>,
}

struct Inner {
    options: RedisOptions,
    conn: BoundedConnection,
    scripts: Scripts,
    keys: Keys,
    wakeups: Arc<Wakeups>,
    subscriber: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.subscriber.abort();
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// The driver's client for `options`.
pub(crate) fn client(options: &RedisOptions) -> Result<Client> {
    Client::open(options.connection_url.as_str()).map_err(|e| {
        // The driver's message may quote the URL; report only the kind.
        Error::InvalidUrl(format!("the redis driver refused the URL ({:?})", e.kind()))
    })
}

/// `connecting` (all the steps of opening a backend or fence), failing
/// transiently once `timeout` has passed. The connection manager retries a
/// failed first connect with backoff, each attempt with its own timeout:
/// unbounded, a server that accepts connections but never answers would
/// hold the caller for several timeouts.
pub(crate) async fn within<T>(
    timeout: Duration,
    connecting: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(timeout, connecting)
        .await
        .unwrap_or_else(|_| Err(map("connect", timed_out(timeout))))
}

/// One driver client per node of a `redis+cluster://` URL: where the
/// pub/sub connection may go, tried in turn when one node is down.
fn node_clients(options: &RedisOptions) -> Result<Vec<Client>> {
    options
        .cluster_nodes
        .iter()
        .map(|node| {
            Client::open(node.as_str()).map_err(|e| {
                Error::InvalidUrl(format!("the redis driver refused the URL ({:?})", e.kind()))
            })
        })
        .collect()
}

/// Opens the command connection (a managed, auto-reconnecting, multiplexed
/// connection to one server, or a cluster connection) and loads the
/// scripts once (on every primary of a cluster), within the connect timeout. Also
/// answers the clients a pub/sub connection may use: the server's, one per
/// listed cluster node, or through Sentinel the master of the moment.
pub(crate) async fn connect(
    options: &RedisOptions,
    scripts: &Scripts,
) -> Result<(NodeClients, BoundedConnection)> {
    if options.is_cluster() {
        let nodes = node_clients(options)?;
        let clients: NodeClients = Arc::new(move || nodes.clone());
        return within(options.connect_timeout, async {
            let conn =
                BoundedConnection::cluster(ClusterNodes::connect(options).await?, options.timeout);
            // SCRIPT LOAD goes to every primary; a replica promoted later
            // gets them on its first NOSCRIPT (`Call::invoke`).
            load_scripts(&conn, scripts, Loads::InTurn, options.connect_timeout).await?;
            Ok((clients, conn))
        })
        .await;
    }
    let client = client(options)?;
    // No response timeout here: `BoundedConnection` bounds every request
    // (reconnection included) by the same `timeout`, and a second timer per
    // command is not free: each one registered with tokio's time driver can
    // wake the runtime's other worker.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(options.connect_timeout)
        .set_number_of_retries(3)
        .set_max_delay(1000);
    if options.is_sentinel() {
        return within(options.connect_timeout, async {
            // Boxed: the Sentinel client's futures nest deep, and callers
            // that open backends inside their own futures (the `redlock`
            // backend's lazy node connections) would carry their layout.
            let master =
                futures_util::FutureExt::boxed(Sentinels::connect(options, config)).await?;
            let conn = BoundedConnection::sentinel(Arc::clone(&master), options.timeout);
            load_scripts(&conn, scripts, Loads::Together, options.connect_timeout).await?;
            let clients: NodeClients = Arc::new(move || vec![master.client()]);
            Ok((clients, conn))
        })
        .await;
    }
    let connecting = async {
        let manager = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| map("connect", e))?;
        let conn = BoundedConnection::new(manager, options.timeout);
        load_scripts(&conn, scripts, Loads::Together, options.connect_timeout).await?;
        let one = client.clone();
        let clients: NodeClients = Arc::new(move || vec![one.clone()]);
        Ok((clients, conn))
    };
    within(
        options.connect_timeout,
        unless_refused(&client, options.connect_timeout, connecting),
    )
    .await
}

/// `connecting`, unless a probe made beside it gets a definite refusal
/// first. The connection manager retries a failed first connect with
/// backoff (the same retries that carry it through a server restart
/// later), which took about 5 s to report a port nobody listens on, a host
/// name the resolver does not know, or a wrong password. Each of those is
/// an answer, returned at once: a refused port or an unknown host as a
/// transient error (callers that wait, `fencelock acquire --wait`, retry
/// them), refused credentials as `unauthorized`. The probe resolves the
/// host, then opens one connection of its own with the URL's credentials
/// (AUTH and SELECT, as the manager's); a silent server is left to the
/// time-out as before: the probe then neither fails nor matters. Unix
/// sockets are not probed.
async fn unless_refused<T>(
    client: &Client,
    timeout: Duration,
    connecting: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let (host, port) = match &client.get_connection_info().addr {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
        _ => return connecting.await,
    };
    let probe = client.clone();
    let refused = async move {
        if let Err(e) = tokio::net::lookup_host((host.as_str(), port)).await {
            let message = format!(
                "connect failed: cannot resolve {}",
                fencelock_core::shorten(&host)
            );
            return Some(BackendError::transient(crate::error::NAME, message, e).into());
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout);
        match probe
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Err(e) if e.is_connection_refusal() => Some(map("connect", e)),
            Err(e) => match map("connect", e) {
                Error::Backend(b) if b.is_unauthorized() => Some(Error::Backend(b)),
                _ => None,
            },
            Ok(_) => None,
        }
    };
    tokio::pin!(connecting);
    tokio::select! {
        result = &mut connecting => result,
        Some(e) = refused => Err(e),
    }
}

/// How [`load_scripts`] sends the loads.
#[derive(Clone, Copy)]
enum Loads {
    /// All at once: on a multiplexed connection to one server they share
    /// one round trip instead of taking one each, which over a distant or
    /// loaded link was most of the time opening took.
    Together,
    /// One after another, on a cluster: there each `SCRIPT LOAD` fans out
    /// to every primary inside the driver's own request queue, and the one
    /// CI run that sent them together saw a cluster open stall for its
    /// whole bound, where loading one at a time never has.
    InTurn,
}

async fn load_scripts(
    conn: &BoundedConnection,
    scripts: &Scripts,
    loads: Loads,
    timeout: Duration,
) -> Result<()> {
    // Part of opening: bounded by the connect timeout, not the (possibly
    // tighter) per-command one, or a server farther away than `timeout`
    // could never be opened at all.
    let conn = &conn.bounded_by(timeout);
    async fn load(script: &Script, mut conn: BoundedConnection) -> Result<()> {
        script
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .map(drop)
            .map_err(|e| map("SCRIPT LOAD", e))
    }
    match loads {
        Loads::Together => {
            futures_util::future::try_join_all(scripts.all().map(|s| load(s, conn.clone())))
                .await
                .map(drop)
        }
        Loads::InTurn => {
            for script in scripts.all() {
                load(script, conn.clone()).await?;
            }
            Ok(())
        }
    }
}

impl RedisBackend {
    /// Connects with `options`: one multiplexed command connection (with a
    /// `redis+cluster://` URL, a cluster connection: one per node) and one
    /// pub/sub connection for wake-ups.
    pub async fn connect_with(options: RedisOptions) -> Result<Self> {
        let scripts = Scripts::new(options.plain);
        let keys = Keys::with_layout(&options.prefix, options.plain)?;
        // One bound for both connections: opening never takes longer than
        // the connect timeout.
        let (conn, wakeups, subscriber) = within(options.connect_timeout, async {
            let (clients, conn) = connect(&options, &scripts).await?;
            let (wakeups, subscriber) = Wakeups::start(
                clients,
                keys.clone(),
                options.timeout,
                options.connect_timeout,
            )
            .await?;
            Ok((conn, wakeups, subscriber))
        })
        .await?;
        Ok(Self {
            inner: Arc::new(Inner {
                options,
                conn,
                scripts,
                keys,
                wakeups,
                subscriber,
            }),
            bound: None,
        })
    }

    /// Connects to `url` (see [`RedisOptions::from_url`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(RedisOptions::from_url(url)?).await
    }

    /// The options in use.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.options
    }

    /// SHA1 of the acquire script, e.g. to compare against a raw
    /// `redis-benchmark … EVALSHA` run or to check `SCRIPT EXISTS`. It takes
    /// `KEYS = [PREFIX:{KEY}, PREFIX:{KEY}:token]` and `ARGV = [owner, ttl_ms,
    /// kind, data, min_token]` (the last three may be empty strings).
    pub fn acquire_script_sha(&self) -> &str {
        self.inner.scripts.acquire.get_hash()
    }

    fn conn(&self) -> BoundedConnection {
        match self.bound {
            Some(timeout) => self.inner.conn.bounded_by(timeout),
            None => self.inner.conn.clone(),
        }
    }

    /// This backend with each request bounded by `timeout` rather than by
    /// the `timeout` option, over the same connections: the `redlock`
    /// backend bounds a node's request by what the lease can afford.
    pub fn bounded_by(&self, timeout: Duration) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            bound: Some(timeout),
        }
    }

    /// The command connection (every request bounded by the `timeout`
    /// option), for running scripts of one's own over this backend's key
    /// layout, as the `redlock` backend does on each of its nodes.
    pub fn connection(&self) -> BoundedConnection {
        self.conn()
    }

    /// This backend's key names.
    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    /// Readers exist in the fencelock layout only (see `capabilities`).
    fn readers_allowed(&self) -> Result<()> {
        if self.inner.options.plain {
            return Err(Error::unsupported("redis", "readers in layout=plain"));
        }
        Ok(())
    }

    /// Runs `WAIT` when configured, on the node that holds `slot` (the
    /// slot just written; one server has every slot); errors when too few
    /// replicas acknowledged.
    async fn wait_replicas(&self, slot: u16) -> Result<()> {
        let want = self.inner.options.wait_replicas;
        if want == 0 {
            return Ok(());
        }
        let timeout_ms = self.inner.options.wait_timeout.as_millis().max(1) as u64;
        let acked: i64 = redis::cmd("WAIT")
            .arg(want)
            .arg(timeout_ms)
            .query_async(
                &mut self
                    .conn()
                    .for_slot(slot)
                    .allowing(self.inner.options.wait_timeout),
            )
            .await
            .map_err(|e| map("WAIT", e))?;
        if acked < i64::from(want) {
            return Err(bad_reply_transient(format!(
                "only {acked} of {want} replicas acknowledged the write within {timeout_ms} ms"
            )));
        }
        Ok(())
    }

    /// One acquisition by `script` (the writer's or the reader's, as the
    /// request's mode says): the same keys, arguments and answer.
    async fn acquire_with(&self, script: &Script, request: &AcquireRequest) -> Result<Acquire> {
        let args = AcquireArgs::of(request)?;
        let mut call = Call::new(script, 5);
        self.add_acquire_keys(&mut call, request);
        let row: Vec<Value> = args
            .add_to(&mut call)
            .arg(self.inner.keys.changes())
            .arg(request.key.as_str())
            .invoke(&mut self.conn())
            .await
            .map_err(|e| map("acquire script", e))?;
        let ttl_ms = args.ttl_ms;
        let granted: i64 = field(&row, 0)?;
        if granted == SPENT {
            return Err(Error::TokensExhausted {
                key: request.key.clone(),
            });
        }
        if granted != 1 {
            return Ok(Acquire::Held(parse_describe(&request.key, &row)?));
        }
        let token: String = field(&row, 1)?;
        let now_ms: i64 = field(&row, 2)?;
        let grant = Grant::new(
            parse_token(&token)?,
            Duration::from_millis(ttl_ms),
            ms_to_time(now_ms.saturating_add(ttl_ms as i64)),
        );
        if let Err(e) = self.wait_replicas(self.inner.keys.slot(&request.key)).await {
            // Do not leave a lease nobody will use behind.
            let _ = self.release(&request.lease(grant.token)).await;
            return Err(e);
        }
        Ok(Acquire::Granted(grant))
    }

    /// The five keys `ACQUIRE` (and each part of `ACQUIRE_ALL`) takes.
    fn add_acquire_keys(&self, call: &mut Call<'_>, request: &AcquireRequest) {
        let keys = &self.inner.keys;
        call.key(keys.lease(&request.key))
            .key(keys.counter(&request.key))
            .key(keys.readers(&request.key))
            .key(keys.readers_info(&request.key))
            .key(keys.intent(&request.key));
    }

    /// One batch of renewals by `script`, which takes the
    /// `keys_per_lease` keys `add_keys` adds for each lease, then each
    /// lease's owner, token and TTL, and answers `{now_ms, r1, r2, …}`.
    ///
    /// A script runs on one Cluster slot, so in a cluster the batch is
    /// split by slot, the parts sent at once, and the answers put back in
    /// order; a part that got no answer fails each of its renewals. Each
    /// part is bounded on its own (`fencelock_core::part_bound`): a primary
    /// that accepts and never answers (stopped) used to hold the whole
    /// batch past the renewer's bound, and every holder of the client lost
    /// its lease, those on healthy primaries too.
    async fn renew_batch(
        &self,
        script: &Script,
        renewals: &[Renewal],
        keys_per_lease: usize,
        add_keys: impl Fn(&mut Call<'_>, &LockKey) + Sync,
    ) -> Result<Vec<Result<Grant>>> {
        let keys = &self.inner.keys;
        let one_slot = match renewals.split_first() {
            None => return Ok(Vec::new()),
            Some((first, rest)) => {
                !self.inner.conn.is_cluster() || {
                    let slot = keys.slot(&first.lease.key);
                    rest.iter().all(|r| keys.slot(&r.lease.key) == slot)
                }
            }
        };
        if one_slot {
            return self
                .renew_slot(script, renewals, keys_per_lease, &add_keys)
                .await;
        }
        let mut parts: std::collections::BTreeMap<u16, (Vec<usize>, Vec<Renewal>)> =
            std::collections::BTreeMap::new();
        for (i, renewal) in renewals.iter().enumerate() {
            let part = parts.entry(keys.slot(&renewal.lease.key)).or_default();
            part.0.push(i);
            part.1.push(renewal.clone());
        }
        let bound = fencelock_core::part_bound(renewals);
        let answers = futures_util::future::join_all(parts.values().map(|(_, part)| {
            fencelock_core::renew_part(
                bound,
                self.renew_slot(script, part, keys_per_lease, &add_keys),
            )
        }))
        .await;
        let mut results: Vec<Option<Result<Grant>>> = std::iter::repeat_with(|| None)
            .take(renewals.len())
            .collect();
        for ((indices, _), answer) in parts.values().zip(answers) {
            match answer {
                Ok(answers) => {
                    for (&i, answer) in indices.iter().zip(answers) {
                        results[i] = Some(answer);
                    }
                }
                Err(e) => {
                    // One failed answer for several leases: each gets a
                    // copy, not a message that repeats "redis backend:".
                    for &i in indices {
                        results[i] = Some(Err(e.duplicate(crate::error::NAME)));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.ok_or_else(|| bad_reply("a renewal of the batch got no answer")))
            .collect()
    }

    /// [`Self::renew_batch`] for renewals whose keys share one slot.
    async fn renew_slot(
        &self,
        script: &Script,
        renewals: &[Renewal],
        keys_per_lease: usize,
        add_keys: &(impl Fn(&mut Call<'_>, &LockKey) + Sync),
    ) -> Result<Vec<Result<Grant>>> {
        let Some(first) = renewals.first() else {
            return Ok(Vec::new());
        };
        // Room for the batch: each key of the first lease twice over (for
        // the encoding and the prefix), its owner, and two decimal numbers.
        let per_renewal = (first.lease.key.as_str().len() * 2 + 24) * keys_per_lease
            + first.lease.owner.as_str().len()
            + 40;
        let mut call = Call::with_capacity(
            script,
            renewals.len() * keys_per_lease,
            renewals.len() * (keys_per_lease + 3),
            renewals.len() * per_renewal,
        );
        for renewal in renewals {
            add_keys(&mut call, &renewal.lease.key);
        }
        let ttls: Vec<u64> = renewals.iter().map(|r| ttl_ms(r.ttl)).collect();
        for (renewal, ttl_ms) in renewals.iter().zip(&ttls) {
            call.arg(renewal.lease.owner.as_str())
                .arg(renewal.lease.token.0)
                .arg(*ttl_ms);
        }
        let answers: Vec<i64> = call
            .invoke(&mut self.conn())
            .await
            .map_err(|e| map("renew script", e))?;
        let Some((&now_ms, renewed)) = answers.split_first() else {
            return Err(bad_reply("the renew script answered nothing"));
        };
        if renewed.len() != renewals.len() {
            return Err(bad_reply(format!(
                "{} answers to {} renewals",
                renewed.len(),
                renewals.len()
            )));
        }
        let mut results: Vec<Result<Grant>> = renewals
            .iter()
            .zip(&ttls)
            .zip(renewed)
            .map(|((renewal, &ttl_ms), &renewed)| {
                let lease = &renewal.lease;
                lease
                    .found(renewed == 1)
                    .map(|()| renewal_grant(lease, ttl_ms, now_ms))
            })
            .collect();
        // One WAIT covers every write of the batch; without its
        // acknowledgement no renewal of the batch counts as confirmed.
        if results.iter().any(Result::is_ok) {
            if let Err(e) = self
                .wait_replicas(self.inner.keys.slot(&first.lease.key))
                .await
            {
                // Transient whatever WAIT's failure was: the writes are
                // done, only their acknowledgement is missing. The text
                // without the "redis backend: " the new error adds again.
                let text = e.to_string();
                let prefix = format!("{} backend: ", crate::error::NAME);
                let message = text.strip_prefix(&prefix).unwrap_or(&text).to_owned();
                for result in results.iter_mut().filter(|r| r.is_ok()) {
                    *result = Err(bad_reply_transient(message.clone()));
                }
            }
        }
        Ok(results)
    }

    /// Every lease whose key starts with `prefix`, with the server's `now`
    /// in ms. SCAN (never KEYS) in batches so the server is never blocked;
    /// in a cluster, on every primary in turn (SCAN walks one node's keys).
    async fn scan_leases(&self, prefix: Option<&str>) -> Result<(Vec<(LockInfo, i64)>, i64)> {
        if self.inner.options.plain {
            return self.scan_plain(prefix).await;
        }
        let nodes = self
            .inner
            .conn
            .primaries()
            .await
            .map_err(|e| map("CLUSTER SLOTS", e))?;
        let mut found = Vec::new();
        let mut now_ms = 0;
        for node in nodes {
            let (leases, node_now_ms) = self.scan_node(node, prefix).await?;
            found.extend(leases);
            now_ms = now_ms.max(node_now_ms);
        }
        // SCAN may return a key more than once.
        found.sort_by(|a, b| a.0.key.cmp(&b.0.key).then(a.0.token.cmp(&b.0.token)));
        found.dedup_by(|a, b| a.0.key == b.0.key && a.0.token == b.0.token);
        Ok((found, now_ms))
    }

    /// [`Self::scan_leases`] on one node (`conn`, routed to it).
    async fn scan_node(
        &self,
        mut conn: BoundedConnection,
        prefix: Option<&str>,
    ) -> Result<(Vec<(LockInfo, i64)>, i64)> {
        let pattern = self.inner.keys.lease_pattern(prefix);
        let mut cursor: u64 = 0;
        let mut found = Vec::new();
        let mut now_ms: i64;
        loop {
            let (next, names) = scan_page(&mut conn, cursor, &pattern).await?;
            let keyed: Vec<(LockKey, Vec<u8>)> = names
                .into_iter()
                .filter_map(|n| Some((self.inner.keys.user_key(&n)?, n)))
                .collect();
            let mut pipe = redis::pipe();
            pipe.cmd("TIME");
            for (_, name) in &keyed {
                pipe.cmd("HMGET")
                    .arg(name)
                    .arg(&["owner", "token", "kind", "data", "acquired", "expires"]);
                pipe.cmd("PTTL").arg(name);
            }
            let replies: Vec<Value> = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| map("HMGET pipeline", e))?;
            let mut replies = replies.into_iter();
            let (secs, micros): (i64, i64) = from_value(replies.next())?;
            now_ms = secs * 1000 + micros / 1000;
            for (key, _) in keyed {
                let mut fields: Vec<Value> = from_value(replies.next())?;
                let pttl: i64 = from_value(replies.next())?;
                let expires = fields.pop().unwrap_or(Value::Nil);
                let mut row = vec![Value::Int(1)];
                row.extend(fields);
                row.extend([Value::Int(pttl), Value::Int(now_ms), expires]);
                if let Some(info) = parse_describe(&key, &row)? {
                    let acquired = acquired_ms(&row)?;
                    found.push((info, acquired));
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        found.extend(self.scan_readers(conn, prefix).await?);
        Ok((found, now_ms))
    }

    /// [`Self::scan_leases`] in the `plain` layout, whose leases are the
    /// users' keys and cannot be told from other keys by name: the keys
    /// with a token counter (those fencelock locked in the counters' idle
    /// week), each inspected, so their holders of other libraries show too.
    async fn scan_plain(&self, prefix: Option<&str>) -> Result<(Vec<(LockInfo, i64)>, i64)> {
        let mut conn = self.conn();
        let pattern = self.inner.keys.counter_pattern(prefix);
        let mut cursor: u64 = 0;
        let mut found = Vec::new();
        let mut now_ms = 0;
        loop {
            let (next, names) = scan_page(&mut conn, cursor, &pattern).await?;
            for key in names
                .iter()
                .filter_map(|n| self.inner.keys.counter_user_key(n))
            {
                let row: Vec<Value> = Call::new(&self.inner.scripts.inspect, 3)
                    .key(self.inner.keys.lease(&key))
                    .key(self.inner.keys.readers(&key))
                    .key(self.inner.keys.readers_info(&key))
                    .invoke(&mut conn)
                    .await
                    .map_err(|e| map("inspect script", e))?;
                now_ms = field(&row, 7)?;
                if let Some(info) = parse_describe(&key, &row)? {
                    found.push((info, acquired_ms(&row)?));
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        found.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        found.dedup_by(|a, b| a.0.key == b.0.key);
        Ok((found, now_ms))
    }

    /// Every live reader lease of a key that starts with `prefix`, with its
    /// grant time in ms: a SCAN for readers sets, then one script per set.
    async fn scan_readers(
        &self,
        mut conn: BoundedConnection,
        prefix: Option<&str>,
    ) -> Result<Vec<(LockInfo, i64)>> {
        let pattern = self.inner.keys.readers_pattern(prefix);
        let mut cursor: u64 = 0;
        let mut found = Vec::new();
        loop {
            let (next, names) = scan_page(&mut conn, cursor, &pattern).await?;
            for key in names
                .iter()
                .filter_map(|n| self.inner.keys.readers_user_key(n))
            {
                let rows: Vec<Vec<Value>> = Call::new(&self.inner.scripts.readers, 2)
                    .key(self.inner.keys.readers(&key))
                    .key(self.inner.keys.readers_info(&key))
                    .invoke(&mut conn)
                    .await
                    .map_err(|e| map("readers script", e))?;
                for row in rows {
                    if let Some(info) = parse_describe(&key, &row)? {
                        found.push((info, acquired_ms(&row)?));
                    }
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        Ok(found)
    }
}

/// How far ahead the end of a foreign holder without expiry is shown.
const FOREIGN_WITHOUT_EXPIRY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The acquire scripts' first element when the key's counter has no token
/// left (`spent` in the scripts).
const SPENT: i64 = 2;

/// Whole milliseconds of `ttl`, at least one: PX cannot express less, and
/// `Grant::ttl` must not claim more than the server will keep.
pub fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The arguments `ACQUIRE` takes for one request, checked.
struct AcquireArgs {
    owner: String,
    ttl_ms: u64,
    kind: String,
    data: String,
    floor: String,
}

/// A request's label and JSON data as the scripts take them: `=KIND`, or
/// empty when there is no label (so that an empty label is still one), and
/// the JSON text, or empty when there is none.
pub fn label_and_data(request: &AcquireRequest) -> Result<(String, String)> {
    let kind = request
        .kind
        .as_ref()
        .map_or_else(String::new, |k| format!("={k}"));
    let data = match &request.data {
        Some(d) => serde_json::to_string(d)
            .map_err(|e| Error::InvalidArgument(format!("lock data: {e}")))?,
        None => String::new(),
    };
    Ok((kind, data))
}

impl AcquireArgs {
    fn of(request: &AcquireRequest) -> Result<Self> {
        let (kind, data) = label_and_data(request)?;
        // Lua numbers are doubles: the script compares and counts exactly
        // only up to 2^53, so floors stop at `MAX_FLOOR` (below it) and the
        // script refuses to draw past `FencingToken::MAX`.
        let floor = match request.min_token {
            Some(_) => request.floor()?.to_string(),
            None => String::new(),
        };
        Ok(Self {
            owner: request.owner.as_str().to_owned(),
            ttl_ms: ttl_ms(request.ttl),
            kind,
            data,
            floor,
        })
    }

    /// Appends the five arguments, in `ACQUIRE`'s order.
    fn add_to<'c, 'a>(&self, call: &'c mut Call<'a>) -> &'c mut Call<'a> {
        call.arg(&self.owner)
            .arg(self.ttl_ms)
            .arg(&self.kind)
            .arg(&self.data)
            .arg(&self.floor)
    }
}

/// The renew script's answer for `lease`: `{1, now_ms}` or `{0}`.
fn renewed(lease: &LeaseId, ttl_ms: u64, row: &[Value]) -> Result<Grant> {
    let renewed: i64 = field(row, 0)?;
    if renewed != 1 {
        return Err(Error::not_held(lease));
    }
    Ok(renewal_grant(lease, ttl_ms, field(row, 1)?))
}

/// The grant of a renewal of `lease` by `ttl_ms` at `now_ms` (server clock).
fn renewal_grant(lease: &LeaseId, ttl_ms: u64, now_ms: i64) -> Grant {
    Grant::new(
        lease.token,
        Duration::from_millis(ttl_ms),
        ms_to_time(now_ms.saturating_add(ttl_ms as i64)),
    )
}

/// What `try_acquire_all` answers for keys in several Cluster slots.
fn cross_slot() -> Error {
    Error::unsupported("redis", "one script over keys in several Cluster slots")
}

fn bad_reply_transient(message: String) -> Error {
    fencelock_core::BackendError::message(
        crate::error::NAME,
        fencelock_core::ErrorStatus::Transient,
        message,
    )
    .into()
}

/// A reply (or a missing one) converted; a permanent error otherwise.
pub fn from_value<T: redis::FromRedisValue>(v: Option<Value>) -> Result<T> {
    let v = v.ok_or_else(|| bad_reply("redis reply is shorter than expected"))?;
    redis::from_owned_redis_value(v).map_err(|e| bad_reply(format!("unexpected redis reply: {e}")))
}

/// Field `i` of a script's answer `row`, converted; a permanent error when
/// it is missing or of another type.
pub fn field<T: redis::FromRedisValue>(row: &[Value], i: usize) -> Result<T> {
    from_value(row.get(i).cloned())
}

/// A server time in ms since the epoch (the epoch itself when out of range).
pub fn ms_to_time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

fn acquired_ms(row: &[Value]) -> Result<i64> {
    let s: Option<String> = field(row, 5)?;
    Ok(s.and_then(|s| s.parse().ok()).unwrap_or(0))
}

/// A token as the scripts write it (decimal).
pub fn parse_token(s: &str) -> Result<FencingToken> {
    s.parse::<u64>()
        .map(FencingToken)
        .map_err(|_| bad_reply(format!("token {s:?} under a fencelock key is not a u64")))
}

/// Parses the `{found, owner, token, kind, data, acquired_ms, pttl_ms,
/// now_ms, expires_ms}` shape of the scripts' `describe`.
pub fn parse_describe(key: &LockKey, row: &[Value]) -> Result<Option<LockInfo>> {
    // A reader's row has a tenth field, 1 (docs/rwlock.md).
    let mode = match row.len() {
        9 => LockMode::Exclusive,
        10 => LockMode::Shared,
        n => return Err(bad_reply(format!("describe returned {n} fields"))),
    };
    let owner: Option<String> = field(row, 1)?;
    let token: Option<String> = field(row, 2)?;
    let pttl: i64 = field(row, 6)?;
    let (Some(owner), Some(token)) = (owner, token) else {
        return Ok(None);
    };
    if pttl == -2 {
        return Ok(None);
    }
    let now_ms: i64 = field(row, 7)?;
    let kind: Option<String> = field(row, 3)?;
    let data: Option<String> = field(row, 4)?;
    let data = match data {
        Some(d) => Some(
            serde_json::from_str(&d)
                .map_err(|e| bad_reply(format!("lock data is not JSON: {e}")))?,
        ),
        None => None,
    };
    // A foreign holder's key may have no expiry (PTTL -1): it stays held
    // until deleted, shown as ending in a year so waiters keep backing off.
    let remaining = match pttl {
        -1 => FOREIGN_WITHOUT_EXPIRY.as_millis() as u64,
        pttl => u64::try_from(pttl).unwrap_or(0),
    };
    let expires_ms = field::<Option<String>>(row, 8)?
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or_else(|| now_ms.saturating_add(remaining as i64));
    Ok(Some(LockInfo {
        key: key.clone(),
        owner: Owner::new(owner).map_err(|e| bad_reply(format!("stored owner is invalid: {e}")))?,
        token: parse_token(&token)?,
        kind,
        data,
        acquired_at: ms_to_time(acquired_ms(row)?),
        expires_at: ms_to_time(expires_ms),
        expires_in: Duration::from_millis(remaining),
        mode,
    }))
}

#[async_trait]
impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .with_wakeups(true)
            .with_persistent(true)
            .with_min_token(true)
            .with_batch_renew(true)
            .with_set_data(true)
            // Other libraries' locks know no readers: a reader of the
            // `plain` layout would not keep their writers out.
            .with_shared(!self.inner.options.plain)
            // See `try_acquire_all`: not in a cluster.
            .with_atomic_multi(!self.inner.conn.is_cluster())
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let script = match request.mode {
            LockMode::Exclusive => &self.inner.scripts.acquire,
            LockMode::Shared => {
                self.readers_allowed()?;
                &self.inner.scripts.acquire_shared
            }
        };
        self.acquire_with(script, request).await
    }

    /// One script over every key (`ACQUIRE_ALL`). On one server a script
    /// may touch any keys. In a Redis Cluster this answers
    /// [`Error::Unsupported`] (and `atomic_multi` is not claimed), as it
    /// does for keys in several slots through a Cluster proxy (`CROSSSLOT`):
    /// the client then takes the keys one by one.
    async fn try_acquire_all(&self, requests: &[AcquireRequest]) -> Result<AcquireAll> {
        let args = requests
            .iter()
            .map(AcquireArgs::of)
            .collect::<Result<Vec<_>>>()?;
        // A script runs on one slot, and user keys cannot be steered into
        // one (braces are encoded, so a user's own hash tag is not one): in
        // a cluster a set shares a slot only by chance, so the claim is not
        // made there and the client takes the keys one by one. Through a
        // proxy, the server's CROSSSLOT says the same.
        if self.inner.conn.is_cluster() {
            return Err(cross_slot());
        }
        let slot = requests
            .first()
            .map(|r| self.inner.keys.slot(&r.key))
            .unwrap_or_default();
        let mut call = Call::new(&self.inner.scripts.acquire_all, 5 * requests.len());
        for request in requests {
            self.add_acquire_keys(&mut call, request);
        }
        for a in &args {
            a.add_to(&mut call);
        }
        call.arg(self.inner.keys.changes());
        for request in requests {
            call.arg(request.key.as_str());
        }
        let row: Vec<Value> = match call.invoke(&mut self.conn()).await {
            Ok(row) => row,
            Err(e) if e.kind() == redis::ErrorKind::CrossSlot => return Err(cross_slot()),
            Err(e) => return Err(map("acquire script", e)),
        };
        let answer: i64 = field(&row, 0)?;
        if answer != 1 {
            let index: usize = field(&row, 1)?;
            let key = &requests
                .get(index)
                .ok_or_else(|| bad_reply(format!("held key index {index} out of range")))?
                .key;
            if answer == SPENT {
                return Err(Error::TokensExhausted { key: key.clone() });
            }
            let holder: Vec<Value> = field(&row, 2)?;
            return Ok(AcquireAll::Held {
                index,
                holder: parse_describe(key, &holder)?,
            });
        }
        let mut grants = Vec::with_capacity(requests.len());
        for (i, a) in args.iter().enumerate() {
            let token: String = field(&row, 1 + 2 * i)?;
            let now_ms: i64 = field(&row, 2 + 2 * i)?;
            grants.push(Grant::new(
                parse_token(&token)?,
                Duration::from_millis(a.ttl_ms),
                ms_to_time(now_ms.saturating_add(a.ttl_ms as i64)),
            ));
        }
        if let Err(e) = self.wait_replicas(slot).await {
            // Do not leave leases nobody will use behind.
            for (request, grant) in requests.iter().zip(&grants) {
                let _ = self.release(&request.lease(grant.token)).await;
            }
            return Err(e);
        }
        Ok(AcquireAll::Granted(grants))
    }

    async fn renew(&self, lease: &LeaseId, ttl: Duration) -> Result<Grant> {
        if lease.mode == LockMode::Shared {
            // Readers have only the batch script.
            return renew_alone(lease, ttl, |one| async move {
                self.renew_side(LockMode::Shared, &one).await
            })
            .await;
        }
        let ttl_ms = ttl_ms(ttl);
        let row: Vec<Value> = Call::new(&self.inner.scripts.renew, 1)
            .key(self.inner.keys.lease(&lease.key))
            .arg(lease.owner.as_str())
            .arg(lease.token.0)
            .arg(ttl_ms)
            .invoke(&mut self.conn())
            .await
            .map_err(|e| map("renew script", e))?;
        let grant = renewed(lease, ttl_ms, &row)?;
        self.wait_replicas(self.inner.keys.slot(&lease.key)).await?;
        Ok(grant)
    }

    async fn release(&self, lease: &LeaseId) -> Result<()> {
        let (key, owner, token) = (&lease.key, &lease.owner, lease.token);
        let script = match lease.mode {
            LockMode::Exclusive => &self.inner.scripts.release,
            LockMode::Shared => &self.inner.scripts.release_shared,
        };
        let mut call = Call::new(script, self.keys_per_lease(lease.mode)?);
        self.add_lease_keys(&mut call, lease.mode, key);
        let removed: i64 = call
            .arg(owner.as_str())
            .arg(token.0)
            .arg(self.inner.keys.channel(key.as_str()))
            .arg(key.as_str())
            .arg(self.inner.keys.changes())
            .invoke(&mut self.conn())
            .await
            .map_err(|e| map("release script", e))?;
        lease.found(removed == 1)
    }

    async fn set_data(&self, lease: &LeaseId, data: Option<serde_json::Value>) -> Result<()> {
        let data = match &data {
            Some(d) => serde_json::to_string(d)
                .map_err(|e| Error::InvalidArgument(format!("lock data: {e}")))?,
            None => String::new(),
        };
        let changed: i64 = Call::new(&self.inner.scripts.set_data, 1)
            .key(self.inner.keys.lease(&lease.key))
            .arg(lease.owner.as_str())
            .arg(lease.token.0)
            .arg(data)
            .invoke(&mut self.conn())
            .await
            .map_err(|e| map("set_data script", e))?;
        lease.found(changed == 1)?;
        self.wait_replicas(self.inner.keys.slot(&lease.key)).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let row: Vec<Value> = Call::new(&self.inner.scripts.inspect, 3)
            .key(self.inner.keys.lease(key))
            .key(self.inner.keys.readers(key))
            .key(self.inner.keys.readers_info(key))
            .invoke(&mut self.conn())
            .await
            .map_err(|e| map("inspect script", e))?;
        parse_describe(key, &row)
    }

    async fn subscribe(&self, key: &LockKey) -> Result<Option<WakeSubscription>> {
        Ok(Some(self.inner.wakeups.subscribe(key).await?))
    }

    async fn changes(&self) -> Result<Option<ChangeFeed>> {
        Ok(Some(self.inner.wakeups.changes().await?))
    }

    fencelock_core::offers!(admin);

    fn write_intents(&self) -> Option<&dyn WriteIntents> {
        // `layout=plain` has no readers (`readers_allowed`).
        (!self.inner.options.plain).then_some(self as &dyn WriteIntents)
    }

    async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        renew_each_mode(self.name(), renewals, |mode, batch| async move {
            self.renew_side(mode, &batch).await
        })
        .await
    }
}

/// Where each side of a key keeps its leases: a writer's (or plain lock's)
/// hash, or the readers' sorted set and their records.
impl RedisBackend {
    /// How many keys a script over one lease of `mode` takes; a reader's
    /// is refused in `layout=plain`.
    fn keys_per_lease(&self, mode: LockMode) -> Result<usize> {
        match mode {
            LockMode::Exclusive => Ok(1),
            LockMode::Shared => self.readers_allowed().map(|()| 2),
        }
    }

    /// Appends the keys of a lease of `mode` on `key`.
    fn add_lease_keys(&self, call: &mut Call<'_>, mode: LockMode, key: &LockKey) {
        let keys = &self.inner.keys;
        match mode {
            LockMode::Exclusive => call.key(keys.lease(key)),
            LockMode::Shared => call.key(keys.readers(key)).key(keys.readers_info(key)),
        };
    }

    /// One batch script over leases all held in `mode`.
    async fn renew_side(&self, mode: LockMode, renewals: &[Renewal]) -> Result<Vec<Result<Grant>>> {
        let script = match mode {
            LockMode::Exclusive => &self.inner.scripts.renew_many,
            LockMode::Shared => &self.inner.scripts.renew_many_shared,
        };
        let keys = self.keys_per_lease(mode)?;
        self.renew_batch(script, renewals, keys, |call, key| {
            self.add_lease_keys(call, mode, key)
        })
        .await
    }
}

/// One page of `SCAN cursor MATCH pattern COUNT 1000`: the next cursor (0
/// at the end) and the key names found.
async fn scan_page(
    conn: &mut BoundedConnection,
    cursor: u64,
    pattern: &str,
) -> Result<(u64, Vec<Vec<u8>>)> {
    redis::cmd("SCAN")
        .arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000)
        .query_async(conn)
        .await
        .map_err(|e| map("SCAN", e))
}
