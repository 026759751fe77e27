//! The xDS client's metrics, read at scrape time.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use super::XdsStats;
use crate::metrics::encode_gauge;

/// Reads the xDS client's figures at scrape time.
#[derive(Debug)]
pub(super) struct XdsCollector {
    pub stats: Arc<XdsStats>,
}

impl Collector for XdsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &self.stats;
        let connected = encoder.encode_descriptor(
            "xds_connected",
            "1 while a stream to the xDS management server is open",
            None,
            MetricType::Gauge,
        )?;
        encode_gauge(
            connected,
            u64::from(stats.connected.load(Ordering::Relaxed)),
        )?;
        for (name, help, value) in [
            (
                "xds_streams",
                "Streams opened to the xDS management server",
                &stats.connects,
            ),
            (
                "xds_disconnects",
                "Streams to the xDS management server that ended or failed to open",
                &stats.disconnects,
            ),
        ] {
            let mut counter = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            counter.encode_counter::<NoLabelSet, _, u64>(&value.load(Ordering::Relaxed), None)?;
        }
        let mut responses = encoder.encode_descriptor(
            "xds_responses",
            "RateLimitConfig responses from the xDS management server by answer (ack: applied, nack: rejected)",
            None,
            MetricType::Counter,
        )?;
        for (result, value) in [("ack", &stats.acks), ("nack", &stats.nacks)] {
            let labels = [("result", result)];
            responses
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&value.load(Ordering::Relaxed), None)?;
        }
        Ok(())
    }
}
