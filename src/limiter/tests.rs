//! The limiter's own decisions on neutral queries: shared wildcard counters, quota mode and
//! the entries' metadata (the Envoy rendering is tested in `rls`).

use super::*;
use crate::limits::Metadata;

fn limiter(yaml: &str, options: LimiterOptions) -> Limiter {
    Limiter::at_test_start(yaml, options)
}

/// Decides one query with a descriptor per entry list, one hit each.
async fn decide(limiter: &Limiter, descriptors: &[&[(&str, &str)]]) -> Verdict {
    let mut query = Query::new("edge");
    for entries in descriptors {
        query.descriptor(entries.iter().copied(), 1);
    }
    limiter.decide(&query).await.expect("a valid query")
}

fn overs(verdict: &Verdict) -> Vec<bool> {
    verdict.statuses.iter().map(Status::is_over).collect()
}

const SHARED: &str = r#"
domain: edge
descriptors:
  - key: file
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: api/*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    value: t-*
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1}
"#;

#[tokio::test(start_paused = true)]
async fn values_matching_a_shared_wildcard_count_on_one_counter() {
    let limiter = limiter(SHARED, LimiterOptions::default());
    for (file, over) in [
        ("files/a.pdf", false),
        ("files/b.csv", false),
        ("files/c.txt", true),
    ] {
        let verdict = decide(&limiter, &[&[("file", file)]]).await;
        assert_eq!(overs(&verdict), [over], "{file}");
    }
    // The pattern spelled out as a value is just one more match of the shared wildcard.
    let literal = decide(&limiter, &[&[("file", "files/*")]]).await;
    assert_eq!(overs(&literal), [true]);
}

#[tokio::test(start_paused = true)]
async fn without_share_threshold_each_wildcard_match_counts_on_its_own() {
    let limiter = limiter(SHARED, LimiterOptions::default());
    for path in ["api/a", "api/b", "api/a"] {
        let verdict = decide(&limiter, &[&[("path", path)]]).await;
        assert_eq!(overs(&verdict), [false], "{path}");
    }
    let third = decide(&limiter, &[&[("path", "api/a")]]).await;
    assert_eq!(overs(&third), [true]);
}

#[tokio::test(start_paused = true)]
async fn a_shared_wildcard_shares_its_entry_for_the_limits_below_it() {
    let limiter = limiter(SHARED, LimiterOptions::default());
    let first = decide(&limiter, &[&[("tenant", "t-1"), ("user", "u1")]]).await;
    assert_eq!(overs(&first), [false]);
    // Another tenant matching t-* is the same counter for u1 ...
    let again = decide(&limiter, &[&[("tenant", "t-2"), ("user", "u1")]]).await;
    assert_eq!(overs(&again), [true]);
    // ... while the user entry below still counts per value.
    let other = decide(&limiter, &[&[("tenant", "t-2"), ("user", "u2")]]).await;
    assert_eq!(overs(&other), [false]);
}

const QUOTA: &str = r#"
domain: edge
descriptors:
  - key: model
    value: gpt-a
    quota_mode: true
    metadata: {backend: a}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: model
    value: gpt-b
    quota_mode: true
    metadata: {backend: b, weight: 2}
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: health
    metadata: {probe: true}
"#;

const MODELS: &[&[(&str, &str)]] = &[&[("model", "gpt-a")], &[("model", "gpt-b")]];

fn backend(metadata: &Option<Arc<Metadata>>) -> Option<&str> {
    metadata.as_ref()?.get("backend")?.as_str()
}

#[tokio::test(start_paused = true)]
async fn quota_mode_passes_until_every_quota_descriptor_is_over() {
    let limiter = limiter(QUOTA, LimiterOptions::default());
    let first = decide(&limiter, MODELS).await;
    assert_eq!(overs(&first), [false, false]);
    assert!(first.soft_mode);
    assert!(first.soft_violations.is_empty());

    // gpt-a is used up: the request still passes, and gpt-a is reported over.
    let second = decide(&limiter, MODELS).await;
    assert!(!second.is_over(), "{second:?}");
    assert_eq!(second.retry_after(), None, "it passes");
    assert_eq!(second.soft_violations.as_slice(), [0]);
    let a = second.statuses[0].limited().expect("a limit applies");
    assert_eq!((a.over, a.remaining), (true, 0));

    // Both used up: now the request is over, on both descriptors.
    let third = decide(&limiter, MODELS).await;
    assert!(third.is_over());
    assert_eq!(overs(&third), [true, true]);
    assert_eq!(third.soft_violations.as_slice(), [0, 1]);
    assert!(third.retry_after().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_normal_limit_over_still_rejects_next_to_quota_descriptors() {
    let limiter = limiter(QUOTA, LimiterOptions::default());
    let both: &[&[(&str, &str)]] = &[&[("model", "gpt-b")], &[("user", "u1")]];
    let first = decide(&limiter, both).await;
    assert!(!first.is_over());
    let second = decide(&limiter, both).await;
    assert_eq!(overs(&second), [false, true]);
    assert!(second.soft_violations.is_empty());
    // Without a quota-mode limit nothing is reported as quota mode.
    let plain = decide(&limiter, &[&[("user", "u2")]]).await;
    assert!(!plain.soft_mode);
}

#[tokio::test(start_paused = true)]
async fn global_quota_mode_makes_every_limit_a_quota_limit() {
    let options = LimiterOptions {
        soft_mode: true,
        ..LimiterOptions::default()
    };
    let limiter = limiter(QUOTA, options);
    let alone = decide(&limiter, &[&[("user", "p")]]).await;
    assert!(alone.soft_mode && !alone.is_over());
    let with_room = decide(&limiter, &[&[("user", "p")], &[("user", "q")]]).await;
    assert!(!with_room.is_over(), "q still has room");
    assert_eq!(overs(&with_room), [true, false]);
    assert_eq!(with_room.soft_violations.as_slice(), [0]);
    // The only quota descriptor is over: nothing is left to fall back on.
    let alone_again = decide(&limiter, &[&[("user", "p")]]).await;
    assert!(alone_again.is_over());
    assert_eq!(overs(&alone_again), [true]);
}

#[tokio::test(start_paused = true)]
async fn metadata_comes_back_only_for_entries_whose_limits_held() {
    let limiter = limiter(QUOTA, LimiterOptions::default());
    let first = decide(&limiter, MODELS).await;
    let backends: Vec<_> = first.metadata.iter().map(backend).collect();
    assert_eq!(backends, [Some("a"), Some("b")]);
    let second = decide(&limiter, MODELS).await;
    let backends: Vec<_> = second.metadata.iter().map(backend).collect();
    assert_eq!(backends, [None, Some("b")], "gpt-a is out of quota");

    // An entry without limits (an allow-list entry) hands its metadata back too; no match
    // and an unknown domain have none.
    let health = decide(&limiter, &[&[("health", "x")], &[("nothing", "here")]]).await;
    let probe = health.metadata[0].as_ref().and_then(|m| m.get("probe"));
    assert_eq!(probe, Some(&serde_json::Value::Bool(true)));
    assert_eq!(health.metadata[1], None);
    let mut unknown = Query::new("elsewhere");
    unknown.descriptor([("model", "gpt-a")], 1);
    let unknown = limiter.decide(&unknown).await.expect("valid");
    assert_eq!(unknown.metadata.as_slice(), [None]);
}

#[tokio::test(start_paused = true)]
async fn a_reset_forgets_every_counter_of_one_descriptor_and_only_those() {
    let limiter = limiter(SHARED, LimiterOptions::default());
    for _ in 0..2 {
        decide(&limiter, &[&[("file", "files/a.pdf")]]).await;
        decide(&limiter, &[&[("path", "api/x")]]).await;
    }
    assert_eq!(
        overs(&decide(&limiter, &[&[("file", "files/a.pdf")]]).await),
        [true]
    );
    // A value sharing the wildcard's counter resets that shared counter.
    let mut query = Query::new("edge");
    query.descriptor([("file", "files/other")], 1);
    let outcome = limiter.reset(&query).await.expect("a valid reset");
    let ResetOutcome::Reset { path, removed, .. } = outcome else {
        panic!("not reset: {outcome:?}");
    };
    assert_eq!((path.as_deref(), removed), (Some("edge > file=files/*"), 1));
    assert_eq!(
        overs(&decide(&limiter, &[&[("file", "files/a.pdf")]]).await),
        [false]
    );
    assert_eq!(
        overs(&decide(&limiter, &[&[("path", "api/x")]]).await),
        [true],
        "untouched"
    );
    // Nothing to reset, or no such domain: told apart; two descriptors: refused.
    let mut none = Query::new("edge");
    none.descriptor([("user", "u")], 1);
    assert_eq!(limiter.reset(&none).await, Ok(ResetOutcome::NoLimit));
    let mut elsewhere = Query::new("nowhere");
    elsewhere.descriptor([("path", "api/x")], 1);
    assert_eq!(
        limiter.reset(&elsewhere).await,
        Ok(ResetOutcome::UnknownDomain)
    );
    let mut two = Query::new("edge");
    two.descriptor([("path", "api/x")], 1);
    two.descriptor([("path", "api/y")], 1);
    let refused = limiter.reset(&two).await.expect_err("two descriptors");
    assert_eq!(
        refused.to_string(),
        "descriptors: 2 given, a reset takes exactly one"
    );
}
