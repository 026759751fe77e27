//! The direct HTTP API, `POST /rate/{domain}/{name}[/{value}]`, through the real binary:
//! allowed then denied with the JSON answer and `RateLimit-*` headers, `hits`, `wait` in
//! real time, the same counters as `POST /json`, errors, and metrics.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::{
    HttpResponse, Ratekeeper, TempDir, http_get, http_post, http_request, metric, serve_limits,
};
use serde_json::{Value, json};

/// Token buckets, so no window boundary can reset a count mid-test. `paced` and friends
/// gain one token every 3 s, with a bucket of one.
const LIMITS: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, algorithm: token_bucket, unit: hour, requests_per_unit: 3, burst: 3}
  - key: generic_key
    value: global
    rate_limit: {name: global, algorithm: token_bucket, unit: hour, requests_per_unit: 2, burst: 2}
  - key: tenant
    value: acme
    descriptors:
      - key: path
        rate_limit: {name: acme_paths, algorithm: token_bucket, unit: hour, requests_per_unit: 5, burst: 5}
  - key: paced
    rate_limit: {name: paced, algorithm: token_bucket, unit: minute, requests_per_unit: 20, burst: 1, max_wait: 5s}
  - key: capped
    rate_limit: {name: capped, algorithm: token_bucket, unit: minute, requests_per_unit: 20, burst: 1, max_wait: 500ms}
  - key: unpaced
    rate_limit: {name: unpaced, algorithm: token_bucket, unit: minute, requests_per_unit: 20, burst: 1}
";

fn start() -> (TempDir, Ratekeeper) {
    serve_limits("http-api", LIMITS, &[])
}

/// `POST path`, returning the response and its JSON body.
fn post(addr: SocketAddr, path: &str) -> (HttpResponse, Value) {
    let response = http_post(addr, path, &[], "").expect("ratekeeper answers");
    let body = serde_json::from_str(&response.body)
        .unwrap_or_else(|error| panic!("POST {path}: {error} in {:?}", response.body));
    (response, body)
}

fn number(response: &HttpResponse, name: &str) -> Option<u64> {
    response.header(name)?.parse().ok()
}

#[test]
fn allowed_until_the_limit_then_denied_with_headers() {
    let (_dir, server) = start();
    let http = server.http_addr();
    for remaining in [2, 1, 0] {
        let (response, body) = post(http, "/rate/api/per_user/alice");
        assert_eq!(response.status, 200, "{body}");
        assert_eq!(body["allowed"], true);
        assert_eq!(body["limit"], 3);
        assert_eq!(body["remaining"], remaining);
        assert_eq!(body["name"], "per_user");
        assert_eq!(body["retry_after_ms"], Value::Null);
        let reset_ms = body["reset_after_ms"].as_u64().expect("reset_after_ms");
        let full_ms = (3 - remaining) * 1_200_000;
        assert!(
            reset_ms <= full_ms && reset_ms + 60_000 > full_ms,
            "{reset_ms} ms"
        );
        assert_eq!(number(&response, "ratelimit-limit"), Some(3));
        assert_eq!(number(&response, "ratelimit-remaining"), Some(remaining));
        assert_eq!(
            number(&response, "ratelimit-reset"),
            Some(reset_ms.div_ceil(1000))
        );
        assert_eq!(response.header("retry-after"), None);
    }
    let (response, body) = post(http, "/rate/api/per_user/alice");
    assert_eq!(response.status, 429, "{body}");
    assert_eq!(body["allowed"], false);
    assert_eq!(body["remaining"], 0);
    // A bucket of 3 refilling 3 per hour has its next token in 20 minutes (not when it is
    // full again, which is what RateLimit-Reset says).
    let retry_ms = body["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(
        retry_ms <= 1_200_000 && retry_ms > 1_140_000,
        "{retry_ms} ms"
    );
    assert_eq!(
        number(&response, "retry-after"),
        Some(retry_ms.div_ceil(1000))
    );
    let (response, body) = post(http, "/rate/api/per_user/bob");
    assert_eq!((response.status, &body["remaining"]), (200, &json!(2)));
}

#[test]
fn hits_count_and_zero_hits_consume_nothing() {
    let (_dir, server) = start();
    let http = server.http_addr();
    let (response, body) = post(http, "/rate/api/per_user/carol?hits=2");
    assert_eq!((response.status, &body["remaining"]), (200, &json!(1)));
    for _ in 0..3 {
        let (response, body) = post(http, "/rate/api/per_user/carol?hits=0");
        assert_eq!((response.status, &body["remaining"]), (200, &json!(1)));
    }
    let (response, body) = post(http, "/rate/api/per_user/carol?hits=2");
    assert_eq!(
        (response.status, &body["remaining"]),
        (429, &json!(0)),
        "two do not fit in one: over the limit, 0 remaining (like the reference); nothing is taken"
    );
    let (response, body) = post(http, "/rate/api/per_user/carol");
    assert_eq!((response.status, &body["remaining"]), (200, &json!(0)));
}

#[test]
fn nested_and_fixed_descriptors_count_like_the_same_json_request() {
    let (_dir, server) = start();
    let http = server.http_addr();
    // The value may hold slashes, percent-encoded: the descriptor is
    // (tenant=acme, path=/v1/orders).
    let (response, body) = post(http, "/rate/api/acme_paths/%2Fv1%2Forders");
    assert_eq!((response.status, &body["remaining"]), (200, &json!(4)));
    let peek = json!({
        "domain": "api",
        "descriptors": [{
            "entries": [
                {"key": "tenant", "value": "acme"},
                {"key": "path", "value": "/v1/orders"}
            ],
            "hits_addend": 0
        }]
    });
    let json_response = http_post(http, "/json", &[], &peek.to_string()).expect("answers");
    let json_body: Value = serde_json::from_str(&json_response.body).expect("JSON");
    assert_eq!(
        json_body["statuses"][0]["limitRemaining"], 4,
        "/json sees the counter /rate used: {json_body}"
    );

    let (response, body) = post(http, "/rate/api/global");
    assert_eq!((response.status, &body["remaining"]), (200, &json!(1)));
    let (response, body) = post(http, "/rate/api/global/extra");
    assert_eq!(response.status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|error| error.contains("call it without a value")),
        "{body}"
    );
}

#[test]
fn wait_is_honoured_and_bounded_by_max_wait() {
    let (_dir, server) = start();
    let http = server.http_addr();

    // paced: one token every 3 s, max_wait 5s.
    let started = Instant::now();
    let (response, _) = post(http, "/rate/api/paced/p");
    assert_eq!(response.status, 200);
    let call = Instant::now();
    let (response, body) = post(http, "/rate/api/paced/p?wait=0");
    assert_eq!(response.status, 429, "wait=0 never waits: {body}");
    assert!(
        call.elapsed() < Duration::from_secs(1),
        "{:?}",
        call.elapsed()
    );
    assert!(
        body["retry_after_ms"]
            .as_u64()
            .is_some_and(|ms| ms <= 3000 && ms > 1000),
        "{body}"
    );
    let call = Instant::now();
    let (response, body) = post(http, "/rate/api/paced/p?wait=5s");
    assert_eq!(
        response.status, 200,
        "the token came within the wait: {body}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(2900),
        "admitted before the token was due: {:?}",
        started.elapsed()
    );
    assert!(
        call.elapsed() < Duration::from_millis(5500),
        "{:?}",
        call.elapsed()
    );

    // capped: max_wait 500ms, so a token 3 s away is out of reach whatever the call asks.
    let (response, _) = post(http, "/rate/api/capped/c");
    assert_eq!(response.status, 200);
    let call = Instant::now();
    let (response, _) = post(http, "/rate/api/capped/c?wait=5s");
    assert_eq!(response.status, 429);
    assert!(
        call.elapsed() < Duration::from_secs(2),
        "{:?}",
        call.elapsed()
    );

    // unpaced: no max_wait, no waiting.
    let (response, _) = post(http, "/rate/api/unpaced/u");
    assert_eq!(response.status, 200);
    let call = Instant::now();
    let (response, _) = post(http, "/rate/api/unpaced/u?wait=5s");
    assert_eq!(response.status, 429);
    assert!(
        call.elapsed() < Duration::from_secs(2),
        "{:?}",
        call.elapsed()
    );
}

#[test]
fn errors_are_404_for_unknown_names_and_400_for_bad_parameters() {
    let (_dir, server) = start();
    let http = server.http_addr();
    let long = "x".repeat(4097);
    let cases = [
        ("/rate/nope/per_user/a", 404, "unknown domain \"nope\""),
        (
            "/rate/api/nope/a",
            404,
            "domain \"api\" has no limit named \"nope\"",
        ),
        (
            "/rate/api/per_user/a?hits=x",
            400,
            "hits: expected a whole number",
        ),
        (
            "/rate/api/per_user/a?hits=-1",
            400,
            "hits: expected a whole number",
        ),
        (
            "/rate/api/per_user/a?hits=4294967296",
            400,
            "hits: expected",
        ),
        (
            "/rate/api/per_user/a?wait=soon",
            400,
            "wait: expected a duration",
        ),
        (
            "/rate/api/per_user/a?domain=api",
            400,
            "unknown parameter \"domain\"",
        ),
        (
            "/rate/api/per_user/a?hits=1&hits=2",
            400,
            "hits: given more than once",
        ),
        ("/rate/api/per_user", 400, "needs a value"),
        (
            &format!("/rate/api/per_user/{long}"),
            400,
            "value: 4097 bytes",
        ),
    ];
    for (path, status, message) in cases {
        let (response, body) = post(http, path);
        let error = body["error"].as_str().unwrap_or_default();
        assert_eq!(response.status, status, "POST {path}: {body}");
        assert!(
            error.contains(message),
            "POST {path}: {error:?} lacks {message:?}"
        );
    }
    let get = http_request(http, "GET", "/rate/api/per_user/a", &[], "").expect("answers");
    assert_eq!(get.status, 405, "checking consumes: POST only");
}

#[test]
fn calls_are_counted_in_the_request_and_limit_metrics() {
    let (_dir, server) = start();
    let http = server.http_addr();
    let ok = r#"ratekeeper_requests_total{result="ok",code="OK"}"#;
    let over = r#"ratekeeper_requests_total{result="over_limit",code="OK"}"#;
    let labels = r#"{domain="api",limit="per_user",unit="hour"}"#;
    let hits = format!("ratekeeper_limit_total_hits_total{labels}");
    let rejected = format!("ratekeeper_limit_over_limit_total{labels}");
    let before = (metric(http, ok), metric(http, over), metric(http, &hits));
    for _ in 0..4 {
        post(http, "/rate/api/per_user/metered");
    }
    assert_eq!(metric(http, ok), before.0 + 3.0);
    assert_eq!(metric(http, over), before.1 + 1.0);
    assert_eq!(metric(http, &hits), before.2 + 4.0);
    assert_eq!(metric(http, &rejected), 1.0);
}

#[test]
fn the_root_lists_the_endpoints_and_logs_to_a_pipe_carry_no_colour_codes() {
    let (_dir, server) = start();
    let index = http_get(server.http_addr(), "/", &[]).expect("ratekeeper answers");
    index.assert_html_page();
    for path in [
        "/healthcheck",
        "/metrics",
        "/rlconfig",
        "/json",
        "/ui",
        "/debug/explain",
        "/debug/rlqs",
        "/counters/{domain}",
        "/stats",
    ] {
        assert!(index.body.contains(path), "{path} in {}", index.body);
    }
    // The test reads stderr through a pipe: plain text, as a log collector wants it.
    let logs = server.stderr_with("serving");
    assert!(logs.contains("serving"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "no ANSI escape codes: {logs:?}");
}

/// A refund over `/json` as over gRPC (`is_negative_hits`, or `isNegativeHits` in
/// protobuf's JSON mapping): answered 200 with what remains after it, never above the limit.
#[test]
fn a_json_refund_gives_hits_back() {
    let (_dir, server) = start();
    let http = server.http_addr();
    let (response, _) = post(http, "/rate/api/per_user/dora?hits=3");
    assert_eq!(response.status, 200);
    let (response, _) = post(http, "/rate/api/per_user/dora");
    assert_eq!(response.status, 429);
    for (name, hits, remaining) in [("is_negative_hits", 2, 2), ("isNegativeHits", 9, 3)] {
        let refund = json!({
            "domain": "api",
            "descriptors": [{
                "entries": [{"key": "user", "value": "dora"}],
                "hits_addend": hits,
                name: true
            }]
        });
        let answer = http_post(http, "/json", &[], &refund.to_string()).expect("answers");
        let body: Value = serde_json::from_str(&answer.body).expect("JSON");
        assert_eq!(answer.status, 200, "{body}");
        assert_eq!(body["overallCode"], "OK", "{body}");
        assert_eq!(
            body["statuses"][0]["limitRemaining"], remaining,
            "{name}: {body}"
        );
    }
    let (response, body) = post(http, "/rate/api/per_user/dora?hits=3");
    assert_eq!((response.status, &body["remaining"]), (200, &json!(0)));
}
