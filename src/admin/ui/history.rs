//! The dashboard's recent past: per configured limit, its hits and over-limit hits since
//! start (what `/metrics` reports, [`Limiter::limit_totals`]), sampled every [`INTERVAL`]
//! for the last [`KEEP`] samples (10 minutes), so a page opened now charts the minutes
//! before it was opened.
//!
//! A background task samples ([`History::spawn`]); nothing here is on the request path
//! (a sample reads the per-limit atomics and the limits snapshot). `/ui/data` reads the
//! series ([`History::series`]).
//!
//! Invariants: bounded: one series per configured limit, at most [`MAX_SERIES`], each a
//! ring of at most `keep` samples; a limit no longer configured loses its series at the
//! next sample. The lock is held for one sample or one read, never across an `.await`. The
//! task holds only weak references: it ends at its next tick once the last [`History`]
//! handle (or the limiter) is gone.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use crate::algorithm::NANOS_PER_SEC;
use crate::clock::Clock;
use crate::limiter::Limiter;

/// Time between two samples.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Samples kept per limit: 10 minutes at one every [`INTERVAL`].
pub const KEEP: usize = 60;
/// Limits followed at most (like the page's rows, [`super::MAX_ROWS`]); others are counted
/// in [`Series`]' `truncated`.
pub const MAX_SERIES: usize = super::MAX_ROWS;

/// One limit's totals at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    /// Unix milliseconds.
    pub at_ms: u64,
    /// Hits counted against the limit since start.
    pub hits: u64,
    /// Of those, hits over the limit.
    pub over: u64,
}

/// Which limit a series follows: the page's key (`domain|path|name`, or `#position` among
/// its entry's limits for an unnamed one), stable across reloads that keep the limit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SeriesKey {
    pub domain: Box<str>,
    pub path: Box<str>,
    pub limit: Box<str>,
}

impl SeriesKey {
    /// `domain|path|limit`, as the page names a limit.
    pub fn joined(&self) -> String {
        format!("{}|{}|{}", self.domain, self.path, self.limit)
    }
}

/// The series of every followed limit, in config order (domains by name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    pub series: Vec<(SeriesKey, Vec<Point>)>,
    /// Limits not followed (beyond [`MAX_SERIES`]) at the last sample.
    pub truncated: usize,
}

#[derive(Default)]
struct Rings {
    series: Vec<(SeriesKey, VecDeque<Point>)>,
    truncated: usize,
}

struct Shared {
    rings: Mutex<Rings>,
    clock: Clock,
    interval: Duration,
    keep: usize,
}

/// A handle to the sampled history; clones share it.
#[derive(Clone)]
pub struct History {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("interval", &self.shared.interval)
            .field("keep", &self.shared.keep)
            .finish()
    }
}

impl History {
    /// An empty history of `keep` samples every `interval`, read through `clock`; nothing
    /// samples it until [`History::spawn`]'s task or [`History::sample`] does.
    pub fn new(clock: Clock, interval: Duration, keep: usize) -> History {
        History {
            shared: Arc::new(Shared {
                rings: Mutex::default(),
                clock,
                interval,
                keep: keep.max(1),
            }),
        }
    }

    /// A history of [`KEEP`] samples every [`INTERVAL`] of `limiter`'s limits, and the task
    /// that samples it (at once, then every interval), on the current tokio runtime.
    pub fn spawn(limiter: &Arc<Limiter>, clock: Clock) -> History {
        History::new(clock, INTERVAL, KEEP).sampled_from(limiter)
    }

    /// Starts the task sampling `limiter` into this history (at once, then every interval).
    pub fn sampled_from(self, limiter: &Arc<Limiter>) -> History {
        let sampler = Sampler {
            history: Arc::downgrade(&self.shared),
            limiter: Arc::downgrade(limiter),
            interval: self.shared.interval,
        };
        tokio::spawn(sampler.run());
        self
    }

    pub fn interval(&self) -> Duration {
        self.shared.interval
    }

    pub fn keep(&self) -> usize {
        self.shared.keep
    }

    /// Unix milliseconds by this history's clock (the page's "now" on its time axis).
    pub fn now_ms(&self) -> u64 {
        self.shared.clock.now() / (NANOS_PER_SEC / 1000)
    }

    /// A copy of every series.
    pub fn series(&self) -> Series {
        let rings = self.lock();
        Series {
            series: rings
                .series
                .iter()
                .map(|(key, points)| (key.clone(), points.iter().copied().collect()))
                .collect(),
            truncated: rings.truncated,
        }
    }

    /// Samples `limiter`'s per-limit totals now: one point more per configured limit (the
    /// oldest dropped past `keep`), series of limits no longer configured dropped.
    pub fn sample(&self, limiter: &Limiter) {
        let at_ms = self.now_ms();
        let snapshot = limiter.limits().load_full();
        // Read every total first, then take the lock only to move the rings.
        let mut current: Vec<(SeriesKey, Point)> = Vec::new();
        let mut truncated = 0;
        for (domain, nodes) in super::in_config_order(&snapshot) {
            let totals = limiter.limit_totals(domain.name());
            for node in nodes {
                for (position, limit) in node.limits.iter().enumerate() {
                    if limit.rate.is_none() {
                        continue;
                    }
                    if current.len() >= MAX_SERIES {
                        truncated += 1;
                        continue;
                    }
                    let (hits, over) = totals.get(limit.index).copied().unwrap_or_default();
                    let key = SeriesKey {
                        domain: Box::from(domain.name()),
                        path: node.path.clone(),
                        limit: match &limit.name {
                            Some(name) => Box::from(&**name),
                            None => format!("#{position}").into_boxed_str(),
                        },
                    };
                    current.push((key, Point { at_ms, hits, over }));
                }
            }
        }
        let keep = self.shared.keep;
        let mut rings = self.lock();
        let mut old: HashMap<SeriesKey, VecDeque<Point>> =
            std::mem::take(&mut rings.series).into_iter().collect();
        rings.series = current
            .into_iter()
            .map(|(key, point)| {
                let mut points = old.remove(&key).unwrap_or_default();
                if points.len() >= keep {
                    points.pop_front();
                }
                points.push_back(point);
                (key, points)
            })
            .collect();
        rings.truncated = truncated;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rings> {
        // A panic while holding this lock would be a bug elsewhere; the rings stay usable.
        self.shared
            .rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The sampling task: weak references only, so it never keeps the history or the limiter
/// alive.
struct Sampler {
    history: Weak<Shared>,
    limiter: Weak<Limiter>,
    interval: Duration,
}

impl Sampler {
    async fn run(self) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let (Some(shared), Some(limiter)) = (self.history.upgrade(), self.limiter.upgrade())
            else {
                return;
            };
            History { shared }.sample(&limiter);
        }
    }
}

#[cfg(test)]
mod tests;
