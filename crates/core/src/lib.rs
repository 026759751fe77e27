//! ratekeeper's pure core: what a limit is and how it decides, with no runtime, network or
//! protocol in sight, so that a Rust program could embed the same limits with the same
//! YAML.
//!
//! - [`limits`]: the limits file (envoyproxy/ratelimit's YAML, plus ratekeeper's
//!   extensions), validated with errors naming file and place, compiled into an immutable
//!   lookup tree.
//! - [`algorithm`]: the four algorithms as pure functions of `(rate, state, now, cost)`.
//! - [`key`]: FNV-1a keys of counters, and the hashes that route them to shards and nodes.
//! - [`check`]: the vocabulary between the limiter and a store: the counters of a
//!   descriptor, the decision, and `Check::decide`, the one way every store decides.
//! - [`clock`]: Unix time read through tokio's clock (its `time` feature alone), so tests
//!   pause and advance it.
//! - [`files`]: reading the files an operator names, bounded and never blocking.
//!
//! What it must not know: a transport, a store, a metric, Envoy. Its `Cargo.toml` is that
//! contract (ARCHITECTURE.md, "Crates").

pub mod algorithm;
pub mod check;
pub mod clock;
pub mod files;
pub mod key;
pub mod limits;
#[cfg(any(test, feature = "test-util"))]
#[doc(hidden)]
pub mod testing;
