//! RLQS quota across the cluster, as the peer protocol carries it (`Quota`): each node sends
//! the owner of a quota bucket (its place on the ring) the demand of its own Envoy streams
//! for that bucket, and the owner answers the node's share of the limit. Who divides and
//! how is not this module's business: the owner's division is installed by the server as a
//! [`QuotaSource`] (so the cluster knows nothing of Envoy); the node's side (what it
//! sends, what it does with the answer) is `envoy::rlqs::cluster`. This module is the
//! vocabulary and the bounds (it imports no sibling).
//!
//! Invariants: bounded: a report carries at most [`MAX_BUCKETS`] buckets, each limit fits
//! in `u32` and each demand is read as at most its limit, checked on the receiving side; a
//! share answered is at most the limit sent (checked on the sending side); every call has
//! the deadline [`DEADLINE`], and an owner that does not answer in time gives no share.

use std::sync::Arc;
use std::time::Duration;

/// Buckets per `Quota` call at most (a node with more sends several calls).
pub const MAX_BUCKETS: usize = 4096;
/// How long an owner's answer is waited for.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// A quota bucket as the cluster knows it: a hash of its domain and bucket id. `route`
/// places it on the ring; `route` and `id` together name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QuotaBucket {
    pub route: u64,
    pub id: u64,
}

/// One bucket's demand on one node, in requests per unit of the bucket's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaDemand {
    pub bucket: QuotaBucket,
    /// The limit as the node's limits say (requests per unit).
    pub limit: u64,
    /// What the node's streams want together, at most `limit`.
    pub demand: u64,
}

/// The owner's division: `(sender, demands)` -> the sender's share of each bucket, in
/// order (`None`: no share, the sender falls back to an equal part per member).
pub type QuotaSource = Arc<dyn Fn(&str, &[QuotaDemand]) -> Vec<Option<u64>> + Send + Sync>;

/// `demand` as a receiver takes it from the wire: `None` when `limit` does not fit a
/// limit's `requests_per_unit` (`u32`), the demand capped at the limit otherwise.
pub fn bounded(bucket: QuotaBucket, limit: u64, demand: u64) -> Option<QuotaDemand> {
    (limit <= u64::from(u32::MAX)).then_some(QuotaDemand {
        bucket,
        limit,
        demand: demand.min(limit),
    })
}
