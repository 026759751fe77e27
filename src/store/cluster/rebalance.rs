//! Rebalancing: what this node holds but does not own goes to the owner.
//!
//! A membership change rebuilds the [`Ring`] and the peer clients into a new [`Topology`],
//! swapped whole (the request path only loads it), and wakes the rebalance task: counters
//! whose owner is now another node (after a join, or kept during a fallback) are exported
//! from this node's engine and handed to their owners (`Handoff`), which merge them into
//! their own; what an owner does not take is imported back, never dropped. Leases' unspent
//! hits go back to the nodes that lent them (`Refund`) once the leases expire. Leaving
//! hands everything over.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::remote::Remote;
use super::ring::Ring;
use super::{Cluster, Node, Topology, convert, lease};
use crate::check::{KeepRoute, Slot};
use crate::key::KeyId;

impl Node {
    /// Rebuilds the ring from the membership if it changed; wakes the rebalance task.
    pub(super) fn refresh(&self) {
        let mut membership = self.lock();
        let members = membership.members(&self.me);
        let current = self.topology.load();
        let same = current.ring.len() == members.len()
            && members.iter().all(|member| current.ring.contains(member));
        if same {
            return;
        }
        let ring = Ring::new(&members, self.options.vnodes);
        let mut remotes = Vec::with_capacity(ring.len());
        for member in ring.members() {
            if **member == *self.me {
                remotes.push(None);
                continue;
            }
            let remote = match membership.remotes.get(member) {
                Some(remote) => Some(Arc::clone(remote)),
                None => match Remote::spawn(
                    Arc::clone(member),
                    Arc::clone(&self.me),
                    &self.options,
                    Arc::clone(&self.rebalance),
                    Arc::clone(&self.leases),
                    self.tls.as_ref(),
                ) {
                    Ok(remote) => {
                        membership
                            .remotes
                            .insert(Arc::clone(member), Arc::clone(&remote));
                        Some(remote)
                    }
                    Err(error) => {
                        tracing::warn!(%error, "ignoring a member");
                        None
                    }
                },
            };
            remotes.push(remote);
        }
        let keep: BTreeSet<&str> = ring.members().iter().map(|member| &**member).collect();
        membership
            .remotes
            .retain(|address, _| keep.contains(&**address));
        tracing::info!(me = %self.me, members = ?ring.members(), "cluster ring changed");
        self.topology.store(Arc::new(Topology { ring, remotes }));
        self.stats.ring_changes.fetch_add(1, Ordering::Relaxed);
        self.rebalance.notify_one();
    }

    pub(super) async fn rebalance_loop(self: Arc<Self>) {
        loop {
            self.rebalance.notified().await;
            // Let a burst of membership changes settle first.
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.rebalance_once().await;
        }
    }

    /// Hands counters this node holds but does not own to their owners; keeps (re-imports)
    /// what an owner would not take.
    async fn rebalance_once(&self) {
        let topology = self.topology.load_full();
        let me = Arc::clone(&self.me);
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
                        self.stats
                            .handoff_sent
                            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    Err(error) => {
                        self.stats
                            .handoff_failed
                            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        tracing::warn!(%error, counters = chunk.len(), "handoff failed: keeping the counters here");
                        self.engine().import(chunk.to_vec());
                    }
                }
            }
        }
    }

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
    /// nodes that lent them, while they still own the keys. Hits whose lender is gone or no
    /// longer the owner are dropped (no other node counted them), and so is a refund that
    /// cannot be delivered: those hits stay counted, never an over-admission.
    async fn refund_now(&self, all: bool) {
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

impl Cluster {
    /// Hands every counter this node holds to its owner, and gives every lease back (after
    /// the drain, before exit).
    pub async fn hand_over_all(&self) {
        self.node.refund_now(true).await;
        self.node.rebalance_once().await;
    }
}
