//! The adapter's checks and the shape of what Envoy is sent.

use std::collections::HashMap;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;

use super::*;
use crate::quota::TokenBucket;

fn report(buckets: Vec<HashMap<String, String>>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: buckets
            .into_iter()
            .map(|bucket| BucketQuotaUsage {
                bucket_id: Some(BucketId { bucket }),
                time_elapsed: Some(ProtoDuration {
                    seconds: 5,
                    nanos: 0,
                }),
                num_requests_allowed: 7,
                num_requests_denied: 3,
            })
            .collect(),
    }
}

fn pairs(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

#[test]
fn usages_read_bucket_ids_ordered_by_key() {
    let usages = usages(&report(vec![pairs(&[
        ("path", "/a"),
        ("api_key", "alice"),
    ])]));
    assert_eq!(
        usages.valid,
        vec![Usage {
            bucket: bucket_key([("api_key", "alice"), ("path", "/a")]),
            allowed: 7,
            denied: 3,
            elapsed: Duration::from_secs(5),
        }]
    );
    assert!(usages.invalid.is_empty());
}

#[test]
fn bad_bucket_ids_are_set_apart_naming_the_field_and_the_rest_is_read() {
    let many: HashMap<String, String> = (0..=MAX_BUCKET_ENTRIES)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    let long = "x".repeat(MAX_ENTRY_BYTES + 1);
    let read = usages(&report(vec![
        pairs(&[("a", "b")]),
        HashMap::new(),
        many.clone(),
        pairs(&[("k", long.as_str())]),
        pairs(&[("c", "d")]),
    ]));
    assert_eq!(read.valid.len(), 2, "the valid buckets are read: {read:?}");
    let invalid: Vec<(&str, &str)> = read
        .invalid
        .iter()
        .map(|bucket| (bucket.reason, bucket.problem.as_str()))
        .collect();
    assert_eq!(invalid.len(), 3);
    assert_eq!(invalid[0].0, "empty");
    assert!(
        invalid[0]
            .1
            .starts_with("bucket_quota_usages[1].bucket_id: missing or empty")
    );
    assert_eq!(invalid[1].0, "too_many_pairs");
    assert!(invalid[1].1.contains("33 pairs"), "{}", invalid[1].1);
    assert_eq!(invalid[2].0, "pair_too_long");
    assert!(invalid[2].1.starts_with("bucket_quota_usages[3].bucket_id"));
    // Each is echoed as reported: Envoy matches the answer by the id.
    assert_eq!(read.invalid[1].bucket.len(), MAX_BUCKET_ENTRIES + 1);
    assert_eq!(read.invalid[2].bucket, bucket_key([("k", long.as_str())]));
    // A negative time is read as none.
    let mut negative = report(vec![pairs(&[("a", "b")])]);
    negative.bucket_quota_usages[0].time_elapsed = Some(ProtoDuration {
        seconds: -4,
        nanos: 0,
    });
    assert_eq!(usages(&negative).valid[0].elapsed, Duration::ZERO);
}

#[test]
fn responses_echo_the_bucket_id_with_whole_seconds() {
    let bucket = bucket_key([("api_key", "alice"), ("path", "/a")]);
    let response = response(
        vec![
            Action::Assign {
                bucket: bucket.clone(),
                strategy: Strategy::TokenBucket(TokenBucket {
                    max_tokens: 4,
                    tokens_per_fill: 20,
                    fill_interval_secs: 60,
                }),
            },
            Action::Assign {
                bucket: bucket.clone(),
                strategy: Strategy::DenyAll,
            },
            Action::Abandon { bucket },
        ],
        Duration::from_millis(15_500),
    );
    let id = pairs(&[("api_key", "alice"), ("path", "/a")]);
    let [token, deny, abandon] = response.bucket_action.as_slice() else {
        panic!("three actions: {response:?}");
    };
    assert_eq!(token.bucket_id.as_ref().map(|id| &id.bucket), Some(&id));
    let Some(ActionKind::QuotaAssignmentAction(assignment)) = &token.bucket_action else {
        panic!("an assignment: {token:?}");
    };
    assert_eq!(
        assignment.assignment_time_to_live,
        Some(ProtoDuration {
            seconds: 15,
            nanos: 0
        })
    );
    assert_eq!(
        assignment.rate_limit_strategy,
        Some(RateLimitStrategy {
            strategy: Some(Proto::TokenBucket(ProtoTokenBucket {
                max_tokens: 4,
                tokens_per_fill: Some(UInt32Value { value: 20 }),
                fill_interval: Some(ProtoDuration {
                    seconds: 60,
                    nanos: 0
                }),
            }))
        })
    );
    let Some(ActionKind::QuotaAssignmentAction(denied)) = &deny.bucket_action else {
        panic!("an assignment: {deny:?}");
    };
    assert_eq!(
        denied.rate_limit_strategy,
        Some(RateLimitStrategy {
            strategy: Some(Proto::BlanketRule(BlanketRule::DenyAll as i32))
        })
    );
    assert_eq!(
        abandon.bucket_action,
        Some(ActionKind::AbandonAction(AbandonAction {}))
    );
}
