//! `GET /counters/{domain}` through the binary: the live counters of a domain with their
//! state, paged, with `--counter-names`; 404 without it or for an unknown domain; 400
//! naming a bad parameter.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use serde_json::{Value, json};
use support::{Ratekeeper, TempDir, http_get, http_post, serve_limits};

const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit: {name: per_key, algorithm: token_bucket, unit: hour, requests_per_unit: 10}
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {name: per_path, algorithm: token_bucket, unit: hour, requests_per_unit: 10}
";

fn start(args: &[&str]) -> (TempDir, Ratekeeper) {
    serve_limits("counters", LIMITS, args)
}

fn hit(http: SocketAddr, entries: &[(&str, &str)], hits: u32) {
    let entries: Vec<Value> = entries
        .iter()
        .map(|(key, value)| json!({"key": key, "value": value}))
        .collect();
    let body =
        json!({"domain": "edge", "hits_addend": hits, "descriptors": [{"entries": entries}]});
    let response = http_post(http, "/json", &[], &body.to_string()).expect("answers");
    assert_eq!(response.status, 200, "{}", response.body);
}

fn get(http: SocketAddr, path: &str) -> (u16, Value) {
    let response = http_get(http, path, &[]).expect("answers");
    let body = serde_json::from_str(&response.body)
        .unwrap_or_else(|error| panic!("GET {path}: {error} in {:?}", response.body));
    (response.status, body)
}

#[test]
fn live_counters_are_listed_with_their_state_in_pages() {
    let (_dir, server) = start(&["--counter-names", "1000", "--shards", "4"]);
    let http = server.http_addr();
    for n in 0..7u32 {
        hit(http, &[("api_key", &format!("key-{n}"))], n + 1);
    }
    hit(http, &[("tenant", "acme"), ("path", "/v1")], 4);
    let mut seen = Vec::new();
    let mut path = "/counters/edge?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let (status, body) = get(http, &path);
        assert_eq!(status, 200, "{body}");
        pages += 1;
        for counter in body["counters"].as_array().expect("counters") {
            let entries: Vec<String> = counter["entries"]
                .as_array()
                .expect("entries")
                .iter()
                .map(|entry| {
                    format!(
                        "{}={}",
                        entry["key"].as_str().unwrap_or(""),
                        entry["value"].as_str().unwrap_or("")
                    )
                })
                .collect();
            let limit = &counter["limits"][0];
            assert!(
                counter["shard"].as_u64().is_some_and(|shard| shard < 4),
                "{counter}"
            );
            seen.push((
                entries.join(","),
                limit["used"].as_u64().expect("used"),
                limit["name"].clone(),
            ));
        }
        match body["next"].as_str() {
            Some(next) => path = format!("/counters/edge?limit=3&after={next}"),
            None => break,
        }
    }
    assert_eq!(pages, 3, "8 counters in pages of 3");
    let unique: BTreeSet<&str> = seen
        .iter()
        .map(|(entries, _, _)| entries.as_str())
        .collect();
    assert_eq!(unique.len(), 8, "each counter once: {seen:?}");
    for n in 0..7u64 {
        let entry = format!("api_key=key-{n}");
        let found = seen
            .iter()
            .find(|(entries, _, _)| *entries == entry)
            .expect("listed");
        assert_eq!((found.1, &found.2), (n + 1, &json!("per_key")));
    }
    assert!(seen.contains(&("tenant=acme,path=/v1".to_owned(), 4, json!("per_path"))));
    let (_, body) = get(http, "/counters/edge");
    assert_eq!(
        body["names"],
        json!({"kept": 8, "capacity": 1000, "dropped": 0})
    );
}

#[test]
fn errors_name_the_problem() {
    let (_dir, off) = start(&[]);
    let (status, body) = get(off.http_addr(), "/counters/edge");
    assert_eq!(status, 404);
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|error| error.contains("--counter-names")),
        "{body}"
    );

    let (_dir, server) = start(&["--counter-names", "10"]);
    let http = server.http_addr();
    let (status, body) = get(http, "/counters/nowhere");
    assert_eq!(
        (status, &body["error"]),
        (404, &json!("unknown domain \"nowhere\""))
    );
    for (query, named) in [
        ("limit=0", "limit:"),
        ("after=zz", "after:"),
        ("sort=1", "unknown parameter"),
    ] {
        let (status, body) = get(http, &format!("/counters/edge?{query}"));
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|error| error.starts_with(named)),
            "{query}: {body}"
        );
    }
}
