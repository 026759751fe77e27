//! The check vocabulary every layer below the limiter speaks: what to decide ([`Check`]: the
//! counters of one request descriptor, a cost, an optional wait), what came out
//! ([`Decision`], re-exported from [`crate::algorithm`]), and a counter's stored state ([`Slot`],
//! what handoff moves between nodes).
//!
//! The limiter builds checks, a store (ratekeeper's `store::Store`) decides them: the in-memory
//! engine (alone or clustered) or another store. Nothing here knows a transport or a store.
//!
//! Invariants:
//! - All counters of one [`Check`] share one route hash (they come from one descriptor), so
//!   they live together and are decided together: all admit and consume, or none consumes.
//! - A store answers one [`Decision`] per counter, in the order of the checks and of their
//!   counters.
//! - A check's [`Charge`] travels with it to wherever it is decided (a peer, Redis's
//!   script), so every store counts rejected hits and refunds alike.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::{self, Rate, State};
pub use crate::algorithm::{Charge, Decision};
use crate::key::KeyId;

/// The most hits one check may cost: a limit counts at most `u32::MAX`, so a larger cost
/// could never be admitted (and every store holds this one exactly, Redis's doubles too).
/// Front ends refuse more (ratekeeper's `limiter::bounds::MAX_HITS`); a store answers any cost
/// and sends a larger one elsewhere as [`bounded_cost`].
pub const MAX_COST: u64 = u32::MAX as u64;

/// A cost as a store sends it elsewhere (to Redis's script, to a peer): the check's own, or
/// 2^32 (`MAX_COST + 1`) for any larger one. No limit admits more than `u32::MAX` hits, so
/// both are denied alike and consume nothing; 2^32 is exact in a double where 2^64 - 1
/// would be rounded, and a peer refuses nothing larger.
pub fn bounded_cost(cost: u64) -> u64 {
    cost.min(MAX_COST + 1)
}

/// One limit of a descriptor: the counter's key and its rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// What a store may ask of the configured rules (the limits in force), by a key's rule tag
/// ([`KeyId::rule`]): the in-memory store keeps each rule's live keys within a budget
/// (see `store::memory::shard`).
pub trait Rules: Send + Sync {
    /// The rule's own `max_keys`, if it set one.
    fn max_keys(&self, rule: u32) -> Option<u32>;
    /// How logs and metrics name the rule (`edge > remote_address`), if it is configured.
    fn name(&self, rule: u32) -> Option<Arc<str>>;
}

/// One rule's keys in a store (on one shard, or summed over a node's shards).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleKeys {
    pub live: u64,
    /// Requests refused because they needed a new key of the rule while it held its budget.
    pub refused: u64,
    /// The budget: the most live keys the rule may hold.
    pub budget: u64,
}

/// Summing one rule's keys over shards.
impl std::ops::AddAssign for RuleKeys {
    fn add_assign(&mut self, other: RuleKeys) {
        self.live += other.live;
        self.refused += other.refused;
        self.budget += other.budget;
    }
}

/// The limits of one request descriptor, decided together.
#[derive(Clone, Debug)]
pub struct Check {
    /// All with the same `key.route`.
    pub counters: Counters,
    /// Hits to consume (or give back, as `charge` says); 0 checks without consuming.
    pub cost: u64,
    /// Never set with a `charge` other than [`Charge::Admitted`]: only a request that
    /// consumes nothing when rejected can wait for room.
    pub wait: Option<WaitPolicy>,
    /// What deciding the check does to its counters: take admitted hits (the default),
    /// count rejected ones too, or give the cost back.
    pub charge: Charge,
}

impl Check {
    /// The route hash of the check's counters (they all share it); 0 for an empty check.
    pub fn route(&self) -> u64 {
        self.counters.first().map_or(0, |counter| counter.key.route)
    }

    /// Whether deciding the check changed its counters' states, given whether it was
    /// `admitted`: what a store writes back. An admitted check with a cost, a rejected one
    /// that counts rejected hits ([`Charge::Always`]), and a refund with a cost.
    pub fn writes(&self, admitted: bool) -> bool {
        self.cost > 0 && (admitted || self.charge == Charge::Always)
    }

    /// Whether the check, admitted, took hits: what to give back if its request fails
    /// elsewhere (a refund took none; a rejected check that counted is not given back: it
    /// was rejected either way).
    pub fn takes(&self) -> bool {
        self.cost > 0 && self.charge != Charge::Refund
    }
}

impl Check {
    /// Decides this check on its counters' states as of `now` (`states[i]` is
    /// `counters[i]`'s; a key seen for the first time is [`algorithm::init`]'s). It is the one
    /// way every store decides a check, so their answers agree. Pushes one decision per
    /// counter onto `out`.
    ///
    /// When every counter admits, `states` become the consumed states and it returns `None`.
    /// Otherwise it returns the denying counter with the longest wait (a wait of "never" is
    /// the longest) and that wait; with [`Charge::Admitted`] nothing is consumed (`states`
    /// stay) and the decisions report each counter as it stands without this request.
    ///
    /// [`Charge::Always`] and [`Charge::Refund`] charge every counter on its own
    /// ([`algorithm::apply`]), admitted or not, as the reference service increments each
    /// limit's key: `states` always become the charged states, and each decision reports
    /// its counter after the charge ([`Check::writes`] says when to store them).
    pub fn decide(
        &self,
        states: &mut [State],
        now: u64,
        out: &mut Decisions,
    ) -> Option<(usize, Option<u64>)> {
        if self.charge != Charge::Admitted {
            let mut denied = None;
            for (index, (counter, state)) in self.counters.iter().zip(states.iter_mut()).enumerate()
            {
                let decision = algorithm::apply(&counter.rate, state, now, self.cost, self.charge);
                if !decision.allowed {
                    denied = longest(denied, index, decision.retry_after);
                }
                out.push(decision);
            }
            return denied;
        }
        let start = out.len();
        let mut denied: Option<(usize, Option<u64>)> = None;
        let mut consumed: States = SmallVec::with_capacity(states.len());
        for (index, (counter, state)) in self.counters.iter().zip(states.iter()).enumerate() {
            let mut state = *state;
            let decision = algorithm::decide(&counter.rate, &mut state, now, self.cost);
            consumed.push(state);
            if !decision.allowed {
                denied = longest(denied, index, decision.retry_after);
            }
            out.push(decision);
        }
        let Some((index, retry_after)) = denied else {
            for (state, consumed) in states.iter_mut().zip(consumed) {
                *state = consumed;
            }
            return None;
        };
        out.truncate(start);
        for (counter, state) in self.counters.iter().zip(states.iter()) {
            out.push(peek(&counter.rate, *state, now, self.cost));
        }
        if let Some(decision) = out.get_mut(start + index) {
            decision.allowed = false;
            decision.retry_after = retry_after;
        }
        denied
    }
}

/// The denying counter with the longest wait so far, `denied`, against counter `index`
/// denying with `retry`: a wait of "never" (`None`) is the longest; the first wins ties.
fn longest(
    denied: Option<(usize, Option<u64>)>,
    index: usize,
    retry: Option<u64>,
) -> Option<(usize, Option<u64>)> {
    match (denied, retry) {
        (None, retry) => Some((index, retry)),
        (Some((_, Some(old))), Some(new)) if new > old => Some((index, Some(new))),
        (Some((_, Some(_))), None) => Some((index, None)),
        (kept, _) => kept,
    }
}

/// A counter as it stands at `now`, without consuming: admitted when `cost` would fit, and
/// when it would not, how long until it would (`retry_after`; `None`: never).
pub fn peek(rate: &Rate, mut state: State, now: u64, cost: u64) -> Decision {
    let mut decision = algorithm::decide(rate, &mut state, now, 0);
    // With cost 0 nothing is ever denied, unless the limit denies everything.
    decision.allowed = decision.allowed && cost <= u64::from(decision.remaining);
    if !decision.allowed {
        // Decided on a copy: the wait for this cost, nothing consumed.
        decision.retry_after = algorithm::decide(rate, &mut state, now, cost).retry_after;
    }
    decision
}

/// The states of one check's counters, in order.
pub type States = SmallVec<[State; 4]>;

/// What a store can do beyond counting, and the limits it can count exactly. Limits files
/// are validated against the selected store's capabilities, so a limit the store cannot
/// honour is refused at load, naming the file and the place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// How config errors name the store (`--store redis`).
    pub name: &'static str,
    /// It can hold a check back in a FIFO queue until capacity frees up (`max_wait`).
    pub wait: bool,
    /// The most `requests_per_unit` a `sliding_window` limit may have (`None`: any).
    pub max_sliding_per_unit: Option<u32>,
    /// The longest a `token_bucket` or `gcra` limit may take to refill from empty
    /// (`unit / requests_per_unit * burst`; `None`: any).
    pub max_refill: Option<Duration>,
}

impl Default for Capabilities {
    fn default() -> Capabilities {
        Capabilities::MEMORY
    }
}

impl Capabilities {
    /// The in-memory engine, alone or clustered: everything.
    pub const MEMORY: Capabilities = Capabilities {
        name: "--store memory",
        wait: true,
        max_sliding_per_unit: None,
        max_refill: None,
    };
}

/// The checks of one request, in request order.
pub type Checks = SmallVec<[Check; 4]>;

/// One decision per counter of a request, in order.
pub type Decisions = SmallVec<[Decision; 4]>;

/// A key's state plus when it may be forgotten (an [`expiry`] tick). 16 bytes. Its meaning
/// depends on the algorithm; only [`algorithm`] reads `a` and `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub a: u64,
    pub b: u32,
    pub expires: u32,
}

/// [`Slot::expires`]: quarter seconds since 2020-01-01 UTC, in a `u32` (enough until 2054),
/// so a key's expiry costs 4 bytes and is still close to the moment its state stops
/// mattering. The cluster wire carries Unix seconds (rounded up: a key is kept longer,
/// never shorter).
pub mod expiry {
    use crate::algorithm::NANOS_PER_SEC;

    const EPOCH_SECS: u64 = 1_577_836_800;
    pub const TICKS_PER_SEC: u64 = 4;
    const NANOS_PER_TICK: u64 = NANOS_PER_SEC / TICKS_PER_SEC;

    /// The tick `unix_nanos` falls in.
    pub fn tick(unix_nanos: u64) -> u32 {
        let since = unix_nanos.saturating_sub(EPOCH_SECS * NANOS_PER_SEC);
        u32::try_from(since / NANOS_PER_TICK).unwrap_or(u32::MAX)
    }

    /// The first tick at or after `unix_nanos`.
    pub fn tick_at_or_after(unix_nanos: u64) -> u32 {
        tick(unix_nanos.saturating_add(NANOS_PER_TICK - 1))
    }

    /// A tick as Unix seconds, rounded up (for the wire).
    pub fn to_unix_secs(tick: u32) -> u32 {
        let secs = (u64::from(tick)).div_ceil(TICKS_PER_SEC) + EPOCH_SECS;
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    /// Unix seconds (from the wire) as a tick.
    pub fn from_unix_secs(secs: u32) -> u32 {
        let since = u64::from(secs).saturating_sub(EPOCH_SECS);
        u32::try_from(since * TICKS_PER_SEC).unwrap_or(u32::MAX)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn ticks_are_quarter_seconds_and_the_wire_rounds_up() {
            let midnight = 1_704_326_400 * NANOS_PER_SEC;
            let at = tick(midnight);
            assert_eq!(tick(midnight + NANOS_PER_TICK - 1), at);
            assert_eq!(tick(midnight + NANOS_PER_TICK), at + 1);
            assert_eq!(tick_at_or_after(midnight), at);
            assert_eq!(tick_at_or_after(midnight + 1), at + 1);
            assert_eq!(to_unix_secs(at), 1_704_326_400);
            assert_eq!(
                to_unix_secs(at + 1),
                1_704_326_401,
                "kept longer, never shorter"
            );
            assert_eq!(from_unix_secs(to_unix_secs(at)), at);
            // Before the epoch, and past what fits.
            assert_eq!(tick(0), 0);
            assert_eq!(tick(u64::MAX), u32::MAX);
            assert_eq!(from_unix_secs(0), 0);
            assert_eq!(to_unix_secs(u32::MAX), 1_577_836_800 + (1 << 30));
        }
    }
}

/// Which routes a store keeps when exporting (cluster handoff).
pub type KeepRoute = Arc<dyn Fn(u64) -> bool + Send + Sync>;
