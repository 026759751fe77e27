//! The reloader's metrics, read at scrape time.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use super::ReloadStats;
use crate::metrics::{encode_gauge, scrape_counters_by, scrape_gauge};

/// Reads the reloader's figures at scrape time.
#[derive(Debug)]
pub(super) struct ReloadCollector {
    pub stats: Arc<ReloadStats>,
}

impl Collector for ReloadCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &self.stats;
        scrape_counters_by(
            &mut encoder,
            "config_loads",
            "Limits loads by result (the start-up load counts as a success)",
            "result",
            &[
                ("success", stats.successes.load(Ordering::Relaxed)),
                ("failure", stats.failures.load(Ordering::Relaxed)),
            ],
        )?;
        scrape_gauge(
            &mut encoder,
            "config_last_success_timestamp_seconds",
            "Unix time of the last successful limits load",
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
        encode_gauge(info.encode_family(&labels)?, 1)
    }
}
