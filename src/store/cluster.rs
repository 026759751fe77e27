//! Cluster mode: one limit across all replicas, without Redis. The in-memory store across
//! peers: a [`Cluster`] wraps this node's [`MemoryStore`] (a single node is that store
//! alone, not a cluster) over the cluster runtime ([`crate::cluster`]: the members, the
//! ring, the peers' clients, the peer service), and is what the limiter sees of it.
//!
//! [`Cluster::check`] decides the checks this node owns (on the runtime's ring) on its own
//! memory store and forwards the others to their owners (the runtime's clients: batched,
//! with a deadline and a circuit breaker). When an owner cannot answer, the
//! [`Fallback`](crate::cluster::Fallback) policy decides: by default this node's own counter
//! for the key (degraded, but bounded). As an owner, this node answers the other nodes'
//! checks, handoffs, resets, refunds and peeks (`owner`: the runtime's peer service hands
//! them over, [`Cluster::peer_service`]).
//!
//! The jobs, one submodule each, around the `Node` they share (the runtime and this node's
//! memory store):
//! - `rebalance`: woken by the runtime when the ring changed (or a peer came back):
//!   counters this node holds but no longer owns (after a join, or kept during a fallback)
//!   are handed to their owners, which merge them into their own. A node leaving gracefully
//!   drains, then hands over everything it holds and gives its leases back.
//! - `forward`: a request's checks scattered to their deciders (a lease, this node, each
//!   owner, the fallback) and their answers gathered back in request order ([`scatter`],
//!   the plan, is pure).
//! - `owner`: the peer messages about this node's counters (`cluster::service::Counters`).
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
//! No import cycle between the submodules: [`scatter`] imports no sibling, `forward`
//! builds on it, `rebalance` and `owner` stand alone.

mod forward;
mod owner;
mod rebalance;
pub mod scatter;

use std::sync::Arc;

use crate::check::{Checks, Decisions};
use crate::cluster::names::NameSource;
use crate::cluster::proto::v1::peer_server::PeerServer;
use crate::cluster::quota::QuotaSource;
use crate::cluster::remote::PeerError;
use crate::cluster::service::{self, PeerService};
use crate::cluster::{ClusterOptions, Runtime};
use crate::error::{ClusterError, StoreError};
use crate::key::KeyId;
use crate::store::memory::MemoryStore;
use crate::store::memory::engine::Engine;
use crate::store::{Capabilities, Checked, Placement, ResetFuture, RuleKeys, Store};
use crate::transport::tls::Tls;

/// What the store over the runtime shares: the runtime, and this node's counters.
struct Node {
    runtime: Arc<Runtime>,
    /// This node's own counters: the keys it owns, and those a local fallback decided.
    memory: MemoryStore,
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
            .field("me", &self.node.runtime.me)
            .field("members", &self.node.runtime.topology.load().ring.members())
            .finish()
    }
}

impl Cluster {
    /// A cluster member talking plain HTTP/2 to its peers: [`Cluster::join_with`].
    pub fn join(memory: MemoryStore, options: ClusterOptions) -> Cluster {
        Cluster::join_with(memory, options, None)
    }

    /// A cluster member, dialling its peers over mutual TLS with `tls` (the config the peer
    /// listener serves with): starts the runtime ([`Runtime::start`]) and the rebalance
    /// task. Call from inside the tokio runtime, once the peer listener is bound (so peers
    /// can reach us as soon as they hear of us).
    pub fn join_with(memory: MemoryStore, options: ClusterOptions, tls: Option<Tls>) -> Cluster {
        let node = Arc::new(Node {
            runtime: Runtime::start(options, tls),
            memory,
        });
        tokio::spawn(Arc::clone(&node).rebalance_loop());
        Cluster { node }
    }

    /// This node's own counters.
    pub fn memory(&self) -> &MemoryStore {
        &self.node.memory
    }

    /// The cluster runtime under this store: the members, the ring, the peers, their
    /// figures.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.node.runtime
    }

    /// The peer service of this node (in its gRPC server), answering the counter messages
    /// on this store, serving the counter names `names` gives (`Names`) and dividing the
    /// quota buckets this node owns with `quota` (`Quota`).
    pub fn peer_service(
        &self,
        names: Option<NameSource>,
        quota: Option<QuotaSource>,
    ) -> PeerServer<PeerService> {
        self.unwrapped_peer_service(names, quota).into_server()
    }

    /// [`Cluster::peer_service`], not wrapped in its gRPC server (the fuzz harness calls
    /// its methods).
    pub(crate) fn unwrapped_peer_service(
        &self,
        names: Option<NameSource>,
        quota: Option<QuotaSource>,
    ) -> PeerService {
        let counters: Arc<dyn service::Counters> = Arc::clone(&self.node) as _;
        PeerService::new(Arc::clone(&self.node.runtime), counters, names, quota)
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
        let topology = node.runtime.topology.load();
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
            node.runtime.leases.forget(&keys);
            let remote = {
                let topology = node.runtime.topology.load();
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
