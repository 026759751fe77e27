use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::clock::Clock;
use crate::cluster::ClusterOptions;
use crate::limiter::{Limiter, LimiterOptions, Query};
use crate::limits::Limits;
use crate::metrics::{Metrics, MetricsOptions};
use crate::store::cluster::Cluster;
use crate::store::memory::{EngineConfig, MemoryStore, engine::Engine};

/// One family as scraped: type, help, and the label names of its samples.
#[derive(Debug, Default)]
struct Scraped {
    kind: String,
    help: String,
    labels: Vec<Vec<String>>,
}

/// The families of an OpenMetrics text, by name.
fn families(text: &str) -> BTreeMap<String, Scraped> {
    let mut found: BTreeMap<String, Scraped> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            found.entry(name.to_owned()).or_default().kind = kind.to_owned();
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("# HELP name help");
            found.entry(name.to_owned()).or_default().help = help.replace("\\\"", "\"");
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().expect("a sample's name");
            let family = ["_total", "_bucket", "_sum", "_count", "_created"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|family| found.contains_key(*family))
                })
                .unwrap_or(name);
            let labels = line
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'))
                .map(|(labels, _)| {
                    labels
                        .split("\",")
                        .filter_map(|pair| pair.split_once("=\"").map(|(k, _)| k.to_owned()))
                        .filter(|label| label != "le")
                        .collect()
                })
                .unwrap_or_default();
            if let Some(family) = found.get_mut(family) {
                family.labels.push(labels);
            } else {
                panic!("sample {line:?} of no family");
            }
        }
    }
    found
}

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

/// Every collector `serve` and `webhook` can register, each with a sample where a
/// labelled family needs one to show its labels: what one process with every option on
/// would export (no process can: the stores exclude each other).
async fn everything() -> String {
    let mut registry = Metrics::registry();
    let engine = Engine::spawn(EngineConfig::default(), Clock::system());
    let memory = MemoryStore::new(engine.clone());
    memory.register_metrics(&mut registry);
    // A seed that never answers: on the ring until the failure detector finds it down,
    // so the per-peer families have a sample.
    let mut options = ClusterOptions::new("127.0.0.1:1");
    options.peers = vec!["127.0.0.1:2".into()];
    let cluster = Cluster::join(MemoryStore::new(engine), options);
    cluster.runtime().register_metrics(&mut registry);
    let redis = crate::store::redis::RedisStore::new(
        crate::store::redis::RedisOptions::new(
            crate::store::redis::Target::parse("redis://127.0.0.1:1").expect("a target"),
        ),
        Clock::system(),
    )
    .expect("a Redis store (it connects lazily)");
    redis.register_metrics(&mut registry);
    Arc::new(crate::reload::ReloadStats::with_version(1)).register_metrics(&mut registry);
    Arc::new(crate::envoy::xds::XdsStats::default()).register_metrics(&mut registry);
    let tls = Arc::new(crate::transport::tls::TlsStats::default());
    tls.register_metrics(&mut registry);
    tls.register_metrics_as(crate::transport::tls::PEER.what, &mut registry);
    tls.register_metrics_as(crate::envoy::xds::TLS_FLAGS.what, &mut registry);
    let rlqs = crate::quota::RlqsStats::default();
    rlqs.register(&mut registry);
    let domain = crate::quota::DomainLabel {
        domain: "edge".into(),
    };
    for family in [
        &rlqs.reported_allowed,
        &rlqs.reported_denied,
        &rlqs.assignments,
        &rlqs.abandons,
        &rlqs.shadow_violations,
    ] {
        family.get_or_create(&domain).inc();
    }
    for family in [&rlqs.streams, &rlqs.buckets] {
        family.get_or_create(&domain).inc();
    }
    let reason = crate::quota::RefusedLabel { reason: "x".into() };
    rlqs.refused.get_or_create(&reason).inc();
    rlqs.invalid_buckets.get_or_create(&reason).inc();
    let metrics = Arc::new(Metrics::new(MetricsOptions::default(), registry));
    let limits = Limits::parse_str("edge.yaml", LIMITS).expect("limits");
    let limiter = Limiter::new(
        Arc::new(arc_swap::ArcSwap::from_pointee(limits)),
        Arc::new(memory),
        LimiterOptions::default(),
        Arc::clone(&metrics),
    );
    let mut query = Query::new("edge");
    query.descriptor([("api_key", "a")], 1);
    limiter.decide(&query).await.expect("decided");
    let (webhook, webhook_registry) = crate::webhook::Metrics::registered(&tls);
    webhook.count("injected");
    let mut webhook_text = String::new();
    prometheus_client::encoding::text::encode(&mut webhook_text, &webhook_registry)
        .expect("encoded");
    metrics.encode() + &webhook_text
}

/// The table and the collectors agree both ways: every family scraped is declared with its
/// type, help and labels, and every family declared is scraped.
#[tokio::test]
async fn every_exported_family_is_declared_and_every_declared_one_exported() {
    let scraped = families(&everything().await);
    let declared: BTreeMap<String, &Declared> = CATALOG
        .iter()
        .map(|declared| (declared.family_name(), declared))
        .collect();
    assert_eq!(declared.len(), CATALOG.len(), "a family declared twice");
    for (name, family) in &scraped {
        let Some(declared) = declared.get(name) else {
            panic!("{name} is exported but not declared in src/metrics/catalog.rs");
        };
        assert_eq!(family.kind, declared.kind.as_str(), "{name}'s type");
        // The registry's own families end their help with a period; collectors' do not.
        let help = family.help.strip_suffix('.').unwrap_or(&family.help);
        assert_eq!(help, declared.help, "{name}'s help");
        assert!(
            !family.labels.is_empty(),
            "{name} has no sample to show its labels"
        );
        for labels in &family.labels {
            assert_eq!(labels, declared.labels, "{name}'s labels");
        }
    }
    for name in declared.keys() {
        assert!(
            scraped.contains_key(name),
            "{name} is declared but not exported"
        );
    }
}

#[test]
fn the_docs_reference_is_generated_from_the_table() {
    crate::generated::check(DOCS_FILE, &markdown(), "catalog");
}
