//! `sliding_window`: like a fixed window, but the previous window's count is weighted by
//! how much of it still overlaps the sliding window ending now (the two-window
//! approximation).
//!
//! State: `a` = (window index mod 2^32) << 32 | the previous window's hits, `b` = hits in
//! the current window. A count matters until the end of the window after its own (where
//! it weighs in as the previous count). Its Redis twin is `sliding_window.lua`.

use super::{Decision, Kernel, Rate, State, clamp_u32, take_back, window_capacity};

pub(crate) struct SlidingWindow;

/// The state's `a`: the window's index (mod 2^32) and the previous window's count.
#[inline]
pub(crate) fn pack(window: u64, previous: u32) -> u64 {
    ((window & 0xffff_ffff) << 32) | u64::from(previous)
}

impl Kernel for SlidingWindow {
    const NAME: &'static str = "sliding_window";
    const CODE: u8 = 1;
    const USES_BURST: bool = false;
    const LUA: &'static str = include_str!("sliding_window.lua");

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
            a: pack(now / rate.window_nanos(), 0),
            b: 0,
        }
    }

    #[inline]
    fn from_numbers(rate: &Rate, time: u64, [previous, current, _]: [u64; 3]) -> State {
        let window = time / rate.window_nanos();
        State {
            a: pack(window, clamp_u32(previous)),
            b: clamp_u32(current),
        }
    }

    #[inline]
    fn step(rate: &Rate, state: &mut State, now: u64, cost: u64) -> Decision {
        let len = rate.window_nanos();
        let window = now / len;
        let elapsed = now % len;
        let stored = state.a >> 32;
        let (previous, current) = match (window & 0xffff_ffff).wrapping_sub(stored) & 0xffff_ffff
        {
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
            state.a = pack(window, clamp_u32(previous));
            state.b = clamp_u32(current);
            let remaining = (limit128 * len128).saturating_sub(estimate) / len128;
            return Decision {
                allowed: false,
                remaining: clamp_u32(u64::try_from(remaining).unwrap_or(u64::MAX)),
                reset_after,
                retry_after: retry_after(previous, current, cost, limit, len, elapsed),
            };
        }
        // Admitted, so `current + cost <= limit`.
        let current = current + cost;
        state.a = pack(window, clamp_u32(previous));
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

    #[inline]
    fn give_back(_rate: &Rate, state: &mut State, _now: u64, cost: u64) {
        take_back(state, cost);
    }

    #[inline]
    fn window(state: &State) -> Option<u64> {
        Some(state.a >> 32)
    }

    #[inline]
    fn refund(_rate: &Rate, state: &mut State, _now: u64, units: u64) -> u64 {
        take_back(state, units)
    }

    #[inline]
    fn lifetime(rate: &Rate, reset_after: u64) -> u64 {
        reset_after.saturating_add(rate.window_nanos())
    }

    #[inline]
    fn merge(_rate: &Rate, ours: State, theirs: State, _now: u64) -> State {
        let previous = (ours.a & 0xffff_ffff) + (theirs.a & 0xffff_ffff);
        State {
            a: pack(ours.a >> 32, clamp_u32(previous)),
            b: ours.b.saturating_add(theirs.b),
        }
    }
}

/// Nanoseconds until `cost` more hits fit under the sliding estimate, or `None` if never.
///
/// With `x` the part of the previous window still inside the sliding window, a hit fits when
/// `previous * x + (current + cost) * len <= limit * len`.
fn retry_after(
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
