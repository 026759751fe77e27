//! `gcra`: the generic cell rate algorithm: one hit every `unit / requests_per_unit`, with
//! up to `burst` (default 1) hits at once.
//!
//! State: `a` = the theoretical arrival time (ns), `b` unused. It matters until that time
//! (the bucket is full again). Its Redis twin is `gcra.lua`.

use std::time::Duration;

use super::{Decision, Kernel, Rate, State, bucket, clamp_u32, nanos};

pub(crate) struct Gcra;

impl Kernel for Gcra {
    const NAME: &'static str = "gcra";
    const CODE: u8 = 3;
    const USES_BURST: bool = true;
    const LUA: &'static str = include_str!("gcra.lua");

    #[inline]
    fn burst(_requests_per_unit: u32, burst: Option<u32>) -> u32 {
        burst.unwrap_or(1)
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
    fn init(_rate: &Rate, now: u64) -> State {
        State { a: now, b: 0 }
    }

    #[inline]
    fn from_numbers(_rate: &Rate, _time: u64, [seconds, nanoseconds, _]: [u64; 3]) -> State {
        State {
            a: nanos(seconds, nanoseconds),
            b: 0,
        }
    }

    #[inline]
    fn step(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
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

    #[inline]
    fn give_back(rate: &Rate, state: &mut State, now: u64, cost: u64) {
        let tat = state.a.max(now);
        let back = cost.saturating_mul(rate.emission_interval()).min(tat - now);
        state.a = tat - back;
    }

    #[inline]
    fn window(_state: &State) -> Option<u64> {
        None
    }

    #[inline]
    fn refund(rate: &Rate, state: &mut State, now: u64, units: u64) -> u64 {
        let interval = rate.emission_interval();
        let tat = state.a.max(now);
        let back = units.min((tat - now) / interval);
        state.a = tat - back * interval;
        back
    }

    #[inline]
    fn lifetime(_rate: &Rate, reset_after: u64) -> u64 {
        reset_after
    }

    #[inline]
    fn merge(_rate: &Rate, ours: State, theirs: State, now: u64) -> State {
        // Each side's theoretical arrival time is ahead of `now` by what it consumed.
        let ahead = |tat: u64| tat.saturating_sub(now);
        State {
            a: now.saturating_add(ahead(ours.a)).saturating_add(ahead(theirs.a)),
            b: 0,
        }
    }
}
