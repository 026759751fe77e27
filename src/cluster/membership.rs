//! Membership: who this node's peers are. The `--peers` seeds, the addresses `--peer-dns`
//! resolves to, and nodes that announced themselves with `Join`, minus nodes that said
//! `Leave` and those the failure detector (`detector`) finds down.
//!
//! Anti-entropy heals a membership broken by mistake (a spoofed or stale `Leave`, a false
//! failure detection, a healed partition): every ping answer carries the peer's ring; a node
//! missing from it joins that peer again, and a node said to have left that answers with
//! itself on its ring is a member again ([`Membership::heard`]). Any change rebuilds the
//! ring and the peer clients into a new `Topology`, swapped whole (the request path only
//! loads it), and wakes the store's rebalance task ([`Runtime::refresh`]).
//!
//! Invariants: `left` only ever holds nodes this node knew of (bounded by the members
//! known); the lock is held briefly, never across an `.await`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::remote::Remote;
use super::ring::Ring;
use super::{Runtime, Topology};

/// The members as this node knows them; the ring is built from [`Membership::members`].
#[derive(Default)]
pub(super) struct Membership {
    pub(super) seeds: BTreeSet<String>,
    pub(super) discovered: BTreeSet<String>,
    pub(super) joined: BTreeSet<String>,
    pub(super) left: BTreeSet<String>,
    /// Members the failure detector found unreachable: off the ring until they answer.
    pub(super) down: BTreeSet<String>,
    pub(super) leaving: bool,
    /// Clients by address, reused across ring changes.
    pub(super) remotes: HashMap<Arc<str>, Arc<Remote>>,
}

impl Membership {
    /// The other nodes this node knows of, reachable or not (what the detector pings).
    pub(super) fn candidates(&self, me: &str) -> BTreeSet<String> {
        self.seeds
            .iter()
            .chain(&self.discovered)
            .chain(&self.joined)
            .filter(|member| !self.left.contains(*member) && **member != *me)
            .cloned()
            .collect()
    }

    /// Every other node the detector pings: the candidates, and the nodes said to have left
    /// (a `Leave` stays honoured only while its node does not answer as a member).
    pub(super) fn probed(&self, me: &str) -> BTreeSet<String> {
        let mut probed = self.candidates(me);
        probed.extend(self.left.iter().filter(|left| **left != *me).cloned());
        probed
    }

    /// Anti-entropy: `peer` answered a ping with its ring, `theirs`. A node said to have
    /// left that still has itself on its ring is alive and not leaving: the `Leave` (spoofed,
    /// or stale from its previous run) is forgotten and the node is a member again. Answers
    /// what follows for both sides.
    pub(super) fn heard(&mut self, me: &str, peer: &str, theirs: &[String]) -> Heard {
        let member = theirs.iter().any(|address| address == peer);
        let back = member && self.left.remove(peer);
        if back {
            self.joined.insert(peer.to_owned());
        }
        Heard {
            back,
            // This node is missing from the peer's ring (it dropped us: a spoofed or stale
            // leave, a false failure detection, a partition that healed): join it again.
            rejoin: !self.leaving && !theirs.iter().any(|address| address == me),
        }
    }

    /// The ring's members: the reachable candidates, and this node unless it is leaving.
    pub(super) fn members(&self, me: &str) -> BTreeSet<String> {
        let mut members: BTreeSet<String> = self
            .candidates(me)
            .into_iter()
            .filter(|member| !self.down.contains(member))
            .collect();
        if self.leaving {
            members.remove(me);
        } else {
            members.insert(me.to_owned());
        }
        members
    }
}

/// What a ping's answer means for the membership ([`Membership::heard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Heard {
    /// The peer was taken back on this node's ring.
    pub(super) back: bool,
    /// This node should announce itself to the peer again.
    pub(super) rejoin: bool,
}

impl Runtime {
    /// The membership, locked (briefly: never across an `.await`).
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Membership> {
        // A panic while holding this lock would be a bug elsewhere; the data stays usable.
        self.membership
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current members' addresses (for `Join`/`Leave` answers).
    pub(super) fn member_list(&self) -> Vec<String> {
        let topology = self.topology.load();
        let members = topology.ring.members();
        members.iter().map(|member| member.to_string()).collect()
    }

    /// Adds `address` (it joined); returns the members we know.
    pub(super) fn joined(&self, address: &str) -> Vec<String> {
        {
            let mut membership = self.lock();
            membership.left.remove(address);
            if *address != *self.me {
                membership.joined.insert(address.to_owned());
            }
        }
        self.refresh();
        self.member_list()
    }

    /// Drops `address` (it is leaving) until it joins again. Only a node this node knows
    /// of is remembered as gone: `left` stays bounded by the members known, and the detector
    /// (which probes nodes said to have left) never dials an address a message made up.
    pub(crate) fn left(&self, address: &str) -> Vec<String> {
        {
            let mut membership = self.lock();
            let known = membership.candidates(&self.me).contains(address);
            membership.joined.remove(address);
            if known {
                membership.left.insert(address.to_owned());
            }
        }
        self.refresh();
        self.member_list()
    }

    /// Announces this node to every member it knows, learning theirs; retries a few times
    /// while none answers.
    pub(super) async fn announce(self: Arc<Self>) {
        for attempt in 0..10u32 {
            let remotes = self.topology.load().peers();
            if remotes.is_empty() && self.options.peer_dns.is_none() {
                return;
            }
            let mut answered = false;
            for remote in remotes {
                if let Ok(members) = remote.join().await {
                    answered = true;
                    let mut membership = self.lock();
                    let fresh: Vec<String> = members
                        .into_iter()
                        .filter(|member| !membership.left.contains(member))
                        .collect();
                    membership.joined.extend(fresh);
                }
            }
            self.refresh();
            if answered {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100) * 2u32.pow(attempt.min(5))).await;
        }
    }

    pub(super) async fn discover_loop(self: Arc<Self>) {
        let Some(name) = self.options.peer_dns.clone() else {
            return;
        };
        let mut tick =
            tokio::time::interval(self.options.dns_refresh.max(Duration::from_millis(100)));
        loop {
            tick.tick().await;
            match tokio::net::lookup_host(name.as_str()).await {
                Ok(addresses) => {
                    let found: BTreeSet<String> = addresses.map(|addr| addr.to_string()).collect();
                    let changed = {
                        let mut membership = self.lock();
                        let changed = membership.discovered != found;
                        membership.discovered = found;
                        changed
                    };
                    if changed {
                        self.refresh();
                    }
                }
                Err(error) => tracing::warn!(%name, %error, "peer discovery failed"),
            }
        }
    }

    /// Every other node this node knows of, and whether the failure detector finds it
    /// reachable.
    pub fn peer_health(&self) -> Vec<(String, bool)> {
        let membership = self.lock();
        membership
            .candidates(&self.me)
            .into_iter()
            .map(|peer| {
                let up = !membership.down.contains(&peer);
                (peer, up)
            })
            .collect()
    }

    /// Stops routing to this node and tells the others it is leaving (before the drain).
    pub async fn leave(&self) {
        let remotes: Vec<Arc<Remote>> = {
            let mut membership = self.lock();
            membership.leaving = true;
            membership.remotes.values().cloned().collect()
        };
        // Off this node's own ring first: its ping answers then no longer list it, so the
        // others' anti-entropy honours the leave (see `Membership::heard`).
        self.refresh();
        let mut calls = Vec::new();
        for remote in remotes {
            calls.push(tokio::spawn(async move { remote.leave().await }));
        }
        for call in calls {
            let _ = call.await;
        }
        self.refresh();
        tracing::info!(me = %self.me, "left the cluster ring");
    }

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
}

#[cfg(test)]
pub(super) mod tests;
