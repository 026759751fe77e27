//! The sockets and TLS under the gRPC listener and the peer listener: [`listener`] accepts
//! connections (TCP or a Unix socket, TLS handshakes on their own tasks) and [`tls`] holds
//! the live TLS configs, reloaded when their files change.
//!
//! Shared by Envoy's gRPC listener ([`crate::envoy::grpc`]) and the cluster's peers
//! ([`crate::cluster`]), so it knows neither.

pub mod listener;
pub mod tls;
