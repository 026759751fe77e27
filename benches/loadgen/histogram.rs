//! A fixed-bucket log-linear latency histogram: exact below 64 ns, then 64 buckets per power
//! of two, so any quantile it reports is within 1/64 (1.6%) of the true value.
//!
//! Recording is one relaxed atomic increment (plus a rare `fetch_max`), so every worker of a
//! load generator records into the same histogram: a few hot cache lines, instead of one
//! cold array per worker. Invariant: `max` is exact; quantiles are bucket middles.

use std::sync::atomic::{AtomicU64, Ordering};

const SUB_BITS: u32 = 6;
const SUB_BUCKETS: usize = 1 << SUB_BITS;
/// Values up to 2^40 ns (18 minutes); anything larger lands in the last bucket.
const MAX_BITS: u32 = 40;
const BUCKETS: usize = SUB_BUCKETS * (MAX_BITS - SUB_BITS + 1) as usize;

#[derive(Debug)]
pub struct Histogram {
    counts: Box<[AtomicU64]>,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn record(&self, nanos: u64) {
        // Relaxed: the counts are read once every recorder has finished (joined).
        self.counts[bucket(nanos)].fetch_add(1, Ordering::Relaxed);
        if nanos > self.max.load(Ordering::Relaxed) {
            self.max.fetch_max(nanos, Ordering::Relaxed);
        }
    }

    pub fn count(&self) -> u64 {
        self.counts
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .sum()
    }

    pub fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// The value at `fraction` (0.5 for the median): the middle of the bucket holding the
    /// `ceil(count * fraction)`-th smallest value, capped at the exact maximum.
    pub fn quantile(&self, fraction: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64 * fraction).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count.load(Ordering::Relaxed);
            if seen >= rank {
                let (low, width) = bounds(index);
                return (low + width / 2).min(self.max());
            }
        }
        self.max()
    }
}

fn bucket(value: u64) -> usize {
    if value < SUB_BUCKETS as u64 {
        return value as usize;
    }
    let top = 63 - value.leading_zeros();
    if top >= MAX_BITS {
        return BUCKETS - 1;
    }
    let shift = top - SUB_BITS;
    let group = (shift + 1) as usize;
    let sub = (value >> shift) as usize - SUB_BUCKETS;
    group * SUB_BUCKETS + sub
}

/// The lowest value of bucket `index` and its width.
fn bounds(index: usize) -> (u64, u64) {
    if index < SUB_BUCKETS {
        return (index as u64, 1);
    }
    let group = index / SUB_BUCKETS;
    let sub = (SUB_BUCKETS + index % SUB_BUCKETS) as u64;
    let shift = group as u32 - 1;
    (sub << shift, 1 << shift)
}

/// Every bucket's bounds contain exactly the values [`bucket`] sends there, and quantiles
/// land within the promised error.
pub fn check() {
    for value in (0..100_000u64).chain([1 << 39, (1 << 40) - 1]) {
        let (low, width) = bounds(bucket(value));
        assert!(
            low <= value && value < low + width,
            "{value} in [{low}, +{width})"
        );
    }
    let histogram = Histogram::default();
    for value in 1..=100_000u64 {
        histogram.record(value * 1000);
    }
    for (fraction, exact) in [
        (0.5, 50_000_000.0),
        (0.99, 99_000_000.0),
        (1.0, 100_000_000.0),
    ] {
        let got = histogram.quantile(fraction) as f64;
        assert!(
            (got - exact).abs() / exact < 1.0 / SUB_BUCKETS as f64,
            "q{fraction}: {got} vs {exact}"
        );
    }
    assert_eq!(histogram.max(), 100_000_000);
}
