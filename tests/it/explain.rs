//! `POST /debug/explain` and `ratekeeper explain` through the real binary: the match, the
//! limits and their counters' state without consuming, every no-limit reason, errors that
//! name the field, and the command line's readable output and failures.

use std::net::SocketAddr;

use crate::support::{Ratekeeper, TempDir, http_post, run_ratekeeper, serve_limits};
use serde_json::{Value, json};

const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: day, requests_per_unit: 5}
  - key: api_key
    value: healthchecker
  - key: api_key
    value: internal
    rate_limit: {unlimited: true}
  - key: tenant
    rate_limit: {name: tenant_wide, unit: day, requests_per_unit: 100}
    descriptors:
      - key: path
        rate_limit: {name: per_path, algorithm: token_bucket, unit: hour, requests_per_unit: 10, burst: 20, replaces: [{name: tenant_wide}]}
";

fn start() -> (TempDir, Ratekeeper) {
    serve_limits("explain", LIMITS, &["--shards", "4"])
}

fn post_json(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let response = http_post(addr, path, &[], &body.to_string()).expect("ratekeeper answers");
    let parsed = serde_json::from_str(&response.body)
        .unwrap_or_else(|error| panic!("POST {path}: {error} in {:?}", response.body));
    (response.status, parsed)
}

fn request(descriptors: &[&[(&str, &str)]]) -> Value {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<Value> = entries
                .iter()
                .map(|(key, value)| json!({"key": key, "value": value}))
                .collect();
            json!({ "entries": entries })
        })
        .collect();
    json!({"domain": "edge", "descriptors": descriptors})
}

#[test]
fn explain_reports_the_limit_and_counter_and_consumes_nothing() {
    let (_dir, server) = start();
    let (http, admin) = (server.http_addr(), server.admin_addr());
    let alice = request(&[&[("api_key", "alice")]]);
    for _ in 0..2 {
        assert_eq!(post_json(http, "/json", &alice).0, 200);
    }
    for _ in 0..5 {
        let (status, body) = post_json(admin, "/debug/explain", &alice);
        assert_eq!(status, 200, "{body}");
        let descriptor = &body["descriptors"][0];
        assert_eq!(descriptor["match"], "limited", "{body}");
        assert_eq!(descriptor["path"], "edge > api_key");
        assert_eq!(descriptor["would_reject"], false);
        assert_eq!(descriptor["shards"], 4);
        assert!(
            descriptor["shard"].as_u64().is_some_and(|shard| shard < 4),
            "{body}"
        );
        assert_eq!(descriptor.get("owner"), None, "not in cluster mode: {body}");
        let limit = &descriptor["limits"][0];
        assert_eq!(limit["name"], "per_key");
        assert_eq!(limit["requests_per_unit"], 5);
        assert_eq!(limit["unit"], "day");
        assert_eq!(limit["algorithm"], "fixed_window");
        assert_eq!(
            (&limit["used"], &limit["remaining"]),
            (&json!(2), &json!(3))
        );
        let reset = limit["reset_after_ms"].as_u64().expect("reset_after_ms");
        assert!(reset > 0 && reset <= 86_400_000, "{reset}");
    }
    // Five explanations later, three hits are still left.
    for _ in 0..3 {
        assert_eq!(post_json(http, "/json", &alice).0, 200);
    }
    assert_eq!(post_json(http, "/json", &alice).0, 429);
    let (_, body) = post_json(admin, "/debug/explain", &alice);
    assert_eq!(body["descriptors"][0]["would_reject"], true, "{body}");
    assert_eq!(body["descriptors"][0]["limits"][0]["remaining"], 0);
}

#[test]
fn a_rejected_request_is_told_when_it_would_pass_again() {
    let (_dir, server) = start();
    let (http, admin) = (server.http_addr(), server.admin_addr());
    let carol = request(&[&[("api_key", "carol")]]);
    let explain = |body: &Value| {
        let (status, answer) = post_json(admin, "/debug/explain", body);
        assert_eq!(status, 200, "{answer}");
        answer["descriptors"][0].clone()
    };
    let within = explain(&carol);
    assert_eq!(within["would_reject"], false, "{within}");
    assert_eq!(within["retry_after_ms"], Value::Null, "{within}");
    assert_eq!(within["limits"][0]["would_reject"], false, "{within}");
    assert_eq!(within["limits"][0]["retry_after_ms"], Value::Null);
    for _ in 0..5 {
        assert_eq!(post_json(http, "/json", &carol).0, 200);
    }
    // A fixed window admits again when it resets.
    let over = explain(&carol);
    assert_eq!(over["would_reject"], true, "{over}");
    let limit = &over["limits"][0];
    assert_eq!(limit["would_reject"], true, "{over}");
    let retry = limit["retry_after_ms"].as_u64().expect("a retry time");
    assert!(retry > 0 && retry <= 86_400_000, "{over}");
    assert_eq!(limit["reset_after_ms"], retry, "{over}");
    assert_eq!(over["retry_after_ms"], retry, "{over}");

    // A bucket of 20 refilled at 10 an hour: one hit fits again in 6 minutes.
    let mut path = request(&[&[("tenant", "acme"), ("path", "/v1")]]);
    path["hits_addend"] = json!(20);
    assert_eq!(post_json(http, "/json", &path).0, 200);
    path["hits_addend"] = json!(1);
    let bucket = explain(&path);
    let retry = bucket["retry_after_ms"].as_u64().expect("a retry time");
    assert!((350_000..=360_000).contains(&retry), "{bucket}");
    assert!(
        bucket["limits"][0]["reset_after_ms"]
            .as_u64()
            .is_some_and(|reset| reset > 7_000_000),
        "full again only after 2 hours: {bucket}"
    );

    // More hits than the limit holds never pass: rejected, and no time to wait for.
    let mut greedy = request(&[&[("api_key", "dave")]]);
    greedy["hits_addend"] = json!(6);
    let never = explain(&greedy);
    assert_eq!(never["would_reject"], true, "{never}");
    assert_eq!(never["limits"][0]["remaining"], 5, "{never}");
    assert_eq!(never["retry_after_ms"], Value::Null, "{never}");
    assert_eq!(never["limits"][0]["retry_after_ms"], Value::Null);

    let stdout = explain_command(admin, &["--descriptor", "api_key=carol", "--hits", "1"]);
    assert_has_lines(
        &stdout,
        &[
            "    rejects 1 hit now; admitted again in ",
            "  over: this request would be rejected now; retry in ",
        ],
    );
    let stdout = explain_command(admin, &["--descriptor", "api_key=dave", "--hits", "6"]);
    assert_has_lines(
        &stdout,
        &[
            "    rejects 6 hits now, and always will",
            "  over: this request would be rejected now, and will never pass",
        ],
    );
}

/// `ratekeeper explain --addr http://ADMIN --domain edge ARGS`, which must succeed; its stdout.
fn explain_command(addr: SocketAddr, args: &[&str]) -> String {
    let addr = format!("http://{addr}");
    let base = ["explain", "--addr", &addr, "--domain", "edge"];
    let (status, stdout, stderr) = run_ratekeeper(&[&base[..], args].concat());
    assert!(status.success(), "{stdout}{stderr}");
    stdout
}

/// Fails unless every one of `expected` is in `stdout`.
fn assert_has_lines(stdout: &str, expected: &[&str]) {
    for expected in expected {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

#[test]
fn every_reason_for_no_limit_is_reported() {
    let (_dir, server) = start();
    let admin = server.admin_addr();
    let (status, body) = post_json(
        admin,
        "/debug/explain",
        &request(&[
            &[("api_key", "healthchecker")],
            &[("api_key", "internal")],
            &[("user", "x")],
            &[("tenant", "acme")],
            &[("tenant", "acme"), ("path", "/v1")],
        ]),
    );
    assert_eq!(status, 200, "{body}");
    let matches: Vec<&str> = body["descriptors"]
        .as_array()
        .expect("descriptors")
        .iter()
        .map(|descriptor| descriptor["match"].as_str().expect("match"))
        .collect();
    assert_eq!(
        matches,
        [
            "allow_listed",
            "unlimited",
            "no_match",
            "replaced",
            "limited"
        ]
    );
    let replaced = &body["descriptors"][3];
    assert_eq!(
        replaced["replaced"],
        json!([{"limit": "tenant_wide", "by": "per_path", "at": "edge > tenant > path"}])
    );
    assert_eq!(
        replaced["reason"],
        "matched edge > tenant, but its limits are replaced by per_path at edge > tenant > path"
    );
    let bucket = &body["descriptors"][4]["limits"][0];
    assert_eq!(
        (&bucket["algorithm"], &bucket["burst"]),
        (&json!("token_bucket"), &json!(20))
    );

    let mut unknown = request(&[&[("api_key", "a")]]);
    unknown["domain"] = json!("nowhere");
    let (status, body) = post_json(admin, "/debug/explain", &unknown);
    assert_eq!(status, 200);
    assert_eq!(body["domain_found"], false);
    assert_eq!(body["descriptors"][0]["match"], "unknown_domain");
}

#[test]
fn bad_bodies_are_refused_naming_the_field() {
    let (_dir, server) = start();
    let admin = server.admin_addr();
    let cases = [
        (
            r#"{"domain": "edge", "descriptors": [{"entries": [{"key": 7}]}]}"#,
            "descriptors[0].entries[0].key",
        ),
        (
            r#"{"domain": "edge", "descriptors": [{"entries": [{"key": ""}]}]}"#,
            "descriptors[0].entries[0].key: must not be empty",
        ),
        (r#"{"descriptors": []}"#, "missing field `domain`"),
        (r#"{"domain": "edge", "extra": 1}"#, "unknown field `extra`"),
        ("not json", "invalid request body"),
    ];
    for (body, expected) in cases {
        let response = http_post(admin, "/debug/explain", &[], body).expect("answers");
        assert_eq!(response.status, 400, "{body}: {}", response.body);
        assert!(
            response.body.contains(expected),
            "{body}: {}",
            response.body
        );
    }
    let huge = format!(r#"{{"domain": "{}"}}"#, "x".repeat(2 << 20));
    let response = http_post(admin, "/debug/explain", &[], &huge).expect("answers");
    assert_eq!(response.status, 413, "bounded like /json");
}

#[test]
fn the_command_prints_a_readable_explanation() {
    let (_dir, server) = start();
    let (http, admin) = (server.http_addr(), server.admin_addr());
    assert_eq!(
        post_json(http, "/json", &request(&[&[("api_key", "bob")]])).0,
        200
    );
    let stdout = explain_command(
        admin,
        &[
            "--descriptor",
            "api_key=bob",
            "--descriptor",
            "tenant=acme,path=/v1",
            "--descriptor",
            "api_key=healthchecker",
        ],
    );
    assert_has_lines(
        &stdout,
        &[
            "descriptor 1: api_key=bob (1 hit)",
            "  matched edge > api_key",
            "  limit per_key: 5 per day, fixed_window",
            "    used 1, remaining 4, fully reset in ",
            "  within the limit: this request would pass now",
            "descriptor 2: tenant=acme,path=/v1 (1 hit)",
            "  limit per_path: 10 per hour, token_bucket, burst 20",
            "descriptor 3: api_key=healthchecker (1 hit)",
            "  no limit: matched edge > api_key=healthchecker, which has no limit (allow-listed)",
        ],
    );
    assert!(stdout.contains("on this node"), "{stdout}");
    // Explaining consumed nothing.
    let (_, body) = post_json(admin, "/debug/explain", &request(&[&[("api_key", "bob")]]));
    assert_eq!(body["descriptors"][0]["limits"][0]["used"], 1);
}

#[test]
fn the_command_fails_clearly() {
    let (_dir, server) = start();
    let addr = format!("http://{}", server.admin_addr());
    let explain = |extra: &[&str]| {
        let mut args = vec!["explain", "--domain", "edge"];
        args.extend_from_slice(extra);
        run_ratekeeper(&args)
    };
    let (status, _, stderr) = explain(&["--addr", &addr, "--descriptor", "api_key"]);
    assert!(!status.success());
    assert!(
        stderr.contains(
            r#"--descriptor "api_key" (number 1): descriptor.entries[0]: no `=` in "api_key""#
        ),
        "{stderr}"
    );
    let long_key = format!("{}=v", "k".repeat(300));
    let (status, _, stderr) = explain(&["--addr", &addr, "--descriptor", &long_key]);
    assert!(!status.success());
    assert!(
        stderr.contains(r#"--descriptor "kkkk"#)
            && stderr.contains("descriptor.entries[0].key: 300 bytes, at most 256 allowed"),
        "{stderr}"
    );
    // What only the server checks comes back as its 400.
    let mut many = vec!["--addr", addr.as_str()];
    for _ in 0..65 {
        many.extend(["--descriptor", "api_key=a"]);
    }
    let (status, _, stderr) = explain(&many);
    assert!(!status.success());
    assert!(
        stderr.contains("ratekeeper answered 400: descriptors: 65"),
        "{stderr}"
    );
    // A port nobody listens on: bind one, note it, let it go.
    let free = crate::support::free_port();
    let nowhere = format!("http://127.0.0.1:{free}");
    let (status, _, stderr) = explain(&["--addr", &nowhere, "--descriptor", "api_key=a"]);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("cannot reach ratekeeper at 127.0.0.1:{free}")),
        "{stderr}"
    );
}
