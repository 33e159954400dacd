//! Elections: campaigning for a [`Guard`] of the leadership, the current
//! leader, and observing the leader's changes ([`LeaderObserver`]).

use fencelock::LockClient;
use napi::{bindgen_prelude::Env, JsObject};
use napi_derive::napi;

use crate::{
    convert::{opt_duration, JsDuration, Leader},
    errors::settle,
    guard::Guard,
    watch::LeaderObserver,
};

type Result<T> = napi::Result<T>;

/// Options of an election.
#[napi(object)]
pub struct ElectionOptions {
    /// The leader's lease length.
    #[napi(ts_type = "number | string")]
    pub ttl: Option<JsDuration>,
    /// How long `campaign` waits (default: forever).
    #[napi(ts_type = "number | string")]
    pub wait: Option<JsDuration>,
    /// The value the leader publishes.
    pub value: Option<serde_json::Value>,
}

/// A leader election (native half).
#[napi]
pub struct Election {
    inner: fencelock::Election,
}

impl Election {
    pub(crate) fn new(
        client: &LockClient,
        name: String,
        options: Option<ElectionOptions>,
    ) -> fencelock::Result<Self> {
        let mut election = client.election(name);
        if let Some(o) = options {
            if let Some(ttl) = opt_duration(&o.ttl, "ttl", false)? {
                election = election.ttl(ttl);
            }
            if let Some(wait) = opt_duration(&o.wait, "wait", true)? {
                election = election.wait(wait);
            }
            if let Some(value) = o.value {
                election = election.value(value);
            }
        }
        Ok(Election { inner: election })
    }
}

#[napi]
impl Election {
    /// Waits to become the leader.
    #[napi(ts_return_type = "Promise<Guard>")]
    pub fn campaign(&self, env: Env) -> Result<JsObject> {
        let election = self.inner.clone();
        settle(&env, async move {
            Ok(Guard::leader(election.campaign().await?))
        })
    }

    /// The current leader, if any.
    #[napi(ts_return_type = "Promise<Leader | null>")]
    pub fn leader(&self, env: Env) -> Result<JsObject> {
        let election = self.inner.clone();
        settle(&env, async move {
            Ok(election.leader().await?.map(Leader::from))
        })
    }

    /// The current leader (first) and every change from now on.
    #[napi(ts_return_type = "Promise<LeaderObserver>")]
    pub fn observe(&self, env: Env) -> Result<JsObject> {
        let election = self.inner.clone();
        settle(&env, async move {
            Ok(LeaderObserver::new(election.observe().await?))
        })
    }
}
