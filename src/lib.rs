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
pub mod allocator;
pub mod breaker;
pub mod check;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod engine;
pub mod error;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc;
pub mod histogram;
pub mod key;
pub mod limiter;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod peer;
pub mod reload;
pub mod ring;
pub mod rls;
pub mod server;
pub mod shard;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod xds;
