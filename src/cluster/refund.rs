//! Giving leases back: a task gives the unspent hits of expired leases back to the nodes
//! that lent them (`Refund`) four times per lease TTL, and leaving gives every lease back.
//!
//! Invariant: hits go back only to their lender, and only while it still owns the key;
//! hits whose lender is gone or no longer the owner are dropped (no other node counted
//! them), and so is a refund that cannot be delivered: those hits stay counted, never an
//! over-admission.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Runtime, convert, lease};

impl Runtime {
    /// Gives expired leases' unspent hits back to their owners, four times per lease TTL.
    pub(super) async fn refund_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(lease::TTL / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.refund_now(false).await;
        }
    }

    /// Gives the unspent hits of expired leases (of all leases with `all`) back to the
    /// nodes that lent them, while they still own the keys (see the module doc).
    pub(crate) async fn refund_now(&self, all: bool) {
        let refunds = self.leases.collect(tokio::time::Instant::now(), all);
        if refunds.is_empty() {
            return;
        }
        let topology = self.topology.load_full();
        let mut by_owner: HashMap<usize, Vec<lease::Refund>> = HashMap::new();
        for refund in refunds {
            let owner = topology.ring.owner_index(refund.counter.key.route);
            let lender_owns = owner
                .and_then(|owner| topology.remotes.get(owner)?.as_ref())
                .is_some_and(|remote| *remote.address() == refund.lender);
            if let (Some(owner), true) = (owner, lender_owns) {
                by_owner.entry(owner).or_default().push(refund);
            }
        }
        for (owner, refunds) in by_owner {
            let Some(Some(remote)) = topology.remotes.get(owner) else {
                continue;
            };
            for chunk in refunds.chunks(convert::MAX_HANDOFF / 10) {
                if let Err(error) = remote.refund(chunk).await {
                    tracing::debug!(%error, refunds = chunk.len(), "could not give leased hits back");
                }
            }
        }
    }
}
