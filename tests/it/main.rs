//! The integration tests, one crate (so `tests/support` and the dependencies are compiled
//! and linked once): each module is one area, run against the real binary and the real
//! tools it works with (Envoy, nginx, redis-server, chromium, network namespaces), which
//! `support` installs when missing. `tests/cluster_overload.rs` stays a binary of its own:
//! it saturates both cores on purpose and must not share them with other tests.
//!
//! A fast loop: `cargo test --lib` (unit tests), or one area: `cargo test --test it
//! cluster::` (a module), `cargo test --test it -- --skip envoy` and so on.
//!
//! `_rlqs` is named to sort first: libtest starts tests in name order, and its real-Envoy
//! tests take 20-25 s each, mostly waiting on Envoy's 5 s reports. Started first they run
//! beside the rest of the suite; started last (as `rlqs`) they made its last 25 s.

#[path = "../support/mod.rs"]
mod support;

mod _rlqs;
mod admin;
mod architecture;
mod cli;
mod cluster;
mod cluster_dns;
mod cluster_partition;
mod cluster_security;
mod counters;
mod dashboard;
mod deploy;
mod docs;
mod envoy_e2e;
mod envoy_metadata;
mod examples;
mod explain;
mod grafana;
mod grpc;
mod http_api;
mod inject;
mod inject_webhook;
mod istio;
mod key_budgets;
mod limits_shipped_config;
mod nginx_e2e;
mod operations;
mod otlp_tracing;
mod redis_store;
mod redis_tls;
mod reference_env;
mod reference_metrics;
mod reset;
mod response_headers;
mod rollout;
mod store_contract;
mod tls;
mod uds;
mod xds;
