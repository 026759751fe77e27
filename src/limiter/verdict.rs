//! What the limiter answers: a [`Verdict`], one [`Status`] per descriptor, plus what quota
//! mode and dynamic metadata need. Plain data: each front end renders it its own way.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::Unit;
use crate::limits::Metadata;

/// The limit a descriptor was decided by, and where its counter stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    /// The limit's `name`, if it has one.
    pub name: Option<Arc<str>>,
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// Hits still admissible right now; 0 when over the limit (like the reference service,
    /// even if a smaller request would still fit).
    pub remaining: u32,
    /// Until the limit has fully recovered (the window ends, the bucket is full).
    pub reset_after: Duration,
    /// Over the limit (and not in shadow mode): the request must not pass.
    pub over: bool,
    /// The limit is in shadow mode: counted and reported, never enforced.
    pub shadow: bool,
    /// When over: how long until the same request would pass (`None`: never can).
    pub retry_after: Option<Duration>,
}

/// What was decided for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// No limit applies (unknown domain, no match, allow-list entry, replaced limits).
    NoLimit,
    /// An `unlimited` limit matched.
    Unlimited,
    /// Decided by a limit: with several on the descriptor, the one closest to exhaustion.
    Limited(Limited),
}

impl Status {
    pub fn is_over(&self) -> bool {
        matches!(self, Status::Limited(limited) if limited.over)
    }

    pub fn limited(&self) -> Option<&Limited> {
        match self {
            Status::Limited(limited) => Some(limited),
            _ => None,
        }
    }
}

/// The answer to a query: one status per descriptor, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub statuses: SmallVec<[Status; 4]>,
    /// Whether any limit checked for this query was in quota mode.
    pub quota_mode: bool,
    /// The descriptors (by index) whose quota-mode limits were exceeded. They pass (their
    /// status is not over) unless every quota-mode descriptor of the query was exceeded.
    pub quota_violations: SmallVec<[usize; 2]>,
    /// Per descriptor, the `metadata` of the configured entry it matched, when its limits
    /// were not exceeded (for front ends that hand it back, like Envoy's dynamic metadata).
    pub metadata: SmallVec<[Option<Arc<Metadata>>; 4]>,
}

impl Verdict {
    /// Whether any descriptor is over its limit: the request must not pass.
    pub fn is_over(&self) -> bool {
        self.statuses.iter().any(Status::is_over)
    }

    /// How long until the whole request would pass: the longest wait of its descriptors
    /// that are over and can pass at all (`None` when none is over, or none can pass).
    pub fn retry_after(&self) -> Option<Duration> {
        self.statuses
            .iter()
            .filter_map(Status::limited)
            .filter(|limited| limited.over)
            .filter_map(|limited| limited.retry_after)
            .max()
    }
}
