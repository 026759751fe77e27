//! `token_bucket`: a bucket of `burst` tokens (default `requests_per_unit`), refilled
//! continuously at `requests_per_unit` per `unit`; a hit takes one token.
//!
//! State: `a` = the time of the last refill (ns), `b` = whole tokens left; the fraction of
//! a token earned so far is kept as the time since `a`. It matters until the bucket would
//! be full again. Its Redis twin is `token_bucket.lua`.

use std::time::Duration;

use super::{Decision, Kernel, Rate, State, bucket, clamp_u32, nanos};

pub(crate) struct TokenBucket;

impl Kernel for TokenBucket {
    const NAME: &'static str = "token_bucket";
    const CODE: u8 = 2;
    const USES_BURST: bool = true;
    const LUA: &'static str = include_str!("token_bucket.lua");

    #[inline]
    fn burst(requests_per_unit: u32, burst: Option<u32>) -> u32 {
        burst.unwrap_or(requests_per_unit)
    }

    #[inline]
    fn share_burst(rate: &Rate, requests_per_unit: u32, members: u32) -> u32 {
        bucket::share_burst(rate, requests_per_unit, members)
    }

    #[inline]
    fn capacity(rate: &Rate) -> u64 {
        bucket::capacity(rate)
    }

    #[inline]
    fn refill_time(rate: &Rate) -> Duration {
        bucket::refill_time(rate)
    }

    #[inline]
    fn init(rate: &Rate, now: u64) -> State {
        State {
            a: now,
            b: rate.burst,
        }
    }

    #[inline]
    fn from_numbers(_rate: &Rate, _time: u64, [tokens, seconds, nanoseconds]: [u64; 3]) -> State {
        State {
            a: nanos(seconds, nanoseconds),
            b: clamp_u32(tokens),
        }
    }

    #[inline]
    fn step(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
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

    #[inline]
    fn give_back(rate: &Rate, state: &mut State, _now: u64, cost: u64) {
        let burst = u64::from(rate.burst);
        let tokens = u64::from(state.b).min(burst);
        state.b = clamp_u32(tokens.saturating_add(cost).min(burst));
    }

    #[inline]
    fn window(_state: &State) -> Option<u64> {
        None
    }

    #[inline]
    fn refund(rate: &Rate, state: &mut State, _now: u64, units: u64) -> u64 {
        let burst = u64::from(rate.burst);
        let tokens = u64::from(state.b).min(burst);
        let back = units.min(burst - tokens);
        state.b = clamp_u32(tokens + back);
        back
    }

    #[inline]
    fn lifetime(_rate: &Rate, reset_after: u64) -> u64 {
        reset_after
    }

    #[inline]
    fn merge(rate: &Rate, ours: State, theirs: State, _now: u64) -> State {
        let burst = rate.burst;
        let used = (burst - ours.b.min(burst)).saturating_add(burst - theirs.b.min(burst));
        State {
            a: ours.a,
            b: burst - used.min(burst),
        }
    }
}
