//! The max-min fair division of one bucket's limit among the Envoys reporting it, and the
//! token bucket each Envoy is assigned from its share. Pure: no clock, no IO.
//!
//! Invariants:
//! - The shares of a bucket never add up to more than its limit, except that every reporter
//!   keeps at least one token per unit: with more reporters than the limit, the sum is the
//!   number of reporters (documented in docs/rlqs.md).
//! - An idle reporter keeps a small share ([`FLOOR_DIVISOR`]); a reporter whose demand is not
//!   known yet (a newcomer) is treated as wanting the whole limit, so it gets a fair share at
//!   once and the others shrink.
//! - What is not wanted is spread evenly over every reporter (headroom to grow into until
//!   the next report), so the whole limit is always handed out.

/// The floors of all reporters together take at most `1 / FLOOR_DIVISOR` of the limit
/// (5 %): what an idle reporter keeps, so its first requests after a quiet spell pass.
pub const FLOOR_DIVISOR: u64 = 20;

/// Divides `limit` (tokens per unit) among reporters that want `demands` (tokens per unit;
/// `None`: not known yet, wants everything). Returns one share per reporter, in order.
///
/// Each reporter first gets a floor of `max(1, limit / (20 n))`; the rest of the limit is
/// water-filled: reporters wanting less than an equal part of what is left get what they
/// want, the others split the remainder evenly. What nobody wants is spread evenly.
pub fn divide(limit: u64, demands: &[Option<u64>]) -> Vec<u64> {
    let n = demands.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let floor = (limit / FLOOR_DIVISOR.saturating_mul(n)).max(1);
    let mut shares = vec![floor; demands.len()];
    let mut pool = limit.saturating_sub(floor.saturating_mul(n));
    // What each wants beyond its floor; a newcomer wants all of it.
    let wants: Vec<u64> = demands
        .iter()
        .map(|demand| demand.map_or(limit, |demand| demand.saturating_sub(floor)))
        .collect();
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|&index| wants[index]);
    for (served, &index) in order.iter().enumerate() {
        let left = n - served as u64;
        let give = wants[index].min(pool / left);
        shares[index] += give;
        pool -= give;
    }
    // Nobody wants the rest (or it is the rounding of the even split): spread it evenly,
    // the odd tokens to the reporters wanting most.
    let each = pool / n;
    let mut odd = pool % n;
    for &index in order.iter().rev() {
        shares[index] += each;
        if odd > 0 {
            shares[index] += 1;
            odd -= 1;
        }
    }
    shares
}

/// Whether a reporter keeps its current share `old` instead of the newly divided `new`.
///
/// Envoy starts a new token bucket full whenever an assignment changes (its burst again),
/// so small changes are not worth sending. Only a small increase is held back (at most
/// 1/16 of the new share): holding back an increase never makes the shares add up to more
/// than the limit, where holding back a decrease could.
pub fn keeps(old: u64, new: u64) -> bool {
    old <= new && new - old <= new / 16
}

/// The token bucket an Envoy enforces for a share of a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    /// Tokens the bucket holds at most (and starts with).
    pub max_tokens: u32,
    /// Tokens added per `fill_interval_secs` (Envoy refills continuously at this rate).
    pub tokens_per_fill: u32,
    /// Whole seconds (Envoy reads only the seconds).
    pub fill_interval_secs: u64,
}

/// The token bucket for `share` of a limit of `limit` per `unit_secs` whose own burst is
/// `burst`: refilled at the share's rate, holding the share's part of the burst (at least
/// one token), so the buckets of all reporters hold about one limit's burst together.
pub fn token_bucket(share: u64, limit: u64, burst: u64, unit_secs: u64) -> TokenBucket {
    let share = share.max(1);
    let max_tokens = if limit == 0 {
        1
    } else {
        // ceil(burst * share / limit), in u128 so the product cannot overflow.
        let scaled = (u128::from(burst) * u128::from(share)).div_ceil(u128::from(limit));
        u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
    };
    TokenBucket {
        max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
        tokens_per_fill: u32::try_from(share).unwrap_or(u32::MAX),
        fill_interval_secs: unit_secs.max(1),
    }
}

/// Requests per `unit_secs` from `count` requests seen over `elapsed_nanos`, rounded to
/// the nearest (at least one second is assumed: Envoy's first report of a bucket covers
/// 0 s).
pub fn rate_per_unit(count: u64, elapsed_nanos: u128, unit_secs: u64) -> u64 {
    let elapsed = elapsed_nanos.max(1_000_000_000);
    let per_unit = u128::from(count)
        .saturating_mul(u128::from(unit_secs))
        .saturating_mul(1_000_000_000)
        .saturating_add(elapsed / 2)
        / elapsed;
    u64::try_from(per_unit).unwrap_or(u64::MAX)
}

/// What a reporter is taken to want from its measured `rate`: 1/8 and one request more,
/// so a steady reporter is not held at exactly its rate (where any jitter is denied) and
/// its share does not flap with the rounding of each interval.
pub fn demand(rate: u64) -> u64 {
    rate.saturating_add(rate / 8).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(limit: u64, demands: &[Option<u64>], expected: &[u64]) {
        let shares = divide(limit, demands);
        assert_eq!(shares, expected, "divide({limit}, {demands:?})");
        if limit >= demands.len() as u64 {
            assert!(
                shares.iter().sum::<u64>() <= limit,
                "{shares:?} over {limit}"
            );
        }
    }

    #[test]
    fn max_min_fair_division() {
        // Alone: everything.
        check(100, &[Some(500)], &[100]);
        check(100, &[Some(0)], &[100]);
        // Two busy reporters split evenly.
        check(100, &[Some(500), Some(500)], &[50, 50]);
        // 80/20 under the limit: each gets its demand, the rest is spread evenly.
        check(100, &[Some(40), Some(10)], &[65, 35]);
        // 80/20 over the limit: the light one gets its demand, the busy one the rest.
        check(100, &[Some(160), Some(40)], &[60, 40]);
        // An idle reporter keeps its floor (100 / 40 = 2), the busy one takes the rest.
        check(100, &[Some(0), Some(1000)], &[2, 98]);
        // A newcomer (demand unknown) gets a fair share at once.
        check(100, &[Some(1000), None], &[50, 50]);
        check(90, &[Some(1000), Some(1000), None], &[30, 30, 30]);
        // Three with uneven demand.
        check(100, &[Some(10), Some(100), Some(30)], &[10, 60, 30]);
        // More reporters than the limit: one token each.
        check(2, &[Some(5), Some(5), Some(5)], &[1, 1, 1]);
        // Nothing to divide among nobody.
        check(10, &[], &[]);
    }

    #[test]
    fn shares_never_exceed_the_limit() {
        let demands: Vec<Option<u64>> = (0..7u64).map(|i| Some(i * 37 % 101)).collect();
        for limit in [7, 10, 99, 100, 1000, u64::from(u32::MAX)] {
            for n in 1..=demands.len() {
                let shares = divide(limit, &demands[..n]);
                assert!(shares.iter().sum::<u64>() <= limit, "{limit} {shares:?}");
                assert!(shares.iter().all(|&share| share >= 1));
            }
        }
        assert_eq!(divide(u64::MAX, &[Some(u64::MAX), None]).len(), 2);
    }

    proptest::proptest! {
        /// Max-min fairness: the shares fit the limit, everyone keeps at least one token,
        /// and a reporter that gets less than it wants gets no less than anyone else
        /// (within one token of rounding).
        #[test]
        fn division_is_max_min_fair(
            limit in 0u64..1_000_000,
            demands in proptest::collection::vec(proptest::option::of(0u64..2_000_000), 0..8),
        ) {
            let shares = divide(limit, &demands);
            proptest::prop_assert_eq!(shares.len(), demands.len());
            if limit >= demands.len() as u64 {
                proptest::prop_assert!(shares.iter().sum::<u64>() <= limit);
            }
            proptest::prop_assert!(shares.iter().all(|&share| share >= 1));
            for (index, demand) in demands.iter().enumerate() {
                let wants = demand.unwrap_or(limit);
                if shares[index] < wants {
                    for other in &shares {
                        proptest::prop_assert!(*other <= shares[index] + 1, "{shares:?} {demands:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn only_small_increases_are_held_back() {
        assert!(keeps(50, 50));
        assert!(keeps(48, 50));
        assert!(!keeps(40, 50));
        // A decrease is always sent, or the shares could add up to more than the limit.
        assert!(!keeps(51, 50));
    }

    #[test]
    fn token_buckets_scale_the_burst_with_the_share() {
        assert_eq!(
            token_bucket(30, 100, 100, 60),
            TokenBucket {
                max_tokens: 30,
                tokens_per_fill: 30,
                fill_interval_secs: 60
            }
        );
        assert_eq!(token_bucket(1, 100, 10, 1).max_tokens, 1);
        assert_eq!(token_bucket(0, 0, 0, 0).fill_interval_secs, 1);
        assert_eq!(
            token_bucket(u64::MAX, 1, u64::MAX, 1).tokens_per_fill,
            u32::MAX
        );
    }

    #[test]
    fn demand_is_a_rate_per_unit() {
        // 50 requests in 5 s is 10 per second, 600 per minute.
        assert_eq!(rate_per_unit(50, 5_000_000_000, 1), 10);
        assert_eq!(rate_per_unit(50, 5_000_000_000, 60), 600);
        // Envoy's first report covers 0 s: read as 1 s.
        assert_eq!(rate_per_unit(3, 0, 1), 3);
        assert_eq!(rate_per_unit(u64::MAX, 1, 31_536_000), u64::MAX);
        // Saturating, never a panic.
        assert_eq!(rate_per_unit(u64::MAX, u128::MAX, u64::MAX), 1);
        // 30 requests in a little over 5 s is still 6 per second.
        assert_eq!(rate_per_unit(30, 5_002_000_000, 1), 6);
        assert_eq!(demand(0), 1);
        assert_eq!(demand(40), 46);
        assert_eq!(demand(u64::MAX), u64::MAX);
    }
}
