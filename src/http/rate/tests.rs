use serde_json::Value;

use super::*;
use crate::algorithm::Unit;
use crate::limiter::{Limited, LimiterOptions, Status};

const LIMITS: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: hour, requests_per_unit: 3}
  - key: user
    value: vip-*
    rate_limit: {name: vip, unit: hour, requests_per_unit: 100}
  - key: user
    value: healthchecker
  - key: generic_key
    value: global
    rate_limit: {name: global, unit: hour, requests_per_unit: 2}
  - key: tenant
    value: acme
    descriptors:
      - key: path
        rate_limit: {name: acme_paths, unit: hour, requests_per_unit: 5}
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {name: tenant_paths, unit: hour, requests_per_unit: 5}
  - key: twice_a
    rate_limit: {name: twice, unit: hour, requests_per_unit: 5}
  - key: twice_b
    rate_limit: {name: twice, unit: hour, requests_per_unit: 5}
  - key: paced
    rate_limit:
      name: paced
      algorithm: token_bucket
      unit: minute
      requests_per_unit: 20
      burst: 1
      max_wait: 5s
  - key: capped
    rate_limit:
      name: capped
      algorithm: token_bucket
      unit: minute
      requests_per_unit: 20
      burst: 1
      max_wait: 1s
  - key: unpaced
    rate_limit: {name: unpaced, algorithm: token_bucket, unit: minute, requests_per_unit: 20, burst: 1}
"#;

fn state() -> RateState {
    RateState {
        limiter: Arc::new(Limiter::at_test_start(LIMITS, LimiterOptions::default())),
        index: Arc::new(ArcSwapOption::empty()),
    }
}

fn index() -> NameIndex {
    let limits = Arc::new(Limits::parse_str("test.yaml", LIMITS).expect("valid limits"));
    NameIndex::build(&limits)
}

fn pairs(items: &[(&str, &str)]) -> Vec<(Box<str>, Box<str>)> {
    items
        .iter()
        .map(|(key, value)| (Box::from(*key), Box::from(*value)))
        .collect()
}

/// Status, headers and JSON body of one call.
async fn call(
    state: &RateState,
    name: &str,
    value: Option<&str>,
    query: &str,
) -> (u16, HeaderMap, Value) {
    let response = check(state, "api", name, value.map(str::to_owned), Some(query)).await;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("a body");
    let json = serde_json::from_slice(&body).expect("a JSON body");
    (status, headers, json)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

#[test]
fn percent_decoding() {
    fn check(raw: &str, expected: &[u8]) {
        assert_eq!(&*percent_decode(raw.as_bytes()), expected, "{raw:?}");
    }
    check("plain", b"plain");
    check("a%2Cb%3Dc%20d", b"a,b=c d");
    check("%2c%2C", b",,");
    check("%25", b"%");
    check("%252C", b"%2C");
    check("100%", b"100%");
    check("%zz%4", b"%zz%4");
    check("%e2%82%ac", "€".as_bytes());
    check("%ff", &[0xff]);
    check("a+b", b"a+b");
    check("", b"");
}

#[test]
fn parameters() {
    fn check(query: &str, expected: Result<(u64, Option<Duration>), &str>) {
        let parsed = Params::parse(query).map(|params| (params.hits, params.wait));
        match (parsed, expected) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{query:?}"),
            (Err(got), Err(want)) => assert!(got.contains(want), "{query:?}: {got}"),
            (got, want) => panic!("{query:?}: got {got:?}, expected {want:?}"),
        }
    }
    let ms = Duration::from_millis;
    check("", Ok((1, None)));
    check("hits=2", Ok((2, None)));
    check("hits=0", Ok((0, None)));
    check("hits=4294967295", Ok((u64::from(u32::MAX), None)));
    check("wait=0", Ok((1, Some(Duration::ZERO))));
    check("wait=50ms&hits=3", Ok((3, Some(ms(50)))));
    check("wait=1.5s", Ok((1, Some(ms(1500)))));
    check("&hits=2&", Ok((2, None)));
    check("h%69ts=%32", Ok((2, None)));
    check(
        "hits=4294967296",
        Err("hits: expected a whole number from 0 to 4294967295"),
    );
    check("hits=-1", Err("hits: expected a whole number"));
    check("hits=x", Err("got \"x\""));
    check("hits=", Err("hits: expected"));
    check("hits", Err("hits: expected"));
    check("hits=1&hits=2", Err("hits: given more than once"));
    check(
        "wait=soon",
        Err("wait: expected a duration like 0, 250ms or 2s, got \"soon\""),
    );
    check("wait=5", Err("wait: expected a duration"));
    check("wait=-1s", Err("wait: expected a duration"));
    check(
        "domain=edge",
        Err("unknown parameter \"domain\" (expected hits or wait)"),
    );
}

#[test]
fn targets_follow_the_configured_path() {
    let exact = |value: &str| Step::Exact(value.into());
    let steps = |items: &[(&str, Step)]| -> Vec<(Box<str>, Step)> {
        items
            .iter()
            .map(|(key, step)| (Box::from(*key), step.clone()))
            .collect()
    };
    assert_eq!(
        Target::resolve("d > k", &steps(&[("k", Step::Default)])),
        Target::Valued {
            path: "d > k".into(),
            prefix: Vec::new(),
            key: "k".into(),
        }
    );
    assert_eq!(
        Target::resolve(
            "d > a=x > b=y*",
            &steps(&[("a", exact("x")), ("b", Step::Wildcard("y*".into()))])
        ),
        Target::Valued {
            path: "d > a=x > b=y*".into(),
            prefix: pairs(&[("a", "x")]),
            key: "b".into(),
        }
    );
    assert_eq!(
        Target::resolve(
            "d > a=x > b=y",
            &steps(&[("a", exact("x")), ("b", exact("y"))])
        ),
        Target::Fixed {
            path: "d > a=x > b=y".into(),
            entries: pairs(&[("a", "x"), ("b", "y")]),
        }
    );
    for unaddressable in [
        steps(&[("a", Step::Default), ("b", Step::Default)]),
        steps(&[("a", Step::Default), ("b", exact("y"))]),
    ] {
        let Target::Unaddressable(why) = Target::resolve("d > a > b", &unaddressable) else {
            panic!("{unaddressable:?} should not be addressable");
        };
        assert!(why.contains("can fill only the last one"), "{why}");
    }
}

#[test]
fn the_index_finds_every_named_limit() {
    let index = index();
    assert_eq!(
        index.get("api", "per_user"),
        Some(&Target::Valued {
            path: "api > user".into(),
            prefix: Vec::new(),
            key: "user".into(),
        })
    );
    assert_eq!(
        index.get("api", "vip"),
        Some(&Target::Valued {
            path: "api > user=vip-*".into(),
            prefix: Vec::new(),
            key: "user".into(),
        })
    );
    assert_eq!(
        index.get("api", "global"),
        Some(&Target::Fixed {
            path: "api > generic_key=global".into(),
            entries: pairs(&[("generic_key", "global")]),
        })
    );
    assert_eq!(
        index.get("api", "acme_paths"),
        Some(&Target::Valued {
            path: "api > tenant=acme > path".into(),
            prefix: pairs(&[("tenant", "acme")]),
            key: "path".into(),
        })
    );
    assert!(matches!(
        index.get("api", "tenant_paths"),
        Some(Target::Unaddressable(_))
    ));
    let Some(Target::Unaddressable(why)) = index.get("api", "twice") else {
        panic!("a name on two descriptors is ambiguous");
    };
    assert!(
        why.contains("on 2 descriptors (api > twice_a, api > twice_b)"),
        "{why}"
    );
    assert_eq!(index.get("api", "nope"), None);
    assert_eq!(index.get("other", "per_user"), None);
}

#[test]
fn entries_need_a_value_exactly_when_the_path_has_an_open_entry() {
    let index = index();
    let valued = index.get("api", "acme_paths").expect("indexed");
    let entries = valued
        .entries("acme_paths", Some("/a/b".to_owned()))
        .expect("entries");
    let entries: Vec<(&str, &str)> = entries
        .iter()
        .map(|(key, value)| (&**key, value.as_str()))
        .collect();
    assert_eq!(entries, [("tenant", "acme"), ("path", "/a/b")]);
    let missing = valued
        .entries("acme_paths", None)
        .expect_err("needs a value");
    assert!(missing.contains("needs a value"), "{missing}");
    let too_long = valued
        .entries("acme_paths", Some("x".repeat(bounds::MAX_VALUE_LEN + 1)))
        .expect_err("too long");
    assert!(
        too_long.contains("value: 4097 bytes, at most 4096"),
        "{too_long}"
    );
    let fixed = index.get("api", "global").expect("indexed");
    assert_eq!(fixed.entries("global", None).expect("entries").len(), 1);
    let extra = fixed
        .entries("global", Some("x".to_owned()))
        .expect_err("takes no value");
    assert!(extra.contains("call it without a value"), "{extra}");
}

fn limited(
    limit: u32,
    remaining: u32,
    reset_after: Duration,
    over: bool,
    retry_after: Option<Duration>,
) -> Status {
    Status::Limited(Limited {
        name: None,
        requests_per_unit: limit,
        unit: Unit::Hour,
        multiplier: 1,
        remaining,
        reset_after,
        over,
        shadow: false,
        retry_after,
    })
}

fn verdict(statuses: Vec<Status>) -> Verdict {
    Verdict {
        denied: statuses.iter().any(Status::is_over),
        statuses: statuses.into(),
        ..Verdict::default()
    }
}

#[test]
fn headers_come_from_the_tightest_descriptor() {
    let secs = Duration::from_secs;
    let allowed = verdict(vec![
        limited(10, 7, secs(30), false, None),
        Status::NoLimit,
        limited(5, 2, Duration::new(59, 100), false, None),
        limited(4, 2, secs(1), false, None),
    ]);
    let headers = rate_limit_headers(&allowed, &LimiterOptions::default());
    assert_eq!(header(&headers, "ratelimit-limit"), Some("5"));
    assert_eq!(header(&headers, "ratelimit-remaining"), Some("2"));
    assert_eq!(
        header(&headers, "ratelimit-reset"),
        Some("60"),
        "rounded up"
    );
    assert_eq!(header(&headers, "retry-after"), None);

    let denied = verdict(vec![
        limited(3, 0, Duration::new(12, 1), true, Some(secs(2))),
        limited(9, 0, secs(40), true, Some(Duration::from_millis(39_200))),
        limited(9, 5, secs(90), false, None),
    ]);
    let headers = rate_limit_headers(&denied, &LimiterOptions::default());
    assert_eq!(header(&headers, "ratelimit-limit"), Some("3"));
    assert_eq!(header(&headers, "ratelimit-remaining"), Some("0"));
    assert_eq!(header(&headers, "ratelimit-reset"), Some("13"));
    assert_eq!(
        header(&headers, "retry-after"),
        Some("40"),
        "the longest wait of the over-limit descriptors, rounded up"
    );

    let empty = verdict(vec![Status::NoLimit]);
    assert!(rate_limit_headers(&empty, &LimiterOptions::default()).is_empty());
}

#[test]
fn a_request_that_can_never_pass_gets_no_retry_after() {
    let never = verdict(vec![limited(3, 0, Duration::from_secs(7), true, None)]);
    let headers = rate_limit_headers(&never, &LimiterOptions::default());
    assert_eq!(headers.len(), 3, "the RateLimit headers only");
    assert_eq!(header(&headers, "ratelimit-reset"), Some("7"));
    assert_eq!(header(&headers, "retry-after"), None);
}

#[tokio::test(start_paused = true)]
async fn allowed_until_the_limit_then_429_with_headers() {
    let state = state();
    for remaining in [2, 1, 0] {
        let (status, headers, body) = call(&state, "per_user", Some("alice"), "").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["allowed"], true);
        assert_eq!(body["limit"], 3);
        assert_eq!(body["remaining"], remaining);
        assert_eq!(body["name"], "per_user");
        assert_eq!(body["retry_after_ms"], Value::Null);
        // 2024-01-04T00:00:10Z: 3590 s left in the hour.
        assert_eq!(body["reset_after_ms"], 3_590_000);
        assert_eq!(header(&headers, "ratelimit-limit"), Some("3"));
        assert_eq!(
            header(&headers, "ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        assert_eq!(header(&headers, "ratelimit-reset"), Some("3590"));
        assert_eq!(header(&headers, "retry-after"), None);
    }
    let (status, headers, body) = call(&state, "per_user", Some("alice"), "").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["allowed"], false);
    assert_eq!(body["remaining"], 0);
    assert_eq!(body["retry_after_ms"], 3_590_000);
    assert_eq!(header(&headers, "retry-after"), Some("3590"));
    let (status, _, body) = call(&state, "per_user", Some("bob"), "").await;
    assert_eq!((status, &body["remaining"]), (200, &Value::from(2)));
}

#[tokio::test(start_paused = true)]
async fn hits_count_and_zero_hits_only_report() {
    let state = state();
    let (status, _, body) = call(&state, "per_user", Some("carol"), "hits=2").await;
    assert_eq!((status, &body["remaining"]), (200, &Value::from(1)));
    for _ in 0..2 {
        let (status, _, body) = call(&state, "per_user", Some("carol"), "hits=0").await;
        assert_eq!((status, &body["remaining"]), (200, &Value::from(1)));
    }
    let (status, _, body) = call(&state, "per_user", Some("carol"), "hits=2").await;
    assert_eq!(
        (status, &body["remaining"]),
        (429, &Value::from(0)),
        "over the limit reports nothing remaining, like the reference service: {body}"
    );
    // The 429 consumed nothing: the one hit left still passes.
    let (status, _, body) = call(&state, "per_user", Some("carol"), "").await;
    assert_eq!((status, &body["remaining"]), (200, &Value::from(0)));
}

#[tokio::test(start_paused = true)]
async fn the_value_is_matched_like_any_request() {
    let state = state();
    // An exact value wins over the default: the allow-listed value has no limit.
    let (status, headers, body) = call(&state, "per_user", Some("healthchecker"), "").await;
    assert_eq!(status, 200);
    assert_eq!(body["limit"], Value::Null);
    assert_eq!(body["name"], Value::Null);
    assert!(header(&headers, "ratelimit-limit").is_none());
    // A wildcard's limit applies to values it matches, and the default to the others.
    let (_, _, body) = call(&state, "vip", Some("vip-1"), "").await;
    assert_eq!(
        (&body["limit"], &body["name"]),
        (&Value::from(100), &Value::from("vip"))
    );
    let (_, _, body) = call(&state, "vip", Some("plain"), "").await;
    assert_eq!(body["name"], "per_user");
    // Nested and fixed paths.
    let (status, _, body) = call(&state, "acme_paths", Some("/a/b"), "").await;
    assert_eq!((status, &body["remaining"]), (200, &Value::from(4)));
    let (status, _, body) = call(&state, "global", None, "").await;
    assert_eq!((status, &body["remaining"]), (200, &Value::from(1)));
}

#[tokio::test(start_paused = true)]
async fn wait_is_bounded_by_the_call_and_by_max_wait() {
    let state = state();
    // One token per 3 s, a bucket of one, max_wait 5s.
    let (status, _, _) = call(&state, "paced", Some("p"), "").await;
    assert_eq!(status, 200);
    let started = tokio::time::Instant::now();
    let (status, _, _) = call(&state, "paced", Some("p"), "wait=0").await;
    assert_eq!(status, 429, "wait=0 never waits");
    assert_eq!(started.elapsed(), Duration::ZERO);
    let (status, _, _) = call(&state, "paced", Some("p"), "wait=1s").await;
    assert_eq!(
        status, 429,
        "the token comes after 3 s, later than the call waits"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    let (status, _, body) = call(&state, "paced", Some("p"), "wait=10s").await;
    assert_eq!(status, 200, "{body}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(2900) && waited <= Duration::from_secs(3),
        "{waited:?}"
    );
    // The call never waits longer than the limit's max_wait.
    let (status, _, _) = call(&state, "capped", Some("c"), "").await;
    assert_eq!(status, 200);
    let started = tokio::time::Instant::now();
    let (status, _, _) = call(&state, "capped", Some("c"), "wait=10s").await;
    assert_eq!(
        status, 429,
        "max_wait 1s: the token 3 s away is out of reach"
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    // Without max_wait nothing waits, whatever the call asks.
    let (status, _, _) = call(&state, "unpaced", Some("u"), "").await;
    assert_eq!(status, 200);
    let started = tokio::time::Instant::now();
    let (status, _, _) = call(&state, "unpaced", Some("u"), "wait=5s").await;
    assert_eq!(status, 429);
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn errors_name_the_problem() {
    let state = state();
    let check_error = |expected_status: u16, expected: &'static str| {
        move |(status, _, body): (u16, HeaderMap, Value)| {
            assert_eq!(status, expected_status, "{body}");
            let message = body["error"].as_str().unwrap_or_default().to_owned();
            assert!(message.contains(expected), "{message:?} lacks {expected:?}");
        }
    };
    let response = check(&state, "nope", "per_user", Some("x".to_owned()), None).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    check_error(404, "domain \"api\" has no limit named \"nope\"")(
        call(&state, "nope", Some("x"), "").await,
    );
    check_error(400, "hits: expected")(call(&state, "per_user", Some("x"), "hits=x").await);
    check_error(400, "needs a value")(call(&state, "per_user", None, "").await);
    check_error(400, "cannot be used with /rate")(
        call(&state, "tenant_paths", Some("x"), "").await,
    );
}
