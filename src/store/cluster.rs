//! Cluster mode: one limit across all replicas, without Redis.
//!
//! Every key has one owner node on a consistent hash [`Ring`] of the members' peer
//! addresses, placed by the key's route hash (so all limits of a descriptor, in every window,
//! have the same owner). [`Cluster::check`] decides the checks this node owns on its own
//! engine and forwards the others to their owners ([`remote`]: batched, with a deadline and a
//! circuit breaker). When an owner cannot answer, the [`Fallback`] policy decides: by default
//! this node's own counter for the key (degraded, but bounded).
//!
//! No partial effects: a request that fails consumes nothing on any of its descriptors.
//! Its checks are split (admitted from leases, decided here, forwarded to owners, decided
//! by the fallback); when one part fails, the forwards still in flight are awaited (each is
//! answered within its deadline) and every part that consumed gives it back before the
//! error is answered (`Taken`): lease spends to their lease, or to its lender when the
//! lease moved on; this engine's checks in the windows they were counted in
//! ([`Engine::give_back`]); an owner's admissions with a `Refund` naming the window the
//! owner counted them in (its answer names it, `counted_window`: a window guessed by this
//! node's clock could, with skew, take hits off a window that never counted them). Left
//! over at most: a refund the owner never gets (it died, the call failed, or the keys moved
//! to another owner meanwhile) keeps that request's hits counted until the window ends, an
//! under-admission, logged.
//!
//! Membership: the `--peers` seeds, the addresses `--peer-dns` resolves to, and nodes that
//! announced themselves with `Join`, minus nodes that said `Leave` and those the failure
//! detector finds down. Anti-entropy heals a membership broken by mistake (a spoofed or stale
//! `Leave`, a false failure detection, a healed partition): every ping answer carries the
//! peer's ring; a node missing from it joins that peer again, and a node said to have left
//! that answers with itself on its ring is a member again (`Membership::heard`, in
//! `detector`). Any change rebuilds the
//! ring (an immutable value swapped atomically) and triggers a rebalance: counters this node
//! holds but no longer owns (after a join, or kept during a fallback) are handed to their
//! owners, which merge them into their own. A node leaving gracefully tells the others, drains,
//! then hands over everything it holds.
//!
//! A single node is not a cluster: it is the [`MemoryStore`] alone, which this store wraps.

pub(crate) mod convert;
mod detector;
mod dial;
pub mod identity;
pub mod lease;
mod metrics;
pub mod names;
pub mod proto;
pub mod remote;
pub mod ring;
pub mod service;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use smallvec::SmallVec;
use tokio::sync::{Notify, oneshot};

use self::remote::{PeerError, Remote};
use crate::check::{Check, Checks, Decision, Decisions, KeepRoute, Slot};
pub use crate::error::ClusterError;
use crate::error::StoreError;
use crate::key::KeyId;
use crate::store::cluster::ring::{DEFAULT_VNODES, Ring};
use crate::store::memory::MemoryStore;
use crate::store::memory::engine::{Consumed, Engine};
use crate::store::{Capabilities, Checked, Placement, ResetFuture, Store};
use crate::transport::tls::{Tls, TlsOptions};

/// What a node does with a check whose owner cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fallback {
    /// Decide on this node's own counter for the key (handed to the owner once it is back).
    #[default]
    Local,
    /// Admit.
    Allow,
    /// Reject.
    Deny,
}

impl Fallback {
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Local => "local",
            Fallback::Allow => "allow",
            Fallback::Deny => "deny",
        }
    }
}

/// Settings of cluster mode.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// This node's peer address as the others reach it.
    pub advertise: String,
    /// Seed members.
    pub peers: Vec<String>,
    /// `name:port` resolved periodically for members (a Kubernetes headless Service).
    pub peer_dns: Option<String>,
    pub dns_refresh: Duration,
    pub vnodes: usize,
    /// Deadline of one forwarded batch: how long an owner that is alive but slow is waited
    /// for (a silent one is cut off sooner by the keepalive).
    pub timeout: Duration,
    /// HTTP/2 pings on every peer connection: how often, and how long one may go
    /// unacknowledged before the connection (and every forward on it) is given up.
    pub keepalive: Duration,
    pub keepalive_timeout: Duration,
    /// Groups per forwarded batch at most.
    pub batch_size: usize,
    /// How long a batch may wait for more groups at most.
    pub batch_window: Duration,
    /// Batches in flight to one peer at most.
    pub max_in_flight: usize,
    /// Groups waiting for one peer's batcher at most.
    pub queue_capacity: usize,
    pub breaker_failures: u32,
    pub breaker_cooldown: Duration,
    pub fallback: Fallback,
    /// The failure detector: every member is pinged this often (each ping's deadline too).
    pub ping_interval: Duration,
    /// Missed pings in a row before a member is taken off this node's ring.
    pub down_after: u32,
    /// Answered pings in a row before a member that was down is back on the ring.
    pub up_after: u32,
    /// Mutual TLS between peers (`--peer-tls-*`: certificate, key, CA, and the optional
    /// shared name): loaded by the server, which serves the peer listener with it.
    pub tls: Option<TlsOptions>,
    /// Serve an unauthenticated peer listener on a non-loopback address (`--peer-insecure`).
    pub insecure: bool,
}

impl ClusterOptions {
    pub fn new(advertise: impl Into<String>) -> ClusterOptions {
        ClusterOptions {
            advertise: advertise.into(),
            peers: Vec::new(),
            peer_dns: None,
            dns_refresh: Duration::from_secs(5),
            vnodes: DEFAULT_VNODES,
            timeout: Duration::from_secs(1),
            keepalive: Duration::from_millis(250),
            keepalive_timeout: Duration::from_secs(1),
            batch_size: 128,
            batch_window: Duration::from_micros(200),
            max_in_flight: 64,
            queue_capacity: 4096,
            breaker_failures: 3,
            breaker_cooldown: Duration::from_secs(1),
            fallback: Fallback::Local,
            ping_interval: Duration::from_millis(500),
            down_after: 3,
            up_after: 2,
            tls: None,
            insecure: false,
        }
    }
}

/// Figures for one peer, kept by its client.
#[derive(Debug, Default)]
pub struct PeerStats {
    /// Groups (one per originating request) forwarded to the peer.
    pub forwarded: AtomicU64,
    pub batches: AtomicU64,
    pub errors: AtomicU64,
    /// Forward batches that took longer than Envoy's default rate limit timeout.
    pub slow: AtomicU64,
}

/// Figures of this node's cluster work, read at scrape time.
#[derive(Debug, Default)]
pub struct ClusterStats {
    pub fallbacks: AtomicU64,
    pub handoff_sent: AtomicU64,
    pub handoff_failed: AtomicU64,
    pub handoff_received: AtomicU64,
    pub ring_changes: AtomicU64,
    /// Peer messages refused: their client certificate does not speak for the node they
    /// concern (mutual TLS).
    pub refused: AtomicU64,
}

/// The routing snapshot: the ring plus a client per member (None for this node).
struct Topology {
    ring: Ring,
    remotes: Vec<Option<Arc<Remote>>>,
}

impl Topology {
    /// The clients of the other members.
    fn peers(&self) -> Vec<Arc<Remote>> {
        self.remotes.iter().flatten().cloned().collect()
    }
}

#[derive(Default)]
struct Membership {
    seeds: BTreeSet<String>,
    discovered: BTreeSet<String>,
    joined: BTreeSet<String>,
    left: BTreeSet<String>,
    /// Members the failure detector found unreachable: off the ring until they answer.
    down: BTreeSet<String>,
    leaving: bool,
    /// Clients by address, reused across ring changes.
    remotes: HashMap<Arc<str>, Arc<Remote>>,
}

impl Membership {
    /// The other nodes this node knows of, reachable or not (what the detector pings).
    fn candidates(&self, me: &str) -> BTreeSet<String> {
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
    fn probed(&self, me: &str) -> BTreeSet<String> {
        let mut probed = self.candidates(me);
        probed.extend(self.left.iter().filter(|left| **left != *me).cloned());
        probed
    }

    /// Anti-entropy: `peer` answered a ping with its ring, `theirs`. A node said to have
    /// left that still has itself on its ring is alive and not leaving: the `Leave` (spoofed,
    /// or stale from its previous run) is forgotten and the node is a member again. Answers
    /// what follows for both sides.
    fn heard(&mut self, me: &str, peer: &str, theirs: &[String]) -> Heard {
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
    fn members(&self, me: &str) -> BTreeSet<String> {
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
struct Heard {
    /// The peer was taken back on this node's ring.
    back: bool,
    /// This node should announce itself to the peer again.
    rejoin: bool,
}

struct Node {
    me: Arc<str>,
    options: ClusterOptions,
    /// Mutual TLS with the other nodes (both ways), when configured.
    tls: Option<Tls>,
    /// This node's own counters: the keys it owns, and those a local fallback decided.
    memory: MemoryStore,
    topology: ArcSwap<Topology>,
    membership: Mutex<Membership>,
    /// Wakes the rebalance task (ring changed, or a peer came back).
    rebalance: Arc<Notify>,
    stats: ClusterStats,
    /// Hits other nodes lent this one (see `lease`).
    leases: Arc<lease::Leases>,
}

/// The in-memory store across peers: decides the checks this node owns on its own
/// [`MemoryStore`] and the others on their owners. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    node: Arc<Node>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("me", &self.node.me)
            .field("members", &self.node.topology.load().ring.members())
            .finish()
    }
}

/// Where the checks of one request go.
enum Target {
    Local,
    /// Admitted from a lease another node granted (see `lease`).
    Leased,
    Remote(Arc<Remote>),
}

impl Cluster {
    /// A cluster member talking plain HTTP/2 to its peers: [`Cluster::join_with`].
    pub fn join(memory: MemoryStore, options: ClusterOptions) -> Cluster {
        Cluster::join_with(memory, options, None)
    }

    /// A cluster member, dialling its peers over mutual TLS with `tls` (the config the peer
    /// listener serves with). Spawns the rebalance and (with `peer_dns`) discovery tasks,
    /// and announces this node to its seeds. Call from inside the tokio runtime, once the
    /// peer listener is bound (so peers can reach us as soon as they hear of us).
    pub fn join_with(memory: MemoryStore, options: ClusterOptions, tls: Option<Tls>) -> Cluster {
        let me: Arc<str> = Arc::from(options.advertise.as_str());
        let membership = Membership {
            seeds: options
                .peers
                .iter()
                .map(|peer| peer.trim().to_owned())
                .filter(|peer| !peer.is_empty())
                .collect(),
            ..Membership::default()
        };
        let node = Arc::new(Node {
            me,
            tls,
            memory,
            topology: ArcSwap::from_pointee(Topology {
                ring: Ring::new([&*options.advertise], options.vnodes),
                remotes: vec![None],
            }),
            membership: Mutex::new(membership),
            rebalance: Arc::new(Notify::new()),
            stats: ClusterStats::default(),
            leases: Arc::new(lease::Leases::default()),
            options,
        });
        node.refresh();
        tokio::spawn(Arc::clone(&node).rebalance_loop());
        tokio::spawn(Arc::clone(&node).announce());
        tokio::spawn(Arc::clone(&node).detect_loop());
        tokio::spawn(Arc::clone(&node).refund_loop());
        if node.options.peer_dns.is_some() {
            tokio::spawn(Arc::clone(&node).discover_loop());
        }
        Cluster { node }
    }

    /// This node's own counters.
    pub fn memory(&self) -> &MemoryStore {
        &self.node.memory
    }

    /// This node's peer address.
    pub fn me(&self) -> &str {
        &self.node.me
    }

    /// The current members, this node included unless it is leaving.
    pub fn members(&self) -> Vec<Arc<str>> {
        self.node.topology.load().ring.members().to_vec()
    }

    /// How many members the ring has (this node included unless it is leaving).
    pub fn member_count(&self) -> usize {
        self.node.topology.load().ring.len()
    }

    /// Every other node this node knows of, and whether the failure detector finds it
    /// reachable.
    pub fn peer_health(&self) -> Vec<(String, bool)> {
        let node = &self.node;
        let membership = node.lock();
        membership
            .candidates(&node.me)
            .into_iter()
            .map(|peer| {
                let up = !membership.down.contains(&peer);
                (peer, up)
            })
            .collect()
    }

    /// The leases this node holds and its lease figures.
    pub fn leases(&self) -> &lease::Leases {
        &self.node.leases
    }

    /// Per-peer and cluster figures, for metrics.
    pub fn stats(&self) -> (&ClusterStats, Vec<Arc<Remote>>) {
        (&self.node.stats, self.node.topology.load().peers())
    }

    /// Registers the cluster's metrics (read at scrape time) in `registry`; this node's
    /// shards register theirs through [`MemoryStore::register_metrics`].
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register_collector(Box::new(metrics::ClusterCollector {
            cluster: self.clone(),
        }));
    }

    /// Decides `checks`; one decision per counter, in order.
    pub async fn check(&self, checks: Checks) -> Result<Decisions, StoreError> {
        Store::check(self, checks).wait().await
    }

    /// [`Cluster::check`] when some checks belong to other nodes; an owner that cannot be
    /// reached is a case for the fallback policy. `leased` holds, per check, what it spent
    /// when it was admitted from a lease already ([`Node::spend_leases`]).
    ///
    /// A request that fails consumes nothing: when any part errs (this node's engine, an
    /// owner's own error such as its key cap, a lost forward, the fallback), every other
    /// part gives back what it consumed ([`Taken::give_back`]) before the error is answered.
    async fn check_distributed(
        &self,
        node: &Node,
        checks: Checks,
        leased: SpentLeases,
    ) -> Result<Decisions, StoreError> {
        let mut spent = leased.into_iter();
        let topology = node.topology.load();
        let target = |check: &Check| -> Option<&Arc<Remote>> {
            let route = check.counters.first()?.key.route;
            let owner = topology.ring.owner_index(route)?;
            topology.remotes.get(owner)?.as_ref()
        };
        // Group by target, remembering where each check's decisions go. Group 1 holds the
        // checks admitted from a lease, decided right here.
        let mut groups: Vec<(Target, Checks)> = vec![
            (Target::Local, Checks::new()),
            (Target::Leased, Checks::new()),
        ];
        let mut taken = Taken::default();
        let mut leased = Decisions::new();
        let mut places = Vec::with_capacity(checks.len());
        let mut total = 0;
        for check in checks {
            let group = match (target(&check), spent.next().flatten()) {
                (None, spent) => {
                    // The ring changed since the lease was spent: this node owns the key
                    // now, and decides it; the lease gets its hits back.
                    if let Some(spent) = spent {
                        node.leases.unspend(&check, &spent);
                    }
                    0
                }
                (Some(_), Some(spent)) => {
                    leased.push(spent.decision);
                    taken.leased.push((check.clone(), spent));
                    1
                }
                (Some(remote), None) => {
                    let found = groups.iter().position(|(target, _)| {
                        matches!(target, Target::Remote(other) if Arc::ptr_eq(other, remote))
                    });
                    found.unwrap_or_else(|| {
                        groups.push((Target::Remote(Arc::clone(remote)), Checks::new()));
                        groups.len() - 1
                    })
                }
            };
            let len = check.counters.len();
            places.push((group, len));
            total += len;
            groups[group].1.push(check);
        }
        drop(topology);
        // Queue the forwards first, so they travel while the local part is decided.
        let mut answers: Vec<Option<Decisions>> = (0..groups.len()).map(|_| None).collect();
        answers[1] = Some(leased);
        let mut waiting: Vec<(usize, Arc<Remote>, oneshot::Receiver<remote::Answer>)> = Vec::new();
        let mut fallbacks: Vec<(usize, Checks)> = Vec::new();
        let mut local = Checks::new();
        for (index, (target, group)) in groups.into_iter().enumerate() {
            match target {
                Target::Local => local = group,
                Target::Leased => {}
                Target::Remote(remote) => match remote.submit(group) {
                    Ok(rx) => waiting.push((index, remote, rx)),
                    Err((_, group)) => fallbacks.push((index, group)),
                },
            }
        }
        // The first error of any part; once there is one, the parts still in flight are
        // awaited only to give back what they consumed.
        let mut failed: Option<StoreError> = None;
        if !local.is_empty() {
            let started = node.engine().begin(&local);
            match started {
                Ok(started) => match started.finish_consumed().await {
                    Ok((decisions, consumed)) => {
                        answers[0] = Some(decisions);
                        taken.engine.push((local, consumed));
                    }
                    Err(error) => failed = Some(error),
                },
                // The engine gave back its own part already.
                Err(error) => failed = Some(error),
            }
        }
        // Every forward is answered within its deadline (see `remote`).
        for (index, remote, rx) in waiting {
            match rx.await {
                Ok(Ok(answered)) => {
                    answers[index] = Some(answered.decisions);
                    taken.forwarded.push((remote, answered.counted));
                }
                Ok(Err((error @ PeerError::Remote { .. }, _))) => {
                    failed.get_or_insert_with(|| ClusterError::from(error).into());
                }
                // Unreachable, or no longer a member: the fallback policy decides.
                Ok(Err((_, group))) => fallbacks.push((index, group)),
                Err(_) => {
                    let peer = Arc::clone(remote.address());
                    let problem = "the forward was dropped".to_owned();
                    failed.get_or_insert_with(|| ClusterError::Protocol { peer, problem }.into());
                }
            }
        }
        if failed.is_none() {
            for (index, group) in fallbacks {
                node.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                match node.fallback(group).await {
                    Ok((decisions, consumed)) => {
                        answers[index] = Some(decisions);
                        taken.engine.extend(consumed);
                    }
                    Err(error) => {
                        failed = Some(error);
                        break;
                    }
                }
            }
        }
        let decided = match failed {
            Some(error) => Err(error),
            None => assemble(answers, places, total),
        };
        if decided.is_err() {
            taken.give_back(node).await;
        }
        decided
    }

    /// [`Store::peek`] when some checks belong to other nodes: each owner is asked once
    /// (`Remote::peek`, at most `convert::MAX_CHECKS_PER_GROUP` checks per call), all at
    /// once, and the answers are put back in request order.
    async fn peek_distributed(&self, node: &Node, checks: Checks) -> Result<Decisions, StoreError> {
        let topology = node.topology.load();
        // Per check: its owner's index in `owners` (`None`: this node) and its counters.
        let mut owners: Vec<(Arc<Remote>, Checks)> = Vec::new();
        let mut local = Checks::new();
        let mut places = Vec::with_capacity(checks.len());
        for check in checks {
            let remote = topology
                .ring
                .owner_index(check.route())
                .and_then(|owner| topology.remotes.get(owner)?.as_ref());
            let len = check.counters.len();
            let Some(remote) = remote else {
                places.push((None, len));
                local.push(check);
                continue;
            };
            let index = owners
                .iter()
                .position(|(other, _)| Arc::ptr_eq(other, remote))
                .unwrap_or_else(|| {
                    owners.push((Arc::clone(remote), Checks::new()));
                    owners.len() - 1
                });
            places.push((Some(index), len));
            owners[index].1.push(check);
        }
        drop(topology);
        let asked = owners.iter().map(|(remote, checks)| async move {
            let mut decisions = Decisions::new();
            for chunk in checks.chunks(convert::MAX_CHECKS_PER_GROUP) {
                let chunk: Checks = chunk.iter().cloned().collect();
                let expected: usize = chunk.iter().map(|check| check.counters.len()).sum();
                let answer = remote.peek(&chunk).await?;
                if answer.len() != expected {
                    return Err(ClusterError::Protocol {
                        peer: Arc::clone(remote.address()),
                        problem: format!("{} decisions for {expected} counters", answer.len()),
                    });
                }
                decisions.extend(answer);
            }
            Ok(decisions)
        });
        let here = node.engine().peek(&local);
        let answers = futures_util::future::try_join_all(asked).await?;
        let mut here = here.into_iter();
        let mut theirs: Vec<_> = answers.into_iter().map(IntoIterator::into_iter).collect();
        let mut decisions = Decisions::new();
        for (owner, len) in places {
            let source: &mut dyn Iterator<Item = Decision> = match owner {
                None => &mut here,
                Some(index) => &mut theirs[index],
            };
            decisions.extend(source.take(len));
        }
        Ok(decisions)
    }

    /// Stops routing to this node and tells the others it is leaving (before the drain).
    pub async fn leave(&self) {
        let node = &self.node;
        let remotes: Vec<Arc<Remote>> = {
            let mut membership = node.lock();
            membership.leaving = true;
            membership.remotes.values().cloned().collect()
        };
        // Off this node's own ring first: its ping answers then no longer list it, so the
        // others' anti-entropy honours the leave (see `Membership::heard`).
        node.refresh();
        let mut calls = Vec::new();
        for remote in remotes {
            calls.push(tokio::spawn(async move { remote.leave().await }));
        }
        for call in calls {
            let _ = call.await;
        }
        node.refresh();
        tracing::info!(me = %node.me, "left the cluster ring");
    }

    /// Hands every counter this node holds to its owner, and gives every lease back (after
    /// the drain, before exit).
    pub async fn hand_over_all(&self) {
        self.node.refund_now(true).await;
        self.node.rebalance_once().await;
    }
}

/// The in-memory store across peers: this node's memory store for the keys it owns, the
/// owners' for the others.
impl Store for Cluster {
    fn capabilities(&self) -> Capabilities {
        self.node.memory.capabilities()
    }

    fn check(&self, checks: Checks) -> Checked<'_> {
        let node = &*self.node;
        if !node.owns_all(&checks) {
            // A hot key owned elsewhere is usually admitted from a lease, right here.
            let spent = node.spend_leases(&checks);
            if spent.iter().all(Option::is_some) {
                let decisions = spent.into_iter().flatten().map(|spent| spent.decision);
                return Checked::Ready(Ok(decisions.collect()));
            }
            let distributed = self.check_distributed(node, checks, spent);
            return Checked::Pending(Box::pin(distributed));
        }
        node.memory.check(checks)
    }

    fn placement(&self, route: u64) -> Placement {
        let node = &*self.node;
        let topology = node.topology.load();
        let owner = topology.ring.owner(route).cloned();
        // Like `owns_all`: a member without a client (this node) decides here.
        let local = topology
            .ring
            .owner_index(route)
            .is_none_or(|owner| topology.remotes.get(owner).is_none_or(Option::is_none));
        Placement {
            shard: local.then(|| node.memory.shard_of(route)),
            owner,
            local,
        }
    }

    /// This node's own checks read on its engine; the others asked of their owners
    /// (`Peek`), never a fallback: an owner that cannot answer is an error.
    fn peek(&self, checks: Checks) -> Checked<'_> {
        let node = &*self.node;
        if !node.owns_all(&checks) {
            return Checked::Pending(Box::pin(self.peek_distributed(node, checks)));
        }
        node.memory.peek(checks)
    }

    /// Forgets the counters here (where a fallback may have counted them) and on their
    /// owner; an owner that cannot be reached is an error.
    fn reset(&self, keys: Vec<KeyId>) -> ResetFuture<'_> {
        Box::pin(async move {
            let node = &*self.node;
            let here = node.engine().reset(&keys);
            node.leases.forget(&keys);
            let remote = {
                let topology = node.topology.load();
                keys.first()
                    .and_then(|key| topology.ring.owner_index(key.route))
                    .and_then(|owner| topology.remotes.get(owner).cloned().flatten())
            };
            let Some(remote) = remote else {
                return Ok(here);
            };
            match remote.reset(&keys).await {
                Ok(removed) => Ok(here + removed as usize),
                Err(error) => {
                    if !matches!(error, PeerError::Remote { .. }) {
                        tracing::warn!(%error, "cannot reset counters on their owner");
                    }
                    Err(ClusterError::from(error).into())
                }
            }
        })
    }
}

/// Per check of a request: what it spent when it was admitted from a lease.
type SpentLeases = SmallVec<[Option<lease::Spent>; 4]>;

/// Puts each group's decisions back in request order: `places` holds, per check in request
/// order, its group and its number of counters (each group's checks were pushed in order).
fn assemble(
    answers: Vec<Option<Decisions>>,
    places: Vec<(usize, usize)>,
    total: usize,
) -> Result<Decisions, StoreError> {
    let mut decisions = Decisions::with_capacity(total);
    let mut iters: Vec<_> = answers
        .into_iter()
        .map(|answer| answer.unwrap_or_default().into_iter())
        .collect();
    for (group, len) in places {
        for _ in 0..len {
            let decision = iters
                .get_mut(group)
                .and_then(Iterator::next)
                .ok_or_else(|| ClusterError::Protocol {
                    peer: Arc::from("a peer"),
                    problem: "answered too few decisions".to_owned(),
                })?;
            decisions.push(decision);
        }
    }
    Ok(decisions)
}

/// What the parts of one request consumed so far, to give back if another part fails.
#[derive(Default)]
struct Taken {
    /// Checks admitted from leases, and what each spent.
    leased: Vec<(Check, lease::Spent)>,
    /// Checks this node's engine decided (its own keys, and the local fallback's), and
    /// which of them consumed when.
    engine: Vec<(Checks, Consumed)>,
    /// What each owner counted for the checks forwarded to it.
    forwarded: Vec<(Arc<Remote>, remote::Counted)>,
}

impl Taken {
    /// Gives everything back: lease spends to their lease (or lender), this node's engine
    /// in the windows its checks were counted in, and each owner's admissions with a
    /// `Refund` naming the windows the owner counted them in (never this node's guess, so
    /// clock skew cannot take hits off a window that did not count them), while it still
    /// owns their keys (after a ring change the counter went to the new owner with the
    /// hits in it; another counter of the old owner's never had them). A refund the owner
    /// does not get (it went away meanwhile, or the keys moved) stays counted until its
    /// window ends: an under-admission of at most that request's cost, never an
    /// over-admission.
    async fn give_back(self, node: &Node) {
        for (check, spent) in &self.leased {
            node.leases.unspend(check, spent);
        }
        for (checks, consumed) in &self.engine {
            node.engine().give_back(checks, consumed);
        }
        let topology = node.topology.load_full();
        let owns = |remote: &Remote, refund: &lease::Refund| {
            topology
                .ring
                .owner(refund.counter.key.route)
                .is_some_and(|owner| owner == remote.address())
        };
        let refunds: Vec<(&Arc<Remote>, Vec<lease::Refund>)> = self
            .forwarded
            .iter()
            .map(|(remote, counted)| {
                let mut refunds = counted.refunds(remote.address());
                refunds.retain(|refund| owns(remote, refund));
                (remote, refunds)
            })
            .collect();
        let refunds = refunds
            .iter()
            .flat_map(|(remote, refunds)| {
                refunds
                    .chunks(convert::MAX_HANDOFF / 10)
                    .map(move |chunk| (*remote, chunk))
            })
            .map(|(remote, chunk)| async move {
                if let Err(error) = remote.refund(chunk).await {
                    tracing::warn!(%error, refunds = chunk.len(), "could not give back what an owner counted for a failed request");
                }
            });
        futures_util::future::join_all(refunds).await;
    }
}

impl Node {
    /// This node's engine (of its [`MemoryStore`]).
    fn engine(&self) -> &Engine {
        self.memory.engine()
    }

    /// Admits from their leases the checks whose keys other nodes own and lent this node
    /// hits for; `None` for the others (this node's own keys, and keys without a lease).
    fn spend_leases(&self, checks: &[Check]) -> SpentLeases {
        let topology = self.topology.load();
        let now = tokio::time::Instant::now();
        checks
            .iter()
            .map(|check| {
                let owner = topology.ring.owner_index(check.route())?;
                topology.remotes.get(owner)?.as_ref()?;
                self.leases.spend(check, now)
            })
            .collect()
    }

    /// Whether this node owns every check's key (then nothing needs forwarding).
    fn owns_all(&self, checks: &[Check]) -> bool {
        let topology = self.topology.load();
        checks.iter().all(|check| {
            topology
                .ring
                .owner_index(check.route())
                .is_none_or(|owner| topology.remotes.get(owner).is_none_or(Option::is_none))
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Membership> {
        // A panic while holding this lock would be a bug elsewhere; the data stays usable.
        self.membership
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Rebuilds the ring from the membership if it changed; wakes the rebalance task.
    fn refresh(&self) {
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

    /// The current members' addresses (for `Join`/`Leave` answers).
    fn member_list(&self) -> Vec<String> {
        let topology = self.topology.load();
        let members = topology.ring.members();
        members.iter().map(|member| member.to_string()).collect()
    }

    /// Adds `address` (it joined); returns the members we know.
    fn joined(&self, address: &str) -> Vec<String> {
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
    fn left(&self, address: &str) -> Vec<String> {
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

    /// Decides `group` (checks whose owner cannot answer) by the fallback policy; with
    /// [`Fallback::Local`], also answers what this node's engine consumed for them (to give
    /// back if the request fails).
    async fn fallback(
        &self,
        group: Checks,
    ) -> Result<(Decisions, Option<(Checks, Consumed)>), StoreError> {
        let synthetic = |allowed: bool| {
            group
                .iter()
                .flat_map(|check| check.counters.iter())
                .map(|_| Decision {
                    allowed,
                    remaining: 0,
                    reset_after: 0,
                    retry_after: None,
                })
                .collect()
        };
        match self.options.fallback {
            Fallback::Local => {
                // This node's share of each limit: with every node falling back at once,
                // together they admit no more than the limit.
                let members = self.topology.load().ring.len();
                let mut group = group;
                for counter in group.iter_mut().flat_map(|check| check.counters.iter_mut()) {
                    counter.rate = counter.rate.share(members);
                }
                let (decisions, consumed) = self.engine().begin(&group)?.finish_consumed().await?;
                Ok((decisions, Some((group, consumed))))
            }
            Fallback::Allow => Ok((synthetic(true), None)),
            Fallback::Deny => Ok((synthetic(false), None)),
        }
    }

    /// Gives expired leases' unspent hits back to their owners, four times per lease TTL.
    async fn refund_loop(self: Arc<Self>) {
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

    /// Announces this node to every member it knows, learning theirs; retries a few times
    /// while none answers.
    async fn announce(self: Arc<Self>) {
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

    async fn discover_loop(self: Arc<Self>) {
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

    async fn rebalance_loop(self: Arc<Self>) {
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
}

#[cfg(test)]
mod tests;
