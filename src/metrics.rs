//! Prometheus metrics, in a registry passed around explicitly (no hidden globals, so each
//! test owns its own).
//!
//! Invariants:
//! - Nothing on the request path does a labelled lookup, except for limits with
//!   `detailed_metric: true`: request handles are resolved at start-up, per-limit handles
//!   once per limits snapshot ([`LimitTable`]); the same labels give the same counter, so
//!   counts carry across reloads.
//! - Labels never carry request values unless the limit has `detailed_metric: true`, and the
//!   number of per-limit series is capped (`max_series`); past it, hits are counted under
//!   `limit="_other"` and in `ratekeeper_limit_series_dropped`.
//! - Engine and reload figures are plain atomics kept by their owners and read at scrape
//!   time by collectors.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::cluster::Cluster;
use crate::engine::Engine;
use crate::limits::{Limit, Limits, Node};
use crate::reload::ReloadStats;

/// Settings of the metrics.
#[derive(Clone, Copy, Debug)]
pub struct MetricsOptions {
    /// A hit is "near the limit" when at least this share of the limit is used after it.
    pub near_limit_ratio: f64,
    /// Most per-limit label sets.
    pub max_series: usize,
}

impl Default for MetricsOptions {
    fn default() -> MetricsOptions {
        MetricsOptions {
            near_limit_ratio: 0.8,
            max_series: 10_000,
        }
    }
}

/// Upper bounds of the latency buckets, in seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 1.0,
];

/// A histogram of durations with fixed buckets, updated with atomics only (the library's
/// histogram takes a lock per observation).
#[derive(Debug, Default)]
pub struct AtomicHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl AtomicHistogram {
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets
            .iter()
            .map(|bucket| bucket.load(Ordering::Relaxed))
            .sum()
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // Per-bucket counts: the encoder makes them cumulative.
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&self.buckets)
            .map(|(bound, count)| (bound, count.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, count)| count).sum();
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// An [`AtomicHistogram`] shared between a family and the handle the request path keeps.
#[derive(Clone, Debug, Default)]
struct SharedHistogram(Arc<AtomicHistogram>);

impl TypedMetric for SharedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for SharedHistogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    result: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    domain: String,
    limit: String,
    unit: String,
}

/// How one `ShouldRateLimit` call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    OverLimit,
    InvalidArgument,
    Unavailable,
}

/// The per-limit counters (reference service names).
#[derive(Clone, Debug, Default)]
pub struct LimitCounters {
    pub total_hits: Counter,
    pub over_limit: Counter,
    pub near_limit: Counter,
    pub within_limit: Counter,
    pub shadow_mode: Counter,
}

#[derive(Debug, Default)]
struct LimitFamilies {
    total_hits: Family<LimitLabels, Counter>,
    over_limit: Family<LimitLabels, Counter>,
    near_limit: Family<LimitLabels, Counter>,
    within_limit: Family<LimitLabels, Counter>,
    shadow_mode: Family<LimitLabels, Counter>,
    /// Label sets created so far (a soft count: two racing creations may count twice).
    series: std::sync::atomic::AtomicUsize,
}

impl LimitFamilies {
    fn counters(&self, labels: &LimitLabels) -> LimitCounters {
        if !self.contains(labels) {
            self.series.fetch_add(1, Ordering::Relaxed);
        }
        LimitCounters {
            total_hits: self.total_hits.get_or_create_owned(labels),
            over_limit: self.over_limit.get_or_create_owned(labels),
            near_limit: self.near_limit.get_or_create_owned(labels),
            within_limit: self.within_limit.get_or_create_owned(labels),
            shadow_mode: self.shadow_mode.get_or_create_owned(labels),
        }
    }

    fn contains(&self, labels: &LimitLabels) -> bool {
        self.total_hits.get(labels).is_some()
    }

    fn len(&self) -> usize {
        self.series.load(Ordering::Relaxed)
    }
}

/// All of ratekeeper's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    options: MetricsOptions,
    ok: Counter,
    over_limit: Counter,
    invalid: Counter,
    unavailable: Counter,
    latency_ok: Arc<AtomicHistogram>,
    latency_over: Arc<AtomicHistogram>,
    latency_error: Arc<AtomicHistogram>,
    limits: Arc<LimitFamilies>,
    dropped_series: Counter,
}

impl Metrics {
    /// Builds the registry, with collectors over the engine's and the reloader's figures.
    pub fn new(options: MetricsOptions, cluster: &Cluster, reload: Arc<ReloadStats>) -> Metrics {
        let engine = cluster.engine();
        let mut registry = Registry::with_prefix("ratekeeper");
        let requests = Family::<RequestLabels, Counter>::default();
        let labels = |result: &str, code: &str| RequestLabels {
            result: result.to_owned(),
            code: code.to_owned(),
        };
        let ok = requests.get_or_create_owned(&labels("ok", "OK"));
        let over_limit = requests.get_or_create_owned(&labels("over_limit", "OK"));
        let invalid = requests.get_or_create_owned(&labels("error", "INVALID_ARGUMENT"));
        let unavailable = requests.get_or_create_owned(&labels("error", "UNAVAILABLE"));
        registry.register(
            "requests",
            "ShouldRateLimit calls by result (ok, over_limit, error) and gRPC code",
            requests,
        );
        let latency = Family::<ResultLabels, SharedHistogram>::default();
        let result = |result: &str| ResultLabels {
            result: result.to_owned(),
        };
        let latency_ok = latency.get_or_create_owned(&result("ok")).0;
        let latency_over = latency.get_or_create_owned(&result("over_limit")).0;
        let latency_error = latency.get_or_create_owned(&result("error")).0;
        registry.register(
            "request_duration_seconds",
            "ShouldRateLimit latency inside ratekeeper, by result",
            latency,
        );
        let limits = Arc::new(LimitFamilies::default());
        for (name, help, family) in [
            (
                "limit_total_hits",
                "Hits checked against a limit (hits_addend counts)",
                &limits.total_hits,
            ),
            (
                "limit_over_limit",
                "Hits rejected by a limit",
                &limits.over_limit,
            ),
            (
                "limit_near_limit",
                "Admitted hits that left the limit at least near_limit_ratio used",
                &limits.near_limit,
            ),
            (
                "limit_within_limit",
                "Hits admitted by a limit",
                &limits.within_limit,
            ),
            (
                "limit_shadow_mode",
                "Hits over a shadow-mode limit (admitted anyway)",
                &limits.shadow_mode,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        let dropped_series = Counter::default();
        registry.register(
            "limit_series_dropped",
            "Hits counted under limit=\"_other\" because the per-limit series cap was reached",
            dropped_series.clone(),
        );
        registry.register_collector(Box::new(EngineCollector {
            engine: engine.clone(),
        }));
        registry.register_collector(Box::new(ReloadCollector { stats: reload }));
        if cluster.me().is_some() {
            registry.register_collector(Box::new(ClusterCollector {
                cluster: cluster.clone(),
            }));
        }
        Metrics {
            registry,
            options,
            ok,
            over_limit,
            invalid,
            unavailable,
            latency_ok,
            latency_over,
            latency_error,
            limits,
            dropped_series,
        }
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }

    pub fn near_limit_ratio(&self) -> f64 {
        self.options.near_limit_ratio
    }

    pub fn record_request(&self, outcome: Outcome, elapsed: Duration) {
        let (counter, latency) = match outcome {
            Outcome::Ok => (&self.ok, &self.latency_ok),
            Outcome::OverLimit => (&self.over_limit, &self.latency_over),
            Outcome::InvalidArgument => (&self.invalid, &self.latency_error),
            Outcome::Unavailable => (&self.unavailable, &self.latency_error),
        };
        counter.inc();
        latency.observe(elapsed);
    }

    /// Resolves the counters of every limit in `limits` (once per snapshot).
    pub fn limit_table(&self, limits: Arc<Limits>) -> LimitTable {
        let mut domains = HashMap::new();
        for domain in limits.domains() {
            let mut table: Vec<LimitCounters> = Vec::new();
            for node in domain.nodes() {
                for limit in node.limits.iter() {
                    let labels = LimitLabels {
                        domain: domain.name().to_owned(),
                        limit: limit_label(node, limit),
                        unit: unit_label(limit),
                    };
                    if table.len() <= limit.index {
                        table.resize_with(limit.index + 1, LimitCounters::default);
                    }
                    table[limit.index] = self.counters_capped(labels);
                }
            }
            domains.insert(Box::<str>::from(domain.name()), table);
        }
        LimitTable { limits, domains }
    }

    /// The counters for `labels`, or the domain's `_other` ones past the series cap.
    fn counters_capped(&self, labels: LimitLabels) -> LimitCounters {
        if self.limits.len() < self.options.max_series || self.limits.contains(&labels) {
            return self.limits.counters(&labels);
        }
        self.dropped_series.inc();
        self.limits.counters(&LimitLabels {
            limit: "_other".to_owned(),
            ..labels
        })
    }

    /// Counters of a `detailed_metric` limit for one request's values: a labelled lookup,
    /// on the request path, bounded by the series cap.
    pub fn detailed_counters(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        limit: &Limit,
    ) -> LimitCounters {
        let mut label = String::new();
        for (index, (key, value)) in entries.iter().enumerate() {
            let separator = if index == 0 { "" } else { "." };
            let _ = write!(label, "{separator}{key}={value}");
        }
        self.counters_capped(LimitLabels {
            domain: domain.to_owned(),
            limit: label,
            unit: unit_label(limit),
        })
    }

    /// Counters for limits a request brings itself (a descriptor's `limit` field).
    pub fn override_counters(&self, domain: &str, unit: &str) -> LimitCounters {
        self.counters_capped(LimitLabels {
            domain: domain.to_owned(),
            limit: "_request_override".to_owned(),
            unit: unit.to_owned(),
        })
    }
}

fn limit_label(node: &Node, limit: &Limit) -> String {
    match &limit.name {
        Some(name) => name.to_string(),
        None => node.key_path.to_string(),
    }
}

fn unit_label(limit: &Limit) -> String {
    limit
        .rate
        .map_or("unlimited", |rate| rate.unit.as_str())
        .to_owned()
}

/// The per-limit counters of one limits snapshot.
#[derive(Debug)]
pub struct LimitTable {
    limits: Arc<Limits>,
    domains: HashMap<Box<str>, Vec<LimitCounters>>,
}

impl LimitTable {
    /// Whether this table was built for `limits`.
    pub fn is_for(&self, limits: &Arc<Limits>) -> bool {
        Arc::ptr_eq(&self.limits, limits)
    }

    /// The counters of `limit` in `domain`, if the table has them.
    pub fn get(&self, domain: &str, limit: &Limit) -> Option<&LimitCounters> {
        self.domains.get(domain)?.get(limit.index)
    }
}

/// Reads the shards' figures at scrape time.
#[derive(Debug)]
struct EngineCollector {
    engine: Engine,
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        type Read = fn(&crate::shard::ShardStats) -> u64;
        let gauges: [(&str, &str, Read); 2] = [
            ("shard_live_keys", "Keys with live state, per shard", |s| {
                s.live_keys.load(Ordering::Relaxed)
            }),
            (
                "shard_waiters",
                "Checks waiting in FIFO queues (max_wait), per shard",
                |s| s.waiters.load(Ordering::Relaxed),
            ),
        ];
        let counters: [(&str, &str, Read); 5] = [
            (
                "shard_expired_keys",
                "Keys swept after 3 idle windows, per shard",
                |s| s.expired_keys.load(Ordering::Relaxed),
            ),
            (
                "shard_overload_rejections",
                "Requests answered UNAVAILABLE because the shard's queue was full",
                |s| s.overloads.load(Ordering::Relaxed),
            ),
            (
                "shard_key_capacity_hits",
                "Requests answered UNAVAILABLE because the shard held max_keys keys",
                |s| s.key_capacity_hits.load(Ordering::Relaxed),
            ),
            (
                "shard_waits_admitted",
                "Waiting checks admitted within max_wait",
                |s| s.waits_admitted.load(Ordering::Relaxed),
            ),
            (
                "shard_waits_rejected",
                "Checks that could not wait (queue full, or no capacity within max_wait)",
                |s| s.waits_rejected.load(Ordering::Relaxed),
            ),
        ];
        let stats = self.engine.stats();
        let shard_label = |index: usize| [("shard", index.to_string())];
        for (name, help, read) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (index, shard) in stats.iter().enumerate() {
                let labels = shard_label(index);
                let metric = family.encode_family(&labels)?;
                metric_gauge(metric, read(shard))?;
            }
        }
        for (name, help, read) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (index, shard) in stats.iter().enumerate() {
                let labels = shard_label(index);
                let mut metric = family.encode_family(&labels)?;
                metric.encode_counter::<NoLabelSet, _, u64>(&read(shard), None)?;
            }
        }
        let mut depth = encoder.encode_descriptor(
            "shard_queue_depth",
            "Messages waiting in the shard's mailbox",
            None,
            MetricType::Gauge,
        )?;
        for (index, queued) in self.engine.queue_depths().into_iter().enumerate() {
            let labels = shard_label(index);
            metric_gauge(depth.encode_family(&labels)?, queued as u64)?;
        }
        let mut wait = encoder.encode_descriptor(
            "shard_queue_wait_seconds",
            "Time a message spent in the shard's mailbox",
            None,
            MetricType::Histogram,
        )?;
        for (index, shard) in stats.iter().enumerate() {
            let labels = shard_label(index);
            shard.queue_wait.encode(wait.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn metric_gauge(mut metric: MetricEncoder<'_>, value: u64) -> Result<(), std::fmt::Error> {
    metric.encode_gauge(&i64::try_from(value).unwrap_or(i64::MAX))
}

/// Reads the cluster's figures at scrape time.
#[derive(Debug)]
struct ClusterCollector {
    cluster: Cluster,
}

impl Collector for ClusterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some((stats, remotes)) = self.cluster.stats() else {
            return Ok(());
        };
        let members = encoder.encode_descriptor(
            "cluster_members",
            "Nodes on this node's hash ring, itself included",
            None,
            MetricType::Gauge,
        )?;
        metric_gauge(members, self.cluster.members().len() as u64)?;
        let totals: [(&str, &str, &AtomicU64); 5] = [
            (
                "cluster_fallbacks",
                "Request groups decided by the fallback policy because their owner did not answer",
                &stats.fallbacks,
            ),
            (
                "cluster_handoff_sent",
                "Counters handed to their new owners",
                &stats.handoff_sent,
            ),
            (
                "cluster_handoff_failed",
                "Counters an owner did not take (kept here)",
                &stats.handoff_failed,
            ),
            (
                "cluster_handoff_received",
                "Counters taken over from other nodes",
                &stats.handoff_received,
            ),
            (
                "cluster_ring_changes",
                "Times the hash ring changed",
                &stats.ring_changes,
            ),
        ];
        for (name, help, value) in totals {
            let counter = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            counter_value(counter, value.load(Ordering::Relaxed))?;
        }
        type Read = fn(&crate::cluster::remote::Remote) -> u64;
        let per_peer: [(&str, &str, MetricType, Read); 4] = [
            (
                "peer_forwarded",
                "Request groups forwarded to the peer (their key's owner)",
                MetricType::Counter,
                |r| r.stats.forwarded.load(Ordering::Relaxed),
            ),
            (
                "peer_batches",
                "Forward batches sent to the peer (forwarded / batches = mean batch size)",
                MetricType::Counter,
                |r| r.stats.batches.load(Ordering::Relaxed),
            ),
            (
                "peer_errors",
                "Forward batches that failed (unreachable, timed out)",
                MetricType::Counter,
                |r| r.stats.errors.load(Ordering::Relaxed),
            ),
            (
                "peer_circuit_open",
                "1 while the peer's circuit breaker is open (its keys use the fallback)",
                MetricType::Gauge,
                |r| u64::from(r.breaker.is_open()),
            ),
        ];
        for (name, help, kind, read) in per_peer {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for remote in &remotes {
                let labels = [("peer", remote.address().to_string())];
                let metric = family.encode_family(&labels)?;
                if matches!(kind, MetricType::Counter) {
                    counter_value(metric, read(remote))?;
                } else {
                    metric_gauge(metric, read(remote))?;
                }
            }
        }
        Ok(())
    }
}

fn counter_value(mut metric: MetricEncoder<'_>, value: u64) -> Result<(), std::fmt::Error> {
    metric.encode_counter::<NoLabelSet, _, u64>(&value, None)
}

/// Reads the reloader's figures at scrape time.
#[derive(Debug)]
struct ReloadCollector {
    stats: Arc<ReloadStats>,
}

impl Collector for ReloadCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &self.stats;
        let mut loads = encoder.encode_descriptor(
            "config_loads",
            "Limits loads by result (the start-up load counts as a success)",
            None,
            MetricType::Counter,
        )?;
        for (result, value) in [
            ("success", stats.successes.load(Ordering::Relaxed)),
            ("failure", stats.failures.load(Ordering::Relaxed)),
        ] {
            let labels = [("result", result)];
            loads
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&value, None)?;
        }
        let last = encoder.encode_descriptor(
            "config_last_success_timestamp_seconds",
            "Unix time of the last successful limits load",
            None,
            MetricType::Gauge,
        )?;
        metric_gauge(
            last,
            stats.last_success_unix_seconds.load(Ordering::Relaxed),
        )?;
        let mut info = encoder.encode_descriptor(
            "config_info",
            "The live limits' version (content hash); always 1",
            None,
            MetricType::Gauge,
        )?;
        let version = format!("{:016x}", stats.version.load(Ordering::Relaxed));
        let labels = [("version", version.as_str())];
        metric_gauge(info.encode_family(&labels)?, 1)
    }
}

#[cfg(test)]
mod tests;
