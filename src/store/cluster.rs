//! Cluster mode: one limit across all replicas, without Redis. The in-memory store across
//! peers: a [`Cluster`] wraps this node's [`MemoryStore`] (a single node is that store
//! alone, not a cluster).
//!
//! Every key has one owner node on a consistent hash [`Ring`] of the members' peer
//! addresses, placed by the key's route hash (so all limits of a descriptor, in every window,
//! have the same owner). [`Cluster::check`] decides the checks this node owns on its own
//! memory store and forwards the others to their owners ([`remote`]: batched, with a
//! deadline and a circuit breaker). When an owner cannot answer, the [`Fallback`] policy
//! decides: by default this node's own counter for the key (degraded, but bounded).
//!
//! The jobs, one submodule each, around the [`Topology`] snapshot and the `Node` they share:
//! - `membership`: who the members are (seeds, DNS, `Join`/`Leave`, anti-entropy on the
//!   failure detector's pings, in `detector`), and leaving.
//! - `rebalance`: a membership change rebuilds the ring (an immutable value swapped
//!   atomically) and wakes the rebalance task: counters this node holds but no longer owns
//!   (after a join, or kept during a fallback) are handed to their owners, which merge them
//!   into their own; expired leases' unspent hits go back to their lenders. A node leaving
//!   gracefully tells the others, drains, then hands over everything it holds.
//! - [`lease`]: hits an owner lends this node for its hot keys, spent on the request path.
//! - `forward`: a request's checks scattered to their deciders (a lease, this node, each
//!   owner, the fallback) and their answers gathered back in request order ([`scatter`],
//!   the plan, is pure).
//!
//! No partial effects: a request that fails consumes nothing on any of its descriptors.
//! When one part fails, the forwards still in flight are awaited (each is answered within
//! its deadline) and every part that consumed gives it back before the error is answered
//! (`Taken`): lease spends to their lease, or to its lender when the lease moved on; this
//! engine's checks in the windows they were counted in ([`Engine::give_back`]); an owner's
//! admissions with a `Refund` naming the window the owner counted them in (its answer names
//! it, `counted_window`: a window guessed by this node's clock could, with skew, take hits
//! off a window that never counted them). Left over at most: a refund the owner never gets
//! (it died, the call failed, or the keys moved to another owner meanwhile) keeps that
//! request's hits counted until the window ends, an under-admission, logged.
//!
//! - [`quota`]: RLQS across the cluster: each node's demand for a quota bucket sent to its
//!   owner, which answers the node's share (the division itself is installed by the
//!   server, see [`quota::QuotaSource`]).
//!
//! No import cycle between the submodules: the vocabulary ([`names`], [`lease`], [`quota`],
//! [`scatter`], [`ring`], [`proto`], [`identity`]) imports no sibling; `convert` maps it to
//! the wire; [`remote`] (one peer's client) builds on `convert`; the jobs build on `remote`.

pub(crate) mod convert;
mod detector;
mod dial;
mod forward;
pub mod identity;
pub(crate) mod lease;
mod membership;
mod metrics;
pub mod names;
pub mod proto;
pub mod quota;
mod rebalance;
pub(crate) mod remote;
pub mod ring;
pub mod scatter;
pub mod service;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;

pub use self::forward::NamesMissing;
use self::membership::Membership;
use self::remote::{PeerError, Remote};
use self::ring::{DEFAULT_VNODES, Ring};
use crate::check::{Checks, Decisions};
pub use crate::error::ClusterError;
use crate::error::StoreError;
use crate::key::KeyId;
use crate::store::failure::FailurePolicy;
use crate::store::memory::MemoryStore;
use crate::store::memory::engine::Engine;
use crate::store::{Capabilities, Checked, Placement, ResetFuture, RuleKeys, Store};
use crate::transport::tls::{Tls, TlsOptions};

/// What a node does with a check whose owner cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fallback {
    /// Decide on this node's own counter for the key (handed to the owner once it is back).
    #[default]
    Local,
    /// Answer by the stores' common [`FailurePolicy`] (`allow` or `deny`, as the Redis
    /// store answers while Redis is down), retrying the owner after the breaker's cooldown.
    Policy(FailurePolicy),
}

impl Fallback {
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Local => "local",
            Fallback::Policy(policy) => policy.as_str(),
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
    /// Request groups whose owner did not answer but had left the ring meanwhile: sent to
    /// the new owner instead of the fallback.
    pub rerouted: AtomicU64,
    pub handoff_sent: AtomicU64,
    pub handoff_failed: AtomicU64,
    pub handoff_received: AtomicU64,
    pub ring_changes: AtomicU64,
    /// Peer messages refused: their client certificate does not speak for the node they
    /// concern (mutual TLS).
    pub refused: AtomicU64,
    /// RLQS: bucket demands sent to their owners, those that got no share back (the owner
    /// did not answer in time, or gave none), `Quota` calls that failed, and bucket demands
    /// this node divided as their owner for other nodes.
    pub quota_sent: AtomicU64,
    pub quota_unanswered: AtomicU64,
    pub quota_failed_calls: AtomicU64,
    pub quota_received: AtomicU64,
}

/// The routing snapshot: the ring plus a client per member (None for this node). Rebuilt
/// and swapped whole when the members change (`rebalance`).
struct Topology {
    ring: Ring,
    remotes: Vec<Option<Arc<Remote>>>,
}

impl Topology {
    /// The clients of the other members.
    fn peers(&self) -> Vec<Arc<Remote>> {
        self.remotes.iter().flatten().cloned().collect()
    }

    /// The client of the member owning `route`; `None` when this node decides it (it owns
    /// the route, or the ring is empty).
    fn owner_of(&self, route: u64) -> Option<&Arc<Remote>> {
        let owner = self.ring.owner_index(route)?;
        self.remotes.get(owner)?.as_ref()
    }
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
            let distributed = self.check_distributed(node, checks, spent, true);
            return Checked::Pending(Box::pin(distributed));
        }
        node.memory.check(checks)
    }

    fn placement(&self, route: u64) -> Placement {
        let node = &*self.node;
        let topology = node.topology.load();
        let owner = topology.ring.owner(route).cloned();
        let local = topology.owner_of(route).is_none();
        Placement {
            shard: local.then(|| node.memory.shard_of(route)),
            owner,
            local,
        }
    }

    /// This node's keys of the rule: each node keeps its own budget for the keys it owns.
    fn all_rule_keys(&self) -> Vec<(u32, RuleKeys)> {
        self.node.memory.all_rule_keys()
    }

    fn rule_keys(&self, rule: u32) -> Option<RuleKeys> {
        self.node.memory.rule_keys(rule)
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
                    .and_then(|key| topology.owner_of(key.route))
                    .cloned()
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

impl Node {
    /// This node's engine (of its [`MemoryStore`]).
    fn engine(&self) -> &Engine {
        self.memory.engine()
    }
}

#[cfg(test)]
mod tests;
