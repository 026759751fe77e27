//! `GET /counters/{domain}` through the binary: the live counters of a domain with their
//! state, paged, with `--counter-names`; 404 without it or for an unknown domain; 400
//! naming a bad parameter. With `?cluster=1`, on three nodes, every counter once with its
//! owner's count whichever nodes its requests went through, and a stopped member reported
//! missing while the others' counters are still listed.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use crate::support::{
    Ratekeeper, TempDir, http_get, http_post, http_request, serve_limits, start_cluster,
    write_config,
};
use serde_json::{Value, json};

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

/// `GET path` on an admin listener.
fn get(admin: SocketAddr, path: &str) -> (u16, Value) {
    let response = http_get(admin, path, &[]).expect("answers");
    let body = serde_json::from_str(&response.body)
        .unwrap_or_else(|error| panic!("GET {path}: {error} in {:?}", response.body));
    (response.status, body)
}

#[test]
fn live_counters_are_listed_with_their_state_in_pages() {
    let (_dir, server) = start(&["--counter-names", "1000", "--shards", "4"]);
    let (http, admin) = (server.http_addr(), server.admin_addr());
    for n in 0..7u32 {
        hit(http, &[("api_key", &format!("key-{n}"))], n + 1);
    }
    hit(http, &[("tenant", "acme"), ("path", "/v1")], 4);
    let mut seen = Vec::new();
    let mut path = "/counters/edge?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let (status, body) = get(admin, &path);
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
    let (_, body) = get(admin, "/counters/edge");
    assert_eq!(
        body["names"],
        json!({"kept": 8, "capacity": 1000, "dropped": 0})
    );
}

#[test]
fn errors_name_the_problem() {
    let (_dir, off) = start(&[]);
    let (status, body) = get(off.admin_addr(), "/counters/edge");
    assert_eq!(status, 404);
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|error| error.contains("--counter-names")),
        "{body}"
    );

    let (_dir, server) = start(&["--counter-names", "10"]);
    let admin = server.admin_addr();
    let (status, body) = get(admin, "/counters/nowhere");
    assert_eq!(
        (status, &body["error"]),
        (404, &json!("unknown domain \"nowhere\""))
    );
    for (query, named) in [
        ("limit=0", "limit:"),
        ("after=zz", "after:"),
        ("sort=1", "unknown parameter"),
    ] {
        let (status, body) = get(admin, &format!("/counters/edge?{query}"));
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|error| error.starts_with(named)),
            "{query}: {body}"
        );
    }
}

/// The peer address of the node owning `value`'s counter, by `/debug/explain`.
fn owner(admin: SocketAddr, value: &str) -> String {
    let body = json!({"domain": "edge", "descriptors": [{"entries": [{"key": "api_key", "value": value}]}]});
    let response = http_post(admin, "/debug/explain", &[], &body.to_string()).expect("answers");
    let explained: Value = serde_json::from_str(&response.body).expect("json");
    explained["descriptors"][0]["owner"]
        .as_str()
        .expect("an owner in cluster mode")
        .to_owned()
}

/// `(value, used, owner)` of each listed counter, in the order listed.
fn listed(body: &Value) -> Vec<(String, u64, String)> {
    body["counters"]
        .as_array()
        .expect("counters")
        .iter()
        .map(|counter| {
            (
                counter["entries"][0]["value"]
                    .as_str()
                    .expect("value")
                    .to_owned(),
                counter["limits"][0]["used"].as_u64().expect("used"),
                counter["owner"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_cluster_listing_shows_every_counter_once_with_its_owners_count() {
    let dir = TempDir::new("counters-cluster");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    // Nodes keep counter names; the failure detector pings once an hour, so a node the test
    // stops stays on the others' rings.
    let mut nodes = start_cluster(
        &config,
        3,
        &[
            "--peer-timeout",
            "1s",
            "--peer-ping-interval",
            "3600s",
            "--counter-names",
            "100",
        ],
    );
    let http: Vec<SocketAddr> = nodes.iter().map(Ratekeeper::http_addr).collect();
    let admin: Vec<SocketAddr> = nodes.iter().map(Ratekeeper::admin_addr).collect();
    let peers: Vec<String> = nodes
        .iter()
        .map(|node| node.peer_addr().to_string())
        .collect();
    // Two keys owned by each node, sent through the two others, every other key first
    // through its owner. A counter is named by the node whose request found it full: its
    // owner, or another node. Key j is used j + 3 times.
    // (value, owner, used, the nodes naming it)
    let mut keys: Vec<(String, usize, u64, Vec<usize>)> = Vec::new();
    for (owned_by, peer) in peers.iter().enumerate() {
        let mut found = (0..1000)
            .map(|n| format!("o{owned_by}-{n}"))
            .filter(|value| owner(admin[0], value) == *peer);
        for _ in 0..2 {
            let value = found.next().expect("a key owned by each node");
            let entries = [("api_key", value.as_str())];
            let j = keys.len() as u64;
            let (next, after) = ((owned_by + 1) % 3, (owned_by + 2) % 3);
            let through_owner = j.is_multiple_of(2);
            let mut naming = vec![if through_owner { owned_by } else { next }];
            if through_owner {
                hit(http[owned_by], &entries, 1);
            }
            hit(
                http[next],
                &entries,
                (j + 2 - u64::from(through_owner)) as u32,
            );
            hit(http[after], &entries, 1);
            if j == 1 {
                // Reset (asked of the owner, so `next` keeps its name), then counted again
                // from full through `after`: the counter is named on two nodes.
                let path = format!("/counters/edge?descriptor=api_key={value}");
                let response =
                    http_request(admin[owned_by], "DELETE", &path, &[], "").expect("answers");
                assert_eq!(response.status, 200, "{}", response.body);
                hit(http[after], &entries, (j + 3) as u32);
                naming.push(after);
            }
            keys.push((value, owned_by, j + 3, naming));
        }
    }
    // Alone, a node lists the counters it holds and named itself.
    for (index, node_admin) in admin.iter().enumerate() {
        let (status, body) = get(*node_admin, "/counters/edge");
        assert_eq!(status, 200, "{body}");
        let mut here: Vec<String> = listed(&body).into_iter().map(|(value, ..)| value).collect();
        here.sort();
        let mut expected: Vec<String> = keys
            .iter()
            .enumerate()
            .filter(|(j, (_, owned_by, ..))| *owned_by == index && j.is_multiple_of(2))
            .map(|(_, (value, ..))| value.clone())
            .collect();
        expected.sort();
        assert_eq!(here, expected, "node {index}: {body}");
    }
    // With ?cluster=1, any node lists them all, once, with the owner's count, by use.
    let mut by_use: Vec<(String, u64, String)> = keys
        .iter()
        .map(|(value, owned_by, used, _)| (value.clone(), *used, peers[*owned_by].clone()))
        .collect();
    by_use.sort_by_key(|(_, used, _)| std::cmp::Reverse(*used));
    for node_admin in &admin {
        let (status, body) = get(*node_admin, "/counters/edge?cluster=1");
        assert_eq!(status, 200, "{body}");
        assert_eq!(listed(&body), by_use, "{body}");
        assert_eq!(body["next"], Value::Null);
        assert_eq!(body["cluster"]["missing"], json!([]), "{body}");
        let mut members: Vec<String> = body["cluster"]["members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|member| member.as_str().expect("address").to_owned())
            .collect();
        members.sort();
        let mut all = peers.clone();
        all.sort();
        assert_eq!(members, all);
        assert_eq!(body["names"]["capacity"], 300, "three maps: {body}");
        assert_eq!(body["names"]["kept"], 7, "key 1 named twice: {body}");
    }
    // Pages of 4 walk the same counters, each once.
    let (_, first) = get(admin[1], "/counters/edge?cluster=1&limit=4");
    let next = first["next"].as_str().expect("a second page").to_owned();
    let (_, second) = get(
        admin[1],
        &format!("/counters/edge?cluster=1&limit=4&after={next}"),
    );
    assert_eq!(second["next"], Value::Null, "{second}");
    let mut walked: Vec<(String, u64, String)> = listed(&first);
    walked.extend(listed(&second));
    walked.sort();
    let mut expected = by_use.clone();
    expected.sort();
    assert_eq!(walked, expected);

    // A member that does not answer (stopped: its connections stay open, silent) is
    // reported; the counters the others name and own are still listed.
    nodes[2].process().signal("-STOP");
    let started = std::time::Instant::now();
    let (status, body) = get(admin[0], "/counters/edge?cluster=1");
    nodes[2].process().signal("-CONT");
    assert_eq!(status, 200, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by deadlines"
    );
    let missing = body["cluster"]["missing"].as_array().expect("missing");
    assert_eq!(missing.len(), 1, "{body}");
    assert_eq!(missing[0]["member"], peers[2].as_str(), "{body}");
    let mut reachable: Vec<(String, u64, String)> = keys
        .iter()
        .filter(|(_, owned_by, _, naming)| *owned_by != 2 && naming.iter().any(|node| *node != 2))
        .map(|(value, owned_by, used, _)| (value.clone(), *used, peers[*owned_by].clone()))
        .collect();
    reachable.sort_by_key(|(_, used, _)| std::cmp::Reverse(*used));
    assert_eq!(reachable.len(), 3, "{reachable:?}");
    assert_eq!(listed(&body), reachable, "{body}");
}
