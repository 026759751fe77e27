//! The adapter's checks and the shape of what Envoy is sent.

use std::collections::HashMap;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;

use super::*;

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
    ])]))
    .expect("a valid report");
    assert_eq!(
        usages,
        vec![Usage {
            bucket: bucket_key([("api_key", "alice"), ("path", "/a")]),
            allowed: 7,
            denied: 3,
            elapsed: Duration::from_secs(5),
        }]
    );
}

#[test]
fn bad_bucket_ids_are_refused_naming_the_field() {
    let empty = usages(&report(vec![pairs(&[("a", "b")]), HashMap::new()]))
        .expect_err("an empty bucket id");
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    assert!(
        empty
            .message()
            .starts_with("bucket_quota_usages[1].bucket_id: "),
        "{}",
        empty.message()
    );
    let many: Vec<(String, String)> = (0..=MAX_BUCKET_ENTRIES)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    let error = usages(&report(vec![many.into_iter().collect()])).expect_err("too many pairs");
    assert!(error.message().contains("33 pairs"), "{}", error.message());
    let long = "x".repeat(MAX_ENTRY_BYTES + 1);
    let error =
        usages(&report(vec![pairs(&[("k", long.as_str())])])).expect_err("too long a value");
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    // A negative time is read as none.
    let mut negative = report(vec![pairs(&[("a", "b")])]);
    negative.bucket_quota_usages[0].time_elapsed = Some(ProtoDuration {
        seconds: -4,
        nanos: 0,
    });
    assert_eq!(usages(&negative).expect("valid")[0].elapsed, Duration::ZERO);
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
