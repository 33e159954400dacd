//! The two streams of changes a client can follow: a key's holders
//! (`client.watch`, [`KeyWatch`]) and an election's leaders
//! (`election.observe`, [`LeaderObserver`]). Both are read one `next` at a
//! time from JavaScript and end with `close`.

use std::sync::Arc;

use fencelock::{CancellationToken, HolderChange};
use futures_util::{Stream, StreamExt};
use napi::{
    bindgen_prelude::{BigInt, Env, ToNapiValue},
    JsObject,
};
use napi_derive::napi;

use crate::{
    convert::{token_to_js, Leader, LockInfo},
    errors::settle,
};

type Result<T> = napi::Result<T>;

/// A stream of the core's changes as JavaScript reads it: `next` settles
/// with the next change converted, or with `null` once closed or when the
/// backend's stream ended.
struct Changes<S> {
    stream: Arc<tokio::sync::Mutex<S>>,
    closed: CancellationToken,
}

impl<S, C> Changes<S>
where
    S: Stream<Item = fencelock::Result<C>> + Unpin + Send + 'static,
    C: 'static,
{
    fn new(stream: S) -> Self {
        Changes {
            stream: Arc::new(tokio::sync::Mutex::new(stream)),
            closed: CancellationToken::new(),
        }
    }

    /// `convert` gives `None` for a kind of change this binding does not
    /// know yet: the stream ends rather than misreport it.
    fn next<T>(&self, env: &Env, convert: fn(C) -> Option<T>) -> Result<JsObject>
    where
        T: ToNapiValue + Send + 'static,
    {
        let stream = Arc::clone(&self.stream);
        let closed = self.closed.clone();
        settle(env, async move {
            let mut stream = stream.lock().await;
            let change = tokio::select! {
                change = stream.next() => change.transpose()?,
                () = closed.cancelled() => None,
            };
            Ok(change.and_then(convert))
        })
    }

    fn close(&self) {
        self.closed.cancel();
    }
}

/// A change of a key's holder.
#[napi(object)]
pub struct KeyChange {
    /// `'acquired'`, `'released'` (or force-released) or `'expired'`.
    pub kind: String,
    /// The key.
    pub key: String,
    /// The holder whose lease began or ended.
    pub owner: String,
    /// That lease's fencing token.
    pub token: BigInt,
    /// The new lease as the backend reports it (`'acquired'`).
    pub lease: Option<LockInfo>,
}

impl KeyChange {
    fn new(change: HolderChange) -> Option<Self> {
        let (kind, id, lease) = match change {
            HolderChange::Acquired(info) => {
                let id = fencelock::LeaseId::new(info.key.clone(), info.owner.clone(), info.token);
                ("acquired", id, Some(LockInfo::from(info)))
            }
            HolderChange::Released(id) => ("released", id, None),
            HolderChange::Expired(id) => ("expired", id, None),
            _ => return None,
        };
        Some(KeyChange {
            kind: kind.into(),
            key: id.key.as_str().to_owned(),
            owner: id.owner.as_str().to_owned(),
            token: token_to_js(id.token),
            lease,
        })
    }
}

/// The holder changes of a key (native half of `watch`).
#[napi]
pub struct KeyWatch(Changes<fencelock::Watch>);

impl KeyWatch {
    pub(crate) fn new(watch: fencelock::Watch) -> Self {
        KeyWatch(Changes::new(watch))
    }
}

#[napi]
impl KeyWatch {
    /// The next change; `null` once closed or when the backend's watch ended.
    #[napi(ts_return_type = "Promise<KeyChange | null>")]
    pub fn next(&self, env: Env) -> Result<JsObject> {
        self.0.next(&env, KeyChange::new)
    }

    /// Stops watching: a pending and every later `next` give `null`.
    #[napi]
    pub fn close(&self) {
        self.0.close();
    }
}

/// A change of an election's leader.
#[napi(object)]
pub struct LeaderChange {
    /// `'elected'` or `'vacant'`.
    pub kind: String,
    /// The new leader (`'elected'`).
    pub leader: Option<Leader>,
    /// The term that ended (`'vacant'`).
    pub previous_term: Option<BigInt>,
    /// Whether that term's lease expired rather than being released (`'vacant'`).
    pub expired: Option<bool>,
}

impl LeaderChange {
    fn new(change: fencelock::LeaderChange) -> Option<Self> {
        match change {
            fencelock::LeaderChange::Elected(leader) => Some(LeaderChange {
                kind: "elected".into(),
                leader: Some(leader.into()),
                previous_term: None,
                expired: None,
            }),
            fencelock::LeaderChange::Vacant {
                previous_term,
                expired,
            } => Some(LeaderChange {
                kind: "vacant".into(),
                leader: None,
                previous_term: Some(token_to_js(previous_term)),
                expired: Some(expired),
            }),
            _ => None,
        }
    }
}

/// The changes of an election's leader (native half of `observe`).
#[napi]
pub struct LeaderObserver(Changes<fencelock::LeaderWatch>);

impl LeaderObserver {
    pub(crate) fn new(watch: fencelock::LeaderWatch) -> Self {
        LeaderObserver(Changes::new(watch))
    }
}

#[napi]
impl LeaderObserver {
    /// The next change; `null` once closed or when the backend's watch ended.
    #[napi(ts_return_type = "Promise<LeaderChange | null>")]
    pub fn next(&self, env: Env) -> Result<JsObject> {
        self.0.next(&env, LeaderChange::new)
    }

    /// Stops observing: a pending and every later `next` give `null`.
    #[napi]
    pub fn close(&self) {
        self.0.close();
    }
}
