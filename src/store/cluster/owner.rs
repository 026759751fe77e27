//! This node as the owner of its keys: the peer protocol's messages about counters
//! (`Check`, `Handoff`, `Reset`, `Refund`, `Peek`), as the runtime's peer service hands
//! them over ([`Counters`]) once it has checked their sender, version and size. Their
//! contents are validated here (see `cluster::convert`: a malformed one is
//! `INVALID_ARGUMENT`) and answered on this node's engine: forwarded checks go through the
//! same engine as local ones, one engine call per originating request, and a key asked for
//! twice or more in one batch earns its sender a lease ([`lease::policy`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use tonic::Status;

use super::Node;
use crate::algorithm;
use crate::check::{Check, Checks, Counter};
use crate::cluster::proto::v1 as wire;
use crate::cluster::service::{Counters, count_within};
use crate::cluster::{convert, lease};
use crate::error::StoreError;
use crate::key::KeyId;
use crate::store::memory::engine::Started;

/// One group of a forwarded batch: its engine call (started), its checks, and the checks
/// whose sender asked for a lease: (decision index, counter).
type Call = (Result<Started, StoreError>, Checks, Vec<(usize, Counter)>);

#[tonic::async_trait]
impl Counters for Node {
    async fn check(&self, batch: wire::CheckBatch) -> Result<wire::CheckBatchReply, Status> {
        let calls = self.begin(batch.groups)?;
        // A key asked for twice or more in this batch is hot at the sender: each of its
        // admitted checks gets a loan (each a share of what is left then, so they shrink as
        // the limit nears).
        let mut asked: HashMap<KeyId, u32> = HashMap::new();
        for (_, _, wanted) in &calls {
            for (_, counter) in wanted {
                *asked.entry(counter.key).or_default() += 1;
            }
        }
        let members = self.runtime.member_count().max(1) as u64;
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
        Ok(wire::CheckBatchReply { groups })
    }

    async fn handoff(&self, batch: wire::HandoffBatch) -> Result<wire::HandoffReply, Status> {
        let counters = batch
            .counters
            .iter()
            .map(convert::state_from_wire)
            .collect::<Result<Vec<_>, _>>()
            .map_err(Status::invalid_argument)?;
        let accepted = self.engine().import(counters);
        self.runtime
            .stats
            .handoff_received
            .fetch_add(accepted as u64, Ordering::Relaxed);
        tracing::debug!(from = %batch.sender, accepted, "counters handed over");
        Ok(wire::HandoffReply {
            accepted: u32::try_from(accepted).unwrap_or(u32::MAX),
        })
    }

    async fn reset(&self, message: wire::ResetRequest) -> Result<wire::ResetReply, Status> {
        let keys = message
            .keys
            .iter()
            .map(|key| convert::key_from_wire(Some(key)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Status::invalid_argument)?;
        let removed = self.engine().reset(&keys);
        tracing::info!(from = %message.sender, removed, "counters reset on a peer's request");
        Ok(wire::ResetReply {
            removed: u32::try_from(removed).unwrap_or(u32::MAX),
        })
    }

    async fn refund(&self, batch: wire::RefundBatch) -> Result<wire::RefundReply, Status> {
        let engine = self.engine();
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
        Ok(wire::RefundReply { taken_back })
    }

    async fn peek(&self, message: wire::PeekRequest) -> Result<wire::PeekReply, Status> {
        let checks = message
            .checks
            .into_iter()
            .map(|check| convert::check_from_wire(check).map(|(check, _)| check))
            .collect::<Result<Checks, _>>()
            .map_err(Status::invalid_argument)?;
        let decisions = self.engine().peek(&checks);
        Ok(wire::PeekReply {
            decisions: decisions.iter().map(convert::decision_to_wire).collect(),
        })
    }
}

/// One group's checks, validated, and the checks whose sender asked for a lease:
/// (decision index, counter).
fn read_group(group: wire::Group) -> Result<(Checks, Vec<(usize, Counter)>), Status> {
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
        let (check, lease) = convert::check_from_wire(check).map_err(Status::invalid_argument)?;
        if lease {
            wanted.push((offset, check.counters[0]));
        }
        offset += check.counters.len();
        checks.push(check);
    }
    Ok((checks, wanted))
}

impl Node {
    /// Starts every group's engine call (decided here and now; only checks that wait for
    /// capacity are left pending), in order; the answers are collected afterwards. Every
    /// group is read and validated before any is started, so a batch refused as malformed
    /// has consumed nothing.
    fn begin(&self, groups: Vec<wire::Group>) -> Result<Vec<Call>, Status> {
        let read = groups
            .into_iter()
            .map(read_group)
            .collect::<Result<Vec<_>, Status>>()?;
        let engine = self.engine();
        Ok(read
            .into_iter()
            .map(|(checks, wanted)| (engine.begin(&checks), checks, wanted))
            .collect())
    }

    /// Lends the sender hits of `counter` (it asked for a lease and was admitted) as
    /// [`lease::policy`] allows, and writes the lease into `decision`.
    fn lend(&self, counter: &Counter, decision: &mut wire::Decision, members: u64) {
        let Some(lent) = self.engine().lend(counter, lease::policy(members)) else {
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
        self.runtime
            .leases
            .stats
            .lent
            .fetch_add(lent.units, Ordering::Relaxed);
    }
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
