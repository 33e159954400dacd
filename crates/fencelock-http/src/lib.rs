//! The `http://` and `https://` backend of fencelock: locks taken through a
//! `fencelock serve` lock service (`docs/http.md`).
//!
//! The [`wire`] module holds the JSON bodies of the REST API, shared by the
//! service and this client so that the two never disagree.

#![forbid(unsafe_code)]

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
mod replicas;
pub mod wire;

#[cfg(feature = "client")]
pub use client::{HttpBackend, HttpDriver, HttpFence, TOKEN_ENV};
