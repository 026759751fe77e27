//! ratekeeper: an Envoy rate limit service (RLS v3) sidecar.
//!
//! The path of one request: a front end ([`envoy::rls`] for Envoy, over [`envoy::grpc`];
//! [`admin`] for HTTP) turns it into a [`limiter::Query`]; the [`limiter`] matches each
//! descriptor against the compiled [`limits`], [`key`] turns each matched limit into a key,
//! and the selected [`store`] decides the resulting [`check`]s: [`store::memory`] (this
//! node's [`engine`](store::memory::engine) steps the [`shard`](store::memory::shard) that
//! owns a key, which decides with the pure [`algorithm`]s), [`store::cluster`] (the memory
//! store across peers: each key decided on its owner node, over the [`cluster`] runtime:
//! members, ring, peers) or [`store::redis`]. [`error`] says how every failure is answered,
//! and [`failure`] what a check is answered when its store cannot decide it. [`reload`]
//! keeps the limits current (or [`envoy::xds`], when they come from an xDS management
//! server), [`metrics`] counts, [`server`] wires the listeners ([`transport`]: the
//! sockets, TCP or Unix, with TLS when configured) and builds the selected store.
//! [`inject`] (the `ratekeeper-inject` crate) adds the sidecar to Kubernetes workloads
//! (`ratekeeper inject`), and [`webhook`] serves it as an admission webhook (`ratekeeper
//! webhook`). The pure core (limits, algorithms, keys, checks, the clock) is the
//! `ratekeeper-core` crate, re-exported here under its module names. See ARCHITECTURE.md.

pub use ratekeeper_core::{algorithm, check, clock, files, key, limits};
pub use ratekeeper_inject as inject;

pub mod admin;
pub mod allocator;
pub mod breaker;
pub mod cli;
pub mod cluster;
pub mod envoy;
pub mod error;
pub mod failure;
/// The cargo-fuzz harnesses (`fuzz/`), and their corpus replayed by `cargo test`; built
/// only for tests and with the `fuzzing` feature, which the fuzz crate turns on.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(test)]
mod generated;
pub mod histogram;
pub mod http;
pub mod limiter;
pub mod metrics;
pub mod quota;
pub mod reload;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod transport;
pub mod webhook;
