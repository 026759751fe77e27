//! Prometheus metrics, in a registry passed around explicitly (no hidden globals, so each
//! test owns its own).
//!
//! Invariants:
//! - Nothing on the request path does a labelled lookup, except for limits with
//!   `detailed_metric: true` or reached through entries with `value_to_metric: true`:
//!   request handles are resolved at start-up, per-limit handles
//!   once per limits snapshot ([`LimitTable`]); the same labels give the same counter, so
//!   counts carry across reloads.
//! - Labels never carry request values unless the limit has `detailed_metric: true` (every
//!   entry's value) or entries with `value_to_metric: true` (those entries' values), and the
//!   number of per-limit series is capped (`max_series`); past it, hits are counted under
//!   `limit="_other"` and in `ratekeeper_limit_series_dropped`.
//! - Engine and reload figures are plain atomics kept by their owners and read at scrape
//!   time by collectors.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::histogram::{AtomicHistogram, SharedHistogram};
use crate::limits::{Limit, Limits, Node};

pub mod catalog;
pub mod reference;

use self::reference::names::{self, Segment, Segments};
use self::reference::{ReferenceStats, Stat};

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
    /// The same counts in the reference service's names, when they are kept.
    pub reference: Option<Arc<Stat>>,
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
            reference: None,
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
    /// The reference service's stats, when a sink wants them.
    reference: Option<Arc<ReferenceStats>>,
}

impl Metrics {
    /// A registry for [`Metrics::new`]: every metric name gets the `ratekeeper_` prefix.
    /// Owners of other figures (the engine, the cluster, the reloader) register their
    /// collectors in it first.
    pub fn registry() -> Registry {
        Registry::with_prefix("ratekeeper")
    }

    /// Adds the request and per-limit metrics to `registry` and keeps it for scrapes.
    pub fn new(options: MetricsOptions, mut registry: Registry) -> Metrics {
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
            reference: None,
        }
    }

    /// These metrics, also counting every limit's hits in `reference` (the reference
    /// service's names).
    pub fn with_reference(mut self, reference: Arc<ReferenceStats>) -> Metrics {
        self.reference = Some(reference);
        self
    }

    /// The reference service's stats, when they are kept.
    pub fn reference(&self) -> Option<&Arc<ReferenceStats>> {
        self.reference.as_ref()
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
        if let Some(reference) = &self.reference {
            reference.request(outcome);
        }
    }

    /// Resolves the counters of every limit in `limits` (once per snapshot), with their
    /// reference stats when those are kept.
    pub fn limit_table(&self, limits: Arc<Limits>) -> LimitTable {
        let mut domains = HashMap::new();
        let mut segments = Segments::new();
        for domain in limits.domains() {
            let mut table: Vec<LimitCounters> = Vec::new();
            for (steps, node) in domain.entries() {
                let path: Vec<Segment> = steps
                    .into_iter()
                    .map(|(key, step)| Segment { key, step })
                    .collect();
                for limit in node.limits.iter() {
                    let labels = LimitLabels {
                        domain: domain.name().to_owned(),
                        limit: limit_label(node, limit),
                        unit: unit_label(limit),
                    };
                    if table.len() <= limit.index {
                        table.resize_with(limit.index + 1, LimitCounters::default);
                    }
                    let mut counters = self.counters_capped(labels);
                    counters.reference = self.reference.as_ref().map(|reference| {
                        reference.stat(domain.name(), &names::limit_key(domain.name(), &path))
                    });
                    table[limit.index] = counters;
                }
                if let (Some(_), Some(last)) = (&self.reference, path.last()) {
                    segments.insert(names::node_id(node), last.clone());
                }
            }
            domains.insert(Box::<str>::from(domain.name()), table);
        }
        LimitTable {
            limits,
            domains,
            segments,
        }
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

    /// `counters` with the reference stat of `key` (built only when they are kept).
    fn with_stat(
        &self,
        mut counters: LimitCounters,
        domain: &str,
        key: impl FnOnce() -> String,
    ) -> LimitCounters {
        counters.reference = self
            .reference
            .as_ref()
            .map(|reference| reference.stat(domain, &key()));
        counters
    }

    /// Counters of a `detailed_metric` limit for one request's values (`steps`: the nodes
    /// they matched): a labelled lookup, on the request path, bounded by the series cap.
    pub fn detailed_counters(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        steps: &[&Node],
        limit: &Limit,
    ) -> LimitCounters {
        let mut label = String::new();
        for (index, (key, value)) in entries.iter().enumerate() {
            let separator = if index == 0 { "" } else { "." };
            let _ = write!(label, "{separator}{key}={value}");
        }
        let counters = self.counters_capped(LimitLabels {
            domain: domain.to_owned(),
            limit: label,
            unit: unit_label(limit),
        });
        self.with_stat(counters, domain, || {
            names::detailed_key(domain, entries, steps)
        })
    }

    /// Counters of a limit reached through entries with `value_to_metric: true`: the label
    /// is the key path with those entries' request values (`route=/api.method=GET.user`).
    /// A labelled lookup on the request path, bounded by the series cap.
    pub fn value_counters(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        steps: &[&Node],
        limit: &Limit,
        table: &LimitTable,
    ) -> LimitCounters {
        let mut label = String::new();
        for (index, (key, value)) in entries.iter().enumerate() {
            if index > 0 {
                label.push('.');
            }
            label.push_str(key);
            if steps.get(index).is_some_and(|node| node.value_to_metric) {
                label.push('=');
                label.push_str(value);
            }
        }
        let counters = self.counters_capped(LimitLabels {
            domain: domain.to_owned(),
            limit: label,
            unit: unit_label(limit),
        });
        self.with_stat(counters, domain, || {
            names::value_key(domain, entries, steps, &table.segments)
        })
    }

    /// Counters for limits a request brings itself (a descriptor's `limit` field).
    pub fn override_counters(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        unit: &str,
    ) -> LimitCounters {
        let counters = self.counters_capped(LimitLabels {
            domain: domain.to_owned(),
            limit: "_request_override".to_owned(),
            unit: unit.to_owned(),
        });
        self.with_stat(counters, domain, || names::override_key(domain, entries))
    }
}

fn limit_label(node: &Node, limit: &Limit) -> String {
    match &limit.name {
        Some(name) => name.to_string(),
        None => node.key_path.to_string(),
    }
}

/// The limit's unit (`second`), or its window (`10s`) with a `unit_multiplier`.
fn unit_label(limit: &Limit) -> String {
    limit
        .rate
        .map_or("unlimited".into(), |rate| rate.window_name())
        .into_owned()
}

/// The per-limit counters of one limits snapshot.
#[derive(Debug)]
pub struct LimitTable {
    limits: Arc<Limits>,
    domains: HashMap<Box<str>, Vec<LimitCounters>>,
    /// How each node matches, for `value_to_metric` stat keys (empty unless the reference
    /// stats are kept).
    segments: Segments,
}

impl LimitTable {
    /// Whether this table was built for `limits`.
    pub fn is_for(&self, limits: &Arc<Limits>) -> bool {
        Arc::ptr_eq(&self.limits, limits)
    }

    /// The counters of `domain`'s limits, by [`Limit::index`] (empty for an unknown domain).
    pub fn domain(&self, domain: &str) -> &[LimitCounters] {
        self.domains.get(domain).map_or(&[], Vec::as_slice)
    }
}

/// Encodes `value` as a gauge (for collectors that read atomics at scrape time).
pub fn encode_gauge(mut metric: MetricEncoder<'_>, value: u64) -> Result<(), std::fmt::Error> {
    metric.encode_gauge(&i64::try_from(value).unwrap_or(i64::MAX))
}

/// Encodes `value` as a counter (for collectors that read atomics at scrape time).
pub fn encode_counter(mut metric: MetricEncoder<'_>, value: u64) -> Result<(), std::fmt::Error> {
    metric.encode_counter::<NoLabelSet, _, u64>(&value, None)
}

/// One unlabelled counter family, `name` = `value` (for collectors reading atomics at
/// scrape time).
pub fn scrape_counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    encode_counter(
        encoder.encode_descriptor(name, help, None, MetricType::Counter)?,
        value,
    )
}

/// One unlabelled gauge family, `name` = `value`.
pub fn scrape_gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    encode_gauge(
        encoder.encode_descriptor(name, help, None, MetricType::Gauge)?,
        value,
    )
}

/// One counter family with a sample per `(label value, count)` of one label.
pub fn scrape_counters_by(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    label: &str,
    samples: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, count) in samples {
        encode_counter(family.encode_family(&[(label, *value)])?, *count)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
