//! ratekeeper: an Envoy rate limit service (RLS v3) sidecar.
//!
//! The path of one request: a front end ([`rls`] for Envoy, [`admin`] for HTTP) turns it
//! into a [`limiter::Query`]; the [`limiter`] matches each descriptor against the compiled
//! [`limits`], [`key`] turns each matched limit into a key, and the [`store`] decides the
//! resulting [`check`]s: in memory, [`cluster`] routes keys to their owner node and
//! [`engine`] to the [`shard`] that owns them, which decides with the pure [`algorithm`]s.
//! [`error`] says how every failure is answered. [`reload`] keeps the limits current (or
//! [`xds`], when they come from an xDS management server),
//! [`metrics`] counts, [`server`] wires the listeners ([`listener`]: the gRPC socket, TCP or
//! Unix, with [`tls`] when configured). See ARCHITECTURE.md.

pub mod admin;
pub mod algorithm;
pub mod breaker;
pub mod check;
pub mod cli;
pub mod clock;
pub mod envoy;
pub mod error;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
pub mod histogram;
pub mod key;
pub mod limiter;
pub mod limits;
pub mod metrics;
pub mod reload;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod transport;
