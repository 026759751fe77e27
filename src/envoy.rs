//! What speaks Envoy's protocols: the gRPC listener's server ([`grpc`]), the rate limit
//! service adapter ([`rls`], the only module that knows Envoy's rate limit protobufs), the
//! rate limit quota service adapter ([`rlqs`], the only one that knows the RLQS protobufs) and
//! the xDS client that takes limits from a management server ([`xds`], the only one that
//! knows the discovery protocol).
//!
//! Each turns Envoy's messages into the crate's plain types (a `limiter::Query`, a
//! `limits::Source`) and back; nothing outside this module imports Envoy's generated code.

pub mod grpc;
pub mod rlqs;
pub mod rls;
pub mod xds;
