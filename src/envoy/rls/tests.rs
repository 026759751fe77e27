use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::google::protobuf::UInt64Value;

mod metadata;

use super::*;
use crate::limiter::{LimiterOptions, bounds};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_key}
  - key: api_key
    value: vip
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: api_key
    value: free
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: day, requests_per_unit: 4}
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
        rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: tenant_wide}]}
  - key: health
"#;

fn limiter(response_headers: bool) -> Limiter {
    limiter_with(LimiterOptions {
        response_headers,
        ..LimiterOptions::default()
    })
}

fn limiter_with(options: LimiterOptions) -> Limiter {
    Limiter::at_test_start(LIMITS, options)
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(limiter: &Limiter, request: &RateLimitRequest) -> RateLimitResponse {
    should_rate_limit(limiter, request)
        .await
        .expect("a valid request")
}

fn codes(response: &RateLimitResponse) -> Vec<Code> {
    response
        .statuses
        .iter()
        .map(|status| Code::try_from(status.code).expect("known code"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_limit_turns_over_after_requests_per_unit_hits() {
    let limiter = limiter(false);
    let one = request(vec![descriptor(&[("api_key", "alice")])]);
    for remaining in [2, 1, 0] {
        let response = ask(&limiter, &one).await;
        assert_eq!(response.overall_code, Code::Ok as i32);
        let status = &response.statuses[0];
        assert_eq!(status.limit_remaining, remaining);
        let limit = status.current_limit.as_ref().expect("a limit applies");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("per_key", 3, Unit::Minute.to_proto())
        );
        let reset = status.duration_until_reset.expect("reset");
        assert_eq!(
            (reset.seconds, reset.nanos),
            (50, 0),
            "the minute ends at :00:60"
        );
    }
    let over = ask(&limiter, &one).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    assert_eq!(codes(&over), [Code::OverLimit]);
    // Each value under the default entry counts on its own.
    let bob = ask(&limiter, &request(vec![descriptor(&[("api_key", "bob")])])).await;
    assert_eq!(codes(&bob), [Code::Ok]);
    // Exact values win over the default entry.
    let vip = ask(&limiter, &request(vec![descriptor(&[("api_key", "vip")])])).await;
    assert_eq!(vip.statuses[0].limit_remaining, 99);
}

#[tokio::test(start_paused = true)]
async fn no_match_and_unknown_domains_are_ok_without_a_limit() {
    let limiter = limiter(false);
    for request in [
        request(vec![descriptor(&[("unknown", "x")])]),
        request(vec![descriptor(&[("health", "")])]),
        request(vec![descriptor(&[("api_key", "a"), ("deeper", "b")])]),
        RateLimitRequest {
            domain: "other".to_owned(),
            ..request(vec![descriptor(&[("api_key", "a")])])
        },
    ] {
        let response = ask(&limiter, &request).await;
        assert_eq!(response.overall_code, Code::Ok as i32);
        assert_eq!(response.statuses.len(), 1);
        assert_eq!(response.statuses[0].current_limit, None);
    }
}

#[tokio::test(start_paused = true)]
async fn one_status_per_descriptor_in_order() {
    let limiter = limiter(false);
    let mixed = request(vec![
        descriptor(&[("api_key", "carol")]),
        descriptor(&[("unknown", "x")]),
        descriptor(&[("api_key", "vip")]),
    ]);
    let response = ask(&limiter, &mixed).await;
    let remaining: Vec<u32> = response
        .statuses
        .iter()
        .map(|s| s.limit_remaining)
        .collect();
    assert_eq!(remaining, [2, 0, 99]);
    assert_eq!(response.statuses[1].current_limit, None);
}

#[tokio::test(start_paused = true)]
async fn several_limits_on_one_descriptor_report_the_closest_to_exhaustion() {
    let limiter = limiter(false);
    let free = request(vec![descriptor(&[("api_key", "free")])]);
    let first = ask(&limiter, &free).await;
    let limit = first.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!(
        (limit.requests_per_unit, first.statuses[0].limit_remaining),
        (2, 1)
    );
    ask(&limiter, &free).await;
    let over = ask(&limiter, &free).await;
    assert_eq!(codes(&over), [Code::OverLimit], "2 per second reached");
    tokio::time::advance(std::time::Duration::from_secs(1)).await;
    let third = ask(&limiter, &free).await;
    let limit = third.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!(
        (
            limit.requests_per_unit,
            limit.unit,
            third.statuses[0].limit_remaining
        ),
        (4, Unit::Day.to_proto(), 1),
        "the day has 1 left (the rejected request did not count), tighter than the second's 1? tie goes to the later reset"
    );
    ask(&limiter, &free).await;
    tokio::time::advance(std::time::Duration::from_secs(1)).await;
    let day_over = ask(&limiter, &free).await;
    assert_eq!(codes(&day_over), [Code::OverLimit]);
    let limit = day_over.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!(
        limit.unit,
        Unit::Day.to_proto(),
        "the day limit is the one over"
    );
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_counts_but_never_rejects() {
    let limiter = limiter(false);
    let shadowed = request(vec![descriptor(&[("api_key", "shadowed")])]);
    ask(&limiter, &shadowed).await;
    let over = ask(&limiter, &shadowed).await;
    assert_eq!(over.overall_code, Code::Ok as i32);
    assert_eq!(codes(&over), [Code::Ok]);
    assert_eq!(
        over.statuses[0].limit_remaining, 0,
        "it reports the real count"
    );
}

#[tokio::test(start_paused = true)]
async fn unlimited_never_rejects() {
    let limiter = limiter(false);
    let internal = request(vec![descriptor(&[("api_key", "internal")])]);
    for _ in 0..10 {
        let response = ask(&limiter, &internal).await;
        assert_eq!(codes(&response), [Code::Ok]);
        assert_eq!(response.statuses[0].limit_remaining, u32::MAX);
        assert_eq!(response.statuses[0].current_limit, None);
    }
}

#[tokio::test(start_paused = true)]
async fn replaces_drops_the_replaced_limit_for_that_request() {
    let limiter = limiter(false);
    let both = request(vec![
        descriptor(&[("tenant", "t1")]),
        descriptor(&[("tenant", "t1"), ("path", "/a")]),
    ]);
    for _ in 0..5 {
        let response = ask(&limiter, &both).await;
        assert_eq!(codes(&response), [Code::Ok, Code::Ok]);
        assert_eq!(
            response.statuses[0].current_limit, None,
            "tenant_wide is replaced"
        );
    }
    assert_eq!(
        codes(&ask(&limiter, &both).await),
        [Code::Ok, Code::OverLimit]
    );
    // Alone, the tenant limit applies, and it was never charged by the requests above.
    let alone = request(vec![descriptor(&[("tenant", "t1")])]);
    assert_eq!(codes(&ask(&limiter, &alone).await), [Code::Ok]);
    assert_eq!(codes(&ask(&limiter, &alone).await), [Code::OverLimit]);
}

#[tokio::test(start_paused = true)]
async fn hits_addend_request_level_and_per_descriptor() {
    let limiter = limiter(false);
    let mut heavy = request(vec![descriptor(&[("api_key", "dave")])]);
    heavy.hits_addend = 2;
    assert_eq!(ask(&limiter, &heavy).await.statuses[0].limit_remaining, 1);
    let mut peek = descriptor(&[("api_key", "dave")]);
    peek.hits_addend = Some(UInt64Value { value: 0 });
    let peeked = ask(&limiter, &request(vec![peek])).await;
    assert_eq!(
        peeked.statuses[0].limit_remaining, 1,
        "explicit 0 checks without consuming"
    );
    let mut one = descriptor(&[("api_key", "dave")]);
    one.hits_addend = Some(UInt64Value { value: 1 });
    heavy.descriptors = vec![one];
    let last = ask(&limiter, &heavy).await;
    assert_eq!(
        (codes(&last)[0], last.statuses[0].limit_remaining),
        (Code::Ok, 0),
        "the descriptor's own hits_addend wins over the request's"
    );
    let mut too_many = request(vec![descriptor(&[("api_key", "erin")])]);
    too_many.hits_addend = 4;
    assert_eq!(codes(&ask(&limiter, &too_many).await), [Code::OverLimit]);
}

#[tokio::test(start_paused = true)]
async fn an_over_limit_descriptor_reports_nothing_remaining_like_the_reference() {
    let limiter = limiter(true);
    let mut two = request(vec![descriptor(&[("api_key", "fay")])]);
    two.hits_addend = 2;
    assert_eq!(ask(&limiter, &two).await.statuses[0].limit_remaining, 1);
    let mut three = two.clone();
    three.hits_addend = 3;
    let over = ask(&limiter, &three).await;
    assert_eq!(codes(&over), [Code::OverLimit]);
    assert_eq!(
        over.statuses[0].limit_remaining, 0,
        "1 hit is left, but a 429 must not say so"
    );
    let remaining = over
        .response_headers_to_add
        .iter()
        .find(|header| header.key == "RateLimit-Remaining")
        .map(|header| header.value.as_str());
    assert_eq!(remaining, Some("0"));
    // Nothing was consumed: the hit that is left is still there.
    let mut one = two.clone();
    one.hits_addend = 1;
    let last = ask(&limiter, &one).await;
    assert_eq!(
        (codes(&last)[0], last.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn the_rate_limit_headers_take_the_configured_names() {
    let limiter = limiter_with(LimiterOptions {
        response_headers: true,
        header_names: crate::limiter::HeaderNames {
            limit: "X-Limit".into(),
            remaining: "X-Left".into(),
            reset: "X-Reset".into(),
        },
        ..LimiterOptions::default()
    });
    let response = ask(&limiter, &request(vec![descriptor(&[("api_key", "ivy")])])).await;
    let headers: Vec<(&str, &str)> = response
        .response_headers_to_add
        .iter()
        .map(|header| (header.key.as_str(), header.value.as_str()))
        .collect();
    assert_eq!(
        headers,
        [("X-Limit", "3"), ("X-Left", "2"), ("X-Reset", "50")]
    );
}

#[test]
fn header_names_must_be_tokens() {
    use crate::limiter::HeaderNames;
    assert_eq!(HeaderNames::check("X-Quota_Remaining.v2"), Ok(()));
    for bad in ["", "Rate Limit", "x:y", "é", &"x".repeat(129)] {
        assert!(HeaderNames::check(bad).is_err(), "{bad:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn global_shadow_mode_reports_every_violation_but_rejects_nothing() {
    let limiter = limiter_with(LimiterOptions {
        shadow_mode: true,
        ..LimiterOptions::default()
    });
    let mut own = descriptor(&[("api_key", "gus")]);
    own.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 2,
    });
    let both = request(vec![descriptor(&[("api_key", "hal")]), own]);
    let first = ask(&limiter, &both).await;
    assert_eq!(codes(&first), [Code::Ok, Code::Ok]);
    // The reference's TestServiceGlobalShadowMode: the overall code is OK, but each
    // violating descriptor keeps OVER_LIMIT (headers, access logs and metadata show it).
    for _ in 0..4 {
        let response = ask(&limiter, &both).await;
        assert_eq!(response.overall_code, Code::Ok as i32);
        assert_eq!(codes(&response)[1], Code::OverLimit);
    }
    let response = ask(&limiter, &both).await;
    assert_eq!(
        response.statuses[0].limit_remaining, 0,
        "counted as usual: 3 per minute, 6 hits"
    );
    let text = limiter.metrics().encode();
    assert!(
        text.contains(
            r#"ratekeeper_limit_shadow_mode_total{domain="edge",limit="per_key",unit="minute"} 3"#
        ),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_descriptor_limit_overrides_the_configured_one() {
    let limiter = limiter(false);
    let mut custom = descriptor(&[("api_key", "frank")]);
    custom.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour.to_proto(),
    });
    let request = request(vec![custom]);
    let first = ask(&limiter, &request).await;
    let limit = first.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Hour.to_proto())
    );
    assert_eq!(codes(&ask(&limiter, &request).await), [Code::OverLimit]);
}

#[tokio::test(start_paused = true)]
async fn response_headers_follow_the_tightest_limit_when_enabled() {
    for enabled in [false, true] {
        let limiter = limiter(enabled);
        let response = ask(
            &limiter,
            &request(vec![
                descriptor(&[("api_key", "vip")]),
                descriptor(&[("api_key", "gina")]),
            ]),
        )
        .await;
        let headers: Vec<(&str, &str)> = response
            .response_headers_to_add
            .iter()
            .map(|header| (header.key.as_str(), header.value.as_str()))
            .collect();
        if enabled {
            assert_eq!(
                headers,
                [
                    ("RateLimit-Limit", "3"),
                    ("RateLimit-Remaining", "2"),
                    ("RateLimit-Reset", "50")
                ]
            );
        } else {
            assert!(headers.is_empty());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn bad_requests_name_the_field() {
    let limiter = limiter(false);
    let long = "x".repeat(bounds::MAX_VALUE_LEN + 1);
    let mut bad_unit = descriptor(&[("api_key", "a")]);
    bad_unit.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let cases = [
        (
            RateLimitRequest {
                domain: String::new(),
                ..request(vec![descriptor(&[("a", "b")])])
            },
            "domain: must not be empty",
        ),
        (request(vec![]), "descriptors: must not be empty"),
        (
            request(vec![descriptor(&[("a", "b")]); 65]),
            "descriptors: 65 given, at most 64 allowed",
        ),
        (
            request(vec![descriptor(&[("a", "b")]), descriptor(&[])]),
            "descriptors[1].entries: must not be empty",
        ),
        (
            request(vec![descriptor(&[("a", "b"), ("", "c")])]),
            "descriptors[0].entries[1].key: must not be empty",
        ),
        (
            request(vec![descriptor(&[("a", &long)])]),
            "descriptors[0].entries[0].value: 4097 bytes, at most 4096 allowed",
        ),
        (
            request(vec![bad_unit]),
            "descriptors[0].limit.unit: unknown unit 0",
        ),
    ];
    for (request, message) in cases {
        let error = should_rate_limit(&limiter, &request)
            .await
            .expect_err(message);
        let status = error.to_grpc();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{message}");
        assert_eq!(status.message(), message);
    }
}

#[tokio::test(start_paused = true)]
async fn the_verdict_says_exactly_when_a_denied_request_would_pass() {
    let limiter = limiter(false);
    let free = request(vec![descriptor(&[("api_key", "free")])]);
    for _ in 0..2 {
        let verdict = limiter
            .decide(&query(&free).expect("valid"))
            .await
            .expect("valid");
        assert_eq!(verdict.retry_after(), None, "admitted: nothing to wait for");
    }
    let denied = limiter
        .decide(&query(&free).expect("valid"))
        .await
        .expect("valid");
    assert_eq!(codes(&response(&denied, &[])), [Code::OverLimit]);
    // 2 per second, and the clock sits exactly on a second: the next window opens in 1 s.
    assert_eq!(
        denied.retry_after(),
        Some(std::time::Duration::from_secs(1))
    );
    tokio::time::advance(std::time::Duration::from_millis(999)).await;
    assert_eq!(codes(&ask(&limiter, &free).await), [Code::OverLimit]);
    tokio::time::advance(std::time::Duration::from_millis(1)).await;
    assert_eq!(codes(&ask(&limiter, &free).await), [Code::Ok]);
}

/// Envoy's `RateLimitResponse` with its pending `RateLimit.unit_multiplier` (field 4, a
/// `UInt32Value`; envoyproxy/envoy#47307), to read what `--unit-multiplier-field` sends.
mod pending {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UInt32Value {
        #[prost(uint32, tag = "1")]
        pub value: u32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimit {
        #[prost(string, tag = "3")]
        pub name: String,
        #[prost(uint32, tag = "1")]
        pub requests_per_unit: u32,
        #[prost(int32, tag = "2")]
        pub unit: i32,
        #[prost(message, optional, tag = "4")]
        pub unit_multiplier: Option<UInt32Value>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DescriptorStatus {
        #[prost(int32, tag = "1")]
        pub code: i32,
        #[prost(message, optional, tag = "2")]
        pub current_limit: Option<RateLimit>,
        #[prost(uint32, tag = "3")]
        pub limit_remaining: u32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimitResponse {
        #[prost(int32, tag = "1")]
        pub overall_code: i32,
        #[prost(message, repeated, tag = "2")]
        pub statuses: Vec<DescriptorStatus>,
    }
}

#[tokio::test]
async fn the_unit_multiplier_field_is_sent_only_when_asked_and_only_where_it_is_not_one() {
    const WINDOWS: &str = "
domain: edge
descriptors:
  - key: ten_seconds
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 5, name: ten}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 3}
";
    let request = request(vec![
        descriptor(&[("ten_seconds", "a")]),
        descriptor(&[("minute", "a")]),
        descriptor(&[("nothing", "a")]),
    ]);
    for field in [false, true] {
        let options = LimiterOptions {
            unit_multiplier_field: field,
            response_headers: true,
            ..LimiterOptions::default()
        };
        let limiter = Limiter::at_test_start(WINDOWS, options);
        let answer = decide(&limiter, &request).await.expect("decided");
        let plain = answer.response.encode_to_vec();
        let mut sent = Vec::new();
        answer.encode(&mut sent);
        // Envoy 1.40 reads exactly what it always did.
        let envoy = RateLimitResponse::decode(sent.as_slice()).expect("Envoy reads it");
        assert_eq!(
            envoy,
            RateLimitResponse::decode(plain.as_slice()).expect("decodes")
        );
        let limit = &envoy.statuses[0].current_limit;
        assert_eq!(
            limit
                .as_ref()
                .map(|limit| (limit.unit, limit.requests_per_unit)),
            Some((Unit::Second.to_proto(), 5)),
            "Envoy's field says the unit alone"
        );
        let pending = pending::RateLimitResponse::decode(sent.as_slice()).expect("decodes");
        let multipliers: Vec<Option<u32>> = pending
            .statuses
            .iter()
            .map(|status| {
                let limit = status.current_limit.as_ref()?;
                limit.unit_multiplier.as_ref().map(|value| value.value)
            })
            .collect();
        if field {
            assert_eq!(multipliers, [Some(10), None, None]);
            let ten = pending.statuses[0].current_limit.as_ref().expect("a limit");
            assert_eq!((ten.name.as_str(), ten.requests_per_unit), ("ten", 5));
        } else {
            assert_eq!(multipliers, [None, None, None]);
            assert_eq!(sent, plain, "off: the bytes are prost's");
        }
    }
}
