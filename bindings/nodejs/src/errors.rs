//! How a fencelock failure crosses into JavaScript.
//!
//! A failure becomes a JavaScript `Error` made on the JavaScript thread,
//! its parts set as properties: `fencelockCode` (the stable code of
//! [`fencelock::Error::code`], the words of the CLI's `--json` errors and
//! of the REST API, except that a wait that ended with the key held is
//! `not_acquired`, the name the package promises) and `clientClosed`. `index.js` picks its typed class from
//! them; nothing parses a message. An `Error` without `fencelockCode` is
//! napi-rs's own (a wrong argument type, a panic).
//!
//! The client's calls return promises made by [`settle`]: the call runs on
//! the binding's tokio runtime and its error is made into the `Error` above
//! when the promise settles, where a JavaScript value can be made.

use std::future::Future;

use napi::{bindgen_prelude::ToNapiValue, Env, JsObject, Status};

/// The JavaScript `Error` of `e`, for a call on the JavaScript thread to
/// throw (or a promise to reject with).
pub(crate) fn to_js(env: &Env, e: fencelock::Error) -> napi::Error {
    match structured(env, &e) {
        Ok(error) => napi::Error::from(error.into_unknown()),
        // Making an object failed (the JavaScript heap is exhausted): the
        // message at least.
        Err(_) => napi::Error::new(Status::GenericFailure, e.to_string()),
    }
}

fn structured(env: &Env, e: &fencelock::Error) -> napi::Result<JsObject> {
    let code = match e {
        fencelock::Error::Timeout { .. } => "not_acquired",
        _ => e.code(),
    };
    let mut error = env.create_error(napi::Error::new(Status::GenericFailure, e.to_string()))?;
    error.set_named_property("fencelockCode", code)?;
    error.set_named_property("clientClosed", matches!(e, fencelock::Error::ClientClosed))?;
    Ok(error)
}

/// A promise of `work`'s outcome: `work` runs on the binding's runtime;
/// the promise resolves with its value or rejects with [`to_js`] of its
/// error.
pub(crate) fn settle<T, F>(env: &Env, work: F) -> napi::Result<JsObject>
where
    T: ToNapiValue + Send + 'static,
    F: Future<Output = fencelock::Result<T>> + Send + 'static,
{
    env.execute_tokio_future(async move { Ok(work.await) }, |env, outcome| {
        outcome.map_err(|e| to_js(env, e))
    })
}
