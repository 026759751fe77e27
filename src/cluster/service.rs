//! The peer service other nodes call: forwarded checks, handoffs, membership, the failure
//! detector's pings, and the operator's resets, explanations (peeks) and counter listings
//! (names), and RLQS quota reports (`Quota`, divided by the installed [`QuotaSource`] for
//! senders on this node's ring).
//!
//! Everything a peer sends is validated (see `convert`); a malformed message is
//! `INVALID_ARGUMENT`, a different protocol version `FAILED_PRECONDITION`. With mutual TLS,
//! a message that changes state on behalf of a node (`Join`, `Leave`, `Handoff`, `Reset`,
//! `Refund`, `Quota`) is accepted only from that node (`identity`): `PERMISSION_DENIED` otherwise.
//!
//! The service answers membership, pings, names and quota itself. The counter messages
//! (`Check`, `Handoff`, `Reset`, `Refund`, `Peek`) it checks as far as their envelope goes
//! (the sender, the version, the number of items) and hands to the store over this runtime
//! (`Counters`, implemented by `store::cluster`), which reads their contents and answers
//! them on its own counters: forwarded checks go through the same engine as local ones,
//! one engine call per originating request.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tonic::{Request, Response, Status};

use super::Runtime;
use super::convert::{self, OLDEST, VERSION};
use super::identity;
use super::names::{self, NameSource};
use super::proto::v1 as wire;
use super::proto::v1::peer_server::{Peer, PeerServer};
use super::quota::QuotaSource;
use crate::transport::listener::ConnInfo;

/// What the store over the runtime answers of the peer protocol: the messages about its
/// counters, each already checked by the service for its sender (mutual TLS), version and
/// number of items; their contents are the store's to read (a malformed one is
/// `INVALID_ARGUMENT`).
#[tonic::async_trait]
pub(crate) trait Counters: Send + Sync + 'static {
    /// Forwarded checks, one group per originating request; the owner may lend hits.
    async fn check(&self, batch: wire::CheckBatch) -> Result<wire::CheckBatchReply, Status>;
    /// Counters handed over by a node that no longer owns them.
    async fn handoff(&self, batch: wire::HandoffBatch) -> Result<wire::HandoffReply, Status>;
    /// Counters to forget (an operator's reset on another node).
    async fn reset(&self, message: wire::ResetRequest) -> Result<wire::ResetReply, Status>;
    /// Hits given back: a lease's unspent ones, or those counted for a failed request.
    async fn refund(&self, batch: wire::RefundBatch) -> Result<wire::RefundReply, Status>;
    /// Counters read without consuming (an explanation).
    async fn peek(&self, message: wire::PeekRequest) -> Result<wire::PeekReply, Status>;
}

/// The `ratekeeper.peer.v1.Peer` service of one node.
#[derive(Clone)]
pub struct PeerService {
    runtime: Arc<Runtime>,
    /// The store's side: the messages about its counters.
    counters: Arc<dyn Counters>,
    /// This node's counter names, for `Names` (`None`: it keeps none).
    names: Option<NameSource>,
    /// This node's division of the quota buckets it owns, for `Quota` (`None`: it serves
    /// no RLQS).
    quota: Option<QuotaSource>,
}

impl std::fmt::Debug for PeerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerService")
            .field("runtime", &self.runtime)
            .field("names", &self.names.is_some())
            .field("quota", &self.quota.is_some())
            .finish()
    }
}

impl PeerService {
    /// The service of `runtime`'s node, answering the counter messages with `counters`,
    /// serving the counter names `names` gives (`Names`) and dividing the quota buckets
    /// this node owns with `quota` (`Quota`). Not wrapped in its gRPC server
    /// ([`PeerService::into_server`]; the fuzz harness calls its methods).
    pub(crate) fn new(
        runtime: Arc<Runtime>,
        counters: Arc<dyn Counters>,
        names: Option<NameSource>,
        quota: Option<QuotaSource>,
    ) -> PeerService {
        PeerService {
            runtime,
            counters,
            names,
            quota,
        }
    }

    /// The service in its gRPC server.
    pub fn into_server(self) -> PeerServer<PeerService> {
        PeerServer::new(self).max_decoding_message_size(64 << 20)
    }

    /// The runtime and the validated address of a `Join`, `Leave` or `Ping`; with
    /// `authorize`, only from the node at that address (see [`authorize`]).
    fn member(
        &self,
        request: Request<wire::Member>,
        authorize: bool,
    ) -> Result<(&Runtime, String), Status> {
        let runtime = &*self.runtime;
        count_within("address bytes", request.get_ref().address.len(), 1, 256)?;
        if authorize {
            self::authorize(runtime, &request, &request.get_ref().address)?;
        }
        let member = request.into_inner();
        same_version(member.version)?;
        Ok((runtime, member.address))
    }
}

/// With mutual TLS, accepts a message that changes state on behalf of the node at
/// `concerns` only over a connection whose client certificate speaks for that node
/// ([`identity::authorize`]: UNAUTHENTICATED without one, PERMISSION_DENIED when it is
/// another node's). Without mutual TLS, everything is accepted (docs/cluster.md: what is and is not
/// authenticated then).
fn authorize<T>(runtime: &Runtime, request: &Request<T>, concerns: &str) -> Result<(), Status> {
    let Some(tls) = &runtime.tls else {
        return Ok(());
    };
    let info = request.extensions().get::<ConnInfo>();
    let cert = info.and_then(ConnInfo::client_cert);
    identity::authorize(cert, concerns, tls.name()).inspect_err(|status| {
        runtime.stats.refused.fetch_add(1, Ordering::Relaxed);
        let from = info.and_then(|info| info.remote);
        tracing::warn!(?from, %concerns, problem = %status.message(), "refused a peer message");
    })
}

/// INVALID_ARGUMENT naming `field` unless it holds `least` to `most` items.
pub(crate) fn count_within(
    field: &str,
    len: usize,
    least: usize,
    most: usize,
) -> Result<(), Status> {
    if (least..=most).contains(&len) {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "{field}: {len} given, expected {least} to {most}"
        )))
    }
}

fn same_version(version: u32) -> Result<(), Status> {
    if (OLDEST..=VERSION).contains(&version) {
        Ok(())
    } else {
        Err(Status::failed_precondition(format!(
            "peer protocol version {version}, this node speaks {OLDEST} to {VERSION}"
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
        count_within("groups", batch.groups.len(), 0, convert::MAX_GROUPS)?;
        self.counters.check(batch).await.map(Response::new)
    }

    async fn handoff(
        &self,
        request: Request<wire::HandoffBatch>,
    ) -> Result<Response<wire::HandoffReply>, Status> {
        authorize(&self.runtime, &request, &request.get_ref().sender)?;
        let batch = request.into_inner();
        same_version(batch.version)?;
        count_within("counters", batch.counters.len(), 0, convert::MAX_HANDOFF)?;
        self.counters.handoff(batch).await.map(Response::new)
    }

    async fn reset(
        &self,
        request: Request<wire::ResetRequest>,
    ) -> Result<Response<wire::ResetReply>, Status> {
        authorize(&self.runtime, &request, &request.get_ref().sender)?;
        let message = request.into_inner();
        same_version(message.version)?;
        count_within(
            "keys",
            message.keys.len(),
            1,
            convert::MAX_COUNTERS_PER_CHECK,
        )?;
        self.counters.reset(message).await.map(Response::new)
    }

    async fn join(
        &self,
        request: Request<wire::Member>,
    ) -> Result<Response<wire::Members>, Status> {
        let (runtime, address) = self.member(request, true)?;
        let addresses = runtime.joined(&address);
        Ok(Response::new(wire::Members { addresses }))
    }

    async fn leave(
        &self,
        request: Request<wire::Member>,
    ) -> Result<Response<wire::Members>, Status> {
        let (runtime, address) = self.member(request, true)?;
        let addresses = runtime.left(&address);
        Ok(Response::new(wire::Members { addresses }))
    }

    async fn refund(
        &self,
        request: Request<wire::RefundBatch>,
    ) -> Result<Response<wire::RefundReply>, Status> {
        authorize(&self.runtime, &request, &request.get_ref().sender)?;
        let batch = request.into_inner();
        same_version(batch.version)?;
        count_within("refunds", batch.refunds.len(), 0, convert::MAX_HANDOFF)?;
        self.counters.refund(batch).await.map(Response::new)
    }

    async fn peek(
        &self,
        request: Request<wire::PeekRequest>,
    ) -> Result<Response<wire::PeekReply>, Status> {
        let message = request.into_inner();
        same_version(message.version)?;
        count_within(
            "checks",
            message.checks.len(),
            0,
            convert::MAX_CHECKS_PER_GROUP,
        )?;
        self.counters.peek(message).await.map(Response::new)
    }

    async fn names(
        &self,
        request: Request<wire::NamesRequest>,
    ) -> Result<Response<wire::NamesReply>, Status> {
        let message = request.into_inner();
        same_version(message.version)?;
        count_within(
            "domain bytes",
            message.domain.len(),
            1,
            names::MAX_NAME_BYTES,
        )?;
        let limit = usize::try_from(message.limit)
            .unwrap_or(usize::MAX)
            .clamp(1, names::MAX_NAMES);
        let after = message.has_after.then_some(message.after);
        let page = self
            .names
            .as_ref()
            .and_then(|names| names(&message.domain, after, limit));
        Ok(Response::new(convert::names_to_wire(page)))
    }

    async fn quota(
        &self,
        request: Request<wire::QuotaReport>,
    ) -> Result<Response<wire::QuotaReply>, Status> {
        let runtime = &*self.runtime;
        count_within(
            "sender bytes",
            request.get_ref().sender.len(),
            1,
            convert::MAX_ADDRESS_BYTES,
        )?;
        // A report speaks for its sender: its demand takes a share from the others.
        authorize(runtime, &request, &request.get_ref().sender)?;
        let report = request.into_inner();
        same_version(report.version)?;
        let demands =
            convert::quota_demands_from_wire(&report.buckets).map_err(Status::invalid_argument)?;
        let Some(quota) = &self.quota else {
            return Ok(Response::new(wire::QuotaReply::default()));
        };
        // Only a member on this node's ring takes a share of a limit: a stranger (or a
        // member this node finds down) gets none and falls back to an equal part.
        let member = runtime
            .members()
            .iter()
            .any(|member| **member == *report.sender);
        if !member {
            tracing::debug!(sender = %report.sender, "a quota report from a node not on this ring: no share given");
            return Ok(Response::new(wire::QuotaReply {
                serves_quota: true,
                shares: vec![0; demands.len()],
            }));
        }
        runtime
            .stats
            .quota_received
            .fetch_add(demands.len() as u64, Ordering::Relaxed);
        let mut shares: Vec<u64> = quota(&report.sender, &demands)
            .into_iter()
            .map(|share| share.unwrap_or(0))
            .collect();
        // One share per bucket, whatever the source answered.
        shares.resize(demands.len(), 0);
        Ok(Response::new(wire::QuotaReply {
            serves_quota: true,
            shares,
        }))
    }

    async fn ping(
        &self,
        request: Request<wire::Member>,
    ) -> Result<Response<wire::Members>, Status> {
        let (runtime, _) = self.member(request, false)?;
        let addresses = runtime.member_list();
        Ok(Response::new(wire::Members { addresses }))
    }
}
