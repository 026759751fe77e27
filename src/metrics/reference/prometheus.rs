//! The reference's Prometheus mode (`USE_PROMETHEUS`, `--prometheus-addr`): a listener of
//! its own serving one path (`--prometheus-path`, `/metrics`) with the reference stats
//! mapped by a statsd_exporter mapping ([`super::mapper`]), then ratekeeper's own metrics.
//!
//! The counts are read at scrape time (the reference's exporter sees them only after each
//! `STATS_FLUSH_INTERVAL`). Names that map to the same metric and labels add up, as
//! statsd_exporter's counters do. The page is OpenMetrics text: a counter's sample gains
//! `_total` (`ratelimit_service_rate_limit_over_limit_total`), where the reference's classic
//! text format shows the name as mapped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::mapper::{Mapped, Mapper};
use super::{Loads, ReferenceStats};
use crate::metrics::Metrics;

/// Where the Prometheus listener serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrometheusOptions {
    pub addr: SocketAddr,
    /// The one path served (the reference's `PROMETHEUS_PATH`).
    pub path: String,
    /// A statsd_exporter mapping file; `None`: the reference's default mapping.
    pub mapping: Option<PathBuf>,
}

/// The counters of one metric, by label set.
#[derive(Debug, Default)]
struct Family {
    help: String,
    samples: BTreeMap<Vec<(String, String)>, u64>,
}

/// Mapped reference stats, by metric name.
#[derive(Debug, Default)]
struct Families(BTreeMap<String, Family>);

impl Families {
    /// `snapshot` (full StatsD names and their counts) through `mapper`.
    fn map(snapshot: &[(String, u64)], mapper: &Mapper) -> Families {
        let mut families = Families::default();
        for (name, value) in snapshot {
            let Mapped::Metric { name, labels, help } = mapper.map_counter(name) else {
                continue;
            };
            // A name template that expanded to nothing names no metric.
            if name.is_empty() {
                continue;
            }
            // OpenMetrics names a counter's family without `_total`; its sample adds it.
            let family = name.strip_suffix("_total").unwrap_or(&name).to_owned();
            let family = families.0.entry(family).or_default();
            family.help = help;
            let count = family.samples.entry(labels).or_default();
            *count = count.saturating_add(*value);
        }
        families
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (name, family) in &self.0 {
            let mut metric =
                encoder.encode_descriptor(name, &family.help, None, MetricType::Counter)?;
            for (labels, value) in &family.samples {
                if labels.is_empty() {
                    metric.encode_counter::<NoLabelSet, _, u64>(value, None)?;
                } else {
                    metric
                        .encode_family(labels)?
                        .encode_counter::<NoLabelSet, _, u64>(value, None)?;
                }
            }
        }
        Ok(())
    }
}

/// The reference stats of `snapshot` mapped by `mapper`, as OpenMetrics text without its
/// closing `# EOF` (ratekeeper's own metrics follow).
pub fn mapped_text(snapshot: &[(String, u64)], mapper: &Mapper) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Families::map(snapshot, mapper)));
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode_registry(&mut text, &registry);
    text
}

/// What the page reads.
#[derive(Clone, Debug)]
pub struct Page {
    pub stats: Arc<ReferenceStats>,
    pub mapper: Arc<Mapper>,
    pub reloads: Arc<dyn Loads>,
    pub metrics: Arc<Metrics>,
}

/// The listener's router: `path` only.
pub fn router(page: Page, path: &str) -> Router {
    Router::new().route(path, get(scrape).with_state(page))
}

async fn scrape(State(page): State<Page>) -> Response {
    let snapshot = page.stats.snapshot(Some(&*page.reloads));
    let mut text = mapped_text(&snapshot, &page.mapper);
    text.push_str(&page.metrics.encode());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
