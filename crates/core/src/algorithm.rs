//! Rate-limit algorithms as pure functions over `(rate, state, now, cost) -> decision`.
//!
//! Nothing here reads a clock or does IO: `now` is nanoseconds since the Unix epoch, passed
//! in by the engine (read under the shard's lock). Windows are aligned to the epoch, as the
//! reference service does (so a `week` starts on a Thursday, a `month` is 30 days and a `year` 365 days).
//!
//! Invariants:
//! - A denied request consumes nothing (a rejected call never eats quota that a later,
//!   smaller call could have used), unless it is charged [`Charge::Always`] (the reference
//!   service's way): then it takes what is left, up to its cost, and never more: a limit
//!   ends exhausted at worst, never in debt.
//! - A refund ([`Charge::Refund`]) is always answered allowed and never leaves a counter
//!   below zero used or above its capacity.
//! - `requests_per_unit == 0` denies everything.
//! - The per-key [`State`] is 12 bytes; its meaning depends on the algorithm, which is part
//!   of the key's identity, so one key's state is always read by the algorithm that wrote it.

use std::fmt;

pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The `unit` of a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    pub const fn nanos(self) -> u64 {
        self.seconds() * NANOS_PER_SEC
    }

    /// Parses a unit name in any case (`second`, `SECOND`, `Second`).
    pub fn parse(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.as_str().eq_ignore_ascii_case(name))
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The value of Envoy's `RateLimitResponse.RateLimit.Unit` enum.
    pub const fn to_proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit for a value of Envoy's `Unit` enum; `None` for `UNKNOWN` and unknown values.
    pub const fn from_proto(value: i32) -> Option<Unit> {
        match value {
            1 => Some(Unit::Second),
            2 => Some(Unit::Minute),
            3 => Some(Unit::Hour),
            4 => Some(Unit::Day),
            5 => Some(Unit::Month),
            6 => Some(Unit::Year),
            7 => Some(Unit::Week),
            _ => None,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a limit counts. See docs/algorithms.md for what each parameter means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// At most `requests_per_unit` hits per epoch-aligned window of one `unit`.
    #[default]
    FixedWindow,
    /// Like a fixed window, but the previous window's count is weighted by how much of it
    /// still overlaps the sliding window ending now (the two-window approximation).
    SlidingWindow,
    /// A bucket of `burst` tokens (default `requests_per_unit`), refilled continuously at
    /// `requests_per_unit` per `unit`; a hit takes one token.
    TokenBucket,
    /// Generic cell rate algorithm: one hit every `unit / requests_per_unit`, with up to
    /// `burst` (default 1) hits at once. One timestamp of state.
    Gcra,
}

impl Algorithm {
    pub const ALL: [Algorithm; 4] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ];

    /// The algorithm's code, the one number every representation uses: the counter slot
    /// hashed into key ids (`key`), the peer wire (`peer.proto`'s `Algorithm`, whose values
    /// are these), and the Redis script (`redis.lua`, which refuses a code it does not
    /// know). Never renumber: keys, peers and scripts of another version read it.
    pub const fn code(self) -> u8 {
        match self {
            Algorithm::FixedWindow => 0,
            Algorithm::SlidingWindow => 1,
            Algorithm::TokenBucket => 2,
            Algorithm::Gcra => 3,
        }
    }

    /// The algorithm of `code` ([`Algorithm::code`]), if there is one.
    pub fn from_code(code: i64) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| i64::from(algorithm.code()) == code)
    }

    pub fn parse(name: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.as_str().eq_ignore_ascii_case(name))
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Whether `burst` means something for this algorithm.
    pub const fn uses_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limit's counting rule: everything an algorithm needs besides state, time and cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    pub algorithm: Algorithm,
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// Bucket size for `token_bucket` and `gcra`; equal to `requests_per_unit` for windows.
    pub burst: u32,
}

impl Rate {
    /// A rate with the algorithm's default burst when `burst` is `None`.
    pub fn new(
        algorithm: Algorithm,
        requests_per_unit: u32,
        unit: Unit,
        burst: Option<u32>,
    ) -> Rate {
        let burst = match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => requests_per_unit,
            Algorithm::TokenBucket => burst.unwrap_or(requests_per_unit),
            Algorithm::Gcra => burst.unwrap_or(1),
        };
        Rate {
            algorithm,
            requests_per_unit,
            unit,
            burst,
        }
    }

    /// A fixed window limit, the reference service's only kind.
    pub fn fixed(requests_per_unit: u32, unit: Unit) -> Rate {
        Rate::new(Algorithm::FixedWindow, requests_per_unit, unit, None)
    }

    /// One of `members` nodes' share of this rate: `requests_per_unit / members` and the
    /// burst likewise, rounded down, so `members` nodes deciding apart admit together no
    /// more than the rate. (A bucket that refills at all keeps a burst of at least one, so a
    /// burst smaller than `members` can be exceeded at one instant, never over time.)
    pub fn share(&self, members: usize) -> Rate {
        let members = u32::try_from(members.max(1)).unwrap_or(u32::MAX);
        let requests_per_unit = self.requests_per_unit / members;
        let burst = match self.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => requests_per_unit,
            Algorithm::TokenBucket | Algorithm::Gcra if requests_per_unit == 0 => 0,
            Algorithm::TokenBucket | Algorithm::Gcra => (self.burst / members).max(1),
        };
        Rate {
            requests_per_unit,
            burst,
            ..*self
        }
    }

    /// The most hits one request can ever be admitted with (a larger cost never passes).
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => u64::from(self.requests_per_unit),
            Algorithm::TokenBucket | Algorithm::Gcra => {
                if self.requests_per_unit == 0 {
                    0
                } else {
                    u64::from(self.burst)
                }
            }
        }
    }

    /// How long an emptied bucket takes to refill (`token_bucket`, `gcra`); zero for windows.
    pub fn refill_time(&self) -> std::time::Duration {
        match self.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => std::time::Duration::ZERO,
            Algorithm::TokenBucket | Algorithm::Gcra => std::time::Duration::from_nanos(
                self.emission_interval()
                    .saturating_mul(u64::from(self.burst)),
            ),
        }
    }

    /// Nanoseconds per token for the bucket algorithms (at least 1).
    pub fn emission_interval(&self) -> u64 {
        (self.unit.nanos() / u64::from(self.requests_per_unit.max(1))).max(1)
    }
}

/// Per-key state. Its meaning depends on the algorithm:
/// - fixed window: `a` = window index, `b` = hits in that window;
/// - sliding window: `a` = (window index mod 2^32) << 32 | previous window's hits,
///   `b` = hits in the current window;
/// - token bucket: `a` = time of the last refill (ns), `b` = whole tokens left;
/// - gcra: `a` = theoretical arrival time (ns), `b` unused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct State {
    pub a: u64,
    pub b: u32,
}

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Hits that could still be admitted right now after this decision.
    pub remaining: u32,
    /// Nanoseconds until the limit has fully recovered (the window ends, the bucket is full).
    pub reset_after: u64,
    /// When denied: nanoseconds until this same cost would be admitted, or `None` if it
    /// never can (the cost exceeds the limit's capacity). `Some(0)` when allowed.
    pub retry_after: Option<u64>,
}

impl State {
    /// The state of a counter kept as plain numbers (the Redis store: `redis.lua` writes the
    /// time of the last write, `time` in Unix nanoseconds, and up to three whole numbers),
    /// as this module keeps it. Per algorithm, the numbers are:
    /// - fixed window: `[used]` (the window is the one `time` falls in);
    /// - sliding window: `[previous window's count, current window's count]`;
    /// - token bucket: `[tokens, refill time: seconds, nanoseconds]`;
    /// - GCRA: `[theoretical arrival time: seconds, nanoseconds]`.
    ///
    /// A count beyond `u32` saturates (the script never writes one).
    pub fn from_numbers(rate: &Rate, time: u64, numbers: [u64; 3]) -> State {
        let [x, y, z] = numbers;
        let small = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        let nanos =
            |seconds: u64, nanos: u64| seconds.saturating_mul(NANOS_PER_SEC).saturating_add(nanos);
        let window = time / rate.unit.nanos();
        match rate.algorithm {
            Algorithm::FixedWindow => State {
                a: window,
                b: small(x),
            },
            Algorithm::SlidingWindow => State::sliding(window, small(x), small(y)),
            Algorithm::TokenBucket => State {
                a: nanos(y, z),
                b: small(x),
            },
            Algorithm::Gcra => State {
                a: nanos(x, y),
                b: 0,
            },
        }
    }

    /// A sliding window's state: `current` hits in window `window` (the index of the unit
    /// since the epoch), after `previous` hits in the window before.
    pub fn sliding(window: u64, previous: u32, current: u32) -> State {
        State {
            a: sliding_pack(window, previous),
            b: current,
        }
    }
}

/// What deciding a check does to a counter.
///
/// - [`Charge::Admitted`] (the default): admitted hits are counted, a rejected request
///   consumes nothing.
/// - [`Charge::Always`] (`--count-rejected-hits`; the reference service's default,
///   `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false`): a rejected request is counted too. It
///   takes what is left of the limit, up to its cost, so the limit ends exhausted: a fixed
///   window's count reaches the limit (the reference's Redis `INCRBY` goes past it, which
///   answers every later hit of the window alike), a sliding window's current count fills
///   up, a token bucket empties, GCRA's arrival time moves to `now + burst` intervals. No
///   limit goes into debt: it recovers as after an admitted request that used it up (the
///   window ends, the bucket refills).
/// - [`Charge::Refund`] (Envoy's `is_negative_hits`): the cost is given back instead of
///   taken; see [`give_back`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Charge {
    #[default]
    Admitted,
    Always,
    Refund,
}

impl Charge {
    pub const fn as_str(self) -> &'static str {
        match self {
            Charge::Admitted => "admitted",
            Charge::Always => "always",
            Charge::Refund => "refund",
        }
    }
}

/// [`decide`] as `charge` says: a plain decision ([`Charge::Admitted`]), one that counts a
/// rejected request too ([`Charge::Always`]: it takes what is left, up to its cost, and is
/// answered as the limit then stands, denied), or a refund ([`give_back`]).
pub fn apply(rate: &Rate, state: &mut State, now: u64, cost: u64, charge: Charge) -> Decision {
    match charge {
        Charge::Admitted => decide(rate, state, now, cost),
        Charge::Always => {
            let decision = decide(rate, state, now, cost);
            if decision.allowed || rate.requests_per_unit == 0 {
                return decision;
            }
            // Denied: `cost` is more than what remains, which is taken (and is admitted).
            let left = u64::from(decision.remaining);
            if left > 0 {
                decide(rate, state, now, left);
            }
            // Reported as the limit stands now, for this cost (on a copy: denied again).
            let mut after = *state;
            decide(rate, &mut after, now, cost)
        }
        Charge::Refund => give_back(rate, state, now, cost),
    }
}

/// Gives back `cost` hits at `now` (a refund: Envoy's `is_negative_hits`), answered allowed
/// with what remains after it. The counter as it stands now takes them back, never below
/// zero used nor above capacity: a window's current count (hits counted in a window that
/// has ended are gone anyway, and a refund cannot name its window), a token bucket's tokens
/// up to its burst, GCRA's arrival time back to `now` at most (a fraction of an interval
/// included, as a partly refilled bucket keeps its fraction). A limit that denies
/// everything has nothing to give back.
pub fn give_back(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
    if rate.requests_per_unit == 0 {
        return Decision {
            allowed: true,
            remaining: 0,
            reset_after: until_window_end(rate.unit, now),
            retry_after: Some(0),
        };
    }
    // Bring the state to `now` (window rotation, refill) without consuming.
    decide(rate, state, now, 0);
    match rate.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            state.b -= clamp_u32(cost.min(u64::from(state.b)));
        }
        Algorithm::TokenBucket => {
            let burst = u64::from(rate.burst);
            let tokens = u64::from(state.b).min(burst);
            state.b = clamp_u32(tokens.saturating_add(cost).min(burst));
        }
        Algorithm::Gcra => {
            let tat = state.a.max(now);
            let back = cost.saturating_mul(rate.emission_interval()).min(tat - now);
            state.a = tat - back;
        }
    }
    let mut decision = decide(rate, state, now, 0);
    decision.allowed = true;
    decision.retry_after = Some(0);
    decision
}

/// The state of a key seen for the first time at `now`.
pub fn init(rate: &Rate, now: u64) -> State {
    match rate.algorithm {
        Algorithm::FixedWindow => State {
            a: now / rate.unit.nanos(),
            b: 0,
        },
        Algorithm::SlidingWindow => State {
            a: sliding_pack(now / rate.unit.nanos(), 0),
            b: 0,
        },
        Algorithm::TokenBucket => State {
            a: now,
            b: rate.burst,
        },
        Algorithm::Gcra => State { a: now, b: 0 },
    }
}

/// Checks `cost` hits against the limit and, when allowed and `cost > 0`, consumes them.
/// Any `u64` cost is answered exactly: one above [`Rate::capacity`] is denied, consumes
/// nothing and has no `retry_after` (it never passes).
pub fn decide(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
    if rate.requests_per_unit == 0 {
        let reset_after = until_window_end(rate.unit, now);
        return Decision {
            allowed: false,
            remaining: 0,
            reset_after,
            retry_after: None,
        };
    }
    if cost > rate.capacity() {
        // Never admitted, whatever the state: answered from the state as it stands (a
        // cost of 0 consumes nothing). Past this point `cost <= u32::MAX`, so no sum or
        // product of counts below can leave its type.
        let now_state = step(rate, state, now, 0);
        return Decision {
            allowed: false,
            retry_after: None,
            ..now_state
        };
    }
    step(rate, state, now, cost)
}

/// [`decide`] for a cost within the limit's capacity.
fn step(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
    match rate.algorithm {
        Algorithm::FixedWindow => fixed_window(rate, state, now, cost),
        Algorithm::SlidingWindow => sliding_window(rate, state, now, cost),
        Algorithm::TokenBucket => token_bucket(rate, state, now, cost),
        Algorithm::Gcra => gcra(rate, state, now, cost),
    }
}

/// Hits lent to another node (cluster leases): taken from a counter at once, spent by the
/// borrower on its own, and given back ([`refund`]) if unspent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lent {
    pub units: u64,
    /// The window the units were taken from (windows only: a refund applies only to it).
    pub window: u64,
    /// The owner's remaining hits after lending.
    pub remaining: u32,
    /// Nanoseconds until the limit has fully recovered, after lending.
    pub reset_after: u64,
    /// Nanoseconds the units may be spent: until the window ends for windows (hits counted
    /// in one window must not be admitted in the next), unbounded for buckets.
    pub valid_for: u64,
}

/// How much a counter lends ([`lend`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LendPolicy {
    /// The most hits one loan takes.
    pub most: u64,
    /// A loan takes at most `1 / share` of what remains.
    pub share: u64,
    /// Smaller loans are not made (they would save few forwards).
    pub least: u64,
}

/// Takes hits from a counter at `now` as `policy` allows; `None` when nothing is lent.
pub fn lend(rate: &Rate, state: &mut State, now: u64, policy: LendPolicy) -> Option<Lent> {
    if rate.requests_per_unit == 0 {
        return None;
    }
    let probe = decide(rate, state, now, 0);
    let units = (u64::from(probe.remaining) / policy.share.max(1)).min(policy.most);
    if units == 0 || units < policy.least {
        return None;
    }
    let taken = decide(rate, state, now, units);
    if !taken.allowed {
        return None;
    }
    let (window, valid_for) = match window_of(rate, state) {
        Some(window) => (window, until_window_end(rate.unit, now)),
        None => (0, u64::MAX),
    };
    Some(Lent {
        units,
        window,
        remaining: taken.remaining,
        reset_after: taken.reset_after,
        valid_for,
    })
}

/// The window `now` falls in, named as [`Lent::window`] names it (0 for buckets, which
/// have none): what [`refund`] needs to give back hits taken at `now`.
pub fn window_at(rate: &Rate, now: u64) -> u64 {
    window_of(rate, &init(rate, now)).unwrap_or(0)
}

/// The window a windowed counter's state is in (the one lent hits are counted in); `None`
/// for buckets, which have no windows.
fn window_of(rate: &Rate, state: &State) -> Option<u64> {
    match rate.algorithm {
        Algorithm::FixedWindow => Some(state.a),
        Algorithm::SlidingWindow => Some(state.a >> 32),
        Algorithm::TokenBucket | Algorithm::Gcra => None,
    }
}

/// Gives back `units` lent from `window` ([`lend`]); answers how many were given back. The
/// counter ends as if the units had never been taken: a window takes them back while it
/// lasts (after, its count is gone anyway); a bucket at any time, never above its burst
/// (what it refilled meanwhile it would have refilled anyway).
pub fn refund(rate: &Rate, state: &mut State, now: u64, units: u64, window: u64) -> u64 {
    if rate.requests_per_unit == 0 {
        return 0;
    }
    decide(rate, state, now, 0);
    match rate.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            if window_of(rate, state) != Some(window) {
                return 0;
            }
            let back = units.min(u64::from(state.b));
            state.b -= clamp_u32(back);
            back
        }
        Algorithm::TokenBucket => {
            let burst = u64::from(rate.burst);
            let tokens = u64::from(state.b).min(burst);
            let back = units.min(burst - tokens);
            state.b = clamp_u32(tokens + back);
            back
        }
        Algorithm::Gcra => {
            let interval = rate.emission_interval();
            let tat = state.a.max(now);
            let back = units.min((tat - now) / interval);
            state.a = tat - back * interval;
            back
        }
    }
}

/// How long (nanoseconds) the state a decision left can still change an answer, given the
/// decision's `reset_after` (or a loan's, [`Lent::reset_after`]): after it, a
/// fresh state ([`init`]) answers every cost exactly as this one would, so the key may be
/// forgotten. A fixed window's count matters until its window ends; a sliding window's
/// until the end of the following one (where it weighs in as the previous count); a token
/// bucket's and GCRA's until the bucket would be full again. The Redis script gives its
/// keys the same lifetimes (plus its TTL margin).
pub fn lifetime(rate: &Rate, reset_after: u64) -> u64 {
    match rate.algorithm {
        Algorithm::SlidingWindow => reset_after.saturating_add(rate.unit.nanos()),
        Algorithm::FixedWindow | Algorithm::TokenBucket | Algorithm::Gcra => reset_after,
    }
}

/// Combines two states of one key that counted different hits (a counter handed over by
/// another node and this node's own): the result has consumed what both consumed, as of
/// `now`. Merging with a fresh [`init`] state changes nothing.
pub fn merge(rate: &Rate, ours: State, theirs: State, now: u64) -> State {
    if rate.requests_per_unit == 0 {
        return ours;
    }
    // Bring both to `now` (window rotation, refill) without consuming.
    let (mut a, mut b) = (ours, theirs);
    decide(rate, &mut a, now, 0);
    decide(rate, &mut b, now, 0);
    match rate.algorithm {
        Algorithm::FixedWindow => State {
            a: a.a,
            b: a.b.saturating_add(b.b),
        },
        Algorithm::SlidingWindow => {
            let previous = (a.a & 0xffff_ffff) + (b.a & 0xffff_ffff);
            State {
                a: sliding_pack(a.a >> 32, clamp_u32(previous)),
                b: a.b.saturating_add(b.b),
            }
        }
        Algorithm::TokenBucket => {
            let burst = rate.burst;
            let used = (burst - a.b.min(burst)).saturating_add(burst - b.b.min(burst));
            State {
                a: a.a,
                b: burst - used.min(burst),
            }
        }
        Algorithm::Gcra => {
            // Each side's theoretical arrival time is ahead of `now` by what it consumed.
            let ahead = |tat: u64| tat.saturating_sub(now);
            State {
                a: now.saturating_add(ahead(a.a)).saturating_add(ahead(b.a)),
                b: 0,
            }
        }
    }
}

fn until_window_end(unit: Unit, now: u64) -> u64 {
    let len = unit.nanos();
    len - now % len
}

fn clamp_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

fn fixed_window(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
    let window = now / rate.unit.nanos();
    if state.a != window {
        *state = State { a: window, b: 0 };
    }
    let limit = u64::from(rate.requests_per_unit);
    let used = u64::from(state.b);
    let reset_after = until_window_end(rate.unit, now);
    let Some(after) = used.checked_add(cost).filter(|after| *after <= limit) else {
        return Decision {
            allowed: false,
            remaining: clamp_u32(limit.saturating_sub(used)),
            reset_after,
            retry_after: (cost <= limit).then_some(reset_after),
        };
    };
    state.b = clamp_u32(after);
    Decision {
        allowed: true,
        remaining: clamp_u32(limit - after),
        reset_after,
        retry_after: Some(0),
    }
}

fn sliding_pack(window: u64, previous: u32) -> u64 {
    ((window & 0xffff_ffff) << 32) | u64::from(previous)
}

fn sliding_window(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
    let len = rate.unit.nanos();
    let window = now / len;
    let elapsed = now % len;
    let stored = state.a >> 32;
    let (previous, current) = match (window & 0xffff_ffff).wrapping_sub(stored) & 0xffff_ffff {
        0 => (state.a & 0xffff_ffff, u64::from(state.b)),
        1 => (u64::from(state.b), 0),
        _ => (0, 0),
    };
    let limit = u64::from(rate.requests_per_unit);
    // Everything below is scaled by the window length to stay in integers:
    // estimate * len = previous * (len - elapsed) + current * len.
    let (len128, limit128) = (u128::from(len), u128::from(limit));
    let weighted_previous = u128::from(previous) * u128::from(len - elapsed);
    let estimate = weighted_previous + u128::from(current) * len128;
    let reset_after = len - elapsed;
    let wanted = estimate + u128::from(cost) * len128;
    if wanted > limit128 * len128 {
        state.a = sliding_pack(window, clamp_u32(previous));
        state.b = clamp_u32(current);
        let remaining = (limit128 * len128).saturating_sub(estimate) / len128;
        return Decision {
            allowed: false,
            remaining: clamp_u32(u64::try_from(remaining).unwrap_or(u64::MAX)),
            reset_after,
            retry_after: sliding_retry_after(previous, current, cost, limit, len, elapsed),
        };
    }
    // Admitted, so `current + cost <= limit`.
    let current = current + cost;
    state.a = sliding_pack(window, clamp_u32(previous));
    state.b = clamp_u32(current);
    let after = weighted_previous + u128::from(current) * len128;
    let remaining = (limit128 * len128 - after) / len128;
    Decision {
        allowed: true,
        remaining: clamp_u32(u64::try_from(remaining).unwrap_or(u64::MAX)),
        reset_after,
        retry_after: Some(0),
    }
}

/// Nanoseconds until `cost` more hits fit under the sliding estimate, or `None` if never.
///
/// With `x` the part of the previous window still inside the sliding window, a hit fits when
/// `previous * x + (current + cost) * len <= limit * len`.
fn sliding_retry_after(
    previous: u64,
    current: u64,
    cost: u64,
    limit: u64,
    len: u64,
    elapsed: u64,
) -> Option<u64> {
    if cost > limit {
        return None;
    }
    let left = len - elapsed;
    // Later in this window, as the previous window's weight shrinks.
    if let Some(room) = current
        .checked_add(cost)
        .and_then(|used| limit.checked_sub(used))
        && previous > 0
    {
        let max_overlap = u128::from(room) * u128::from(len) / u128::from(previous);
        if max_overlap > 0 {
            return Some(left - u64::try_from(max_overlap.min(u128::from(left))).unwrap_or(left));
        }
    }
    // In the next window, where this window's hits become the previous count.
    if current == 0 {
        return Some(left);
    }
    let max_overlap = u128::from(limit - cost) * u128::from(len) / u128::from(current);
    let overlap = u64::try_from(max_overlap.min(u128::from(len))).unwrap_or(len);
    Some(left + (len - overlap))
}

fn token_bucket(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
    let interval = rate.emission_interval();
    let burst = u64::from(rate.burst);
    // Refill whole tokens; `a` advances by exactly the time those tokens took, so the
    // fraction of a token earned so far is kept for the next call.
    let mut tokens = u64::from(state.b).min(burst);
    let mut last = state.a.min(now);
    let earned = (now - last) / interval;
    if tokens.saturating_add(earned) >= burst {
        tokens = burst;
        last = now;
    } else {
        tokens += earned;
        last += earned * interval;
    }
    let partial = now - last;
    let time_for = |missing: u64| (missing.saturating_mul(interval)).saturating_sub(partial);
    if cost > tokens {
        state.a = last;
        state.b = clamp_u32(tokens);
        return Decision {
            allowed: false,
            remaining: clamp_u32(tokens),
            reset_after: time_for(burst - tokens),
            retry_after: (cost <= burst).then(|| time_for(cost - tokens)),
        };
    }
    tokens -= cost;
    // A full bucket's clock restarts at the first token taken from it.
    state.a = last;
    state.b = clamp_u32(tokens);
    Decision {
        allowed: true,
        remaining: clamp_u32(tokens),
        reset_after: time_for(burst - tokens),
        retry_after: Some(0),
    }
}

fn gcra(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
    let interval = u128::from(rate.emission_interval());
    let capacity = interval * u128::from(rate.burst);
    let now128 = u128::from(now);
    let tat = u128::from(state.a).max(now128);
    let new_tat = tat + interval * u128::from(cost);
    let to_u64 = |value: u128| u64::try_from(value).unwrap_or(u64::MAX);
    if new_tat - now128 > capacity {
        let remaining = capacity.saturating_sub(tat - now128) / interval;
        let retry_after =
            (u64::from(rate.burst) >= cost).then(|| to_u64(new_tat - capacity - now128));
        return Decision {
            allowed: false,
            remaining: clamp_u32(to_u64(remaining)),
            reset_after: to_u64(tat - now128),
            retry_after,
        };
    }
    state.a = to_u64(new_tat);
    let remaining = (capacity - (new_tat - now128)) / interval;
    Decision {
        allowed: true,
        remaining: clamp_u32(to_u64(remaining)),
        reset_after: to_u64(new_tat - now128),
        retry_after: Some(0),
    }
}

#[cfg(test)]
mod tests;
