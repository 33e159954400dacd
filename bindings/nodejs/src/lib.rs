//! The native half of the `fencelock` npm package: napi-rs classes over the
//! `fencelock` facade. Everything here converts (types, errors, futures);
//! the locking, renewal and loss deadline are the Rust client's. The
//! JavaScript half (`index.js`, `index.mjs`, `index.d.ts`) adds what is
//! idiom in Node.js: the `'lost'` event, `AbortSignal` in `run`, typed error
//! classes.
//!
//! One module per concern, as the package's classes are:
//! - [`client`], `connect` and the client's calls;
//! - [`guard`], a held lock or leadership, and locks on several keys;
//! - [`election`], campaigns and the leader;
//! - [`watch`], the changes of a key's holders and of an election's leaders;
//! - [`fence`], fences;
//! - [`errors`], how a failure crosses into JavaScript (a structured
//!   `Error`, never a message to parse), and the promises that carry it;
//! - [`convert`], durations, tokens and the plain objects of leases and
//!   counts.

// No `forbid(unsafe_code)` or `missing_docs` here: napi-derive's generated
// glue is unsafe code with undocumented items.

// Public so that the items napi-rs registers (in a test build too, where
// nothing registers them) count as the crate's API.
pub mod client;
pub mod convert;
pub mod election;
pub mod errors;
pub mod fence;
pub mod guard;
pub mod watch;

use napi::{bindgen_prelude::Either, Env};
use napi_derive::napi;

/// Blocks the JavaScript thread until the releases that collected guards
/// sent in the background are done, at most `bound_ms`; `true` when none
/// is left. `index.js` runs it in the `'exit'` event after closing the
/// clients still open, so that a guard collected just before the exit is
/// released too.
#[napi]
pub fn wait_for_background_releases(env: Env, bound_ms: f64) -> napi::Result<bool> {
    let bound = convert::duration(&Either::A(bound_ms), "bound", false)
        .map_err(|e| errors::to_js(&env, e))?;
    Ok(napi::bindgen_prelude::block_on(
        fencelock::wait_for_background_releases(bound),
    ))
}
