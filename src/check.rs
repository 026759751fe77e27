//! The check vocabulary every layer below the limiter speaks: what to decide ([`Check`]: the
//! counters of one request descriptor, a cost, an optional wait), what came out
//! ([`Decision`], re-exported from [`crate::algorithm`]), and a counter's stored state ([`Slot`],
//! what handoff moves between nodes).
//!
//! The limiter builds checks, a [`Store`](crate::store::Store) decides them: the in-memory
//! engine (alone or clustered) or another store. Nothing here knows a transport or a store.
//!
//! Invariants:
//! - All counters of one [`Check`] share one route hash (they come from one descriptor), so
//!   they live together and are decided together: all admit and consume, or none consumes.
//! - A store answers one [`Decision`] per counter, in the order of the checks and of their
//!   counters.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

pub use crate::algorithm::Decision;
use crate::algorithm::Rate;
use crate::key::KeyId;

/// One limit of a descriptor: the counter's key and its rate.
#[derive(Clone, Copy, Debug)]
pub struct Counter {
    pub key: KeyId,
    pub rate: Rate,
}

/// The counters of one check; almost always one or two, kept inline.
pub type Counters = SmallVec<[Counter; 2]>;

/// Opt-in waiting: a check that would be over its limit may wait up to `max_wait` in the
/// key's FIFO queue for capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPolicy {
    pub max_wait: Duration,
    pub max_queue: u32,
}

/// The limits of one request descriptor, decided together.
#[derive(Clone, Debug)]
pub struct Check {
    /// All with the same `key.route`.
    pub counters: Counters,
    /// Hits to consume; 0 checks without consuming.
    pub cost: u64,
    pub wait: Option<WaitPolicy>,
}

impl Check {
    /// The route hash of the check's counters (they all share it); 0 for an empty check.
    pub fn route(&self) -> u64 {
        self.counters.first().map_or(0, |counter| counter.key.route)
    }
}

/// The checks of one request, in request order.
pub type Checks = SmallVec<[Check; 4]>;

/// One decision per counter of a request, in order.
pub type Decisions = SmallVec<[Decision; 4]>;

/// A key's state plus when it may be forgotten (Unix seconds). 16 bytes. Its meaning
/// depends on the algorithm; only [`algorithm`](crate::algorithm) reads `a` and `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub a: u64,
    pub b: u32,
    pub expires: u32,
}

/// Which routes a store keeps when exporting (cluster handoff).
pub type KeepRoute = Arc<dyn Fn(u64) -> bool + Send + Sync>;
