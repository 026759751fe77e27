//! The peer protocol (`proto/ratekeeper/peer/v1/peer.proto`), generated at build time.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("ratekeeper.peer.v1");
}
