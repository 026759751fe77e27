//! `DELETE /counters/{domain}?descriptor=...` through the binary: a blocked descriptor
//! passes again after its reset, on one node, across a cluster of three (the reset asked
//! of a node that does not own the counter), and with the counters in Redis (where other
//! processes see the reset too; on a Redis Cluster, where a descriptor's keys share one
//! hash slot, only that descriptor's keys go). Bad input answers 400 naming the parameter;
//! an unknown domain 404; `--admin-counters=false` turns the endpoint off.

use std::net::SocketAddr;

use crate::support::{
    Ratekeeper, RedisCluster, RedisServer, TempDir, http_post, http_request, metric, start_cluster,
    write_config,
};
use serde_json::{Value, json};

const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: day, requests_per_unit: 2}
  - key: tenant
    descriptors:
      - key: path
        rate_limits:
          - {name: per_path, unit: day, requests_per_unit: 2}
          - {name: per_path_hour, unit: hour, requests_per_unit: 5}
  - key: open
";

/// `POST /json` for one descriptor: `Some(true)` admitted, `Some(false)` over the limit.
fn ask(http: SocketAddr, entries: &[(&str, &str)]) -> bool {
    let entries: Vec<Value> = entries
        .iter()
        .map(|(key, value)| json!({"key": key, "value": value}))
        .collect();
    let body = json!({"domain": "edge", "descriptors": [{"entries": entries}]});
    let response = http_post(http, "/json", &[], &body.to_string()).expect("answers");
    match response.status {
        200 => true,
        429 => false,
        status => panic!("/json answered {status}: {}", response.body),
    }
}

/// `DELETE path` on an admin listener.
fn reset(admin: SocketAddr, path: &str) -> (u16, Value) {
    let response = http_request(admin, "DELETE", path, &[], "").expect("answers");
    let body = serde_json::from_str(&response.body)
        .unwrap_or_else(|error| panic!("DELETE {path}: {error} in {:?}", response.body));
    (response.status, body)
}

/// Uses up `entries`' limit of 2 through `http` and checks the third is refused.
fn block(http: SocketAddr, entries: &[(&str, &str)]) {
    assert!(ask(http, entries), "first of 2 admitted");
    assert!(ask(http, entries), "second of 2 admitted");
    assert!(!ask(http, entries), "third refused: {entries:?} is blocked");
}

#[test]
fn a_reset_lets_a_blocked_descriptor_pass_again_on_one_node() {
    let dir = TempDir::new("reset-single");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let node = Ratekeeper::start(&config, &[]);
    let (http, admin) = (node.http_addr(), node.admin_addr());
    block(http, &[("api_key", "k1")]);
    block(http, &[("api_key", "k2")]);
    let (status, body) = reset(admin, "/counters/edge?descriptor=api_key=k1");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["path"], "edge > api_key");
    assert_eq!(body["limits"], json!(["per_key"]));
    assert_eq!(body["removed"], 1);
    assert!(ask(http, &[("api_key", "k1")]), "k1 passes again");
    assert!(!ask(http, &[("api_key", "k2")]), "k2 was not reset");
    // All limits of a nested descriptor at once; values percent-decoded after splitting.
    let nested = [("tenant", "acme,inc"), ("path", "/v1")];
    block(http, &nested);
    let (status, body) = reset(
        admin,
        "/counters/edge?descriptor=tenant=acme%2Cinc,path=%2Fv1",
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limits"], json!(["per_path", "per_path_hour"]));
    assert_eq!(body["removed"], 2);
    assert!(ask(http, &nested), "the nested descriptor passes again");
    // Nothing counted yet: still 200, nothing removed.
    let (status, body) = reset(admin, "/counters/edge?descriptor=api_key=fresh");
    assert_eq!((status, body["removed"].clone()), (200, json!(0)), "{body}");
}

#[test]
fn a_bad_reset_is_refused_naming_the_problem() {
    let dir = TempDir::new("reset-errors");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let node = Ratekeeper::start(&config, &[]);
    let admin = node.admin_addr();
    for (path, status, problem) in [
        ("/counters/edge", 400, "descriptor: missing"),
        (
            "/counters/edge?descriptor=api_key",
            400,
            "descriptor.entries[0]: no `=`",
        ),
        (
            "/counters/edge?descriptor=api_key=a&page=2",
            400,
            "unknown parameter \"page\"",
        ),
        (
            "/counters/nowhere?descriptor=api_key=a",
            404,
            "unknown domain \"nowhere\"",
        ),
        (
            "/counters/edge?descriptor=open=x",
            404,
            "descriptor: matches no limit",
        ),
        (
            "/counters/edge?descriptor=user=x",
            404,
            "descriptor: matches no limit",
        ),
    ] {
        let (got, body) = reset(admin, path);
        assert_eq!(got, status, "{path}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(problem), "{path}: {error}");
    }
    let off = Ratekeeper::start(&config, &["--admin-counters=false"]);
    let (status, body) = reset(off.admin_addr(), "/counters/edge?descriptor=api_key=a");
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|error| error.contains("--admin-counters=false")),
        "{body}"
    );
}

/// Whether `admin`'s node owns `value`'s counter, by `/debug/explain`.
fn owns(admin: SocketAddr, value: &str) -> bool {
    let body = json!({"domain": "edge", "descriptors": [{"entries": [{"key": "api_key", "value": value}]}]});
    let response = http_post(admin, "/debug/explain", &[], &body.to_string()).expect("answers");
    assert_eq!(response.status, 200, "{}", response.body);
    let explained: Value = serde_json::from_str(&response.body).expect("json");
    explained["descriptors"][0]["local"]
        .as_bool()
        .expect("local is reported in cluster mode")
}

#[test]
fn a_reset_reaches_the_owner_across_a_cluster_of_three() {
    let dir = TempDir::new("reset-cluster");
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let nodes = start_cluster(&config, 3, &["--peer-timeout", "2s"]);
    let (first, asked, last) = (
        nodes[0].http_addr(),
        nodes[1].admin_addr(),
        nodes[2].http_addr(),
    );
    let values: Vec<String> = (0..12).map(|n| format!("user-{n}")).collect();
    let remote = values.iter().filter(|value| !owns(asked, value)).count();
    assert!(
        remote > 0,
        "some of 12 keys are owned by another node than the one asked"
    );
    for value in &values {
        block(first, &[("api_key", value)]);
    }
    for value in &values {
        let (status, body) = reset(asked, &format!("/counters/edge?descriptor=api_key={value}"));
        assert_eq!(status, 200, "{value}: {body}");
        assert_eq!(
            body["removed"], 1,
            "{value}: the owner held the counter: {body}"
        );
    }
    for value in &values {
        assert!(ask(last, &[("api_key", value)]), "{value} passes again");
    }
    for node in &nodes {
        assert_eq!(
            metric(node.http_addr(), "ratekeeper_cluster_fallbacks_total"),
            0.0,
            "no fallback stood in for an owner"
        );
    }
}

#[test]
fn a_reset_deletes_the_counters_in_redis_for_every_process() {
    let dir = TempDir::new("reset-redis");
    let server = RedisServer::start(dir.path(), &[]);
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    let url = server.url();
    let (one, two) = (
        Ratekeeper::start(&config, &["--store", &url, "--store-blocked-keys", "0"]),
        Ratekeeper::start(&config, &["--store", &url]),
    );
    let entries = [("api_key", "shared")];
    block(two.http_addr(), &entries);
    block(one.http_addr(), &[("api_key", "other")]);
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "2", "one key per counter");
    // Asked of the process whose blocked cache holds the descriptor: it forgets it too.
    let (status, body) = reset(two.admin_addr(), "/counters/edge?descriptor=api_key=shared");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["removed"], 1, "{body}");
    assert!(
        ask(one.http_addr(), &entries),
        "the other process sees the reset"
    );
    assert!(ask(two.http_addr(), &entries), "passes again here");
    assert!(
        !ask(one.http_addr(), &[("api_key", "other")]),
        "only that descriptor was reset"
    );
    let (status, body) = reset(one.admin_addr(), "/counters/edge?descriptor=api_key=other");
    assert_eq!((status, body["removed"].clone()), (200, json!(1)), "{body}");
    assert!(ask(one.http_addr(), &[("api_key", "other")]));
}

/// The counter keys each master of `cluster` holds, sorted.
fn keys_per_master(cluster: &RedisCluster) -> Vec<Vec<String>> {
    cluster
        .masters
        .iter()
        .map(|master| {
            let mut keys: Vec<String> = master
                .cli(&["keys", "rk:*"])
                .lines()
                .map(str::trim)
                .filter(|key| !key.is_empty())
                .map(str::to_owned)
                .collect();
            keys.sort();
            keys
        })
        .collect()
}

/// The route of a key `rk:{ROUTE}:ID` (its hash tag).
fn route(key: &str) -> &str {
    key.split(['{', '}']).nth(1).unwrap_or(key)
}

#[test]
fn a_reset_on_a_redis_cluster_deletes_one_descriptors_keys_in_their_slot() {
    let dir = TempDir::new("reset-redis-cluster");
    let cluster = RedisCluster::start(dir.path(), 3);
    let config = write_config(dir.path(), "edge.yaml", LIMITS);
    // No over-limit cache: every answer below is the cluster's.
    let node = Ratekeeper::start(
        &config,
        &["--store", &cluster.url(), "--store-blocked-keys", "0"],
    );
    let (http, admin) = (node.http_addr(), node.admin_addr());
    let path = [("tenant", "acme"), ("path", "/v1")];
    block(http, &path);
    let others: Vec<String> = (0..6).map(|n| format!("k{n}")).collect();
    for other in &others {
        block(http, &[("api_key", other)]);
    }
    let before = keys_per_master(&cluster);
    assert_eq!(before.iter().map(Vec::len).sum::<usize>(), 8, "{before:?}");
    // The descriptor's two limits are two keys with one hash tag, on one master.
    let holder = before
        .iter()
        .position(|keys| {
            let routes: Vec<&str> = keys.iter().map(|key| route(key)).collect();
            routes.windows(2).any(|pair| pair[0] == pair[1])
        })
        .unwrap_or_else(|| panic!("two keys of one route on one master: {before:?}"));
    let shared = before[holder]
        .windows(2)
        .find(|pair| route(&pair[0]) == route(&pair[1]))
        .map(|pair| route(&pair[0]).to_owned())
        .expect("the shared route");

    let (status, body) = reset(admin, "/counters/edge?descriptor=tenant=acme,path=/v1");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["removed"], 2, "both limits' keys: {body}");
    assert_eq!(
        body["limits"],
        json!(["per_path", "per_path_hour"]),
        "{body}"
    );
    let after = keys_per_master(&cluster);
    let expected: Vec<Vec<String>> = before
        .iter()
        .map(|keys| {
            keys.iter()
                .filter(|key| route(key) != shared)
                .cloned()
                .collect()
        })
        .collect();
    assert_eq!(after, expected, "only that descriptor's keys are gone");
    assert!(ask(http, &path), "the descriptor passes again");
    assert!(ask(http, &path), "with its whole limit");
    assert!(!ask(http, &path), "and is limited again after it");
    for other in &others {
        assert!(
            !ask(http, &[("api_key", other)]),
            "{other} is still blocked: its counter is untouched"
        );
    }

    // Another descriptor, maybe on another master: reset alone, like the first.
    let (status, body) = reset(admin, "/counters/edge?descriptor=api_key=k3");
    assert_eq!((status, body["removed"].clone()), (200, json!(1)), "{body}");
    assert!(ask(http, &[("api_key", "k3")]));
    assert!(!ask(http, &[("api_key", "k4")]), "k4 untouched");
}
