//! Model checks of fencelock's own protocols with
//! [stateright](https://docs.rs/stateright): Redlock with quorum-monotonic
//! tokens ([`redlock_fast`], the one-round grant the code runs, and
//! [`redlock`], the probe-round protocol before it), two-step resharding ([`sharding`]), election
//! hand-over ([`election`]) and the fence at a protected resource
//! ([`fence`], with the one liveness check). `docs/safety.md` says what each model covers,
//! the bounds checked, and the bugs planted in them ([`plant`]) that CI
//! requires each bound to catch.
//!
//! Every model is a set of actors (clients, nodes or stores) written as
//! message handlers over one explicit state, with a reference clock that
//! ticks, node clocks that drift within the documented bound, a network
//! that loses, delays and reorders, and nodes that restart without their
//! data. stateright's own actor framework has neither time nor restarts
//! that lose state, which leases need.
//!
//! ```
//! use fencelock_models::{common::run, redlock::{Config, Redlock}};
//! let mut config = Config::small();
//! config.clients = 1;
//! config.restarts = 0;
//! config.horizon = 1;
//! let outcome = run(Redlock(config), 1, false);
//! assert!(outcome.discovery("exclusion").is_none());
//! assert!(outcome.discovery("a grant").is_some());
//! ```

pub mod bounds;
pub mod common;
pub mod election;
pub mod fence;
pub mod plant;
pub mod redlock;
pub mod redlock_fast;
pub mod sharding;
