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
//!
//! Each algorithm is one file, a [`Kernel`]: its state's layout, its decision, how it gives
//! hits back, lends, merges and how long its state matters, and beside it its Redis twin
//! (`NAME.lua`, pasted into the Redis store's script by [`lua_branches`]). The
//! `algorithms!` list registers them: one line each. What all of them share (a limit of
//! 0, a cost beyond capacity, bringing a state to `now` before giving back or merging) is
//! here, once.

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

    /// A window of `multiplier` of this unit, in seconds.
    #[inline]
    pub const fn window_seconds(self, multiplier: u32) -> u64 {
        self.seconds() * multiplier as u64
    }

    /// How answers name a window of `multiplier` of this unit: the unit (`second`, `week`)
    /// without a multiplier, as always; else the window as a short duration (`10s`, `5m`,
    /// `2h`, `14d`: [`duration_text`]).
    pub fn window_name(self, multiplier: u32) -> std::borrow::Cow<'static, str> {
        if multiplier == 1 {
            self.as_str().into()
        } else {
            duration_text(self.window_seconds(multiplier)).into()
        }
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

/// One algorithm: everything about it that differs from the others. Its functions are
/// called only through [`Algorithm`]'s dispatch, after the shared steps (see the module
/// doc), so a kernel never sees a limit of 0 or a cost beyond its capacity.
pub(crate) trait Kernel {
    /// Its name in limits files (`algorithm: NAME`), metrics and explain.
    const NAME: &'static str;
    /// Its code: the counter slot hashed into key ids (`key`), the peer wire
    /// (`peer.proto`'s `Algorithm`, whose values are these) and the Redis script (which
    /// refuses a code it does not know). Never renumber: keys, peers and scripts of another
    /// version read it.
    const CODE: u8;
    /// Whether `burst` means something for it.
    const USES_BURST: bool;
    /// Its branch of the Redis script (`NAME.lua`; see its header for what it reads and sets).
    const LUA: &'static str;

    /// Its bucket size given a limit's `burst` (`None` when the file says none).
    fn burst(requests_per_unit: u32, burst: Option<u32>) -> u32;
    /// The burst of one of `members` nodes' share, whose rate is `requests_per_unit`.
    fn share_burst(rate: &Rate, requests_per_unit: u32, members: u32) -> u32;
    /// [`Rate::capacity`].
    fn capacity(rate: &Rate) -> u64;
    /// [`Rate::refill_time`]: zero for a window.
    fn refill_time(_rate: &Rate) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// [`init`].
    fn init(rate: &Rate, now: u64) -> State;
    /// [`State::from_numbers`].
    fn from_numbers(rate: &Rate, time: u64, numbers: [u64; 3]) -> State;
    /// [`decide`], for a cost within capacity and a limit above 0.
    fn step(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision;
    /// [`give_back`]'s change to a state already brought to `now`.
    fn give_back(rate: &Rate, state: &mut State, now: u64, cost: u64);
    /// The window a state is in (the one lent hits are counted in); `None` for a bucket.
    fn window(state: &State) -> Option<u64>;
    /// [`refund`], on a state brought to `now` and, for a window, still in the loan's.
    fn refund(rate: &Rate, state: &mut State, now: u64, units: u64) -> u64;
    /// [`lifetime`].
    fn lifetime(rate: &Rate, reset_after: u64) -> u64;
    /// [`merge`], of two states brought to `now`.
    fn merge(rate: &Rate, ours: State, theirs: State, now: u64) -> State;
}

/// Declares [`Algorithm`] from the list of kernels, and its dispatch: one `match` per
/// kernel function, each arm a static call, so nothing is dynamic on the request path.
macro_rules! algorithms {
    ($($(#[$meta:meta])* $variant:ident => $module:ident::$kernel:ident,)*) => {
        $(mod $module;)*

        /// How a limit counts. See docs/algorithms.md for what each parameter means.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
        pub enum Algorithm {
            $($(#[$meta])* $variant,)*
        }

        impl Algorithm {
            pub const ALL: [Algorithm; [$(stringify!($variant)),*].len()] =
                [$(Algorithm::$variant),*];

            /// The algorithm's code, the one number every representation uses (see
            /// [`Kernel::CODE`]).
            #[inline]
            pub const fn code(self) -> u8 {
                match self { $(Algorithm::$variant => <$module::$kernel as Kernel>::CODE,)* }
            }

            #[inline]
            pub const fn as_str(self) -> &'static str {
                match self { $(Algorithm::$variant => <$module::$kernel as Kernel>::NAME,)* }
            }

            /// Whether `burst` means something for this algorithm.
            #[inline]
            pub const fn uses_burst(self) -> bool {
                match self {
                    $(Algorithm::$variant => <$module::$kernel as Kernel>::USES_BURST,)*
                }
            }

            /// Its branch of the Redis script.
            #[inline]
            pub const fn lua(self) -> &'static str {
                match self { $(Algorithm::$variant => <$module::$kernel as Kernel>::LUA,)* }
            }

            #[inline]
            fn burst(self, requests_per_unit: u32, burst: Option<u32>) -> u32 {
                match self {
                    $(Algorithm::$variant =>
                        <$module::$kernel as Kernel>::burst(requests_per_unit, burst),)*
                }
            }

            #[inline]
            fn share_burst(self, rate: &Rate, requests_per_unit: u32, members: u32) -> u32 {
                match self {
                    $(Algorithm::$variant => <$module::$kernel as Kernel>::share_burst(
                        rate, requests_per_unit, members),)*
                }
            }

            #[inline]
            fn capacity(self, rate: &Rate) -> u64 {
                match self { $(Algorithm::$variant => <$module::$kernel as Kernel>::capacity(rate),)* }
            }

            #[inline]
            fn refill_time(self, rate: &Rate) -> std::time::Duration {
                match self {
                    $(Algorithm::$variant => <$module::$kernel as Kernel>::refill_time(rate),)*
                }
            }

            #[inline]
            fn init(self, rate: &Rate, now: u64) -> State {
                match self { $(Algorithm::$variant => <$module::$kernel as Kernel>::init(rate, now),)* }
            }

            #[inline]
            fn state_from_numbers(self, rate: &Rate, time: u64, numbers: [u64; 3]) -> State {
                match self {
                    $(Algorithm::$variant =>
                        <$module::$kernel as Kernel>::from_numbers(rate, time, numbers),)*
                }
            }

            #[inline]
            fn step(self, rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
                match self {
                    $(Algorithm::$variant =>
                        <$module::$kernel as Kernel>::step(rate, state, now, cost),)*
                }
            }

            #[inline]
            fn give_back(self, rate: &Rate, state: &mut State, now: u64, cost: u64) {
                match self {
                    $(Algorithm::$variant =>
                        <$module::$kernel as Kernel>::give_back(rate, state, now, cost),)*
                }
            }

            #[inline]
            fn window(self, state: &State) -> Option<u64> {
                match self { $(Algorithm::$variant => <$module::$kernel as Kernel>::window(state),)* }
            }

            #[inline]
            fn refund(self, rate: &Rate, state: &mut State, now: u64, units: u64) -> u64 {
                match self {
                    $(Algorithm::$variant =>
                        <$module::$kernel as Kernel>::refund(rate, state, now, units),)*
                }
            }

            #[inline]
            fn lifetime(self, rate: &Rate, reset_after: u64) -> u64 {
                match self {
                    $(Algorithm::$variant =>
                        <$module::$kernel as Kernel>::lifetime(rate, reset_after),)*
                }
            }

            #[inline]
            fn merge(self, rate: &Rate, ours: State, theirs: State, now: u64) -> State {
                match self {
                    $(Algorithm::$variant =>
                        <$module::$kernel as Kernel>::merge(rate, ours, theirs, now),)*
                }
            }
        }
    };
}

// The registry: a new algorithm is its file (a `Kernel`), its `.lua` beside it, and one line
// here (plus its value in `peer.proto`'s `Algorithm`, which a test holds to this list).
algorithms! {
    /// At most `requests_per_unit` hits per epoch-aligned window of one `unit`.
    #[default]
    FixedWindow => fixed_window::FixedWindow,
    /// Like a fixed window, but the previous window's count is weighted by how much of it
    /// still overlaps the sliding window ending now (the two-window approximation).
    SlidingWindow => sliding_window::SlidingWindow,
    /// A bucket of `burst` tokens (default `requests_per_unit`), refilled continuously at
    /// `requests_per_unit` per `unit`; a hit takes one token.
    TokenBucket => token_bucket::TokenBucket,
    /// Generic cell rate algorithm: one hit every `unit / requests_per_unit`, with up to
    /// `burst` (default 1) hits at once. One timestamp of state.
    Gcra => gcra::Gcra,
}

impl Algorithm {
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
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The per-algorithm branches of the Redis store's script: `elseif algorithm == CODE then`
/// and the algorithm's Lua, for every algorithm, to follow the script's `if rpu <= 0`.
pub fn lua_branches() -> String {
    let mut branches = String::new();
    for algorithm in Algorithm::ALL {
        branches.push_str("    elseif algorithm == ");
        branches.push_str(&algorithm.code().to_string());
        branches.push_str(" then\n");
        // The file's header (its leading comment) is for its readers, not the script.
        let body = algorithm
            .lua()
            .lines()
            .skip_while(|line| line.starts_with("--"));
        for line in body {
            if !line.is_empty() {
                branches.push_str("      ");
                branches.push_str(line);
            }
            branches.push('\n');
        }
    }
    branches
}

/// The longest window (or refill period) a limit may have: a year, the reference's
/// longest unit. A counter lives as long as its window, so a longer one would keep state
/// (in memory, on peers, in Redis) for years.
pub const MAX_WINDOW_SECONDS: u64 = Unit::Year.seconds();

/// A limit's counting rule: everything an algorithm needs besides state, time and cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    pub algorithm: Algorithm,
    pub requests_per_unit: u32,
    /// With `multiplier`, the window (or refill period): `multiplier` units. Kept in
    /// canonical form ([`Rate::every`]): the longest unit that divides the window, so
    /// `day` x 7 is `week` and `second` x 60 is `minute`; a limit is its window's length.
    pub unit: Unit,
    /// How many `unit`s the window is (`unit_multiplier`, 1 unless set).
    pub multiplier: u32,
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
        let burst = algorithm.burst(requests_per_unit, burst);
        Rate {
            algorithm,
            requests_per_unit,
            unit,
            multiplier: 1,
            burst,
        }
    }

    /// This rate with a window of `multiplier` times its unit (`unit_multiplier`), in
    /// canonical form: the unit becomes the longest that divides the window (`day` x 14 is
    /// `week` x 2). `None` for 0, or past [`MAX_WINDOW_SECONDS`].
    pub fn every(self, multiplier: u32) -> Option<Rate> {
        let seconds = self
            .window_seconds()
            .checked_mul(u64::from(multiplier))
            .filter(|seconds| (1..=MAX_WINDOW_SECONDS).contains(seconds))?;
        let unit = Unit::ALL
            .into_iter()
            .filter(|unit| seconds % unit.seconds() == 0)
            .max_by_key(|unit| unit.seconds())?;
        Some(Rate {
            unit,
            multiplier: u32::try_from(seconds / unit.seconds()).ok()?,
            ..self
        })
    }

    /// The window (or refill period) in seconds: `multiplier` units.
    #[inline]
    pub fn window_seconds(&self) -> u64 {
        self.unit.window_seconds(self.multiplier)
    }

    /// The window (or refill period) in nanoseconds.
    #[inline]
    pub fn window_nanos(&self) -> u64 {
        self.window_seconds() * NANOS_PER_SEC
    }

    /// How answers name the window ([`Unit::window_name`]).
    pub fn window_name(&self) -> std::borrow::Cow<'static, str> {
        self.unit.window_name(self.multiplier)
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
        let burst = self.algorithm.share_burst(self, requests_per_unit, members);
        Rate {
            requests_per_unit,
            burst,
            ..*self
        }
    }

    /// The most hits one request can ever be admitted with (a larger cost never passes).
    pub fn capacity(&self) -> u64 {
        self.algorithm.capacity(self)
    }

    /// How long an emptied bucket takes to refill (`token_bucket`, `gcra`); zero for windows.
    pub fn refill_time(&self) -> std::time::Duration {
        self.algorithm.refill_time(self)
    }

    /// Nanoseconds per token for the bucket algorithms (at least 1).
    pub fn emission_interval(&self) -> u64 {
        (self.window_nanos() / u64::from(self.requests_per_unit.max(1))).max(1)
    }
}

/// `seconds` as a short duration: `1s`, `90s`, `5m`, `2h`, `7d`.
pub fn duration_text(seconds: u64) -> String {
    let (count, suffix) = [(86_400, "d"), (3_600, "h"), (60, "m")]
        .into_iter()
        .find(|&(size, _)| seconds >= size && seconds.is_multiple_of(size))
        .map_or((seconds, "s"), |(size, suffix)| (seconds / size, suffix));
    format!("{count}{suffix}")
}

/// Per-key state. Its meaning depends on the algorithm: each kernel's file says its own.
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
        rate.algorithm.state_from_numbers(rate, time, numbers)
    }

    /// A sliding window's state: `current` hits in window `window` (the index of the unit
    /// since the epoch), after `previous` hits in the window before.
    pub fn sliding(window: u64, previous: u32, current: u32) -> State {
        State {
            a: sliding_window::pack(window, previous),
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
            reset_after: until_window_end(rate, now),
            retry_after: Some(0),
        };
    }
    // Bring the state to `now` (window rotation, refill) without consuming.
    decide(rate, state, now, 0);
    rate.algorithm.give_back(rate, state, now, cost);
    let mut decision = decide(rate, state, now, 0);
    decision.allowed = true;
    decision.retry_after = Some(0);
    decision
}

/// The state of a key seen for the first time at `now`.
pub fn init(rate: &Rate, now: u64) -> State {
    rate.algorithm.init(rate, now)
}

/// Checks `cost` hits against the limit and, when allowed and `cost > 0`, consumes them.
/// Any `u64` cost is answered exactly: one above [`Rate::capacity`] is denied, consumes
/// nothing and has no `retry_after` (it never passes).
pub fn decide(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
    if rate.requests_per_unit == 0 {
        let reset_after = until_window_end(rate, now);
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
#[inline]
fn step(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
    rate.algorithm.step(rate, state, now, cost)
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
        Some(window) => (window, until_window_end(rate, now)),
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
    rate.algorithm.window(state)
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
    if window_of(rate, state).is_some_and(|current| current != window) {
        return 0;
    }
    rate.algorithm.refund(rate, state, now, units)
}

/// How long (nanoseconds) the state a decision left can still change an answer, given the
/// decision's `reset_after` (or a loan's, [`Lent::reset_after`]): after it, a
/// fresh state ([`init`]) answers every cost exactly as this one would, so the key may be
/// forgotten. A fixed window's count matters until its window ends; a sliding window's
/// until the end of the following one (where it weighs in as the previous count); a token
/// bucket's and GCRA's until the bucket would be full again. The Redis script gives its
/// keys the same lifetimes (plus its TTL margin).
pub fn lifetime(rate: &Rate, reset_after: u64) -> u64 {
    rate.algorithm.lifetime(rate, reset_after)
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
    rate.algorithm.merge(rate, a, b, now)
}

#[inline]
fn until_window_end(rate: &Rate, now: u64) -> u64 {
    let len = rate.window_nanos();
    len - now % len
}

/// What the two windows share: the count is the limit's, and hits given back (a refund,
/// a loan's return) come off the current window's count, never below zero; answers how
/// many did.
#[inline]
fn take_back(state: &mut State, units: u64) -> u64 {
    let back = units.min(u64::from(state.b));
    state.b -= clamp_u32(back);
    back
}

/// A window's capacity: its limit.
#[inline]
fn window_capacity(rate: &Rate) -> u64 {
    u64::from(rate.requests_per_unit)
}

/// What the two buckets share: their size is `burst`.
mod bucket {
    use std::time::Duration;

    use super::Rate;

    /// One of `members` nodes' burst: a share of the bucket, at least one hit while it
    /// refills at all.
    #[inline]
    pub(super) fn share_burst(rate: &Rate, requests_per_unit: u32, members: u32) -> u32 {
        if requests_per_unit == 0 {
            0
        } else {
            (rate.burst / members).max(1)
        }
    }

    /// The bucket's size, or 0 when it never refills.
    #[inline]
    pub(super) fn capacity(rate: &Rate) -> u64 {
        if rate.requests_per_unit == 0 {
            0
        } else {
            u64::from(rate.burst)
        }
    }

    /// How long an emptied bucket takes to fill.
    #[inline]
    pub(super) fn refill_time(rate: &Rate) -> Duration {
        Duration::from_nanos(
            rate.emission_interval()
                .saturating_mul(u64::from(rate.burst)),
        )
    }
}

#[inline]
fn clamp_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// `seconds` and `nanos` as nanoseconds, saturating.
#[inline]
fn nanos(seconds: u64, nanos: u64) -> u64 {
    seconds.saturating_mul(NANOS_PER_SEC).saturating_add(nanos)
}

#[cfg(test)]
mod tests;
