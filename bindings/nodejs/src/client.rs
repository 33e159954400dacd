//! `connect` and the client's calls: acquisitions of every kind, the
//! backend's view of its leases, `resume`, `watch` and elections.

use fencelock::{AcquireSettings, LockClient, Owner};
use napi::{Env, JsObject};
use napi_derive::napi;
use tokio::runtime::Handle;

use crate::{
    convert::{opt_duration, token_from_js, JsDuration, LockInfo, Stats},
    election::{Election, ElectionOptions},
    errors::{settle, to_js},
    guard::{Guard, MultiGuard},
    watch::KeyWatch,
};

type Result<T> = napi::Result<T>;

/// Options of `connect`.
#[napi(object)]
pub struct ConnectOptions {
    /// The owner name locks are taken as (default: generated, host and pid).
    pub owner: Option<String>,
    /// The default lease length of this client's locks.
    #[napi(ts_type = "number | string")]
    pub ttl: Option<JsDuration>,
    /// The bound on each backend call.
    #[napi(ts_type = "number | string")]
    pub op_timeout: Option<JsDuration>,
}

/// Options of an acquisition.
#[napi(object)]
pub struct LockOptions {
    /// Lease length: milliseconds or a duration string (default: the
    /// client's, 30s).
    #[napi(ts_type = "number | string")]
    pub ttl: Option<JsDuration>,
    /// How long to wait for a held key (default 0: one try; `Infinity`:
    /// forever).
    #[napi(ts_type = "number | string")]
    pub wait: Option<JsDuration>,
    /// Take the lock as this owner instead of the client's.
    pub owner: Option<String>,
    /// A free-form label shown by inspect, list and stats.
    pub kind: Option<String>,
    /// JSON data stored with the lease.
    pub data: Option<serde_json::Value>,
    /// Renewal period (default: a third of the TTL).
    #[napi(ts_type = "number | string")]
    pub renew_every: Option<JsDuration>,
    /// Lock delay: a release before this keeps the key until it has passed.
    #[napi(ts_type = "number | string")]
    pub hold_at_least: Option<JsDuration>,
}

/// Options of `resume`.
#[napi(object)]
pub struct ResumeOptions {
    /// Lease length from now on (default: the client's).
    #[napi(ts_type = "number | string")]
    pub ttl: Option<JsDuration>,
    /// Renewal period (default: a third of the TTL).
    #[napi(ts_type = "number | string")]
    pub renew_every: Option<JsDuration>,
}

/// Connects to the backend a URL names.
#[napi(ts_return_type = "Promise<Client>")]
pub fn connect(env: Env, url: String, options: Option<ConnectOptions>) -> Result<JsObject> {
    settle(&env, async move {
        let backend = fencelock::open_backend(&url).await?;
        let mut builder = LockClient::builder(backend);
        if let Some(options) = options {
            if let Some(owner) = options.owner {
                builder = builder.owner(Owner::new(owner)?);
            }
            if let Some(ttl) = opt_duration(&options.ttl, "ttl", false)? {
                builder = builder.ttl(ttl);
            }
            if let Some(t) = opt_duration(&options.op_timeout, "opTimeout", false)? {
                builder = builder.op_timeout(t);
            }
        }
        Ok(Client {
            inner: builder.build()?,
            runtime: Handle::try_current().ok(),
        })
    })
}

/// A lock client (native half).
#[napi]
pub struct Client {
    inner: LockClient,
    /// The binding's runtime, where the exit hook's `close` runs.
    runtime: Option<Handle>,
}

/// `request` with the settings of `options` that every acquisition takes
/// (the label and data moved out of `o`, not copied).
fn settings<R: AcquireSettings>(mut request: R, o: &mut LockOptions) -> fencelock::Result<R> {
    if let Some(ttl) = opt_duration(&o.ttl, "ttl", false)? {
        request = request.ttl(ttl);
    }
    if let Some(wait) = opt_duration(&o.wait, "wait", true)? {
        request = request.wait(wait);
    }
    if let Some(kind) = o.kind.take() {
        request = request.kind(kind);
    }
    if let Some(data) = o.data.take() {
        request = request.data(data);
    }
    if let Some(period) = opt_duration(&o.renew_every, "renewEvery", false)? {
        request = request.renew_every(period);
    }
    Ok(request)
}

/// `request` with every option of one lock's acquisition applied.
fn request<'a>(
    request: fencelock::LockRequest<'a>,
    options: Option<LockOptions>,
) -> fencelock::Result<fencelock::LockRequest<'a>> {
    let Some(mut o) = options else {
        return Ok(request);
    };
    let mut request = settings(request, &mut o)?;
    if let Some(owner) = o.owner {
        request = request.owner(Owner::new(owner)?);
    }
    if let Some(delay) = opt_duration(&o.hold_at_least, "holdAtLeast", false)? {
        request = request.hold_at_least(delay);
    }
    Ok(request)
}

#[napi]
impl Client {
    /// The owner name this client's locks are taken as.
    #[napi(getter)]
    pub fn owner(&self) -> String {
        self.inner.owner().as_str().to_owned()
    }

    /// Acquires `key` (exclusive).
    #[napi(ts_return_type = "Promise<Guard>")]
    pub fn acquire(&self, env: Env, key: String, options: Option<LockOptions>) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move {
            let guard = request(client.lock(key), options)?.acquire().await?;
            Ok(Guard::lock(guard, None))
        })
    }

    /// Acquires the read-write lock `key` as a reader (`shared`) or writer.
    #[napi(ts_return_type = "Promise<Guard>")]
    pub fn acquire_rw(
        &self,
        env: Env,
        key: String,
        shared: bool,
        options: Option<LockOptions>,
    ) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move {
            let rw = client.rwlock(key);
            let base = if shared { rw.read() } else { rw.write() };
            let guard = request(base, options)?.acquire().await?;
            Ok(Guard::lock(guard, None))
        })
    }

    /// Takes one of the `permits` permits of the semaphore `name`.
    #[napi(ts_return_type = "Promise<Guard>")]
    pub fn acquire_permit(
        &self,
        env: Env,
        name: String,
        permits: u32,
        options: Option<LockOptions>,
    ) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move {
            let mut sem = client.semaphore(name, permits);
            if let Some(mut o) = options {
                sem = settings(sem, &mut o)?;
            }
            let permit = sem.acquire().await?;
            let slot = permit.slot();
            Ok(Guard::lock(permit.into_guard(), Some(slot)))
        })
    }

    /// Acquires every key of `keys`, all or none.
    #[napi(ts_return_type = "Promise<MultiGuard>")]
    pub fn lock_all(
        &self,
        env: Env,
        keys: Vec<String>,
        options: Option<LockOptions>,
    ) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move {
            let mut multi = client.lock_all(keys);
            if let Some(mut o) = options {
                multi = settings(multi, &mut o)?;
            }
            Ok(MultiGuard::new(multi.acquire().await?))
        })
    }

    /// The current lease of `key`, if any.
    #[napi(ts_return_type = "Promise<LockInfo | null>")]
    pub fn inspect(&self, env: Env, key: String) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move {
            Ok(client.inspect(&key).await?.map(LockInfo::from))
        })
    }

    /// Every current lease (whose key starts with `prefix`).
    #[napi(ts_return_type = "Promise<Array<LockInfo>>")]
    pub fn list(&self, env: Env, prefix: Option<String>) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move {
            let leases = client.list(prefix.as_deref()).await?;
            Ok(leases.into_iter().map(LockInfo::from).collect::<Vec<_>>())
        })
    }

    /// Counts of the backend's leases.
    #[napi(ts_return_type = "Promise<Stats>")]
    pub fn stats(&self, env: Env) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move { Ok(Stats::from(client.stats().await?)) })
    }

    /// Ends the lease of `key` whoever holds it; the lease it ended, if any.
    #[napi(ts_return_type = "Promise<LockInfo | null>")]
    pub fn force_release(&self, env: Env, key: String) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move {
            Ok(client.force_release(&key).await?.map(LockInfo::from))
        })
    }

    /// Deletes expired leases; how many.
    #[napi(ts_return_type = "Promise<number>")]
    pub fn cleanup(&self, env: Env) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move { Ok(client.cleanup().await? as f64) })
    }

    /// Re-attaches to the lease of `owner` on `key` granted with `token`
    /// (one a guard detached, here or in another process): a guard renewed
    /// by this client, once the backend confirmed the lease is current.
    #[napi(ts_return_type = "Promise<Guard>")]
    pub fn resume(
        &self,
        env: Env,
        key: String,
        owner: String,
        token: napi::bindgen_prelude::BigInt,
        options: Option<ResumeOptions>,
    ) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move {
            let owner = Owner::new(owner)?;
            let mut request = client.resume(key, owner, token_from_js(token)?);
            if let Some(o) = options {
                if let Some(ttl) = opt_duration(&o.ttl, "ttl", false)? {
                    request = request.ttl(ttl);
                }
                if let Some(period) = opt_duration(&o.renew_every, "renewEvery", false)? {
                    request = request.renew_every(period);
                }
            }
            Ok(Guard::lock(request.await?, None))
        })
    }

    /// The holder changes of `key` from now on.
    #[napi(ts_return_type = "Promise<KeyWatch>")]
    pub fn watch(&self, env: Env, key: String) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(
            &env,
            async move { Ok(KeyWatch::new(client.watch(&key).await?)) },
        )
    }

    /// The election `name`.
    #[napi]
    pub fn election(
        &self,
        env: Env,
        name: String,
        options: Option<ElectionOptions>,
    ) -> Result<Election> {
        Election::new(&self.inner, name, options).map_err(|e| to_js(&env, e))
    }

    /// Releases every lock this client holds and stops its renewer.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close(&self, env: Env) -> Result<JsObject> {
        let client = self.inner.clone();
        settle(&env, async move { client.close().await })
    }

    /// `close()`, blocking the JavaScript thread until done (each release
    /// bounded by the operation timeout): what `index.js` runs for every
    /// client still open when Node.js exits normally (its `'exit'` event:
    /// the event loop ran out of work, or `process.exit()`), when no
    /// Promise can settle any more. Python's interpreter releases a
    /// process's locks at exit alike. A crash or a kill releases nothing.
    #[napi]
    pub fn close_blocking(&self) {
        let Some(runtime) = &self.runtime else {
            return;
        };
        if let Err(e) = runtime.block_on(self.inner.close()) {
            eprintln!("fencelock: releasing the locks held at exit: {e}");
        }
    }
}
