//! RLQS quotas, protocol-neutral: how a limit is divided among the clients that enforce it
//! themselves (Envoy's `rate_limit_quota` filter; [`crate::envoy::rlqs`] is the adapter
//! that speaks its protocol). "Quota" in this code means this, and only this.
//!
//! - [`rule`] (pure): a bucket id read as a descriptor and looked up in the compiled
//!   limits: allow all, deny all, a limit to divide, or shadow.
//! - [`division`] (pure): the max-min fair division of a limit among reporters from their
//!   demand, and the token bucket for a share.
//! - [`hub`]: the node's state under one short lock: streams and, per bucket, its
//!   reporters' demand and share; in cluster mode the node's share from the bucket's owner.
//! - [`cluster`]: the division across nodes: the `Owner` of a bucket divides it among the
//!   nodes reporting it, and the `Exchanger` sends this node's demand to the owners.
//! - [`stats`]: the `ratekeeper_rlqs_*` metric families.
//!
//! Plain types only: nothing here knows a protobuf.

pub mod cluster;
mod division;
#[cfg(test)]
mod envoy_model;
mod hub;
mod rule;
mod stats;

use std::time::Duration;

pub use self::division::{FLOOR_DIVISOR, TokenBucket, divide, keeps};
pub use self::hub::{
    Action, BucketView, Hub, HubError, HubOptions, Members, NodeDemand, ReporterView, Sink,
    Strategy, StreamId, Usage, node_limit,
};
pub use self::rule::{BucketKey, Rule, bucket_key, resolve};
pub use self::stats::{DomainLabel, RefusedLabel, RlqsStats, UNKNOWN_DOMAIN};

/// Envoy 1.40 reports every bucket this often (fixed; `reporting_interval` is not read):
/// the clock of the division (staleness, the exchange across the cluster).
pub const ENVOY_REPORT_INTERVAL: Duration = Duration::from_secs(5);
