//! `fixed_window`: at most `requests_per_unit` hits per epoch-aligned window of one `unit`,
//! the reference service's only algorithm.
//!
//! State: `a` = the window's index since the epoch, `b` = hits counted in it. A count
//! matters until its window ends. Its Redis twin is `fixed_window.lua`.

use super::{Decision, Kernel, Rate, State, clamp_u32, take_back, window_capacity, until_window_end};

pub(crate) struct FixedWindow;

impl Kernel for FixedWindow {
    const NAME: &'static str = "fixed_window";
    const CODE: u8 = 0;
    const USES_BURST: bool = false;
    const LUA: &'static str = include_str!("fixed_window.lua");

    #[inline]
    fn burst(requests_per_unit: u32, _burst: Option<u32>) -> u32 {
        requests_per_unit
    }

    #[inline]
    fn share_burst(_rate: &Rate, requests_per_unit: u32, _members: u32) -> u32 {
        requests_per_unit
    }

    #[inline]
    fn capacity(rate: &Rate) -> u64 {
        window_capacity(rate)
    }

    #[inline]
    fn init(rate: &Rate, now: u64) -> State {
        State {
            a: now / rate.window_nanos(),
            b: 0,
        }
    }

    #[inline]
    fn from_numbers(rate: &Rate, time: u64, [used, _, _]: [u64; 3]) -> State {
        let window = time / rate.window_nanos();
        State {
            a: window,
            b: clamp_u32(used),
        }
    }

    #[inline]
    fn step(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
        let window = now / rate.window_nanos();
        if state.a != window {
            *state = State { a: window, b: 0 };
        }
        let limit = u64::from(rate.requests_per_unit);
        let used = u64::from(state.b);
        let reset_after = until_window_end(rate, now);
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

    #[inline]
    fn give_back(_rate: &Rate, state: &mut State, _now: u64, cost: u64) {
        take_back(state, cost);
    }

    #[inline]
    fn window(state: &State) -> Option<u64> {
        Some(state.a)
    }

    #[inline]
    fn refund(_rate: &Rate, state: &mut State, _now: u64, units: u64) -> u64 {
        take_back(state, units)
    }

    #[inline]
    fn lifetime(_rate: &Rate, reset_after: u64) -> u64 {
        reset_after
    }

    #[inline]
    fn merge(_rate: &Rate, ours: State, theirs: State, _now: u64) -> State {
        State {
            a: ours.a,
            b: ours.b.saturating_add(theirs.b),
        }
    }
}
