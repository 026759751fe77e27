//! ratekeeper: an Envoy rate limit service (RLS v3) sidecar.
//!
//! The path of one request: [`rls`] validates it and matches each descriptor against the
//! compiled [`limits`]; [`key`] turns each matched limit into a key; [`engine`] routes keys by
//! FNV-1a hash to [`shard`] actors, which own all counters and decide with the pure
//! [`algorithm`]s. [`reload`] keeps the limits current, [`metrics`] counts, [`server`] wires
//! the listeners ([`admin`] is the HTTP side). See ARCHITECTURE.md.

pub mod admin;
pub mod algorithm;
pub mod check;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod engine;
pub mod error;
pub mod histogram;
pub mod key;
pub mod limiter;
pub mod limits;
pub mod metrics;
pub mod peer;
pub mod reload;
pub mod ring;
pub mod rls;
pub mod server;
pub mod shard;
pub mod store;
