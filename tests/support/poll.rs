//! Bounded polling: wait for a condition with a deadline instead of a fixed sleep.
//!
//! Every wait backs off from 5 ms to 100 ms and gives up at its timeout, returning what it
//! saw; the caller decides how to fail.

use std::thread;
use std::time::{Duration, Instant};

/// Polls `condition` until it holds or `timeout` passes; returns whether it held. Backs off
/// from 5 ms to 100 ms between polls.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    eventually_some(timeout, || condition().then_some(())).is_some()
}

/// Polls `probe` until it yields a value or `timeout` passes.
pub fn eventually_some<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// [`eventually`] for async conditions; sleeps on the tokio timer between polls.
pub async fn eventually_async<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if condition().await {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// When each of `count` conditions first held after `since`: `holds(i)` polled every 20 ms
/// until all have held or `observe` has passed since `since` (`None`: not within it). For
/// measuring how fast something happens, not only whether it does.
pub async fn first_times(
    since: Instant,
    observe: Duration,
    count: usize,
    mut holds: impl FnMut(usize) -> bool,
) -> Vec<Option<Duration>> {
    let mut seen: Vec<Option<Duration>> = vec![None; count];
    while since.elapsed() < observe && seen.contains(&None) {
        for (index, first) in seen.iter_mut().enumerate() {
            if first.is_none() && holds(index) {
                *first = Some(since.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen
}
