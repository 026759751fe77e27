//! The cluster's metrics, read at scrape time: membership, fallbacks, handoffs, the RLQS
//! quota exchange, and per-peer forwarding figures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use super::Runtime;
use crate::metrics::{encode_counter, encode_gauge, scrape_counter, scrape_gauge};

/// Reads the cluster's figures at scrape time.
#[derive(Debug)]
pub(super) struct ClusterCollector {
    pub runtime: Arc<Runtime>,
}

impl Collector for ClusterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.encode_totals(&mut encoder)?;
        self.encode_leases(&mut encoder)?;
        self.encode_peers(&mut encoder)
    }
}

impl ClusterCollector {
    /// Membership, fallbacks, handoffs and the RLQS exchange.
    fn encode_totals(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (stats, _) = self.runtime.stats();
        scrape_gauge(
            encoder,
            "cluster_members",
            "Nodes on this node's hash ring, itself included",
            self.runtime.member_count() as u64,
        )?;
        let totals: [(&str, &str, &AtomicU64); 11] = [
            (
                "cluster_fallbacks",
                "Request groups decided by the fallback policy because their owner did not answer",
                &stats.fallbacks,
            ),
            (
                "cluster_rerouted",
                "Request groups whose owner did not answer but left the ring meanwhile, sent to the new owner",
                &stats.rerouted,
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
            (
                "cluster_peer_refused",
                "Peer messages refused because the client certificate does not speak for the node they concern (mutual TLS)",
                &stats.refused,
            ),
            (
                "cluster_quota_sent",
                "RLQS: bucket demands sent to their owners (one per bucket per report interval)",
                &stats.quota_sent,
            ),
            (
                "cluster_quota_unanswered",
                "RLQS: bucket demands that got no share back (owner unreachable or full): the bucket used an equal part of its limit per member",
                &stats.quota_unanswered,
            ),
            (
                "cluster_quota_failed_calls",
                "RLQS: Quota calls to an owner that failed or timed out",
                &stats.quota_failed_calls,
            ),
            (
                "cluster_quota_received",
                "RLQS: bucket demands this node divided as their owner for other nodes",
                &stats.quota_received,
            ),
        ];
        for (name, help, value) in totals {
            scrape_counter(encoder, name, help, value.load(Ordering::Relaxed))?;
        }
        Ok(())
    }

    /// The hits lent and borrowed with leases.
    fn encode_leases(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let leases = self.runtime.leases();
        let lease_totals: [(&str, &str, &AtomicU64); 3] = [
            (
                "cluster_lease_units_lent",
                "Hits this node, as their owner, lent to other nodes with leases",
                &leases.stats.lent,
            ),
            (
                "cluster_lease_hits",
                "Requests' checks admitted from a lease, without a forward",
                &leases.stats.spent,
            ),
            (
                "cluster_lease_units_returned",
                "Leased hits that ended unspent: given back to the node that lent them, or dropped when it no longer owns the key",
                &leases.stats.returned,
            ),
        ];
        for (name, help, value) in lease_totals {
            scrape_counter(encoder, name, help, value.load(Ordering::Relaxed))?;
        }
        scrape_gauge(
            encoder,
            "cluster_leases",
            "Keys this node holds a lease for",
            leases.len() as u64,
        )
    }

    /// Each peer's forwarding figures, breaker and health.
    fn encode_peers(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (_, remotes) = self.runtime.stats();
        type Read = fn(&super::remote::Remote) -> u64;
        let per_peer: [(&str, &str, MetricType, Read); 5] = [
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
                "peer_slow",
                "Forward batches that took over 20 ms (Envoy's default rate limit timeout): the owner is alive but slow",
                MetricType::Counter,
                |r| r.stats.slow.load(Ordering::Relaxed),
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
                    encode_counter(metric, read(remote))?;
                } else {
                    encode_gauge(metric, read(remote))?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "peer_up",
            "1 while the failure detector finds the peer reachable (on this node's ring), 0 while it is down",
            None,
            MetricType::Gauge,
        )?;
        for (peer, up) in self.runtime.peer_health() {
            let labels = [("peer", peer)];
            encode_gauge(family.encode_family(&labels)?, u64::from(up))?;
        }
        Ok(())
    }
}
