use std::sync::Arc;

use super::*;
use crate::algorithm::NANOS_PER_SEC;
use crate::limiter::{Limiter, LimiterOptions, Query};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: api_key
    value: named
    rate_limit: {unit: hour, requests_per_unit: 2, name: named_limit}
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

fn limiter(options: MetricsOptions) -> Limiter {
    let start = 1_704_326_400 * NANOS_PER_SEC;
    Limiter::for_tests(LIMITS, start, LimiterOptions::default(), options)
}

async fn hit(limiter: &Limiter, key: &str, value: &str) {
    let mut query = Query::new("edge");
    query.descriptor([(key, value)], 1);
    limiter.decide(&query).await.expect("answers");
}

/// The value of the sample line starting with `prefix` (name and labels), if any.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// A refund (Envoy's `is_negative_hits`) gives hits back: it is not a hit, so the hit
/// counters stay as they were, and the hits it gave back pass again.
#[tokio::test(start_paused = true)]
async fn refunds_are_not_counted_as_hits() {
    let limiter = limiter(MetricsOptions::default());
    for _ in 0..6 {
        hit(&limiter, "api_key", "bob").await;
    }
    let mut refund = Query::new("edge");
    refund.descriptor([("api_key", "bob")], 3).refund = true;
    let verdict = limiter.decide(&refund).await.expect("answers");
    assert!(!verdict.is_over(), "a refund is answered OK");
    let text = limiter.metrics().encode();
    let labels = r#"{domain="edge",limit="api_key",unit="hour"}"#;
    let value = |name: &str| sample(&text, &format!("ratekeeper_limit_{name}_total{labels}"));
    assert_eq!(value("total_hits"), Some(6.0), "{text}");
    assert_eq!(value("within_limit"), Some(5.0));
    assert_eq!(value("over_limit"), Some(1.0));
    for _ in 0..3 {
        hit(&limiter, "api_key", "bob").await;
    }
    let text = limiter.metrics().encode();
    let value = |name: &str| sample(&text, &format!("ratekeeper_limit_{name}_total{labels}"));
    assert_eq!(
        value("within_limit"),
        Some(8.0),
        "the 3 given back passed: {text}"
    );
}

#[tokio::test(start_paused = true)]
async fn per_limit_counters_move_with_requests() {
    let limiter = limiter(MetricsOptions::default());
    for _ in 0..6 {
        hit(&limiter, "api_key", "alice").await;
    }
    let text = limiter.metrics().encode();
    let labels = r#"{domain="edge",limit="api_key",unit="hour"}"#;
    let value = |name: &str| sample(&text, &format!("ratekeeper_limit_{name}_total{labels}"));
    assert_eq!(value("total_hits"), Some(6.0), "{text}");
    assert_eq!(value("within_limit"), Some(5.0));
    assert_eq!(value("over_limit"), Some(1.0));
    // 4 of 5 used (80%) and 5 of 5: two hits were near the limit.
    assert_eq!(value("near_limit"), Some(2.0));
    assert!(
        !text.contains("alice"),
        "request values never become labels by default"
    );
    let requests = |result: &str| {
        sample(
            &text,
            &format!(r#"ratekeeper_requests_total{{result="{result}",code="OK"}}"#),
        )
    };
    assert_eq!(requests("ok"), Some(5.0));
    assert_eq!(requests("over_limit"), Some(1.0));
    assert_eq!(
        sample(
            &text,
            r#"ratekeeper_request_duration_seconds_count{result="ok"}"#
        ),
        Some(5.0)
    );
}

#[tokio::test(start_paused = true)]
async fn names_label_their_limit_and_shadow_mode_counts_separately() {
    let limiter = limiter(MetricsOptions::default());
    for _ in 0..3 {
        hit(&limiter, "api_key", "named").await;
        hit(&limiter, "trial", "t").await;
    }
    let text = limiter.metrics().encode();
    assert_eq!(
        sample(
            &text,
            r#"ratekeeper_limit_over_limit_total{domain="edge",limit="named_limit",unit="hour"}"#
        ),
        Some(1.0),
        "{text}"
    );
    let trial = r#"{domain="edge",limit="trial",unit="hour"}"#;
    assert_eq!(
        sample(&text, &format!("ratekeeper_limit_shadow_mode_total{trial}")),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, &format!("ratekeeper_limit_over_limit_total{trial}")),
        Some(0.0)
    );
}

#[tokio::test(start_paused = true)]
async fn detailed_metrics_carry_values_up_to_the_series_cap() {
    let limiter = limiter(MetricsOptions {
        near_limit_ratio: 0.8,
        max_series: 6,
    });
    for user in ["u1", "u2", "u3", "u4"] {
        hit(&limiter, "user", user).await;
    }
    let text = limiter.metrics().encode();
    // Four configured label sets exist from the start; two detailed ones fit under the cap.
    assert!(text.contains(r#"limit="user=u1""#), "{text}");
    assert!(text.contains(r#"limit="user=u2""#), "{text}");
    assert!(!text.contains(r#"limit="user=u3""#), "{text}");
    assert_eq!(
        sample(
            &text,
            r#"ratekeeper_limit_total_hits_total{domain="edge",limit="_other",unit="hour"}"#
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "ratekeeper_limit_series_dropped_total"),
        Some(2.0)
    );
}

#[tokio::test(start_paused = true)]
async fn engine_and_config_figures_are_read_at_scrape_time() {
    let limiter = limiter(MetricsOptions::default());
    hit(&limiter, "api_key", "k1").await;
    hit(&limiter, "api_key", "k2").await;
    tokio::task::yield_now().await;
    let text = limiter.metrics().encode();
    let live: f64 = (0..2)
        .filter_map(|shard| {
            sample(
                &text,
                &format!(r#"ratekeeper_shard_live_keys{{shard="{shard}"}}"#),
            )
        })
        .sum();
    assert_eq!(live, 2.0, "{text}");
    assert!(
        text.contains(r#"ratekeeper_config_info{version="0000000000000abc"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("ratekeeper_shard_lock_wait_seconds_bucket"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn histogram_buckets_are_cumulative() {
    use crate::histogram::{AtomicHistogram, SharedHistogram};

    let histogram = AtomicHistogram::default();
    histogram.observe(Duration::from_micros(5));
    histogram.observe(Duration::from_micros(30));
    histogram.observe(Duration::from_secs(5));
    assert_eq!(histogram.count(), 3);
    let mut registry = Registry::default();
    registry.register("h", "test", SharedHistogram(Arc::new(histogram)));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
    assert!(text.contains(r#"h_bucket{le="0.00001"} 1"#), "{text}");
    assert!(text.contains(r#"h_bucket{le="0.000025"} 1"#), "{text}");
    assert!(text.contains(r#"h_bucket{le="0.00005"} 2"#), "{text}");
    assert!(text.contains(r#"h_bucket{le="1.0"} 2"#), "{text}");
    assert!(text.contains(r#"h_bucket{le="+Inf"} 3"#), "{text}");
    assert!(text.contains("h_count 3"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn value_to_metric_puts_only_those_entries_values_in_the_label() {
    let yaml = r#"
domain: edge
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1, name: per_user}
"#;
    let start = 1_704_326_400 * NANOS_PER_SEC;
    let options = MetricsOptions {
        near_limit_ratio: 0.8,
        max_series: 3,
    };
    let limiter = Limiter::for_tests(yaml, start, LimiterOptions::default(), options);
    for (route, user) in [("/a", "u1"), ("/a", "u2"), ("/b", "u1"), ("/c", "u1")] {
        let mut query = Query::new("edge");
        query.descriptor([("route", route), ("user", user)], 1);
        limiter.decide(&query).await.expect("answers");
    }
    let text = limiter.metrics().encode();
    let total = |limit: &str| {
        sample(
            &text,
            &format!(
                r#"ratekeeper_limit_total_hits_total{{domain="edge",limit="{limit}",unit="hour"}}"#
            ),
        )
    };
    assert_eq!(total("route=/a.user"), Some(2.0), "{text}");
    assert_eq!(total("route=/b.user"), Some(1.0), "{text}");
    // The configured `per_user` series and two valued ones fill the cap of 3.
    assert_eq!(total("route=/c.user"), None, "{text}");
    assert_eq!(total("_other"), Some(1.0), "{text}");
    assert!(!text.contains("u1") && !text.contains("u2"), "{text}");
}
