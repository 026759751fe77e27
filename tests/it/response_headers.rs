//! `--response-headers`: the IETF draft's `RateLimit-Policy` and `RateLimit` structured
//! fields on every front end (gRPC, `/json`, `/nginx`, `/rate`), parsed by an independent
//! structured-field parser, and the boolean forms that keep draft-03's three headers.

use crate::support::{
    Ratekeeper, TempDir, http_get, http_post, run_ratekeeper, serve_limits_with_env,
    structured_list, write_config,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};

/// Token buckets refilling one token every 20 minutes: no window boundary mid-test.
const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit: {name: per_key, algorithm: token_bucket, unit: hour, requests_per_unit: 3}
  - key: tenant
    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 10}
";

fn start(args: &[&str], env: &[(&str, &str)]) -> (TempDir, Ratekeeper) {
    serve_limits_with_env("response-headers", LIMITS, args, env)
}

type Members = Vec<(String, Vec<(String, i64)>)>;

/// Checks `RateLimit-Policy` and `RateLimit` of one `per_key` policy with `remaining` hits
/// left, and returns the reset (`t`) in seconds.
fn check_per_key(policy: &str, state: &str, remaining: i64) -> i64 {
    let policy: Members = structured_list(policy);
    assert_eq!(
        policy,
        [(
            "per_key".to_owned(),
            vec![("q".to_owned(), 3), ("w".to_owned(), 3600)]
        )]
    );
    let state: Members = structured_list(state);
    assert_eq!(state.len(), 1, "{state:?}");
    assert_eq!(state[0].0, "per_key");
    let params = &state[0].1;
    assert_eq!(params[0], ("r".to_owned(), remaining), "{state:?}");
    assert_eq!(params[1].0, "t");
    let reset = params[1].1;
    // Each used token takes 20 minutes to come back.
    let used = 3 - remaining;
    assert!(
        reset > (used - 1) * 1200 && reset <= used * 1200,
        "{reset} s for {used} used"
    );
    reset
}

fn json_request(value: &str) -> String {
    json!({"domain": "edge", "descriptors": [{"entries": [{"key": "api_key", "value": value}]}]})
        .to_string()
}

/// `responseHeadersToAdd` of a `/json` answer, as (key, value) pairs.
fn json_headers(server: &Ratekeeper, value: &str) -> Vec<(String, String)> {
    let response =
        http_post(server.http_addr(), "/json", &[], &json_request(value)).expect("answers");
    let body: Value = serde_json::from_str(&response.body).expect("JSON");
    body["responseHeadersToAdd"]
        .as_array()
        .map(|headers| {
            headers
                .iter()
                .map(|header| {
                    let text = |name: &str| header[name].as_str().unwrap_or_default().to_owned();
                    (text("key"), text("value"))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ietf_fields_on_grpc_json_nginx_and_rate() {
    let (_dir, server) = start(&["--response-headers=ietf"], &[]);

    // gRPC: what Envoy adds to the client's response.
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr()))
        .await
        .expect("connects");
    let request = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".to_owned(),
                value: "a".to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let response = client
        .should_rate_limit(request)
        .await
        .expect("answers")
        .into_inner();
    let headers: Vec<(&str, &str)> = response
        .response_headers_to_add
        .iter()
        .map(|header| (header.key.as_str(), header.value.as_str()))
        .collect();
    assert_eq!(
        headers.iter().map(|(key, _)| *key).collect::<Vec<_>>(),
        ["RateLimit-Policy", "RateLimit"],
        "the draft-03 headers are replaced"
    );
    check_per_key(headers[0].1, headers[1].1, 2);

    // /json carries the same headers.
    let headers = json_headers(&server, "a");
    assert_eq!(headers[0].0, "RateLimit-Policy");
    assert_eq!(headers[1].0, "RateLimit");
    check_per_key(&headers[0].1, &headers[1].1, 1);

    // nginx: on the 204 itself.
    let descriptor = ("X-Ratelimit-Descriptor", "api_key=a");
    let response = http_get(server.http_addr(), "/nginx/edge", &[descriptor]).expect("answers");
    assert_eq!(response.status, 204);
    assert_eq!(response.header("ratelimit-limit"), None);
    check_per_key(
        response.header("ratelimit-policy").expect("a policy"),
        response.header("ratelimit").expect("a state"),
        0,
    );

    // /rate: denied now, with Retry-After beside the fields.
    let response = http_post(server.http_addr(), "/rate/edge/per_key/a", &[], "").expect("answers");
    assert_eq!(response.status, 429, "{}", response.body);
    assert_eq!(response.header("ratelimit-remaining"), None);
    let reset = check_per_key(
        response.header("ratelimit-policy").expect("a policy"),
        response.header("ratelimit").expect("a state"),
        0,
    );
    let retry: i64 = response
        .header("retry-after")
        .and_then(|value| value.parse().ok())
        .expect("Retry-After");
    assert!(
        retry <= 1200 && retry < reset,
        "one token back before all three"
    );

    // Several limits: one policy each, the tightest first.
    let response = http_get(
        server.http_addr(),
        "/nginx/edge",
        &[
            ("X-Ratelimit-Descriptor", "tenant=t1"),
            ("X-Ratelimit-Descriptor", "api_key=b"),
        ],
    )
    .expect("answers");
    assert_eq!(response.status, 204);
    let policy = structured_list(response.header("ratelimit-policy").expect("a policy"));
    let names: Vec<&str> = policy.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["per_key", "10/minute"], "2 left before 9 left");
    assert_eq!(
        policy[1].1,
        [("q".to_owned(), 10), ("w".to_owned(), 60)],
        "an unnamed limit is named by its rate"
    );
    let state = structured_list(response.header("ratelimit").expect("a state"));
    assert_eq!((state[0].1[0].1, state[1].1[0].1), (2, 9));
}

#[test]
fn the_boolean_forms_keep_the_draft_03_headers() {
    let draft03 = ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"];
    /// Flags, environment, and the header names `/json` answers with.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: [Case<'_>; 6] = [
        (&["--response-headers"], &[], &draft03),
        // A bare flag followed by another flag takes no value.
        (&["--response-headers", "--shadow-mode"], &[], &draft03),
        (&["--response-headers=true"], &[], &draft03),
        (&[], &[("RATEKEEPER_RESPONSE_HEADERS", "true")], &draft03),
        (&[], &[("RATEKEEPER_RESPONSE_HEADERS", "false")], &[]),
        (
            &[],
            &[("RATEKEEPER_RESPONSE_HEADERS", "ietf")],
            &["RateLimit-Policy", "RateLimit"],
        ),
    ];
    for (args, env, expected) in cases {
        let (_dir, server) = start(args, env);
        let headers = json_headers(&server, "k");
        let names: Vec<&str> = headers.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(names, expected, "{args:?} {env:?}");
    }
}

#[test]
fn an_unknown_style_is_refused_at_start() {
    let dir = TempDir::new("response-headers-bad");
    write_config(dir.path(), "edge.yaml", LIMITS);
    let config = dir.path().to_str().expect("utf-8 path");
    let (status, _, stderr) =
        run_ratekeeper(&["serve", "--config", config, "--response-headers=draft99"]);
    assert!(!status.success());
    assert!(
        stderr
            .contains(r#""draft99" is not a header style (expected ietf, draft03, true or false)"#),
        "{stderr}"
    );
}
