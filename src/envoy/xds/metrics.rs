//! The xDS client's metrics, read at scrape time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::XdsStats;
use crate::metrics::{scrape_counter, scrape_counters_by, scrape_gauge};

/// Reads the xDS client's figures at scrape time.
#[derive(Debug)]
pub(super) struct XdsCollector {
    pub stats: Arc<XdsStats>,
}

impl Collector for XdsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &self.stats;
        let read = |value: &AtomicU64| value.load(Ordering::Relaxed);
        scrape_gauge(
            &mut encoder,
            "xds_connected",
            "1 while a stream to the xDS management server is open",
            u64::from(stats.connected.load(Ordering::Relaxed)),
        )?;
        scrape_counter(
            &mut encoder,
            "xds_streams",
            "Streams opened to the xDS management server",
            read(&stats.connects),
        )?;
        scrape_counter(
            &mut encoder,
            "xds_disconnects",
            "Streams to the xDS management server that ended or failed to open",
            read(&stats.disconnects),
        )?;
        scrape_counters_by(
            &mut encoder,
            "xds_responses",
            "RateLimitConfig responses from the xDS management server by answer (ack: applied, nack: rejected)",
            "result",
            &[("ack", read(&stats.acks)), ("nack", read(&stats.nacks))],
        )
    }
}
