//! A consecutive-failure circuit breaker for anything remote that can stop answering (a
//! peer node, an external counter store), so a dead dependency costs a fast answer by
//! policy instead of a timeout per request. A leaf: it knows no other module.
//!
//! Invariants: at most one probe is in flight while open; a probe that is never sent or
//! whose caller went away must be given back ([`Breaker::abandon`]), so the breaker cannot
//! stay refusing for good.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A consecutive-failure circuit breaker. Closed: calls go through. Open: calls are refused
/// until the cooldown passes. Half-open (after the cooldown): one call at a time probes the
/// peer while the others are still refused; its success closes the breaker, its failure
/// opens it for another cooldown.
#[derive(Debug)]
pub struct Breaker {
    failures: AtomicU32,
    open: AtomicBool,
    /// A half-open probe is in flight.
    probing: AtomicBool,
    /// Milliseconds since `base` until which calls are refused.
    open_until: AtomicU64,
    base: Instant,
    threshold: u32,
    cooldown: Duration,
}

impl Breaker {
    pub fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            open_until: AtomicU64::new(0),
            base: Instant::now(),
            threshold: threshold.max(1),
            cooldown,
        }
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether a call is refused right now. Past the cooldown, the first caller becomes the
    /// probe (and must report its outcome, or call [`Breaker::abandon`]).
    pub fn refuses(&self) -> bool {
        if !self.open.load(Ordering::Relaxed) {
            return false;
        }
        if self.millis() < self.open_until.load(Ordering::Relaxed) {
            return true;
        }
        self.probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    }

    /// A probe that was never sent: let the next caller probe instead.
    pub fn abandon(&self) {
        self.probing.store(false, Ordering::Release);
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Records a good call; true if this closed an open breaker.
    pub fn succeeded(&self) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        let was_open = self.open.swap(false, Ordering::Relaxed);
        self.probing.store(false, Ordering::Release);
        was_open
    }

    /// Records a failed call; true if this opened a closed breaker.
    pub fn failed(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < self.threshold {
            return false;
        }
        let cooldown = u64::try_from(self.cooldown.as_millis()).unwrap_or(u64::MAX);
        self.open_until
            .store(self.millis().saturating_add(cooldown), Ordering::Relaxed);
        let opened = !self.open.swap(true, Ordering::Relaxed);
        self.probing.store(false, Ordering::Release);
        opened
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_breaker_opens_after_consecutive_failures_and_closes_on_success() {
        let breaker = Breaker::new(3, Duration::from_secs(60));
        assert!(!breaker.failed());
        assert!(!breaker.failed());
        assert!(!breaker.refuses());
        assert!(breaker.failed(), "the third failure opens it");
        assert!(breaker.refuses());
        assert!(!breaker.failed(), "already open: no second transition");
        assert!(breaker.succeeded(), "a success closes it");
        assert!(!breaker.is_open());
        assert!(!breaker.failed(), "the count starts over");
    }

    #[test]
    fn after_the_cooldown_one_probe_at_a_time_goes_through() {
        let breaker = Breaker::new(1, Duration::ZERO);
        assert!(breaker.failed());
        assert!(breaker.is_open());
        assert!(!breaker.refuses(), "zero cooldown: the first caller probes");
        assert!(breaker.refuses(), "the others wait for the probe's outcome");
        assert!(!breaker.failed(), "a failed probe keeps it open");
        assert!(!breaker.refuses(), "next cooldown over: a new probe");
        breaker.abandon();
        assert!(!breaker.refuses(), "an abandoned probe frees the slot");
        assert!(breaker.succeeded(), "a good probe closes it");
        assert!(!breaker.refuses());
        assert!(!breaker.refuses(), "closed: everyone goes through");
    }
}
