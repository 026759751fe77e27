use super::*;
use crate::algorithm::{Algorithm, Unit};
use crate::limiter::{LimitOverride, LimiterOptions};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_key}
  - key: api_key
    value: free
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: day, requests_per_unit: 4, algorithm: token_bucket, name: daily}
  - key: api_key
    value: internal
    rate_limit: {unlimited: true}
  - key: api_key
    value: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1, name: tenant_wide}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 5, name: per_path, replaces: [{name: tenant_wide}]}
  - key: health
"#;

fn limiter() -> Limiter {
    Limiter::at_test_start(LIMITS, LimiterOptions::default())
}

fn query<'a>(domain: &'a str, descriptors: &[&'a [(&'a str, &'a str)]], cost: u64) -> Query<'a> {
    let mut query = Query::new(domain);
    for entries in descriptors {
        query.descriptor(entries.iter().copied(), cost);
    }
    query
}

async fn explain_one(limiter: &Limiter, entries: &[(&str, &str)]) -> DescriptorExplanation {
    let explanation = limiter
        .explain(&query("edge", &[entries], 1))
        .await
        .expect("explains");
    assert!(explanation.domain_found);
    explanation.descriptors.into_iter().next().expect("one")
}

#[tokio::test(start_paused = true)]
async fn a_limited_descriptor_reports_its_counter_and_explaining_consumes_nothing() {
    let limiter = limiter();
    let hit = query("edge", &[&[("api_key", "alice")]], 1);
    limiter.decide(&hit).await.expect("decides");
    for _ in 0..3 {
        let explained = explain_one(&limiter, &[("api_key", "alice")]).await;
        assert_eq!(explained.matched, Matched::Limited);
        assert_eq!(explained.path.as_deref(), Some("edge > api_key"));
        assert_eq!(explained.limits.len(), 1);
        let limit = &explained.limits[0];
        assert_eq!(limit.name.as_deref(), Some("per_key"));
        assert_eq!(limit.rate.requests_per_unit, 3);
        assert_eq!(limit.rate.unit, Unit::Minute);
        assert_eq!(limit.rate.algorithm, Algorithm::FixedWindow);
        assert_eq!((limit.used, limit.remaining), (1, 2));
        assert_eq!(limit.reset_after, Duration::from_secs(50));
        assert!(!explained.would_reject());
        let placement = explained.placement.expect("a placement");
        assert!(placement.local);
        assert_eq!(placement.owner, None, "not in cluster mode");
        let (shard, shards) = placement.shard.expect("a shard here");
        assert_eq!(shards, 2);
        let mut key = crate::key::KeyBuilder::new("edge");
        key.entry("api_key", "alice");
        assert_eq!(shard, crate::key::shard_of(key.route(), 2));
    }
    // Two more hits fit: the explanations took nothing.
    for _ in 0..2 {
        let verdict = limiter.decide(&hit).await.expect("decides");
        assert!(!verdict.is_over());
    }
    let explained = explain_one(&limiter, &[("api_key", "alice")]).await;
    assert_eq!(
        (explained.limits[0].used, explained.limits[0].remaining),
        (3, 0)
    );
    assert!(explained.would_reject(), "a fourth hit would be over");
    assert!(limiter.decide(&hit).await.expect("decides").is_over());
}

#[tokio::test(start_paused = true)]
async fn explaining_is_not_a_request_in_the_metrics() {
    let limiter = limiter();
    explain_one(&limiter, &[("api_key", "alice")]).await;
    let text = limiter.metrics().encode();
    for (sample, value) in [
        (
            r#"ratekeeper_limit_total_hits_total{domain="edge",limit="per_key",unit="minute"}"#,
            " 0",
        ),
        (r#"ratekeeper_requests_total{result="ok",code="OK"}"#, " 0"),
    ] {
        let line = text.lines().find(|line| line.starts_with(sample));
        assert_eq!(line, Some(format!("{sample}{value}").as_str()), "{text}");
    }
    // The same query decided does count: the sample above is the right one.
    limiter
        .decide(&query("edge", &[&[("api_key", "alice")]], 1))
        .await
        .expect("decides");
    let text = limiter.metrics().encode();
    assert!(text.contains(
        r#"ratekeeper_limit_total_hits_total{domain="edge",limit="per_key",unit="minute"} 1"#
    ));
}

#[tokio::test(start_paused = true)]
async fn every_reason_for_no_limit_is_told_apart() {
    let limiter = limiter();
    let unknown = limiter
        .explain(&query("nowhere", &[&[("api_key", "a")]], 1))
        .await
        .expect("explains");
    assert!(!unknown.domain_found);
    assert_eq!(unknown.descriptors[0].matched, Matched::UnknownDomain);

    type Case<'a> = (&'a [(&'a str, &'a str)], Matched, Option<&'a str>);
    let cases: [Case<'_>; 5] = [
        (&[("nothing", "x")], Matched::NoMatch, None),
        (&[("api_key", "a"), ("deeper", "x")], Matched::NoMatch, None),
        (
            &[("health", "probe")],
            Matched::AllowListed,
            Some("edge > health"),
        ),
        (
            &[("api_key", "internal")],
            Matched::Unlimited,
            Some("edge > api_key=internal"),
        ),
        (
            &[("tenant", "t1"), ("path", "/a")],
            Matched::Limited,
            Some("edge > tenant > path"),
        ),
    ];
    for (entries, matched, path) in cases {
        let explained = explain_one(&limiter, entries).await;
        assert_eq!(explained.matched, matched, "{entries:?}");
        assert_eq!(explained.path.as_deref(), path, "{entries:?}");
        assert_eq!(
            explained.limits.is_empty(),
            !matched.is_limited(),
            "{entries:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_replaced_limit_names_the_limit_and_entry_that_replaced_it() {
    let limiter = limiter();
    let explanation = limiter
        .explain(&query(
            "edge",
            &[&[("tenant", "t1")], &[("tenant", "t1"), ("path", "/a")]],
            1,
        ))
        .await
        .expect("explains");
    let tenant = &explanation.descriptors[0];
    assert_eq!(tenant.matched, Matched::Replaced);
    assert_eq!(
        tenant.replaced,
        [Replacement {
            limit: Arc::from("tenant_wide"),
            by: Some(Arc::from("per_path")),
            at: Box::from("edge > tenant > path"),
        }]
    );
    assert_eq!(explanation.descriptors[1].matched, Matched::Limited);
    // Alone, the tenant's own limit applies.
    let alone = explain_one(&limiter, &[("tenant", "t1")]).await;
    assert_eq!(alone.matched, Matched::Limited);
    assert!(alone.replaced.is_empty());
}

#[tokio::test(start_paused = true)]
async fn several_limits_shadow_mode_and_request_limits_are_reported() {
    let limiter = limiter();
    let free = explain_one(&limiter, &[("api_key", "free")]).await;
    let names: Vec<Option<&str>> = free
        .limits
        .iter()
        .map(|limit| limit.name.as_deref())
        .collect();
    assert_eq!(names, [None, Some("daily")]);
    assert_eq!(free.limits[1].rate.algorithm, Algorithm::TokenBucket);
    assert_eq!((free.limits[1].used, free.limits[1].remaining), (0, 4));

    let shadowed = query("edge", &[&[("api_key", "shadowed")]], 1);
    limiter.decide(&shadowed).await.expect("decides");
    let explained = explain_one(&limiter, &[("api_key", "shadowed")]).await;
    assert!(explained.shadow);
    assert_eq!(explained.limits[0].remaining, 0);
    assert!(
        !explained.would_reject(),
        "a shadow limit is never enforced"
    );

    let mut own = query("edge", &[&[("api_key", "bob")]], 1);
    own.descriptors[0].limit = Some(LimitOverride {
        requests_per_unit: 7,
        unit: Unit::Hour,
    });
    let explanation = limiter.explain(&own).await.expect("explains");
    let explained = &explanation.descriptors[0];
    assert_eq!(explained.matched, Matched::RequestLimit);
    assert_eq!(explained.path, None);
    assert_eq!(explained.limits[0].rate.requests_per_unit, 7);
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_refused_naming_the_field() {
    let limiter = limiter();
    let error = limiter
        .explain(&query("edge", &[&[("", "x")]], 1))
        .await
        .expect_err("an empty key is invalid");
    assert_eq!(
        error.to_string(),
        "descriptors[0].entries[0].key: must not be empty"
    );
    let error = limiter
        .explain(&query("edge", &[], 1))
        .await
        .expect_err("no descriptors");
    assert_eq!(error.to_string(), "descriptors: must not be empty");
}

const EVERY_ALGORITHM: &str = r#"
domain: retry
descriptors:
  - key: fixed_window
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: sliding_window
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
  - key: token_bucket
    rate_limit: {unit: minute, requests_per_unit: 6, algorithm: token_bucket, burst: 3}
  - key: gcra
    rate_limit: {unit: minute, requests_per_unit: 6, algorithm: gcra, burst: 3}
"#;

#[tokio::test(start_paused = true)]
async fn a_rejecting_limit_says_exactly_when_the_hits_pass_again() {
    for algorithm in ["fixed_window", "sliding_window", "token_bucket", "gcra"] {
        for cost in [1, 2, 3] {
            let limiter = Limiter::at_test_start(EVERY_ALGORITHM, LimiterOptions::default());
            let entries: &[(&str, &str)] = &[(algorithm, "k")];
            let hits = |cost| query("retry", &[entries], cost);
            for _ in 0..3 {
                assert!(!limiter.decide(&hits(1)).await.expect("decides").is_over());
            }
            let explain = || async {
                let explanation = limiter.explain(&hits(cost)).await.expect("explains");
                explanation.descriptors.into_iter().next().expect("one")
            };
            let explained = explain().await;
            let case = format!("{algorithm}, {cost} hits: {explained:?}");
            assert!(explained.would_reject(), "{case}");
            assert!(explained.limits[0].rejects, "{case}");
            let wait = explained.retry_after().expect("a wait");
            assert_eq!(explained.limits[0].retry_after, Some(wait), "{case}");
            assert!(wait > Duration::ZERO, "{case}");
            // A millisecond early the hits are still over; at the wait they pass.
            tokio::time::advance(wait - Duration::from_millis(1)).await;
            assert!(explain().await.would_reject(), "{case}");
            let early = limiter.decide(&hits(cost)).await.expect("decides");
            assert!(early.is_over(), "{case}");
            tokio::time::advance(Duration::from_millis(1)).await;
            let explained = explain().await;
            assert!(!explained.would_reject(), "{case}");
            assert_eq!(explained.retry_after(), None, "passes now: {case}");
            assert_eq!(explained.limits[0].retry_after, None, "{case}");
            let now = limiter.decide(&hits(cost)).await.expect("decides");
            assert!(!now.is_over(), "{case}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn hits_beyond_a_limits_capacity_are_rejected_for_ever() {
    let every = Limiter::at_test_start(EVERY_ALGORITHM, LimiterOptions::default());
    for algorithm in ["fixed_window", "sliding_window", "token_bucket", "gcra"] {
        let explanation = every
            .explain(&query("retry", &[&[(algorithm, "fresh")]], 4))
            .await
            .expect("explains");
        let explained = &explanation.descriptors[0];
        assert_eq!(explained.limits[0].remaining, 3, "{algorithm}: untouched");
        assert!(explained.would_reject(), "{algorithm}: 4 hits never fit 3");
        assert!(explained.limits[0].rejects);
        assert_eq!(explained.limits[0].retry_after, None, "{algorithm}");
        assert_eq!(explained.retry_after(), None, "{algorithm}");
    }
    // The descriptor waits for its longest-waiting rejecting limit; "never" is the longest.
    let limiter = limiter();
    let free = |cost| query("edge", &[&[("api_key", "free")]], cost);
    for _ in 0..2 {
        assert!(!limiter.decide(&free(1)).await.expect("decides").is_over());
    }
    let waits = |explanation: &Explanation| -> Vec<Option<Duration>> {
        let limits = &explanation.descriptors[0].limits;
        limits.iter().map(|limit| limit.retry_after).collect()
    };
    // 2 per second (used up), 4 per day in a bucket of 4 (2 left): only the first rejects.
    let one = limiter.explain(&free(1)).await.expect("explains");
    assert_eq!(waits(&one), [Some(Duration::from_secs(1)), None]);
    assert_eq!(
        one.descriptors[0].retry_after(),
        Some(Duration::from_secs(1))
    );
    // 3 hits: never within a second, in 6 hours (a token per 6 hours) in the bucket.
    let three = limiter.explain(&free(3)).await.expect("explains");
    assert_eq!(waits(&three), [None, Some(Duration::from_secs(6 * 3600))]);
    let rejecting: Vec<bool> = three.descriptors[0]
        .limits
        .iter()
        .map(|l| l.rejects)
        .collect();
    assert_eq!(rejecting, [true, true]);
    assert_eq!(three.descriptors[0].retry_after(), None);
}
