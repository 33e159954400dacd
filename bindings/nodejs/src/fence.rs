//! Fences: what a protected resource uses to refuse stale tokens.

use std::sync::Arc;

use fencelock::LockMode;
use napi::{
    bindgen_prelude::{BigInt, Env},
    JsObject,
};
use napi_derive::napi;

use crate::{
    convert::{token_from_js, token_to_js},
    errors::settle,
};

type Result<T> = napi::Result<T>;

/// Opens the fence kept by the backend a URL names.
#[napi(ts_return_type = "Promise<Fence>")]
pub fn open_fence(env: Env, url: String) -> Result<JsObject> {
    settle(&env, async move {
        Ok(Fence {
            inner: fencelock::open_fence(&url).await?,
        })
    })
}

/// A fence: admits a resource's writes only with the highest token seen.
#[napi]
pub struct Fence {
    inner: Arc<dyn fencelock::Fence>,
}

#[napi]
impl Fence {
    /// Admits `token` for `resource` (exclusive holders); rejects a stale one.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn admit(&self, env: Env, resource: String, token: BigInt) -> Result<JsObject> {
        let fence = Arc::clone(&self.inner);
        settle(&env, async move {
            fence.admit(&resource, token_from_js(token)?).await
        })
    }

    /// Admits `token` of a reader of a read-write lock.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn admit_shared(&self, env: Env, resource: String, token: BigInt) -> Result<JsObject> {
        let fence = Arc::clone(&self.inner);
        settle(&env, async move {
            fence
                .admit_shared(&resource, token_from_js(token)?, LockMode::Shared)
                .await
        })
    }

    /// Forgets `resource` (`Fence::reset`): its highest tokens and its
    /// stored value; the highest token it had, or `null`.
    #[napi(ts_return_type = "Promise<bigint | null>")]
    pub fn reset(&self, env: Env, resource: String) -> Result<JsObject> {
        let fence = Arc::clone(&self.inner);
        settle(&env, async move {
            Ok(fence.reset(&resource).await?.map(token_to_js))
        })
    }
}
