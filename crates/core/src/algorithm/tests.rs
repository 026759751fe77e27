use super::*;

const S: u64 = NANOS_PER_SEC;
const MS: u64 = 1_000_000;
/// 2024-01-04T00:00:00Z, a Thursday: a week, day, hour, minute and second boundary.
const THURSDAY: u64 = 1_704_326_400 * S;

fn rate(algorithm: Algorithm, requests_per_unit: u32, unit: Unit, burst: Option<u32>) -> Rate {
    Rate::new(algorithm, requests_per_unit, unit, burst)
}

/// Runs `hits` calls of `cost` at `now` and returns which were allowed.
fn run(rate: &Rate, state: &mut State, now: u64, cost: u64, hits: usize) -> Vec<bool> {
    (0..hits)
        .map(|_| decide(rate, state, now, cost).allowed)
        .collect()
}

#[test]
fn units_parse_in_any_case_and_map_to_envoy() {
    for (name, unit, seconds, proto) in [
        ("second", Unit::Second, 1, 1),
        ("MINUTE", Unit::Minute, 60, 2),
        ("Hour", Unit::Hour, 3_600, 3),
        ("day", Unit::Day, 86_400, 4),
        ("WeEk", Unit::Week, 604_800, 7),
        ("month", Unit::Month, 30 * 86_400, 5),
        ("YEAR", Unit::Year, 365 * 86_400, 6),
    ] {
        assert_eq!(Unit::parse(name), Some(unit), "{name}");
        assert_eq!(unit.seconds(), seconds);
        assert_eq!(unit.to_proto(), proto);
        assert_eq!(Unit::from_proto(proto), Some(unit));
    }
    assert_eq!(Unit::parse("minutes"), None);
    assert_eq!(Unit::from_proto(0), None, "UNKNOWN is not a unit");
    assert_eq!(Algorithm::parse("GCRA"), Some(Algorithm::Gcra));
    assert_eq!(Algorithm::parse("leaky"), None);
}

#[test]
fn default_bursts() {
    assert_eq!(
        rate(Algorithm::TokenBucket, 10, Unit::Second, None).burst,
        10
    );
    assert_eq!(
        rate(Algorithm::TokenBucket, 10, Unit::Second, Some(3)).burst,
        3
    );
    assert_eq!(rate(Algorithm::Gcra, 10, Unit::Second, None).burst, 1);
    assert_eq!(
        rate(Algorithm::FixedWindow, 10, Unit::Second, Some(3)).burst,
        10
    );
}

#[test]
fn fixed_window_admits_the_limit_then_resets_at_the_epoch_aligned_boundary() {
    let limit = Rate::fixed(3, Unit::Minute);
    let start = THURSDAY + 20 * S;
    let mut state = init(&limit, start);
    assert_eq!(
        run(&limit, &mut state, start, 1, 4),
        [true, true, true, false]
    );
    let denied = decide(&limit, &mut state, start + 39 * S, 1);
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 0);
    assert_eq!(denied.reset_after, S, "the minute ends 40 s after :20");
    assert_eq!(denied.retry_after, Some(S));
    // One nanosecond before the boundary still denied, at the boundary a fresh window.
    assert!(!decide(&limit, &mut state, THURSDAY + 60 * S - 1, 1).allowed);
    let fresh = decide(&limit, &mut state, THURSDAY + 60 * S, 1);
    assert!(fresh.allowed);
    assert_eq!(fresh.remaining, 2);
    assert_eq!(fresh.reset_after, 60 * S);
}

#[test]
fn weeks_start_on_thursday_like_the_reference_service() {
    let limit = Rate::fixed(1, Unit::Week);
    let mut state = init(&limit, THURSDAY - S);
    assert!(decide(&limit, &mut state, THURSDAY - S, 1).allowed);
    assert_eq!(
        decide(&limit, &mut state, THURSDAY - S, 1).reset_after,
        S,
        "Wednesday 23:59:59 is one second before the week ends"
    );
    assert!(
        decide(&limit, &mut state, THURSDAY, 1).allowed,
        "a new week"
    );
}

#[test]
fn windows_work_at_the_unix_epoch() {
    for algorithm in Algorithm::ALL {
        let limit = rate(algorithm, 2, Unit::Second, Some(2));
        let mut state = init(&limit, 0);
        assert_eq!(
            run(&limit, &mut state, 0, 1, 3),
            [true, true, false],
            "{algorithm}"
        );
    }
}

#[test]
fn a_multiplier_makes_a_window_of_that_many_units_in_canonical_form() {
    let every = |unit, multiplier| Rate::fixed(5, unit).every(multiplier);
    let window = |rate: Option<Rate>| rate.map(|rate| (rate.unit, rate.multiplier));
    assert_eq!(window(every(Unit::Second, 1)), Some((Unit::Second, 1)));
    assert_eq!(window(every(Unit::Second, 10)), Some((Unit::Second, 10)));
    assert_eq!(window(every(Unit::Second, 90)), Some((Unit::Second, 90)));
    assert_eq!(window(every(Unit::Second, 60)), Some((Unit::Minute, 1)));
    assert_eq!(window(every(Unit::Second, 300)), Some((Unit::Minute, 5)));
    assert_eq!(window(every(Unit::Minute, 120)), Some((Unit::Hour, 2)));
    assert_eq!(window(every(Unit::Day, 7)), Some((Unit::Week, 1)));
    assert_eq!(window(every(Unit::Day, 14)), Some((Unit::Week, 2)));
    assert_eq!(window(every(Unit::Day, 30)), Some((Unit::Month, 1)));
    assert_eq!(window(every(Unit::Day, 365)), Some((Unit::Year, 1)));
    assert_eq!(window(every(Unit::Week, 2)), Some((Unit::Week, 2)));
    // A year at most; 0 is no window.
    assert_eq!(
        window(every(Unit::Second, 31_536_000)),
        Some((Unit::Year, 1))
    );
    assert_eq!(every(Unit::Second, 31_536_001), None);
    assert_eq!(every(Unit::Day, 366), None);
    assert_eq!(every(Unit::Year, 2), None);
    assert_eq!(every(Unit::Year, u32::MAX), None);
    assert_eq!(every(Unit::Second, 0), None);
    // Applied twice, it multiplies.
    let twice = every(Unit::Second, 10).and_then(|rate| rate.every(6));
    assert_eq!(window(twice), Some((Unit::Minute, 1)));
    let rate = every(Unit::Minute, 5).expect("5 minutes");
    assert_eq!((rate.window_seconds(), rate.window_nanos()), (300, 300 * S));
    assert_eq!(rate.window_name(), "5m");
    assert_eq!(Rate::fixed(5, Unit::Week).window_name(), "week");
    for (seconds, text) in [
        (1, "1s"),
        (90, "90s"),
        (120, "2m"),
        (5_400, "90m"),
        (7_200, "2h"),
        (1_209_600, "14d"),
    ] {
        assert_eq!(duration_text(seconds), text);
    }
}

#[test]
fn every_algorithm_counts_over_the_whole_multiplied_window() {
    // 5 per 10 seconds: 5 pass at once, the sixth waits for the window (or the refill of
    // one token: 2 s); a plain 5 per second would have passed more after a second.
    for algorithm in Algorithm::ALL {
        let limit = rate(algorithm, 5, Unit::Second, Some(5))
            .every(10)
            .expect("10 s");
        let start = THURSDAY + 3 * S; // inside the window [:00, :10)
        let mut state = init(&limit, start);
        assert_eq!(
            run(&limit, &mut state, start, 1, 6),
            [true, true, true, true, true, false]
        );
        let denied = decide(&limit, &mut state.clone(), start + S, 1);
        assert!(
            !denied.allowed,
            "{algorithm}: one second later is still the same window"
        );
        let retry = denied.retry_after.expect("a retry time");
        let expected = match algorithm {
            // The fixed window ends at :10, 6 s after the hits' second; the sliding window's
            // previous count of 5 weighs 5 * (1 - x) until x = 1/5 of the next window.
            Algorithm::FixedWindow => 6 * S,
            Algorithm::SlidingWindow => 8 * S,
            // One token every 2 s, counted from the burst at `start`.
            Algorithm::TokenBucket | Algorithm::Gcra => S,
        };
        assert_eq!(retry, expected, "{algorithm}");
        assert!(decide(&limit, &mut state.clone(), start + S + retry, 1).allowed);
        if algorithm == Algorithm::FixedWindow {
            assert_eq!(denied.reset_after, 6 * S, "until the window ends at :10");
        }
    }
}

#[test]
fn zero_requests_per_unit_blocks_everything() {
    for algorithm in Algorithm::ALL {
        let limit = rate(algorithm, 0, Unit::Second, None);
        let mut state = init(&limit, THURSDAY);
        let decision = decide(&limit, &mut state, THURSDAY + 250 * MS, 1);
        assert!(!decision.allowed, "{algorithm}");
        assert_eq!(decision.remaining, 0);
        assert_eq!(decision.retry_after, None);
        assert_eq!(decision.reset_after, 750 * MS);
    }
}

#[test]
fn a_denied_request_consumes_nothing() {
    for algorithm in Algorithm::ALL {
        let limit = rate(algorithm, 10, Unit::Hour, Some(10));
        let mut state = init(&limit, THURSDAY);
        assert!(
            decide(&limit, &mut state, THURSDAY, 8).allowed,
            "{algorithm}"
        );
        let before = state;
        assert!(
            !decide(&limit, &mut state, THURSDAY, 5).allowed,
            "{algorithm}"
        );
        assert_eq!(
            state, before,
            "{algorithm}: the denied cost left the state alone"
        );
        assert!(
            decide(&limit, &mut state, THURSDAY, 2).allowed,
            "{algorithm}"
        );
        assert!(
            !decide(&limit, &mut state, THURSDAY, 1).allowed,
            "{algorithm}"
        );
    }
}

#[test]
fn zero_cost_checks_without_consuming() {
    for algorithm in Algorithm::ALL {
        let limit = rate(algorithm, 2, Unit::Hour, Some(2));
        let mut state = init(&limit, THURSDAY);
        for _ in 0..5 {
            let decision = decide(&limit, &mut state, THURSDAY, 0);
            assert!(decision.allowed, "{algorithm}");
            assert_eq!(decision.remaining, 2, "{algorithm}");
        }
    }
}

#[test]
fn huge_costs_never_pass_and_never_overflow() {
    for algorithm in Algorithm::ALL {
        let limit = rate(algorithm, u32::MAX, Unit::Year, Some(u32::MAX));
        let mut state = init(&limit, THURSDAY);
        let decision = decide(&limit, &mut state, THURSDAY, u64::MAX);
        assert!(!decision.allowed, "{algorithm}");
        assert_eq!(decision.retry_after, None, "{algorithm}: can never fit");
        assert!(
            decide(&limit, &mut state, THURSDAY, u64::from(u32::MAX)).allowed,
            "{algorithm}"
        );
    }
}

#[test]
fn sliding_window_weighs_the_previous_window_by_its_overlap() {
    let limit = rate(Algorithm::SlidingWindow, 10, Unit::Minute, None);
    let mut state = init(&limit, THURSDAY);
    assert!(decide(&limit, &mut state, THURSDAY + 10 * S, 10).allowed);
    // Halfway through the next minute, half of the previous 10 still count.
    let halfway = THURSDAY + 90 * S;
    let decision = decide(&limit, &mut state, halfway, 0);
    assert_eq!(decision.remaining, 5);
    assert_eq!(
        run(&limit, &mut state, halfway, 1, 6),
        [true, true, true, true, true, false]
    );
    // Two windows later nothing of it is left.
    let later = decide(&limit, &mut state, THURSDAY + 180 * S, 0);
    assert_eq!(later.remaining, 10);
}

#[test]
fn sliding_window_is_smoother_than_a_fixed_window_at_the_boundary() {
    // A fixed window admits 2x the limit around a boundary; the sliding one does not.
    let sliding = rate(Algorithm::SlidingWindow, 10, Unit::Second, None);
    let fixed = Rate::fixed(10, Unit::Second);
    let (mut s, mut f) = (init(&sliding, THURSDAY), init(&fixed, THURSDAY));
    let before = THURSDAY + S - MS;
    let after = THURSDAY + S + MS;
    assert_eq!(
        run(&sliding, &mut s, before, 1, 10)
            .iter()
            .filter(|a| **a)
            .count(),
        10
    );
    assert_eq!(
        run(&fixed, &mut f, before, 1, 10)
            .iter()
            .filter(|a| **a)
            .count(),
        10
    );
    assert_eq!(
        run(&fixed, &mut f, after, 1, 10)
            .iter()
            .filter(|a| **a)
            .count(),
        10
    );
    assert_eq!(
        run(&sliding, &mut s, after, 1, 10)
            .iter()
            .filter(|a| **a)
            .count(),
        0
    );
}

#[test]
fn token_bucket_bursts_then_refills_continuously() {
    let limit = rate(Algorithm::TokenBucket, 3, Unit::Second, Some(3));
    let mut state = init(&limit, THURSDAY);
    assert_eq!(
        run(&limit, &mut state, THURSDAY, 1, 4),
        [true, true, true, false]
    );
    let denied = decide(&limit, &mut state, THURSDAY, 1);
    assert_eq!(denied.retry_after, Some(333_333_333), "one token per 1/3 s");
    assert_eq!(
        denied.reset_after, 999_999_999,
        "full again after three tokens"
    );
    // Half a token's time earns nothing yet, and the fraction is kept.
    assert!(!decide(&limit, &mut state, THURSDAY + 200 * MS, 1).allowed);
    assert!(decide(&limit, &mut state, THURSDAY + 334 * MS, 1).allowed);
    assert!(!decide(&limit, &mut state, THURSDAY + 334 * MS, 1).allowed);
    // Never more than the burst, however long it rests.
    let rested = decide(&limit, &mut state, THURSDAY + 3_600 * S, 0);
    assert_eq!(rested.remaining, 3);
}

#[test]
fn token_bucket_burst_can_exceed_the_rate() {
    let limit = rate(Algorithm::TokenBucket, 1, Unit::Second, Some(5));
    let mut state = init(&limit, THURSDAY);
    assert_eq!(
        run(&limit, &mut state, THURSDAY, 1, 6),
        [true, true, true, true, true, false]
    );
    assert!(decide(&limit, &mut state, THURSDAY + S, 1).allowed);
}

#[test]
fn gcra_spaces_requests_and_allows_its_burst() {
    let smooth = rate(Algorithm::Gcra, 10, Unit::Second, None);
    let mut state = init(&smooth, THURSDAY);
    assert_eq!(run(&smooth, &mut state, THURSDAY, 1, 2), [true, false]);
    let denied = decide(&smooth, &mut state, THURSDAY + 40 * MS, 1);
    assert_eq!(denied.retry_after, Some(60 * MS));
    assert!(decide(&smooth, &mut state, THURSDAY + 100 * MS, 1).allowed);

    let bursty = rate(Algorithm::Gcra, 10, Unit::Second, Some(5));
    let mut state = init(&bursty, THURSDAY);
    assert_eq!(
        run(&bursty, &mut state, THURSDAY, 1, 6),
        [true, true, true, true, true, false]
    );
    let after = decide(&bursty, &mut state, THURSDAY, 0);
    assert_eq!(after.remaining, 0);
    assert_eq!(
        after.reset_after,
        500 * MS,
        "five emission intervals to drain"
    );
}

/// A small deterministic generator (no dependency needed for this).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound.max(1)
    }
}

#[test]
fn retry_after_is_exactly_when_the_request_would_pass() {
    let mut random = Lcg(7);
    for algorithm in Algorithm::ALL {
        // A multiplier of 7 (`unit_multiplier`): 7-second and 7-minute windows.
        for (unit, multiplier) in [
            (Unit::Second, 1),
            (Unit::Minute, 1),
            (Unit::Second, 7),
            (Unit::Minute, 7),
        ] {
            for round in 0..300 {
                let limit = rate(
                    algorithm,
                    1 + random.next(20) as u32,
                    unit,
                    Some(1 + random.next(20) as u32),
                )
                .every(multiplier)
                .expect("a window");
                let mut now = THURSDAY + random.next(limit.window_nanos());
                let mut state = init(&limit, now);
                // Drive the state somewhere interesting.
                for _ in 0..random.next(40) {
                    now += random.next(limit.window_nanos() / 8);
                    decide(&limit, &mut state, now, 1 + random.next(3));
                }
                let cost = 1 + random.next(4);
                let mut probe = state;
                let decision = decide(&limit, &mut probe, now, cost);
                let context = format!(
                    "{algorithm} {unit} round {round}: {limit:?} {state:?} now {now} cost {cost}"
                );
                match decision.retry_after {
                    Some(0) => assert!(decision.allowed, "{context}"),
                    Some(wait) => {
                        assert!(!decision.allowed, "{context}");
                        let mut at = state;
                        assert!(
                            decide(&limit, &mut at, now + wait, cost).allowed,
                            "{context}: retry {wait}"
                        );
                        let mut before = state;
                        assert!(
                            !decide(&limit, &mut before, now + wait - 1, cost).allowed,
                            "{context}: retry {wait} is not the first moment"
                        );
                    }
                    None => assert!(cost > limit.capacity(), "{context}"),
                }
            }
        }
    }
}

/// What `state` answers at `at` for a range of costs (consuming nothing from the caller's
/// state).
fn answers(rate: &Rate, state: State, at: u64) -> Vec<Decision> {
    let capacity = rate.capacity();
    [0, 1, 2, capacity / 2, capacity, capacity + 1]
        .into_iter()
        .map(|cost| decide(rate, &mut state.clone(), at, cost))
        .collect()
}

#[test]
fn a_state_matters_for_exactly_its_lifetime_and_not_a_nanosecond_more() {
    for algorithm in Algorithm::ALL {
        for (limit, unit, burst) in [(10, Unit::Second, None), (5, Unit::Hour, Some(8))] {
            let rate = rate(algorithm, limit, unit, burst);
            // Hits at several points of a window, then hits some time later.
            for (first, later) in [(0, 1), (unit.nanos() / 3, 2), (unit.nanos() - 1, 3)] {
                let start = THURSDAY + first;
                let mut state = init(&rate, start);
                decide(&rate, &mut state, start, 2);
                let now = start + unit.nanos() / 7 * later / 3;
                let decision = decide(&rate, &mut state, now, 1);
                assert!(decision.allowed, "{algorithm:?} {limit}/{unit}");
                let end = now + lifetime(&rate, decision.reset_after);
                let context = format!("{algorithm:?} {limit}/{unit}, hits at {first} and {now}");
                assert_eq!(
                    answers(&rate, state, end),
                    answers(&rate, init(&rate, end), end),
                    "{context}: at the end of its lifetime a state answers as a fresh one"
                );
                assert_ne!(
                    answers(&rate, state, end - 1),
                    answers(&rate, init(&rate, end - 1), end - 1),
                    "{context}: a nanosecond before, it still matters"
                );
            }
        }
    }
}

#[test]
fn merging_two_nodes_counters_counts_both() {
    for algorithm in Algorithm::ALL {
        let limit = rate(algorithm, 10, Unit::Hour, Some(10));
        let now = THURSDAY + 5 * S;
        let (mut ours, mut theirs, mut together) =
            (init(&limit, now), init(&limit, now), init(&limit, now));
        for _ in 0..3 {
            assert!(decide(&limit, &mut ours, now, 1).allowed);
            assert!(decide(&limit, &mut together, now, 1).allowed);
        }
        for _ in 0..4 {
            assert!(decide(&limit, &mut theirs, now, 1).allowed);
            assert!(decide(&limit, &mut together, now, 1).allowed);
        }
        let mut merged = merge(&limit, ours, theirs, now);
        let expected = decide(&limit, &mut together.clone(), now, 0).remaining;
        assert_eq!(
            decide(&limit, &mut merged.clone(), now, 0).remaining,
            expected,
            "{algorithm}"
        );
        assert_eq!(expected, 3, "{algorithm}");
        assert_eq!(
            run(&limit, &mut merged, now, 1, 4),
            [true, true, true, false],
            "{algorithm}"
        );
    }
}

#[test]
fn merging_with_a_fresh_or_stale_counter_changes_nothing() {
    for algorithm in Algorithm::ALL {
        let limit = rate(algorithm, 10, Unit::Minute, Some(10));
        let now = THURSDAY + 30 * S;
        let mut ours = init(&limit, now);
        decide(&limit, &mut ours, now, 6);
        let fresh = init(&limit, now);
        let stale = {
            let mut old = init(&limit, THURSDAY - 3_600 * S);
            decide(&limit, &mut old, THURSDAY - 3_600 * S, 9);
            old
        };
        for other in [fresh, stale] {
            let merged = merge(&limit, ours, other, now);
            assert_eq!(
                decide(&limit, &mut merged.clone(), now, 0).remaining,
                4,
                "{algorithm}"
            );
        }
    }
}

#[test]
fn a_share_of_a_rate_is_rounded_down_so_the_shares_never_add_up_to_more() {
    let fixed = rate(Algorithm::FixedWindow, 100, Unit::Hour, None);
    assert_eq!(
        fixed.share(3),
        rate(Algorithm::FixedWindow, 33, Unit::Hour, None)
    );
    assert_eq!(fixed.share(1), fixed);
    assert_eq!(fixed.share(0), fixed, "no members is treated as one");
    assert_eq!(fixed.share(200).capacity(), 0, "too small to share: none");
    let bucket = rate(Algorithm::TokenBucket, 10, Unit::Second, Some(20));
    let share = bucket.share(3);
    assert_eq!((share.requests_per_unit, share.burst), (3, 6));
    let gcra = rate(Algorithm::Gcra, 10, Unit::Second, None);
    let share = gcra.share(3);
    assert_eq!((share.requests_per_unit, share.burst), (3, 1));
    let share = gcra.share(20);
    assert_eq!((share.requests_per_unit, share.capacity()), (0, 0));
}

#[test]
fn a_fixed_window_lends_a_share_of_what_remains_and_takes_back_only_in_that_window() {
    let limit = rate(Algorithm::FixedWindow, 100, Unit::Minute, None);
    let minute = Unit::Minute.nanos();
    let now = 10 * minute + 5;
    let mut state = init(&limit, now);
    assert!(decide(&limit, &mut state, now, 4).allowed);
    let lent = lend(&limit, &mut state, now, policy(1_000, 6)).expect("96 remain: 16 lent");
    assert_eq!((lent.units, lent.window, lent.remaining), (16, 10, 80));
    assert_eq!((lent.reset_after, lent.valid_for), (minute - 5, minute - 5));
    assert_eq!(
        lend(&limit, &mut state, now, policy(5, 6)).map(|lent| lent.units),
        Some(5)
    );
    assert_eq!(state.b, 25);
    let picky = LendPolicy {
        least: 14,
        ..policy(100, 6)
    };
    assert_eq!(lend(&limit, &mut state, now, picky), None, "75 / 6 < 14");
    assert_eq!(state.b, 25, "nothing taken");
    // Unspent units come back in the same window only.
    assert_eq!(refund(&limit, &mut state, now + 1, 10, 10), 10);
    assert_eq!(state.b, 15);
    assert_eq!(
        refund(&limit, &mut state, now + 1, 100, 10),
        15,
        "never below zero"
    );
    let mut later = state;
    decide(&limit, &mut later, 11 * minute, 1);
    assert_eq!(
        refund(&limit, &mut later, 11 * minute, 1, 10),
        0,
        "a new window"
    );
    assert_eq!(later.b, 1);
    let mut full = init(&limit, now);
    decide(&limit, &mut full, now, 97);
    assert_eq!(
        lend(&limit, &mut full, now, policy(10, 6)),
        None,
        "too little left"
    );
}

#[test]
fn a_sliding_window_takes_a_loan_back_only_in_the_window_it_came_from() {
    let limit = rate(Algorithm::SlidingWindow, 60, Unit::Minute, None);
    let minute = Unit::Minute.nanos();
    let now = 20 * minute;
    let mut state = init(&limit, now);
    let lent = lend(&limit, &mut state, now, policy(30, 2)).expect("30 of 60");
    assert_eq!((lent.units, lent.window, lent.valid_for), (30, 20, minute));
    assert_eq!(refund(&limit, &mut state, now + 5, 12, 20), 12);
    assert_eq!(decide(&limit, &mut state, now + 5, 0).remaining, 42);
    let mut next = state;
    assert_eq!(
        refund(&limit, &mut next, 21 * minute, 5, 20),
        0,
        "counted, then gone"
    );
}

/// Lends at most `most`, a `1/share` of what remains, however little.
fn policy(most: u64, share: u64) -> LendPolicy {
    LendPolicy {
        most,
        share,
        least: 1,
    }
}

#[test]
fn a_bucket_takes_a_loan_back_at_any_time_as_if_it_had_never_been_taken() {
    let second = Unit::Second.nanos();
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        // 10 per second, bucket of 20.
        let limit = rate(algorithm, 10, Unit::Second, Some(20));
        let now = 100 * second;
        let mut state = init(&limit, now);
        let lent = lend(&limit, &mut state, now, policy(8, 2)).expect("8 of 20");
        assert_eq!(
            (lent.units, lent.remaining, lent.valid_for),
            (8, 12, u64::MAX)
        );
        // Without the loan, 3 spent: what a refund of the other 5 must leave.
        let mut spent_only = init(&limit, now);
        assert!(decide(&limit, &mut spent_only, now, 3).allowed);
        let later = now + second / 4;
        assert_eq!(refund(&limit, &mut state, later, 5, 0), 5, "{algorithm:?}");
        assert_eq!(
            decide(&limit, &mut state, later, 0).remaining,
            decide(&limit, &mut spent_only, later, 0).remaining,
            "{algorithm:?}"
        );
        // Once refilled, nothing more fits: a refund never overfills.
        assert_eq!(refund(&limit, &mut state, later + 10 * second, 3, 0), 0);
        assert_eq!(
            decide(&limit, &mut state, later + 10 * second, 0).remaining,
            20
        );
    }
}

mod model;

#[test]
fn a_counted_rejection_takes_what_is_left_and_ends_like_an_exhausted_limit() {
    for algorithm in Algorithm::ALL {
        let limit = rate(algorithm, 5, Unit::Hour, Some(5));
        let mut state = init(&limit, THURSDAY);
        assert!(apply(&limit, &mut state, THURSDAY, 3, Charge::Always).allowed);
        let rejected = apply(&limit, &mut state, THURSDAY, 4, Charge::Always);
        assert!(!rejected.allowed, "{algorithm}");
        assert_eq!(rejected.remaining, 0, "{algorithm}: the 2 left were taken");
        assert!(
            rejected.retry_after.is_some(),
            "{algorithm}: 4 can pass later"
        );
        // By default the 2 left would still pass; counted, a hit of 1 is rejected too.
        assert!(
            !decide(&limit, &mut state, THURSDAY, 1).allowed,
            "{algorithm}"
        );
        // No debt: exactly the state of a limit that admitted 5.
        let mut exhausted = init(&limit, THURSDAY);
        assert!(decide(&limit, &mut exhausted, THURSDAY, 5).allowed);
        assert_eq!(state, exhausted, "{algorithm}");
        // A cost no limit admits is counted alike, and still never passes.
        let mut fresh = init(&limit, THURSDAY);
        let never = apply(&limit, &mut fresh, THURSDAY, u64::MAX, Charge::Always);
        assert_eq!(
            (never.allowed, never.retry_after),
            (false, None),
            "{algorithm}"
        );
        assert_eq!(fresh, exhausted, "{algorithm}");
    }
}

#[test]
fn a_refund_is_allowed_and_gives_back_never_below_zero_used_nor_above_capacity() {
    for algorithm in Algorithm::ALL {
        let limit = rate(algorithm, 5, Unit::Hour, Some(5));
        let mut state = init(&limit, THURSDAY);
        assert!(decide(&limit, &mut state, THURSDAY, 4).allowed);
        let refund = apply(&limit, &mut state, THURSDAY + 1, 3, Charge::Refund);
        assert!(refund.allowed, "{algorithm}");
        assert_eq!(refund.retry_after, Some(0), "{algorithm}");
        assert_eq!(refund.remaining, 4, "{algorithm}: 1 left, 3 given back");
        let all = apply(&limit, &mut state, THURSDAY + 1, u64::MAX, Charge::Refund);
        assert_eq!(all.remaining, 5, "{algorithm}: never above capacity");
        assert_eq!(
            run(&limit, &mut state, THURSDAY + 1, 1, 6),
            [true, true, true, true, true, false],
            "{algorithm}: exactly the capacity passes after a refund of 2^64 - 1"
        );
    }
    // A window gives back only what the current window counted.
    let limit = Rate::fixed(5, Unit::Minute);
    let mut state = init(&limit, THURSDAY);
    assert!(decide(&limit, &mut state, THURSDAY, 5).allowed);
    assert!(decide(&limit, &mut state, THURSDAY + 60 * S, 2).allowed);
    let refund = apply(&limit, &mut state, THURSDAY + 61 * S, 4, Charge::Refund);
    assert_eq!(
        refund.remaining, 5,
        "the 5 of the window before are gone anyway"
    );
    // A limit that denies everything has nothing to give back, and stays shut.
    let shut = Rate::fixed(0, Unit::Minute);
    let mut state = init(&shut, THURSDAY);
    let refund = apply(&shut, &mut state, THURSDAY, 3, Charge::Refund);
    assert!(refund.allowed && refund.remaining == 0);
    assert!(!decide(&shut, &mut state, THURSDAY, 1).allowed);
}

#[test]
fn a_cost_no_limit_can_admit_is_denied_and_consumes_nothing_with_hits_already_counted() {
    // The finding: hits_addend 2^64 - 1 against 5/hour with 3 used wrapped to 2 and passed.
    let huge = [
        6,
        u64::from(u32::MAX),
        1 << 32,
        (1 << 53) + 1,
        1 << 63,
        u64::MAX - 2,
        u64::MAX,
    ];
    for algorithm in Algorithm::ALL {
        for cost in huge {
            let limit = rate(algorithm, 5, Unit::Hour, Some(5));
            let mut state = init(&limit, THURSDAY);
            assert!(decide(&limit, &mut state, THURSDAY, 3).allowed);
            let before = state;
            let decision = decide(&limit, &mut state, THURSDAY + 1, cost);
            assert!(!decision.allowed, "{algorithm} cost {cost}");
            assert_eq!(decision.retry_after, None, "{algorithm} cost {cost}: never");
            assert_eq!(decision.remaining, 2, "{algorithm} cost {cost}");
            let mut check = before;
            assert_eq!(
                decide(&limit, &mut state, THURSDAY + 1, 0).remaining,
                decide(&limit, &mut check, THURSDAY + 1, 0).remaining,
                "{algorithm} cost {cost}: nothing consumed"
            );
            assert_eq!(
                run(&limit, &mut state, THURSDAY + 1, 1, 3),
                [true, true, false],
                "{algorithm} cost {cost}: exactly the 2 left pass"
            );
        }
    }
}
