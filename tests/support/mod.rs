//! Helpers shared by the integration tests: real processes (ratekeeper, Envoy, nginx) on
//! `127.0.0.1:0`, the library's server in-process, bounded polling, temp dirs, a raw HTTP/1.1 client and a tiny upstream,
//! and network namespaces for partition tests.
//!
//! Everything waits with a bound and panics with the child's stderr when it gives up, so a
//! hung or crashed process fails the test with a reason instead of hanging it. Children are
//! killed when their handle drops. Each submodule owns one concern; every public name is
//! re-exported here, so tests write `support::name`.
#![allow(
    dead_code,
    reason = "each test binary compiles this module on its own and uses only part of it"
)]

mod certs;
mod chromium;
mod cluster;
mod envoy;
mod http;
mod netns;
mod nginx;
mod poll;
mod process;
mod ratekeeper;
mod redis;
mod repo;
mod server;
mod temp;
mod tools;
mod upstream;

#[allow(
    unused_imports,
    reason = "each test binary uses only some of these names; the rest are unused there"
)]
pub use self::{
    certs::*, chromium::*, cluster::*, envoy::*, http::*, netns::*, nginx::*, poll::*, process::*,
    ratekeeper::*, redis::*, repo::*, server::*, temp::*, tools::*, upstream::*,
};
