//! The cluster runtime: this node among its peers, whatever it counts with. Who the members
//! are, where each key lives, how the peers are reached and what they may ask. The store over
//! it, the memory store across peers, is [`crate::store::cluster`]; this module imports
//! nothing of the stores.
//!
//! Every key has one owner node on a consistent hash [`Ring`] of the members' peer
//! addresses, placed by the key's route hash (so all limits of a descriptor, in every window,
//! have the same owner). The `Topology` (the ring and a client per other member,
//! [`remote`]: batched, with a deadline and a circuit breaker) is one immutable value behind
//! `ArcSwap`; a membership change builds a new one and swaps it, and wakes whoever hands
//! counters over (the runtime's `rebalance` notify). When an owner cannot answer, the
//! [`Fallback`] policy says what the store does: by default its own counter for the key
//! (degraded, but bounded).
//!
//! The jobs, one submodule each, around the [`Runtime`] they share:
//! - `membership`: who the members are (seeds, DNS, `Join`/`Leave`, anti-entropy on the
//!   failure detector's pings, in `detector`), the ring rebuilt from them, and leaving.
//! - [`lease`]: hits an owner lends this node for its hot keys (kept by [`remote`], spent by
//!   the store on the request path); `refund`: the task giving expired leases' unspent hits
//!   back to their lenders.
//! - `exchange`: every member asked at once: the RLQS quota exchange and the counter names.
//! - [`service`]: the peer service other nodes call. It answers membership, pings, names and
//!   quota itself, and hands the counter messages (checks, handoffs, resets, refunds,
//!   peeks) to the store (`service::Counters`).
//! - [`quota`]: RLQS across the cluster: each node's demand for a quota bucket sent to its
//!   owner, which answers the node's share (the division itself is installed by the
//!   server, see [`quota::QuotaSource`]).
//!
//! No import cycle between the submodules: the vocabulary ([`names`], [`lease`], [`quota`],
//! [`ring`], [`proto`], [`identity`]) imports no sibling; `convert` maps it to the wire;
//! [`remote`] (one peer's client) builds on `convert` and `dial`; the jobs build on
//! `remote`; a child may use its parent's own items ([`Runtime`], `Topology`).

pub(crate) mod convert;
mod detector;
mod dial;
mod exchange;
pub mod identity;
pub(crate) mod lease;
mod membership;
mod metrics;
pub mod names;
pub mod proto;
pub mod quota;
mod refund;
pub(crate) mod remote;
pub mod ring;
pub mod service;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;

pub use self::exchange::NamesMissing;
use self::lease::Leases;
use self::membership::Membership;
use self::remote::Remote;
use self::ring::{DEFAULT_VNODES, Ring};
use crate::failure::FailurePolicy;
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
/// and swapped whole when the members change (`membership`).
pub(crate) struct Topology {
    pub(crate) ring: Ring,
    pub(crate) remotes: Vec<Option<Arc<Remote>>>,
}

impl Topology {
    /// The clients of the other members.
    pub(crate) fn peers(&self) -> Vec<Arc<Remote>> {
        self.remotes.iter().flatten().cloned().collect()
    }

    /// The client of the member owning `route`; `None` when this node decides it (it owns
    /// the route, or the ring is empty).
    pub(crate) fn owner_of(&self, route: u64) -> Option<&Arc<Remote>> {
        let owner = self.ring.owner_index(route)?;
        self.remotes.get(owner)?.as_ref()
    }
}

/// This node in the cluster: its address, the members and the ring over them, the clients
/// of the other members, the leases they granted and the cluster's figures. Shared (`Arc`)
/// by the store over it, the peer service and the runtime's own tasks.
pub struct Runtime {
    pub(crate) me: Arc<str>,
    pub(crate) options: ClusterOptions,
    /// Mutual TLS with the other nodes (both ways), when configured.
    tls: Option<Tls>,
    pub(crate) topology: ArcSwap<Topology>,
    membership: Mutex<Membership>,
    /// Wakes whoever hands counters over (the store's rebalance task): the ring changed,
    /// or a peer came back.
    pub(crate) rebalance: Arc<Notify>,
    pub(crate) stats: ClusterStats,
    /// Hits other nodes lent this one (see `lease`).
    pub(crate) leases: Arc<Leases>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("me", &self.me)
            .field("members", &self.topology.load().ring.members())
            .finish()
    }
}

impl Runtime {
    /// This node as a cluster member, dialling its peers over mutual TLS with `tls` (the
    /// config the peer listener serves with) when given. Spawns the failure detector, the
    /// lease refunds and (with `peer_dns`) discovery, and announces this node to its seeds.
    /// Call from inside the tokio runtime, once the peer listener is bound (so peers can
    /// reach us as soon as they hear of us).
    pub fn start(options: ClusterOptions, tls: Option<Tls>) -> Arc<Runtime> {
        let membership = Membership {
            seeds: options
                .peers
                .iter()
                .map(|peer| peer.trim().to_owned())
                .filter(|peer| !peer.is_empty())
                .collect(),
            ..Membership::default()
        };
        let runtime = Arc::new(Runtime {
            me: Arc::from(options.advertise.as_str()),
            tls,
            topology: ArcSwap::from_pointee(Topology {
                ring: Ring::new([&*options.advertise], options.vnodes),
                remotes: vec![None],
            }),
            membership: Mutex::new(membership),
            rebalance: Arc::new(Notify::new()),
            stats: ClusterStats::default(),
            leases: Arc::new(Leases::default()),
            options,
        });
        runtime.refresh();
        tokio::spawn(Arc::clone(&runtime).announce());
        tokio::spawn(Arc::clone(&runtime).detect_loop());
        tokio::spawn(Arc::clone(&runtime).refund_loop());
        if runtime.options.peer_dns.is_some() {
            tokio::spawn(Arc::clone(&runtime).discover_loop());
        }
        runtime
    }

    /// This node's peer address.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// The current members, this node included unless it is leaving.
    pub fn members(&self) -> Vec<Arc<str>> {
        self.topology.load().ring.members().to_vec()
    }

    /// How many members the ring has (this node included unless it is leaving).
    pub fn member_count(&self) -> usize {
        self.topology.load().ring.len()
    }

    /// The leases this node holds and its lease figures.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// Per-peer and cluster figures, for metrics.
    pub fn stats(&self) -> (&ClusterStats, Vec<Arc<Remote>>) {
        (&self.stats, self.topology.load().peers())
    }

    /// Registers the cluster's metrics (read at scrape time) in `registry`; this node's
    /// shards register theirs through their store.
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        registry.register_collector(Box::new(metrics::ClusterCollector {
            runtime: Arc::clone(self),
        }));
    }
}

#[cfg(test)]
pub(crate) mod tests;
