//! The Redis store's metrics, read at scrape time: calls, failures, the breaker, the
//! failure policy's decisions and the blocked cache.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::Inner;
use crate::histogram::AtomicHistogram;
use crate::metrics::{scrape_counter, scrape_gauge};

/// The store's figures, written on the request path with relaxed atomics.
#[derive(Debug, Default)]
pub(super) struct RedisStats {
    pub calls: AtomicU64,
    pub errors: AtomicU64,
    pub timeouts: AtomicU64,
    pub busy: AtomicU64,
    pub breaker_opened: AtomicU64,
    pub policy_decisions: AtomicU64,
    pub blocked_hits: AtomicU64,
    pub blocked_full: AtomicU64,
    pub disagreements: AtomicU64,
    pub latency: AtomicHistogram,
}

pub(super) fn register(inner: Arc<Inner>, registry: &mut Registry) {
    registry.register_collector(Box::new(RedisCollector { inner }));
}

struct RedisCollector {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisCollector")
    }
}

impl Collector for RedisCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &self.inner.stats;
        let totals: [(&str, &str, &AtomicU64); 9] = [
            ("store_calls", "Redis script calls answered", &stats.calls),
            (
                "store_errors",
                "Redis calls that failed with an error",
                &stats.errors,
            ),
            (
                "store_timeouts",
                "Redis calls that missed their deadline (--store-timeout)",
                &stats.timeouts,
            ),
            (
                "store_breaker_opened",
                "Times the Redis circuit breaker opened",
                &stats.breaker_opened,
            ),
            (
                "store_busy",
                "Requests decided by --store-failure because the queue to Redis was full (this node is overloaded; the breaker is not told)",
                &stats.busy,
            ),
            (
                "store_policy_decisions",
                "Descriptor checks decided by --store-failure because Redis could not answer",
                &stats.policy_decisions,
            ),
            (
                "store_blocked_cache_hits",
                "Descriptor checks answered from the over-limit cache, with no Redis call",
                &stats.blocked_hits,
            ),
            (
                "store_blocked_cache_full",
                "Over-limit descriptors not cached because the cache was full",
                &stats.blocked_full,
            ),
            (
                "store_disagreements",
                "Checks where the Redis script and ratekeeper disagreed (a bug if not 0)",
                &stats.disagreements,
            ),
        ];
        for (name, help, value) in totals {
            scrape_counter(&mut encoder, name, help, value.load(Ordering::Relaxed))?;
        }
        scrape_gauge(
            &mut encoder,
            "store_circuit_open",
            "1 while the Redis circuit breaker is open (checks use --store-failure)",
            u64::from(self.inner.breaker.is_open()),
        )?;
        scrape_gauge(
            &mut encoder,
            "store_blocked_cache_entries",
            "Key slots held by the over-limit cache (a descriptor with several limits takes one per limit)",
            self.inner.blocked.len() as u64,
        )?;
        let latency = encoder.encode_descriptor(
            "store_call_seconds",
            "Time of one Redis script call, failures included",
            None,
            MetricType::Histogram,
        )?;
        stats.latency.encode(latency)
    }
}
