use axum::http::HeaderValue;

use super::*;
use crate::limiter::LimiterOptions;

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 1}
"#;

fn limiter(response_headers: bool) -> Arc<Limiter> {
    Arc::new(Limiter::at_test_start(
        LIMITS,
        LimiterOptions {
            response_headers,
            ..LimiterOptions::default()
        },
    ))
}

fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.append(
            *name,
            HeaderValue::from_bytes(value).expect("a valid header value"),
        );
    }
    headers
}

/// The entries of one header, or the error.
fn entries(raw: &[u8]) -> Result<Option<Vec<(String, String)>>, String> {
    parse_descriptor(raw, 0)
}

#[test]
fn descriptor_headers() {
    fn check(raw: &[u8], expected: &[(&str, &str)]) {
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        assert_eq!(entries(raw), Ok(Some(expected)), "{raw:?}");
    }
    check(b"api_key=k1", &[("api_key", "k1")]);
    check(
        b"remote_address=10.0.0.1,path=/v1/x",
        &[("remote_address", "10.0.0.1"), ("path", "/v1/x")],
    );
    check(b" a=1 ,\tb=2 ", &[("a", "1"), ("b", "2")]);
    // Escapes keep separators and spaces inside one value.
    check(
        b"path=/a%2Cb%3Dc%20d,q=100%25",
        &[("path", "/a,b=c d"), ("q", "100%")],
    );
    // Only the first `=` separates; a stray `%` is kept.
    check(b"k=a=b,p=50%", &[("k", "a=b"), ("p", "50%")]);
    check(b"k%20ey=v", &[("k ey", "v")]);
    // Bytes that are not UTF-8 never fail a request.
    check(b"k=\xff", &[("k", "\u{fffd}")]);
    check(b"k=%ff", &[("k", "\u{fffd}")]);
}

#[test]
fn empty_values_drop_the_descriptor() {
    assert_eq!(entries(b"api_key="), Ok(None));
    assert_eq!(entries(b"remote_address=1.2.3.4,api_key="), Ok(None));
    // The rest of the header is still checked.
    assert!(entries(b"api_key=,broken").is_err());
}

#[test]
fn malformed_descriptor_headers() {
    fn check(raw: &[u8], expected: &str) {
        match entries(raw) {
            Err(problem) => assert!(problem.contains(expected), "{raw:?}: {problem}"),
            Ok(parsed) => panic!("{raw:?} parsed as {parsed:?}"),
        }
    }
    check(b"", "x-ratelimit-descriptor[0].entries[0]: empty entry");
    check(
        b"a=1,,b=2",
        "x-ratelimit-descriptor[0].entries[1]: empty entry",
    );
    check(b"a=1,", "entries[1]: empty entry");
    check(b"a=1,b", "entries[1]: no `=` in \"b\"");
    check(b"=v", "entries[0].key: must not be empty");
    check(b"%zz=v,=w", "entries[1].key: must not be empty");
    let long_key = format!("{}=v", "k".repeat(bounds::MAX_KEY_LEN + 1));
    check(
        long_key.as_bytes(),
        "entries[0].key: 257 bytes, at most 256 allowed",
    );
    let long_value = format!("k={}", "%41".repeat(bounds::MAX_VALUE_LEN + 1));
    check(
        long_value.as_bytes(),
        "entries[0].value: 4097 bytes, at most 4096 allowed",
    );
    let fits = format!("k={}", "%41".repeat(bounds::MAX_VALUE_LEN));
    assert!(
        entries(fits.as_bytes()).is_ok(),
        "the bound is on decoded bytes"
    );
    let many = vec!["k=v"; bounds::MAX_ENTRIES + 1].join(",");
    check(
        many.as_bytes(),
        "x-ratelimit-descriptor[0]: 33 entries, at most 32 allowed",
    );
    let most = vec!["k=v"; bounds::MAX_ENTRIES].join(",");
    assert!(entries(most.as_bytes()).is_ok());
}

#[test]
fn requests_from_headers() {
    let request = parse_request(
        "edge".to_owned(),
        &headers(&[
            (DESCRIPTOR_HEADER, b"api_key=k1"),
            ("other", b"ignored"),
            (DESCRIPTOR_HEADER, b"api_key="),
            (DESCRIPTOR_HEADER, b"remote_address=1.2.3.4,path=/x"),
        ]),
    )
    .expect("valid")
    .expect("descriptors left");
    assert_eq!(request.domain, "edge");
    let keys: Vec<Vec<&str>> = request
        .descriptors
        .iter()
        .map(|entries| entries.iter().map(|(key, _)| key.as_str()).collect())
        .collect();
    assert_eq!(keys, [vec!["api_key"], vec!["remote_address", "path"]]);
    assert_eq!(request.hits, None);
    let query = request.query();
    assert!(
        query
            .descriptors
            .iter()
            .all(|descriptor| descriptor.cost == 1)
    );

    let hits = parse_request(
        "edge".to_owned(),
        &headers(&[
            (DESCRIPTOR_HEADER, b"a=1"),
            (DESCRIPTOR_HEADER, b"b=2"),
            (HITS_HEADER, b"0"),
        ]),
    )
    .expect("valid")
    .expect("descriptors left");
    assert_eq!(hits.hits, Some(0));
    let query = hits.query();
    assert_eq!(query.descriptors.len(), 2);
    assert!(
        query
            .descriptors
            .iter()
            .all(|descriptor| descriptor.cost == 0)
    );

    for nothing in [headers(&[]), headers(&[(DESCRIPTOR_HEADER, b"api_key=")])] {
        assert_eq!(parse_request("edge".to_owned(), &nothing), Ok(None));
    }
}

#[test]
fn malformed_requests() {
    fn check(pairs: &[(&'static str, &[u8])], expected: &str) {
        match parse_request("edge".to_owned(), &headers(pairs)) {
            Err(problem) => assert!(problem.contains(expected), "{problem}"),
            Ok(parsed) => panic!("{pairs:?} parsed as {parsed:?}"),
        }
    }
    check(
        &[(DESCRIPTOR_HEADER, b"a=1"), (DESCRIPTOR_HEADER, b"b")],
        "x-ratelimit-descriptor[1].entries[0]: no `=`",
    );
    check(
        &[(DESCRIPTOR_HEADER, b"a=1"), (HITS_HEADER, b"two")],
        "x-ratelimit-hits: expected a whole number from 0 to 4294967295, got \"two\"",
    );
    check(
        &[(HITS_HEADER, b"-1"), (DESCRIPTOR_HEADER, b"a=1")],
        "x-ratelimit-hits: expected",
    );
    check(
        &[(HITS_HEADER, b"1"), (HITS_HEADER, b"1")],
        "x-ratelimit-hits: sent more than once",
    );
    let too_many: Vec<(&'static str, &[u8])> =
        vec![(DESCRIPTOR_HEADER, b"a=1"); bounds::MAX_DESCRIPTORS + 1];
    check(
        &too_many,
        "x-ratelimit-descriptor: 65 headers, at most 64 allowed",
    );
    let most = headers(&vec![
        (DESCRIPTOR_HEADER, b"a=1".as_slice());
        bounds::MAX_DESCRIPTORS
    ]);
    assert!(parse_request("edge".to_owned(), &most).is_ok());
}

/// Status and headers of one subrequest.
async fn ask(limiter: &Arc<Limiter>, pairs: &[(&'static str, &[u8])]) -> (u16, HeaderMap) {
    let response = check(
        State(Arc::clone(limiter)),
        Ok(Path("edge".to_owned())),
        headers(pairs),
    )
    .await;
    (response.status().as_u16(), response.headers().clone())
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

#[tokio::test(start_paused = true)]
async fn allowed_is_204_and_limited_is_403_with_headers() {
    for response_headers in [false, true] {
        let limiter = limiter(response_headers);
        let key = [(DESCRIPTOR_HEADER, b"api_key=k1".as_slice())];
        for remaining in ["1", "0"] {
            let (status, headers) = ask(&limiter, &key).await;
            assert_eq!(status, 204);
            assert_eq!(header(&headers, "ratelimit-limit"), Some("2"));
            assert_eq!(header(&headers, "ratelimit-remaining"), Some(remaining));
            // 3590 s left in the hour.
            assert_eq!(header(&headers, "ratelimit-reset"), Some("3590"));
            assert_eq!(header(&headers, "retry-after"), None);
        }
        let (status, headers) = ask(&limiter, &key).await;
        assert_eq!(status, 403);
        assert_eq!(header(&headers, "ratelimit-remaining"), Some("0"));
        assert_eq!(header(&headers, "retry-after"), Some("3590"));
    }
}

#[tokio::test(start_paused = true)]
async fn the_tightest_descriptor_sets_the_headers() {
    let limiter = limiter(false);
    let (status, headers) = ask(
        &limiter,
        &[
            (DESCRIPTOR_HEADER, b"remote_address=10.0.0.1"),
            (DESCRIPTOR_HEADER, b"remote_address=10.0.0.1,path=%2Fa%2Cb"),
        ],
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(header(&headers, "ratelimit-limit"), Some("1"));
    assert_eq!(header(&headers, "ratelimit-remaining"), Some("0"));
    assert_eq!(header(&headers, "ratelimit-reset"), Some("50"));
    let (status, headers) = ask(
        &limiter,
        &[(DESCRIPTOR_HEADER, b"remote_address=10.0.0.1,path=/a%2cb")],
    )
    .await;
    assert_eq!(status, 403, "the same decoded path: the same counter");
    assert_eq!(header(&headers, "retry-after"), Some("50"));
}

#[tokio::test(start_paused = true)]
async fn hits_zero_checks_without_consuming() {
    let limiter = limiter(false);
    for _ in 0..3 {
        let (status, headers) = ask(
            &limiter,
            &[(DESCRIPTOR_HEADER, b"api_key=peek"), (HITS_HEADER, b"0")],
        )
        .await;
        assert_eq!(status, 204);
        assert_eq!(header(&headers, "ratelimit-remaining"), Some("2"));
    }
    let (status, headers) = ask(
        &limiter,
        &[(DESCRIPTOR_HEADER, b"api_key=peek"), (HITS_HEADER, b"2")],
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(header(&headers, "ratelimit-remaining"), Some("0"));
}

#[tokio::test(start_paused = true)]
async fn nothing_to_limit_is_allowed_without_headers() {
    let limiter = limiter(false);
    for pairs in [
        vec![],
        vec![(DESCRIPTOR_HEADER, b"api_key=".as_slice())],
        vec![(DESCRIPTOR_HEADER, b"unknown_key=x".as_slice())],
    ] {
        let (status, headers) = ask(&limiter, &pairs).await;
        assert_eq!(status, 204, "{pairs:?}");
        assert!(header(&headers, "ratelimit-limit").is_none(), "{pairs:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn malformed_subrequests_are_400_and_never_counted() {
    let limiter = limiter(false);
    let response = check(
        State(Arc::clone(&limiter)),
        Ok(Path("edge".to_owned())),
        headers(&[(DESCRIPTOR_HEADER, b"api_key")]),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .expect("a body");
    assert_eq!(
        String::from_utf8_lossy(&body),
        "x-ratelimit-descriptor[0].entries[0]: no `=` in \"api_key\" (expected key=value)\n"
    );
    let invalid = r#"ratekeeper_requests_total{result="error",code="INVALID_ARGUMENT"}"#;
    assert!(
        limiter
            .metrics()
            .encode()
            .contains(&format!("{invalid} 0\n")),
        "a malformed subrequest never reaches the limiter"
    );
    // A domain the limiter rejects is a 400 as well.
    let response = check(
        State(Arc::clone(&limiter)),
        Ok(Path("d".repeat(bounds::MAX_DOMAIN_LEN + 1))),
        headers(&[(DESCRIPTOR_HEADER, b"api_key=k")]),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(
        limiter
            .metrics()
            .encode()
            .contains(&format!("{invalid} 1\n")),
        "the limiter counts what it rejects"
    );
}
