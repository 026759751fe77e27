//! Rebalancing: what this node holds but does not own goes to the owner.
//!
//! A membership change rebuilds the runtime's ring and wakes the rebalance task (so does a
//! peer whose breaker closes again): counters whose owner is now another node (after a
//! join, or kept during a fallback) are exported from this node's engine and handed to
//! their owners (`Handoff`), which merge them into their own; what an owner does not take
//! is imported back, never dropped. Leaving hands everything over, after giving every
//! lease back.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Cluster, Node};
use crate::check::{KeepRoute, Slot};
use crate::cluster::convert;
use crate::key::KeyId;

impl Node {
    pub(super) async fn rebalance_loop(self: Arc<Self>) {
        loop {
            self.runtime.rebalance.notified().await;
            // Let a burst of membership changes settle first.
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.rebalance_once().await;
        }
    }

    /// Hands counters this node holds but does not own to their owners; keeps (re-imports)
    /// what an owner would not take.
    async fn rebalance_once(&self) {
        let topology = self.runtime.topology.load_full();
        let me = Arc::clone(&self.runtime.me);
        let ring = topology.ring.clone();
        let keep: KeepRoute =
            Arc::new(move |route| ring.owner(route).is_none_or(|owner| **owner == *me));
        let exported = self.engine().export(keep);
        if exported.is_empty() {
            return;
        }
        let mut by_owner: HashMap<usize, Vec<(KeyId, Slot)>> = HashMap::new();
        for (key, slot) in exported {
            if let Some(owner) = topology.ring.owner_index(key.route) {
                by_owner.entry(owner).or_default().push((key, slot));
            }
        }
        for (owner, counters) in by_owner {
            let Some(Some(remote)) = topology.remotes.get(owner) else {
                self.engine().import(counters);
                continue;
            };
            for chunk in counters.chunks(convert::MAX_HANDOFF / 10) {
                match remote.handoff(chunk).await {
                    Ok(_) => {
                        self.runtime
                            .stats
                            .handoff_sent
                            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    Err(error) => {
                        self.runtime
                            .stats
                            .handoff_failed
                            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        tracing::warn!(%error, counters = chunk.len(), "handoff failed: keeping the counters here");
                        self.engine().import(chunk.to_vec());
                    }
                }
            }
        }
    }
}

impl Cluster {
    /// Hands every counter this node holds to its owner, and gives every lease back (after
    /// the drain, before exit).
    pub async fn hand_over_all(&self) {
        self.node.runtime.refund_now(true).await;
        self.node.rebalance_once().await;
    }
}
