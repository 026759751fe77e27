//! The peer service other nodes call: forwarded checks, handoffs, membership, and the
//! failure detector's pings.
//!
//! Everything a peer sends is validated (see `convert`); a malformed message is
//! `INVALID_ARGUMENT`, a different protocol version `FAILED_PRECONDITION`. Forwarded checks go
//! through the same engine as local ones, one engine call per originating request.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tonic::{Request, Response, Status};

use super::convert::{self, VERSION};
use super::{Cluster, Node};
use crate::check::Checks;
use crate::peer::v1 as wire;
use crate::peer::v1::peer_server::{Peer, PeerServer};

/// The `ratekeeper.peer.v1.Peer` service of one node.
#[derive(Debug, Clone)]
pub struct PeerService {
    cluster: Cluster,
}

impl PeerService {
    /// The service for a cluster member; `None` outside cluster mode.
    pub fn new(cluster: &Cluster) -> Option<PeerServer<PeerService>> {
        cluster.node.as_ref()?;
        Some(
            PeerServer::new(PeerService {
                cluster: cluster.clone(),
            })
            .max_decoding_message_size(64 << 20),
        )
    }

    /// The node and the validated address of a `Join` or `Leave`.
    fn member(&self, request: Request<wire::Member>) -> Result<(&Arc<Node>, String), Status> {
        let node = self.node()?;
        let member = request.into_inner();
        same_version(member.version)?;
        if member.address.is_empty() || member.address.len() > 256 {
            return Err(Status::invalid_argument("address: must be 1 to 256 bytes"));
        }
        Ok((node, member.address))
    }

    fn node(&self) -> Result<&Arc<Node>, Status> {
        self.cluster
            .node
            .as_ref()
            .ok_or_else(|| Status::failed_precondition("not in cluster mode"))
    }
}

fn same_version(version: u32) -> Result<(), Status> {
    if version == VERSION {
        Ok(())
    } else {
        Err(Status::failed_precondition(format!(
            "peer protocol version {version}, this node speaks {VERSION}"
        )))
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn check(
        &self,
        request: Request<wire::CheckBatch>,
    ) -> Result<Response<wire::CheckBatchReply>, Status> {
        let batch = request.into_inner();
        same_version(batch.version)?;
        if batch.groups.len() > convert::MAX_GROUPS {
            return Err(Status::invalid_argument(format!(
                "groups: {} given, at most {}",
                batch.groups.len(),
                convert::MAX_GROUPS
            )));
        }
        let engine = self.cluster.engine();
        // Start every group's engine call, then collect the answers in order.
        let mut calls = Vec::with_capacity(batch.groups.len());
        for group in batch.groups {
            if group.checks.len() > convert::MAX_CHECKS_PER_GROUP {
                return Err(Status::invalid_argument("too many checks in a group"));
            }
            let checks = group
                .checks
                .into_iter()
                .map(convert::check_from_wire)
                .collect::<Result<Checks, _>>()
                .map_err(Status::invalid_argument)?;
            // Decided here and now; only checks that wait for capacity are left pending.
            calls.push(engine.start(checks));
        }
        let mut groups = Vec::with_capacity(calls.len());
        for call in calls {
            let decided = match call {
                Ok(started) => started.finish().await,
                Err(error) => Err(error),
            };
            let reply = match decided {
                Ok(decisions) => wire::GroupReply {
                    decisions: decisions.iter().map(convert::decision_to_wire).collect(),
                    ..Default::default()
                },
                Err(error) => wire::GroupReply {
                    decisions: Vec::new(),
                    error: error.to_string(),
                    code: convert::error_to_wire(error.kind()) as i32,
                },
            };
            groups.push(reply);
        }
        Ok(Response::new(wire::CheckBatchReply { groups }))
    }

    async fn handoff(
        &self,
        request: Request<wire::HandoffBatch>,
    ) -> Result<Response<wire::HandoffReply>, Status> {
        let node = self.node()?;
        let batch = request.into_inner();
        same_version(batch.version)?;
        if batch.counters.len() > convert::MAX_HANDOFF {
            return Err(Status::invalid_argument("too many counters in one handoff"));
        }
        let counters = batch
            .counters
            .iter()
            .map(convert::state_from_wire)
            .collect::<Result<Vec<_>, _>>()
            .map_err(Status::invalid_argument)?;
        let accepted = self.cluster.engine().import(counters);
        node.stats
            .handoff_received
            .fetch_add(accepted as u64, Ordering::Relaxed);
        tracing::debug!(from = %batch.sender, accepted, "counters handed over");
        Ok(Response::new(wire::HandoffReply {
            accepted: u32::try_from(accepted).unwrap_or(u32::MAX),
        }))
    }

    async fn reset(
        &self,
        request: Request<wire::ResetRequest>,
    ) -> Result<Response<wire::ResetReply>, Status> {
        self.node()?;
        let message = request.into_inner();
        same_version(message.version)?;
        if message.keys.is_empty() || message.keys.len() > convert::MAX_COUNTERS_PER_CHECK {
            return Err(Status::invalid_argument(format!(
                "keys: {} given, expected 1 to {}",
                message.keys.len(),
                convert::MAX_COUNTERS_PER_CHECK
            )));
        }
        let keys = message
            .keys
            .iter()
            .map(|key| convert::key_from_wire(Some(key)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Status::invalid_argument)?;
        let removed = self.cluster.engine().reset(&keys);
        tracing::info!(from = %message.sender, removed, "counters reset on a peer's request");
        Ok(Response::new(wire::ResetReply {
            removed: u32::try_from(removed).unwrap_or(u32::MAX),
        }))
    }

    async fn join(
        &self,
        request: Request<wire::Member>,
    ) -> Result<Response<wire::Members>, Status> {
        let (node, address) = self.member(request)?;
        let addresses = node.joined(&address);
        Ok(Response::new(wire::Members { addresses }))
    }

    async fn leave(
        &self,
        request: Request<wire::Member>,
    ) -> Result<Response<wire::Members>, Status> {
        let (node, address) = self.member(request)?;
        let addresses = node.left(&address);
        Ok(Response::new(wire::Members { addresses }))
    }

    async fn ping(
        &self,
        request: Request<wire::Member>,
    ) -> Result<Response<wire::Members>, Status> {
        let (node, _) = self.member(request)?;
        let addresses = node.member_list();
        Ok(Response::new(wire::Members { addresses }))
    }
}
