//! Property tests: random sequences of hits (addends from 0 to 2^64 - 1), hits that count
//! when rejected ([`Charge::Always`]), refunds of hits ([`Charge::Refund`]), loans, loan
//! refunds and clock steps, run through each algorithm and through a small reference model of it written
//! in plain `u128` arithmetic (no packing, no clamping). Every decision must equal the
//! model's, and independently of the model, nothing may pass more than the limit allows:
//! per epoch-aligned window for the windows, `burst` plus what refilled for the buckets.

use proptest::prelude::*;

use super::*;

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Op {
    Hit(u64),
    /// A hit charged [`Charge::Always`]: counted when rejected too.
    Counted(u64),
    /// Hits given back ([`Charge::Refund`], Envoy's `is_negative_hits`).
    GiveBack(u64),
    /// Advance the clock by this many nanoseconds.
    Step(u64),
    /// Lend as much as `policy(most, share)` allows.
    Lend {
        most: u64,
        share: u64,
    },
    /// Give back the loan at this index (modulo the loans taken), once.
    Refund(usize),
}

/// The costs an attacker would try, and small ones around the limit.
fn cost(limit: u32) -> impl Strategy<Value = u64> {
    let limit = u64::from(limit);
    prop_oneof![
        Just(0),
        Just(1),
        Just(limit),
        Just(limit + 1),
        Just(1 << 32),
        Just((1 << 53) + 1),
        Just(1 << 63),
        Just(u64::MAX),
        0..=limit + 2,
    ]
}

/// Steps sized to the window, `len` nanoseconds.
fn ops(limit: u32, len: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => cost(limit).prop_map(Op::Hit),
        2 => cost(limit).prop_map(Op::Counted),
        2 => cost(limit).prop_map(Op::GiveBack),
        2 => prop_oneof![0..len / 10, 0..3 * len].prop_map(Op::Step),
        1 => (prop_oneof![Just(u64::MAX), 1..8u64], 1..4u64)
            .prop_map(|(most, share)| Op::Lend { most, share }),
        1 => any::<usize>().prop_map(Op::Refund),
    ];
    prop::collection::vec(op, 1..80)
}

fn rates() -> impl Strategy<Value = Rate> {
    let algorithm = prop::sample::select(Algorithm::ALL.to_vec());
    let per_unit = prop_oneof![8 => 1..12u32, 1 => Just(u32::MAX)];
    let burst = prop_oneof![Just(None), (1..12u32).prop_map(Some)];
    let unit = prop::sample::select(vec![Unit::Second, Unit::Minute]);
    // `unit_multiplier`: windows of 1, 7, 10, 30 or 90 units (90 s is no whole minute; 7 m
    // and 30 m are).
    let multiplier = prop::sample::select(vec![1, 1, 7, 10, 30, 90]);
    (algorithm, per_unit, unit, burst, multiplier).prop_map(
        |(algorithm, per_unit, unit, burst, multiplier)| {
            let rate = Rate::new(algorithm, per_unit, unit, burst);
            rate.every(multiplier).expect("a window within a year")
        },
    )
}

/// The reference model's state, in nanoseconds and hits, as `u128`.
#[derive(Clone, Debug)]
enum Model {
    /// Hits per window index.
    Windows(std::collections::BTreeMap<u64, u128>),
    /// Tokens as nanoseconds of refill (`interval` per token), capped at `burst * interval`,
    /// as of `at`.
    Bucket { level: u128, at: u64 },
    /// Theoretical arrival time.
    Gcra { tat: u128 },
}

impl Model {
    fn new(rate: &Rate, now: u64) -> Model {
        match rate.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => Model::Windows(Default::default()),
            Algorithm::TokenBucket => Model::Bucket {
                level: cap(rate),
                at: now,
            },
            Algorithm::Gcra => Model::Gcra {
                tat: u128::from(now),
            },
        }
    }

    /// What `cost` more hits would count against the limit at `now`, and the room there is
    /// (both scaled alike); refills the bucket first.
    fn weigh(&mut self, rate: &Rate, now: u64, cost: u64) -> (u128, u128) {
        let len = u128::from(rate.window_nanos());
        let window = now / rate.window_nanos();
        let limit = u128::from(rate.requests_per_unit);
        let interval = u128::from(rate.emission_interval());
        let cost = u128::from(cost);
        match self {
            Model::Windows(counts) => {
                let current = counts.get(&window).copied().unwrap_or(0);
                if rate.algorithm == Algorithm::FixedWindow {
                    return (current + cost, limit);
                }
                let previous = match window.checked_sub(1) {
                    Some(before) => counts.get(&before).copied().unwrap_or(0),
                    None => 0,
                };
                let left = len - u128::from(now % rate.window_nanos());
                ((previous * left) + (current + cost) * len, limit * len)
            }
            Model::Bucket { level, at } => {
                *level = (*level + u128::from(now - *at)).min(cap(rate));
                *at = now;
                (cost * interval, *level)
            }
            Model::Gcra { tat } => {
                let start = (*tat).max(u128::from(now));
                (start - u128::from(now) + cost * interval, cap(rate))
            }
        }
    }

    /// Takes `cost` hits at `now` if they fit; answers whether they did.
    fn take(&mut self, rate: &Rate, now: u64, cost: u64) -> bool {
        if rate.requests_per_unit == 0 {
            return false;
        }
        let (wanted, room) = self.weigh(rate, now, cost);
        if wanted > room {
            return false;
        }
        let window = now / rate.window_nanos();
        let interval = u128::from(rate.emission_interval());
        match self {
            Model::Windows(counts) => *counts.entry(window).or_default() += u128::from(cost),
            Model::Bucket { level, .. } => *level -= u128::from(cost) * interval,
            Model::Gcra { tat } => {
                *tat = (*tat).max(u128::from(now)) + u128::from(cost) * interval;
            }
        }
        true
    }

    /// [`Model::take`] for a hit that counts when rejected: one that does not fit takes
    /// what remains. Answers whether it fit.
    fn take_counting(&mut self, rate: &Rate, now: u64, cost: u64) -> bool {
        if self.take(rate, now, cost) {
            return true;
        }
        if rate.requests_per_unit > 0 {
            let left = u64::try_from(self.remaining(rate, now)).expect("below the limit");
            assert!(self.take(rate, now, left), "what remains fits");
        }
        false
    }

    /// Gives back `cost` hits at `now` (a refund); answers how much it gave back: hits for
    /// the windows, nanoseconds of refill for the buckets.
    fn refund_hits(&mut self, rate: &Rate, now: u64, cost: u64) -> u128 {
        if rate.requests_per_unit == 0 {
            return 0;
        }
        self.weigh(rate, now, 0);
        let window = now / rate.window_nanos();
        let cost = u128::from(cost);
        let interval = u128::from(rate.emission_interval());
        match self {
            Model::Windows(counts) => {
                let count = counts.entry(window).or_default();
                let back = cost.min(*count);
                *count -= back;
                back
            }
            Model::Bucket { level, .. } => {
                let back = (cost * interval).min(cap(rate) - *level);
                *level += back;
                back
            }
            Model::Gcra { tat } => {
                let start = (*tat).max(u128::from(now));
                let back = (cost * interval).min(start - u128::from(now));
                *tat = start - back;
                back
            }
        }
    }

    /// Hits that could pass at `now`.
    fn remaining(&mut self, rate: &Rate, now: u64) -> u128 {
        let (used, room) = self.weigh(rate, now, 0);
        let interval = u128::from(rate.emission_interval());
        match self {
            Model::Windows(_) if rate.algorithm == Algorithm::FixedWindow => room - used,
            Model::Windows(_) => room.saturating_sub(used) / u128::from(rate.window_nanos()),
            Model::Bucket { .. } => room / interval,
            Model::Gcra { .. } => room.saturating_sub(used) / interval,
        }
    }

    /// Gives back up to `units` lent in `window` (windows) at `now`; answers how many.
    fn give_back(&mut self, rate: &Rate, now: u64, units: u64, window: u64) -> u64 {
        self.weigh(rate, now, 0);
        let interval = u128::from(rate.emission_interval());
        let units = u128::from(units);
        let back = match self {
            Model::Windows(counts) => {
                if now / rate.window_nanos() != window {
                    return 0;
                }
                let count = counts.entry(window).or_default();
                let back = units.min(*count);
                *count -= back;
                back
            }
            Model::Bucket { level, .. } => {
                let tokens = *level / interval;
                let back = units.min(u128::from(rate.burst) - tokens);
                *level = (*level + back * interval).min(cap(rate));
                back
            }
            Model::Gcra { tat } => {
                let start = (*tat).max(u128::from(now));
                let back = units.min((start - u128::from(now)) / interval);
                *tat = start - back * interval;
                back
            }
        };
        u64::try_from(back).expect("at most what was lent")
    }
}

/// A bucket's capacity in nanoseconds of refill.
fn cap(rate: &Rate) -> u128 {
    u128::from(rate.burst) * u128::from(rate.emission_interval())
}

/// Hits taken (admitted, counted when rejected, or lent, less refunds) per window, for the
/// model-free bound.
#[derive(Default)]
struct Taken {
    by_window: std::collections::BTreeMap<u64, u128>,
    /// Buckets: everything taken since the start, in nanoseconds of refill.
    total: u128,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn every_algorithm_agrees_with_its_model_and_never_passes_its_limit(
        (rate, ops) in rates().prop_flat_map(|rate| (Just(rate), ops(rate.requests_per_unit, rate.window_nanos()))),
        start in 0..1_000u64,
    ) {
        let start = THURSDAY + start * S / 7;
        let mut now = start;
        let mut state = init(&rate, now);
        let mut model = Model::new(&rate, now);
        let mut loans: Vec<Option<Lent>> = Vec::new();
        let mut taken = Taken::default();
        let window_at = |now: u64| now / rate.window_nanos();
        let interval = u128::from(rate.emission_interval());
        for op in ops {
            match op {
                Op::Step(nanos) => now += nanos,
                Op::Hit(cost) => {
                    let decision = decide(&rate, &mut state, now, cost);
                    let admitted = model.take(&rate, now, cost);
                    prop_assert_eq!(decision.allowed, admitted, "cost {} at {}", cost, now - start);
                    prop_assert_eq!(
                        u128::from(decision.remaining),
                        model.remaining(&rate, now).min(u128::from(u32::MAX)),
                        "remaining after cost {} at {}", cost, now - start
                    );
                    prop_assert!(u64::from(decision.remaining) <= rate.capacity());
                    if cost > rate.capacity() {
                        prop_assert!(!decision.allowed);
                        prop_assert_eq!(decision.retry_after, None);
                    }
                    if admitted {
                        *taken.by_window.entry(window_at(now)).or_default() += u128::from(cost);
                        taken.total += u128::from(cost) * interval;
                    }
                }
                Op::Counted(cost) => {
                    let before = model.remaining(&rate, now);
                    let decision = apply(&rate, &mut state, now, cost, Charge::Always);
                    let admitted = model.take_counting(&rate, now, cost);
                    prop_assert_eq!(decision.allowed, admitted, "counted cost {} at {}", cost, now - start);
                    let after = model.remaining(&rate, now);
                    prop_assert_eq!(
                        u128::from(decision.remaining),
                        after.min(u128::from(u32::MAX)),
                        "remaining after counted cost {} at {}", cost, now - start
                    );
                    if !admitted {
                        prop_assert_eq!(after, 0, "a counted rejection exhausts the limit");
                        prop_assert_eq!(decision.retry_after.is_none(), cost > rate.capacity());
                    }
                    let took = before - after;
                    *taken.by_window.entry(window_at(now)).or_default() += took;
                    taken.total += took * interval;
                }
                Op::GiveBack(cost) => {
                    let decision = apply(&rate, &mut state, now, cost, Charge::Refund);
                    let back = model.refund_hits(&rate, now, cost);
                    prop_assert!(decision.allowed, "a refund is answered allowed");
                    prop_assert_eq!(decision.retry_after, Some(0));
                    prop_assert_eq!(
                        u128::from(decision.remaining),
                        model.remaining(&rate, now).min(u128::from(u32::MAX)),
                        "remaining after a refund of {} at {}", cost, now - start
                    );
                    prop_assert!(u64::from(decision.remaining) <= rate.capacity(), "never above capacity");
                    match rate.algorithm {
                        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                            if let Some(count) = taken.by_window.get_mut(&window_at(now)) {
                                *count -= back.min(*count);
                            }
                        }
                        Algorithm::TokenBucket | Algorithm::Gcra => taken.total -= back,
                    }
                }
                Op::Lend { most, share } => {
                    let lent = lend(&rate, &mut state, now, LendPolicy { most, share, least: 1 });
                    if let Some(lent) = lent {
                        prop_assert!(model.take(&rate, now, lent.units), "lent {} the model lacks", lent.units);
                        *taken.by_window.entry(window_at(now)).or_default() += u128::from(lent.units);
                        taken.total += u128::from(lent.units) * interval;
                    } else {
                        prop_assert!(
                            rate.requests_per_unit == 0 || model.remaining(&rate, now) / u128::from(share) == 0,
                            "nothing lent with room left"
                        );
                    }
                    loans.push(lent);
                }
                Op::Refund(which) if !loans.is_empty() => {
                    let index = which % loans.len();
                    if let Some(loan) = loans[index].take() {
                        let back = refund(&rate, &mut state, now, loan.units, loan.window);
                        // A sliding window names its window modulo 2^32: the same index
                        // for seconds and minutes since the epoch.
                        let expected = model.give_back(&rate, now, loan.units, loan.window);
                        prop_assert_eq!(back, expected, "refund of {}", loan.units);
                        prop_assert!(back <= loan.units);
                        if let Some(count) = taken.by_window.get_mut(&window_at(now)) {
                            *count -= u128::from(back).min(*count);
                        }
                        taken.total -= u128::from(back) * interval;
                    }
                }
                Op::Refund(_) => {}
            }
            // The model-free bound.
            let limit = u128::from(rate.requests_per_unit);
            match rate.algorithm {
                Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                    for (window, count) in &taken.by_window {
                        prop_assert!(*count <= limit, "{} taken in window {}", count, window);
                    }
                }
                Algorithm::TokenBucket | Algorithm::Gcra => {
                    // In nanoseconds of refill: the bucket's capacity plus the time passed.
                    let most = u128::from(rate.capacity()) * interval + u128::from(now - start);
                    prop_assert!(taken.total <= most, "{} ns taken, at most {}", taken.total, most);
                }
            }
        }
    }
}
