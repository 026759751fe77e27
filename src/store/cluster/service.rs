//! The peer service other nodes call: forwarded checks, handoffs, membership, the failure
//! detector's pings, and the operator's resets, explanations (peeks) and counter listings
//! (names), and RLQS quota reports (`Quota`, divided by the installed [`QuotaSource`] for
//! senders on this node's ring).
//!
//! Everything a peer sends is validated (see `convert`); a malformed message is
//! `INVALID_ARGUMENT`, a different protocol version `FAILED_PRECONDITION`. With mutual TLS,
//! a message that changes state on behalf of a node (`Join`, `Leave`, `Handoff`, `Reset`,
//! `Refund`, `Quota`) is accepted only from that node (`identity`): `PERMISSION_DENIED` otherwise. Forwarded checks go
//! through the same engine as local ones, one engine call per originating request.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tonic::{Request, Response, Status};

use super::convert::{self, VERSION};
use super::identity;
use super::lease;
use super::names::{self, NameSource};
use super::proto::v1 as wire;
use super::proto::v1::peer_server::{Peer, PeerServer};
use super::quota::QuotaSource;
use super::{Cluster, Node};
use crate::algorithm;
use crate::check::{Check, Checks, Counter};
use crate::key::KeyId;
use crate::transport::listener::ConnInfo;

/// The `ratekeeper.peer.v1.Peer` service of one node.
#[derive(Clone)]
pub struct PeerService {
    cluster: Cluster,
    /// This node's counter names, for `Names` (`None`: it keeps none).
    names: Option<NameSource>,
    /// This node's division of the quota buckets it owns, for `Quota` (`None`: it serves
    /// no RLQS).
    quota: Option<QuotaSource>,
}

impl std::fmt::Debug for PeerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerService")
            .field("cluster", &self.cluster)
            .field("names", &self.names.is_some())
            .field("quota", &self.quota.is_some())
            .finish()
    }
}

impl PeerService {
    /// The service of a cluster member.
    pub fn new(cluster: &Cluster) -> PeerServer<PeerService> {
        PeerService::with_names(cluster, None)
    }

    /// [`PeerService::new`], serving the counter names `names` gives (`Names`).
    pub fn with_names(cluster: &Cluster, names: Option<NameSource>) -> PeerServer<PeerService> {
        PeerService::with_sources(cluster, names, None)
    }

    /// [`PeerService::with_names`], dividing the quota buckets this node owns with `quota`
    /// (`Quota`).
    pub fn with_sources(
        cluster: &Cluster,
        names: Option<NameSource>,
        quota: Option<QuotaSource>,
    ) -> PeerServer<PeerService> {
        PeerServer::new(PeerService {
            cluster: cluster.clone(),
            names,
            quota,
        })
        .max_decoding_message_size(64 << 20)
    }

    /// The service itself, not wrapped in its gRPC server (the fuzz harness calls its
    /// methods).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn unwrapped(cluster: &Cluster) -> PeerService {
        PeerService {
            cluster: cluster.clone(),
            names: None,
            quota: None,
        }
    }

    /// The node and the validated address of a `Join`, `Leave` or `Ping`; with `authorize`,
    /// only from the node at that address (see [`authorize`]).
    fn member(
        &self,
        request: Request<wire::Member>,
        authorize: bool,
    ) -> Result<(&Arc<Node>, String), Status> {
        let node = self.node();
        count_within("address bytes", request.get_ref().address.len(), 1, 256)?;
        if authorize {
            self::authorize(node, &request, &request.get_ref().address)?;
        }
        let member = request.into_inner();
        same_version(member.version)?;
        Ok((node, member.address))
    }

    fn node(&self) -> &Arc<Node> {
        &self.cluster.node
    }

    /// Lends the sender hits of `counter` (it asked for a lease and was admitted) as
    /// [`lease::policy`] allows, and writes the lease into `decision`.
    fn lend(&self, counter: &Counter, decision: &mut wire::Decision, members: u64) {
        let engine = self.cluster.memory().engine();
        let Some(lent) = engine.lend(counter, lease::policy(members)) else {
            return;
        };
        let lease_for = lease::TTL.min(std::time::Duration::from_nanos(lent.valid_for));
        decision.lease_units = lent.units;
        decision.lease_window = lent.window;
        decision.lease_for_nanos = u64::try_from(lease_for.as_nanos()).unwrap_or(u64::MAX);
        // What the sender can still admit: the owner's remaining plus its lease.
        decision.remaining = lent
            .remaining
            .saturating_add(u32::try_from(lent.units).unwrap_or(u32::MAX));
        decision.reset_after_nanos = lent.reset_after;
        self.node()
            .leases
            .stats
            .lent
            .fetch_add(lent.units, Ordering::Relaxed);
    }
}

/// With mutual TLS, accepts a message that changes state on behalf of the node at
/// `concerns` only over a connection whose client certificate speaks for that node
/// ([`identity::authorize`]: UNAUTHENTICATED without one, PERMISSION_DENIED when it is
/// another node's). Without mutual TLS, everything is accepted (docs/cluster.md: what is and is not
/// authenticated then).
fn authorize<T>(node: &Node, request: &Request<T>, concerns: &str) -> Result<(), Status> {
    let Some(tls) = &node.tls else {
        return Ok(());
    };
    let info = request.extensions().get::<ConnInfo>();
    let cert = info.and_then(ConnInfo::client_cert);
    identity::authorize(cert, concerns, tls.name()).inspect_err(|status| {
        node.stats.refused.fetch_add(1, Ordering::Relaxed);
        let from = info.and_then(|info| info.remote);
        tracing::warn!(?from, %concerns, problem = %status.message(), "refused a peer message");
    })
}

/// Names in each admitted check's decisions the window its hits were counted in (by this
/// node's clock, when its shard consumed them), so a sender whose request fails elsewhere
/// can give them back exactly (`Decision.counted_window`).
fn counted_windows(checks: &[Check], consumed: &[(usize, u64)], decisions: &mut [wire::Decision]) {
    let mut offsets = Vec::with_capacity(checks.len());
    let mut offset = 0;
    for check in checks {
        offsets.push(offset);
        offset += check.counters.len();
    }
    for &(position, at) in consumed {
        let (Some(check), Some(&offset)) = (checks.get(position), offsets.get(position)) else {
            continue;
        };
        for (index, counter) in check.counters.iter().enumerate() {
            if let Some(decision) = decisions.get_mut(offset + index) {
                decision.counted_window = algorithm::window_at(&counter.rate, at);
            }
        }
    }
}

/// INVALID_ARGUMENT naming `field` unless it holds `least` to `most` items.
fn count_within(field: &str, len: usize, least: usize, most: usize) -> Result<(), Status> {
    if (least..=most).contains(&len) {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "{field}: {len} given, expected {least} to {most}"
        )))
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
        count_within("groups", batch.groups.len(), 0, convert::MAX_GROUPS)?;
        let engine = self.cluster.memory().engine();
        // Start every group's engine call, then collect the answers in order. Remember the
        // checks whose sender asked for a lease: (decision index, counter).
        let mut calls = Vec::with_capacity(batch.groups.len());
        for group in batch.groups {
            count_within(
                "checks",
                group.checks.len(),
                0,
                convert::MAX_CHECKS_PER_GROUP,
            )?;
            let mut checks = Checks::with_capacity(group.checks.len());
            let mut wanted: Vec<(usize, Counter)> = Vec::new();
            let mut offset = 0;
            for check in group.checks {
                let (check, lease) =
                    convert::check_from_wire(check).map_err(Status::invalid_argument)?;
                if lease {
                    wanted.push((offset, check.counters[0]));
                }
                offset += check.counters.len();
                checks.push(check);
            }
            // Decided here and now; only checks that wait for capacity are left pending.
            calls.push((engine.begin(&checks), checks, wanted));
        }
        // A key asked for twice or more in this batch is hot at the sender: each of its
        // admitted checks gets a loan (each a share of what is left then, so they shrink as
        // the limit nears).
        let mut asked: HashMap<KeyId, u32> = HashMap::new();
        for (_, _, wanted) in &calls {
            for (_, counter) in wanted {
                *asked.entry(counter.key).or_default() += 1;
            }
        }
        let members = self.cluster.member_count().max(1) as u64;
        let mut groups = Vec::with_capacity(calls.len());
        for (call, checks, wanted) in calls {
            let decided = match call {
                Ok(started) => started.finish_consumed().await,
                Err(error) => Err(error),
            };
            let reply = match decided {
                Ok((decisions, consumed)) => {
                    let mut wire: Vec<wire::Decision> =
                        decisions.iter().map(convert::decision_to_wire).collect();
                    counted_windows(&checks, &consumed, &mut wire);
                    for (index, counter) in wanted {
                        let hot = asked.get(&counter.key).is_some_and(|asked| *asked >= 2);
                        if hot
                            && let Some(decision) = wire.get_mut(index)
                            && decision.allowed
                        {
                            self.lend(&counter, decision, members);
                        }
                    }
                    wire::GroupReply {
                        decisions: wire,
                        ..Default::default()
                    }
                }
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
        let node = self.node();
        authorize(node, &request, &request.get_ref().sender)?;
        let batch = request.into_inner();
        same_version(batch.version)?;
        count_within("counters", batch.counters.len(), 0, convert::MAX_HANDOFF)?;
        let counters = batch
            .counters
            .iter()
            .map(convert::state_from_wire)
            .collect::<Result<Vec<_>, _>>()
            .map_err(Status::invalid_argument)?;
        let accepted = self.cluster.memory().engine().import(counters);
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
        let node = self.node();
        authorize(node, &request, &request.get_ref().sender)?;
        let message = request.into_inner();
        same_version(message.version)?;
        count_within(
            "keys",
            message.keys.len(),
            1,
            convert::MAX_COUNTERS_PER_CHECK,
        )?;
        let keys = message
            .keys
            .iter()
            .map(|key| convert::key_from_wire(Some(key)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Status::invalid_argument)?;
        let removed = self.cluster.memory().engine().reset(&keys);
        tracing::info!(from = %message.sender, removed, "counters reset on a peer's request");
        Ok(Response::new(wire::ResetReply {
            removed: u32::try_from(removed).unwrap_or(u32::MAX),
        }))
    }

    async fn join(
        &self,
        request: Request<wire::Member>,
    ) -> Result<Response<wire::Members>, Status> {
        let (node, address) = self.member(request, true)?;
        let addresses = node.joined(&address);
        Ok(Response::new(wire::Members { addresses }))
    }

    async fn leave(
        &self,
        request: Request<wire::Member>,
    ) -> Result<Response<wire::Members>, Status> {
        let (node, address) = self.member(request, true)?;
        let addresses = node.left(&address);
        Ok(Response::new(wire::Members { addresses }))
    }

    async fn refund(
        &self,
        request: Request<wire::RefundBatch>,
    ) -> Result<Response<wire::RefundReply>, Status> {
        let node = self.node();
        authorize(node, &request, &request.get_ref().sender)?;
        let batch = request.into_inner();
        same_version(batch.version)?;
        count_within("refunds", batch.refunds.len(), 0, convert::MAX_HANDOFF)?;
        let engine = self.cluster.memory().engine();
        let mut taken_back = 0;
        for refund in &batch.refunds {
            let counter = refund
                .counter
                .as_ref()
                .ok_or_else(|| "a refund without a counter".to_owned())
                .and_then(convert::counter_from_wire)
                .map_err(|problem| Status::invalid_argument(format!("refunds: {problem}")))?;
            taken_back += engine.refund(&counter, refund.units, refund.window);
        }
        tracing::debug!(from = %batch.sender, taken_back, "leased hits given back");
        Ok(Response::new(wire::RefundReply { taken_back }))
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
        let checks = message
            .checks
            .into_iter()
            .map(|check| convert::check_from_wire(check).map(|(check, _)| check))
            .collect::<Result<Checks, _>>()
            .map_err(Status::invalid_argument)?;
        let decisions = self.cluster.memory().engine().peek(&checks);
        Ok(Response::new(wire::PeekReply {
            decisions: decisions.iter().map(convert::decision_to_wire).collect(),
        }))
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
        let node = self.node();
        count_within(
            "sender bytes",
            request.get_ref().sender.len(),
            1,
            convert::MAX_ADDRESS_BYTES,
        )?;
        // A report speaks for its sender: its demand takes a share from the others.
        authorize(node, &request, &request.get_ref().sender)?;
        let report = request.into_inner();
        same_version(report.version)?;
        let demands =
            convert::quota_demands_from_wire(&report.buckets).map_err(Status::invalid_argument)?;
        let Some(quota) = &self.quota else {
            return Ok(Response::new(wire::QuotaReply::default()));
        };
        // Only a member on this node's ring takes a share of a limit: a stranger (or a
        // member this node finds down) gets none and falls back to an equal part.
        let member = self
            .cluster
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
        node.stats
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
        let (node, _) = self.member(request, false)?;
        let addresses = node.member_list();
        Ok(Response::new(wire::Members { addresses }))
    }
}
