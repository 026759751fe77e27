//! RLQS in cluster mode: one limit across the nodes, each Envoy talking to its own node.
//!
//! Every report interval each node's [`Exchanger`] sums, per bucket, the demand of its own
//! streams ([`Hub::node_demands`]) and sends it to the bucket's owner on the peer ring
//! (the cluster runtime's `Quota` call, batched per owner; the bucket is placed by
//! [`quota_bucket`], a hash of its domain and id). The owner's [`Owner`] divides the limit
//! among the nodes reporting the bucket with the same max-min division a node uses among
//! its streams ([`division::divide`], the nodes being the reporters), answers each node its
//! share, and forgets a node not heard for [`FORGET_AFTER`] (two intervals). Each node then
//! divides its share among its own streams ([`Hub::set_node_shares`]); until the owner's
//! first answer, or while it cannot be reached, a node divides an equal part of the limit
//! per member.
//!
//! Invariants:
//! - The shares the owner answers for one bucket at one instant add up to at most its limit
//!   (every node keeps at least one token per unit: with more nodes than the limit, the sum
//!   is the number of nodes), as [`division::divide`] guarantees.
//! - Bounded: the owner holds at most `max_buckets` buckets and [`MAX_NODES_PER_BUCKET`]
//!   nodes per bucket; past either, it gives no share (the node falls back to an equal
//!   part). Node names come from authenticated peers (mutual TLS) and are at most 256 bytes
//!   (checked by the peer service).
//! - The owner's state takes `now` as an argument; only the exchanger's task reads the
//!   clock and does IO, and it never holds the hub's lock across an await.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::ENVOY_REPORT_INTERVAL;
use super::division;
use super::hub::{Hub, NodeDemand};
use super::rule::BucketKey;
use crate::cluster::Runtime;
use crate::cluster::quota::{QuotaBucket, QuotaDemand, QuotaSource};
use crate::key::{fmix64, fnv1a64};

/// How often a node sends its demand to the owners unless told otherwise
/// (`--rlqs-exchange-every`): Envoy's report interval.
pub const EXCHANGE_EVERY: Duration = ENVOY_REPORT_INTERVAL;

/// The exchange intervals `--rlqs-exchange-every` may be: at most three of Envoy's reports.
/// Longer, shares would follow demand slowly, and an owner would keep a dead node's share
/// for over 30 s (two intervals).
pub const EXCHANGE_INTERVALS: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(15);

/// An owner forgets a node it has not heard from for two exchange intervals: its share goes
/// to the others at their next exchange.
pub const fn forget_after(exchange_every: Duration) -> Duration {
    exchange_every.saturating_mul(2)
}

/// [`forget_after`] the default interval.
pub const FORGET_AFTER: Duration = forget_after(EXCHANGE_EVERY);

/// Nodes one bucket's owner divides among at most.
pub const MAX_NODES_PER_BUCKET: usize = 256;

/// Seeds of the two hashes naming a bucket on the ring (part of the peer protocol: every
/// node of a cluster must place a bucket alike).
const ROUTE_SEED: u64 = 0x7271_6c73_726f_7574;
const ID_SEED: u64 = 0x7271_6c73_6964_5f5f;

/// The bucket `bucket` of `domain` as the cluster names it: hashes of the domain and the
/// pairs (ordered by key, each part length-prefixed so no two ids hash the same bytes).
pub fn quota_bucket(domain: &str, bucket: &BucketKey) -> QuotaBucket {
    let hash = |seed: u64| {
        let mut hash = seed;
        let mut part = |bytes: &[u8]| {
            hash = fnv1a64(hash, &(bytes.len() as u64).to_le_bytes());
            hash = fnv1a64(hash, bytes);
        };
        part(domain.as_bytes());
        for (key, value) in bucket.iter() {
            part(key.as_bytes());
            part(value.as_bytes());
        }
        fmix64(hash)
    };
    QuotaBucket {
        route: hash(ROUTE_SEED),
        id: hash(ID_SEED),
    }
}

/// One node's demand for a bucket, as its owner last heard it.
#[derive(Clone, Copy, Debug)]
struct Heard {
    demand: u64,
    at: Instant,
}

#[derive(Debug)]
struct Owned {
    /// The limit as the latest report said.
    limit: u64,
    nodes: BTreeMap<Arc<str>, Heard>,
}

/// The division of the quota buckets this node owns among the nodes reporting them.
#[derive(Debug)]
pub struct Owner {
    max_buckets: usize,
    forget_after: Duration,
    buckets: Mutex<HashMap<QuotaBucket, Owned>>,
}

impl Owner {
    /// An owner holding at most `max_buckets` buckets, forgetting a node not heard for
    /// `forget_after`.
    pub fn new(max_buckets: usize, forget_after: Duration) -> Owner {
        Owner {
            max_buckets,
            forget_after,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<QuotaBucket, Owned>> {
        // The map is consistent after every statement that changes it.
        self.buckets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `sender`'s demands and answers its share of each bucket, in order (`None`:
    /// the owner is full and gives none).
    pub fn divide(&self, sender: &str, demands: &[QuotaDemand], now: Instant) -> Vec<Option<u64>> {
        let sender: Arc<str> = Arc::from(sender);
        let mut buckets = self.lock();
        demands
            .iter()
            .map(|demand| {
                let held = buckets.len();
                let owned = match buckets.entry(demand.bucket) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(entry) if held < self.max_buckets => entry.insert(Owned {
                        limit: demand.limit,
                        nodes: BTreeMap::new(),
                    }),
                    Entry::Vacant(_) => return None,
                };
                let forget_after = self.forget_after;
                owned
                    .nodes
                    .retain(|_, heard| now.saturating_duration_since(heard.at) < forget_after);
                if !owned.nodes.contains_key(&sender) && owned.nodes.len() >= MAX_NODES_PER_BUCKET {
                    return None;
                }
                owned.limit = demand.limit;
                owned.nodes.insert(
                    Arc::clone(&sender),
                    Heard {
                        demand: demand.demand.min(demand.limit),
                        at: now,
                    },
                );
                let wants: Vec<Option<u64>> = owned
                    .nodes
                    .values()
                    .map(|heard| Some(heard.demand))
                    .collect();
                let shares = division::divide(owned.limit, &wants);
                let index = owned.nodes.keys().position(|node| *node == sender)?;
                shares.get(index).copied()
            })
            .collect()
    }

    /// Forgets the nodes not heard for `forget_after`, and the buckets left without any.
    pub fn sweep(&self, now: Instant) {
        let forget_after = self.forget_after;
        self.lock().retain(|_, owned| {
            owned
                .nodes
                .retain(|_, heard| now.saturating_duration_since(heard.at) < forget_after);
            !owned.nodes.is_empty()
        });
    }

    /// The nodes reporting `bucket` with their demand (for tests and debugging).
    pub fn nodes(&self, bucket: QuotaBucket) -> Vec<(Arc<str>, u64)> {
        self.lock().get(&bucket).map_or_else(Vec::new, |owned| {
            owned
                .nodes
                .iter()
                .map(|(node, heard)| (Arc::clone(node), heard.demand))
                .collect()
        })
    }

    /// How many buckets this node divides as their owner.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether this node divides no bucket.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This owner as the peer service calls it (`Quota`), reading the clock per call.
    pub fn source(self: &Arc<Owner>) -> QuotaSource {
        let owner = Arc::clone(self);
        Arc::new(move |sender: &str, demands: &[QuotaDemand]| {
            owner.divide(sender, demands, Instant::now())
        })
    }
}

/// Every exchange interval ([`EXCHANGE_EVERY`] by default), sends this node's demand for every bucket to its owner and
/// hands the answered shares to the hub; ends once the hub is gone.
pub struct Exchanger {
    hub: Weak<Hub>,
    cluster: Arc<Runtime>,
    owner: Arc<Owner>,
    every: Duration,
}

impl Exchanger {
    /// The exchanger of `hub` in `cluster`, dividing the buckets this node owns with
    /// `owner` (not started). Makes `hub` count the cluster's members.
    pub fn new(
        hub: &Arc<Hub>,
        cluster: Arc<Runtime>,
        owner: Arc<Owner>,
        every: Duration,
    ) -> Exchanger {
        let members = Arc::clone(&cluster);
        hub.follow_members(Arc::new(move || members.member_count() as u64));
        Exchanger {
            hub: Arc::downgrade(hub),
            cluster,
            owner,
            every,
        }
    }

    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run())
    }

    pub async fn run(self) {
        let here = self.owner.source();
        let mut ticks = tokio::time::interval(self.every.max(Duration::from_millis(10)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(hub) = self.hub.upgrade() else {
                return;
            };
            self.owner.sweep(Instant::now());
            exchange(&hub, &self.cluster, &here).await;
        }
    }
}

/// One exchange: this node's demands out to their owners, the shares back into `hub`.
pub async fn exchange(hub: &Hub, cluster: &Runtime, here: &QuotaSource) {
    let demands = hub.node_demands();
    let shares = cluster.exchange_quota(&outgoing(&demands), here).await;
    take_shares(hub, demands, shares);
}

/// This node's demands as its buckets' owners are sent them, in the same order.
fn outgoing(demands: &[NodeDemand]) -> Vec<QuotaDemand> {
    demands
        .iter()
        .map(|demand| QuotaDemand {
            bucket: quota_bucket(&demand.domain, &demand.bucket),
            limit: demand.limit,
            demand: demand.demand,
        })
        .collect()
}

/// Hands `hub` the owners' answers to `demands` (one per demand, in order; `None`: none).
fn take_shares(hub: &Hub, demands: Vec<NodeDemand>, shares: Vec<Option<u64>>) {
    hub.set_node_shares(
        demands
            .into_iter()
            .zip(shares)
            .map(|(demand, share)| ((demand.domain, demand.bucket), share)),
    );
}

#[cfg(test)]
mod tests;
