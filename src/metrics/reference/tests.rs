use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::*;
use crate::algorithm::NANOS_PER_SEC;
use crate::limiter::{Limiter, LimiterOptions, Query};
use crate::limits::Limits;
use crate::metrics::{Metrics, MetricsOptions};
use crate::store::memory::{Engine, EngineConfig, MemoryStore};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: api_key
    value: vip
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: path
    value: "/api*"
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tenant
    value: "t*"
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

/// A limiter counting the reference stats (at most `max_names` keys) into the stats it
/// returns.
fn limiter(max_names: usize) -> (Limiter, Arc<ReferenceStats>) {
    let limits = Limits::parse_str("test.yaml", LIMITS).expect("valid limits");
    let config = EngineConfig {
        shards: 2,
        max_keys: 1000,
        max_waiters: 10,
        rule_key_share: 1.0,
    };
    let engine = Engine::spawn(
        config,
        crate::clock::Clock::starting_at(1_704_326_400 * NANOS_PER_SEC),
    );
    let stats = Arc::new(ReferenceStats::new(max_names, &[]));
    let metrics = Metrics::new(MetricsOptions::default(), Metrics::registry())
        .with_reference(Arc::clone(&stats));
    let limiter = Limiter::new(
        Arc::new(ArcSwap::from_pointee(limits)),
        Arc::new(MemoryStore::new(engine)),
        LimiterOptions::default(),
        Arc::new(metrics),
    );
    (limiter, stats)
}

async fn hit(limiter: &Limiter, entries: &[(&str, &str)]) {
    let mut query = Query::new("edge");
    query.descriptor(entries.iter().copied(), 1);
    limiter.decide(&query).await.expect("answers");
}

/// The stats that counted something, by full name.
fn counted(stats: &ReferenceStats) -> BTreeMap<String, u64> {
    stats.snapshot(None).into_iter().collect()
}

fn rate_limit(stats: &ReferenceStats, key: &str, kind: &str) -> Option<u64> {
    counted(stats)
        .get(&format!("ratelimit.service.rate_limit.{key}.{kind}"))
        .copied()
}

/// Denied calls are counted as over_limit, admitted ones as within_limit, all as
/// total_hits, under the configured key path; and every call as a request.
#[tokio::test(start_paused = true)]
async fn a_configured_limit_counts_under_its_key_path() {
    let (limiter, stats) = limiter(100);
    for _ in 0..5 {
        hit(&limiter, &[("api_key", "bob")]).await;
    }
    assert_eq!(rate_limit(&stats, "edge.api_key", "total_hits"), Some(5));
    assert_eq!(rate_limit(&stats, "edge.api_key", "within_limit"), Some(2));
    assert_eq!(rate_limit(&stats, "edge.api_key", "over_limit"), Some(3));
    // The second hit used the whole limit of 2 (0.8 of it or more).
    assert_eq!(rate_limit(&stats, "edge.api_key", "near_limit"), Some(1));
    assert_eq!(rate_limit(&stats, "edge.api_key", "shadow_mode"), None);
    assert_eq!(
        counted(&stats).get("ratelimit_server.ShouldRateLimit.total_requests"),
        Some(&5)
    );
}

#[tokio::test(start_paused = true)]
async fn keys_name_each_configured_entry_with_its_value() {
    let (limiter, stats) = limiter(100);
    hit(&limiter, &[("api_key", "vip"), ("path", "/x")]).await;
    hit(&limiter, &[("path", "/api/v1")]).await;
    hit(&limiter, &[("trial", "a")]).await;
    hit(&limiter, &[("trial", "a")]).await;
    assert_eq!(
        rate_limit(&stats, "edge.api_key_vip.path", "total_hits"),
        Some(1)
    );
    // A wildcard's pattern stands for its value.
    assert_eq!(rate_limit(&stats, "edge.path_/api*", "total_hits"), Some(1));
    // Over a shadow-mode limit: shadow_mode, and over_limit too, as the reference counts.
    assert_eq!(rate_limit(&stats, "edge.trial", "shadow_mode"), Some(1));
    assert_eq!(rate_limit(&stats, "edge.trial", "over_limit"), Some(1));
}

#[tokio::test(start_paused = true)]
async fn detailed_value_to_metric_and_request_limits_name_request_values() {
    let (limiter, stats) = limiter(100);
    hit(&limiter, &[("user", "alice")]).await;
    hit(&limiter, &[("user", "")]).await;
    hit(&limiter, &[("tenant", "t42")]).await;
    hit(&limiter, &[("route", "/a"), ("method", "GET")]).await;
    let mut query = Query::new("edge");
    query
        .descriptor([("api_key", "carol"), ("plan", "")], 1)
        .limit = Some(crate::limiter::LimitOverride {
        requests_per_unit: 10,
        unit: crate::algorithm::Unit::Minute,
    });
    limiter.decide(&query).await.expect("answers");
    let names = counted(&stats);
    for key in [
        "edge.user_alice",
        // detailed_metric writes `key_` for an empty value.
        "edge.user_",
        // share_threshold: the pattern, not the value.
        "edge.tenant_t*",
        "edge.route_/a.method_GET",
        "edge.api_key_carol.plan",
    ] {
        let name = format!("ratelimit.service.rate_limit.{key}.total_hits");
        assert_eq!(names.get(&name), Some(&1), "{name} in {names:#?}");
    }
}

/// Past the cap, new keys count under their domain's `_other`; known keys keep counting.
#[tokio::test(start_paused = true)]
async fn keys_past_the_cap_count_under_other() {
    // The seven configured limits' keys, and room for one more.
    let (limiter, stats) = limiter(8);
    for user in ["a", "b", "c", "a"] {
        hit(&limiter, &[("user", user)]).await;
    }
    assert_eq!(rate_limit(&stats, "edge.user_a", "total_hits"), Some(2));
    assert_eq!(rate_limit(&stats, "edge._other", "total_hits"), Some(2));
    assert_eq!(rate_limit(&stats, "edge.user_b", "total_hits"), None);
}

#[test]
fn extra_tags_are_appended_sorted_with_dots_replaced() {
    let tags = [
        ("zone".to_owned(), "eu.west:1".to_owned()),
        ("app".to_owned(), "rl".to_owned()),
        ("empty".to_owned(), String::new()),
    ];
    assert_eq!(serialize_tags(&tags), ".__app=rl.__zone=eu_west_1");
    let stats = ReferenceStats::new(10, &tags);
    stats.stat("edge", "edge.k").add(Kind::OverLimit, 2);
    stats.request(crate::metrics::Outcome::Unavailable);
    let reloads = crate::reload::ReloadStats::default();
    reloads.successes.store(3, Ordering::Relaxed);
    let names: BTreeMap<String, u64> = stats.snapshot(Some(&reloads)).into_iter().collect();
    let expected: BTreeMap<String, u64> = [
        (
            "ratelimit.service.rate_limit.edge.k.over_limit.__app=rl.__zone=eu_west_1",
            2,
        ),
        (
            "ratelimit.service.call.should_rate_limit.redis_error.__app=rl.__zone=eu_west_1",
            1,
        ),
        (
            "ratelimit.service.config_load_success.__app=rl.__zone=eu_west_1",
            3,
        ),
        ("ratelimit_server.ShouldRateLimit.total_requests", 1),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    assert_eq!(names, expected);
}

/// Names mapped to the same metric and labels add up (statsd_exporter's counters do);
/// OpenMetrics samples of a counter end in `_total`.
#[test]
fn the_page_adds_up_names_that_map_alike() {
    let mapper = mapper::Mapper::reference_default();
    let snapshot = vec![
        (
            "ratelimit.service.rate_limit.d.a.b.c.over_limit".to_owned(),
            2,
        ),
        (
            "ratelimit.service.rate_limit.d.a.b.x.over_limit".to_owned(),
            3,
        ),
        ("ratelimit.service.rate_limit.d.k.total_hits".to_owned(), 4),
        ("ratelimit.service.config_load_success".to_owned(), 1),
    ];
    let text = prometheus::mapped_text(&snapshot, &mapper);
    for line in [
        "# TYPE ratelimit_service_rate_limit_over_limit counter",
        r#"ratelimit_service_rate_limit_over_limit_total{domain="d",key1="a",key2="b"} 5"#,
        r#"ratelimit_service_rate_limit_total_hits_total{domain="d",key1="k"} 4"#,
        "ratelimit_service_config_load_success_total 1",
    ] {
        assert!(text.lines().any(|got| got == line), "{line} in:\n{text}");
    }
    assert!(
        !text.contains("# EOF"),
        "ratekeeper's metrics follow: {text}"
    );
}

/// The reference's arithmetic (`base_limiter.go`), table-driven: capacity 10 and ratio 0.8
/// put the near-limit threshold at 8.
#[test]
fn hits_count_as_the_reference_counts_them() {
    let hit = |remaining: u64, cost: u64, admitted: bool, shadow: bool| Hit {
        capacity: 10,
        remaining,
        cost,
        admitted,
        refused: !admitted,
        shadow,
    };
    // [total_hits, over_limit, near_limit, within_limit, shadow_mode]
    let cases = [
        // The 8th hit is at the threshold, not past it; the 9th is past it.
        (hit(2, 1, true, false), [1, 0, 0, 1, 0]),
        (hit(1, 1, true, false), [1, 0, 1, 1, 0]),
        // 3 hits from 6 to 9: one past the threshold.
        (hit(1, 3, true, false), [3, 0, 1, 3, 0]),
        // 5 hits refused at 6: one over the limit, two between threshold and limit.
        (hit(4, 5, false, false), [5, 1, 2, 0, 0]),
        // Refused when used up: all over.
        (hit(0, 2, false, false), [2, 2, 0, 0, 0]),
        // In shadow mode, over the limit is also shadow_mode.
        (hit(0, 1, false, true), [1, 1, 0, 0, 1]),
    ];
    for (hit, expected) in cases {
        assert_eq!(hit.counts(0.8), expected, "{hit:?}");
    }
    // The threshold is computed in float32: floor(5 * 0.8) is 4 there.
    let five = Hit {
        capacity: 5,
        remaining: 0,
        cost: 1,
        admitted: true,
        refused: false,
        shadow: false,
    };
    assert_eq!(five.counts(0.8)[Kind::NearLimit as usize], 1);
}
