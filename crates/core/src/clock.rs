//! Wall-clock time for the shards, read through tokio's clock.
//!
//! Algorithms need Unix time (windows align to the epoch) but tests need to control it.
//! A [`Clock`] pins a Unix timestamp to a `tokio::time::Instant` once and measures from
//! there, so `#[tokio::test(start_paused = true)]` plus `tokio::time::advance` moves it.
//! Tests that wait on real IO (a Redis server) cannot pause tokio's time, which would jump
//! to the next deadline while the IO is pending; they use [`Clock::manual`] instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base_unix: u64,
    base: Instant,
    /// Set: the clock reads this, and only moves when it is stored to.
    manual: Option<&'static AtomicU64>,
}

impl Clock {
    /// The system's Unix time, measured monotonically from now on.
    pub fn system() -> Clock {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Clock::starting_at(u64::try_from(unix.as_nanos()).unwrap_or(u64::MAX))
    }

    /// A clock that reads `unix_nanos` now (tests).
    pub fn starting_at(unix_nanos: u64) -> Clock {
        Clock {
            base_unix: unix_nanos,
            base: Instant::now(),
            manual: None,
        }
    }

    /// A clock that reads `time` (Unix nanoseconds) and moves only when it is stored to
    /// (tests that wait on real IO). Waiting (`max_wait`) is measured from when it was made.
    pub fn manual(time: &'static AtomicU64) -> Clock {
        Clock {
            manual: Some(time),
            ..Clock::starting_at(time.load(Ordering::SeqCst))
        }
    }

    /// Nanoseconds since the Unix epoch.
    pub fn now(&self) -> u64 {
        match self.manual {
            Some(time) => time.load(Ordering::SeqCst),
            None => self.unix_at(Instant::now()),
        }
    }

    /// What this clock reads at `instant` (lets a caller read the time once and reuse it).
    pub fn unix_at(&self, instant: Instant) -> u64 {
        let elapsed = instant.saturating_duration_since(self.base);
        let elapsed = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.base_unix.saturating_add(elapsed)
    }

    /// The tokio instant at which this clock reads `unix_nanos`.
    pub fn instant_at(&self, unix_nanos: u64) -> Instant {
        let offset = unix_nanos.saturating_sub(self.base_unix);
        self.base + Duration::from_nanos(offset)
    }
}
