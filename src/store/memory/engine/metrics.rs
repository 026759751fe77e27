//! The engine's metrics, read from the shards at scrape time.

use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;

use super::Engine;
use crate::check::RuleKeys;
use crate::metrics::{encode_counter, encode_gauge};
use crate::store::memory::shard::ShardStats;

#[derive(Debug)]
pub(super) struct EngineCollector {
    pub engine: Engine,
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.encode_shards(&mut encoder)?;
        self.encode_rules(&mut encoder)?;
        self.encode_lock_wait(&mut encoder)
    }
}

fn shard_label(index: usize) -> [(&'static str, String); 1] {
    [("shard", index.to_string())]
}

impl EngineCollector {
    /// Each shard's keys, waiters and counts.
    fn encode_shards(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures = self.engine.figures();
        type Figure = fn(&super::ShardFigures) -> usize;
        let gauges: [(&str, &str, Figure); 3] = [
            ("shard_live_keys", "Keys with live state, per shard", |f| {
                f.live_keys
            }),
            (
                "shard_key_slots",
                "Keys the shard's table holds before it grows (its memory), per shard",
                |f| f.key_slots,
            ),
            (
                "shard_waiters",
                "Checks waiting in FIFO queues (max_wait), per shard",
                |f| f.waiters,
            ),
        ];
        for (name, help, read) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (index, shard) in figures.iter().enumerate() {
                let labels = shard_label(index);
                encode_gauge(family.encode_family(&labels)?, read(shard) as u64)?;
            }
        }
        type Read = fn(&ShardStats) -> u64;
        let counters: [(&str, &str, Read); 6] = [
            (
                "shard_expired_keys",
                "Keys forgotten once their state could no longer change an answer, per shard",
                |s| s.expired_keys.load(Ordering::Relaxed),
            ),
            (
                "shard_swept_keys",
                "Keys the sweep of idle keys looked at, per shard (the sweep's work)",
                |s| s.swept_keys.load(Ordering::Relaxed),
            ),
            (
                "shard_contended",
                "Checks that found their shard busy with another request's step and waited for it",
                |s| s.contended.load(Ordering::Relaxed),
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
        for (name, help, read) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (index, shard) in self.engine.stats().enumerate() {
                let labels = shard_label(index);
                encode_counter(family.encode_family(&labels)?, read(shard))?;
            }
        }
        Ok(())
    }

    /// Each rule's keys, budget and refusals.
    fn encode_rules(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Each rule named once per scrape, for the three families.
        let rules: Vec<([(&str, String); 1], RuleKeys)> = self
            .engine
            .rule_keys()
            .into_iter()
            .map(|(rule, keys)| ([("rule", self.engine.rule_name(rule).to_string())], keys))
            .collect();
        type Keys = fn(&RuleKeys) -> u64;
        let rule_gauges: [(&str, &str, Keys); 2] = [
            ("rule_keys", "Live keys of each rule on this node", |k| {
                k.live
            }),
            (
                "rule_key_budget",
                "The most live keys each rule may hold on this node (max_keys, or its share of --max-keys)",
                |k| k.budget,
            ),
        ];
        for (name, help, read) in rule_gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (label, keys) in &rules {
                encode_gauge(family.encode_family(label)?, read(keys))?;
            }
        }
        let mut refusals = encoder.encode_descriptor(
            "rule_key_refusals",
            "Requests answered UNAVAILABLE because they needed a new key of a rule that held its key budget",
            None,
            MetricType::Counter,
        )?;
        for (label, keys) in &rules {
            encode_counter(refusals.encode_family(label)?, keys.refused)?;
        }
        Ok(())
    }

    /// How long checks waited for a busy shard, per shard.
    fn encode_lock_wait(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut wait = encoder.encode_descriptor(
            "shard_lock_wait_seconds",
            "How long checks that found their shard busy waited for it",
            None,
            MetricType::Histogram,
        )?;
        for (index, shard) in self.engine.stats().enumerate() {
            let labels = shard_label(index);
            shard.lock_wait.encode(wait.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
