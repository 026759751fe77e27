//! Cluster mode with real ratekeeper processes on 127.0.0.1: one limit across all nodes,
//! forwarding to owners, a killed node taken off the ring (and the bound on what it costs),
//! and counter handoff on SIGTERM.
//!
//! Forward deadlines are 2 s here (the default is 1 s) so even a very busy CI machine
//! cannot turn a slow forward into a fallback and break an exact count; every test that
//! counts also asserts no fallback happened. `tests/cluster_overload.rs` runs the defaults
//! on a saturated machine.

use std::time::{Duration, Instant};

use crate::support::{
    Ratekeeper, TempDir, eventually, start_cluster, start_member, wait_for_members, write_config,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(20);
/// Every node's forward deadline (see the module doc).
const PEER_ARGS: &[&str] = &["--peer-timeout", "2s"];

fn limits(requests_per_unit: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {{unit: day, requests_per_unit: {requests_per_unit}, name: per_key}}\n"
    )
}

/// The value of the first `/metrics` sample of `node` starting with `prefix` (0 if absent).
fn metric(node: &Ratekeeper, prefix: &str) -> f64 {
    crate::support::metric(node.http_addr(), prefix)
}

fn request(values: &[&str]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: values
            .iter()
            .map(|value| RateLimitDescriptor {
                entries: vec![Entry {
                    key: "api_key".to_owned(),
                    value: (*value).to_owned(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn admitted(client: &mut RateLimitServiceClient<Channel>, value: &str) -> bool {
    let response = client
        .should_rate_limit(request(&[value]))
        .await
        .expect("answers")
        .into_inner();
    response.overall_code == Code::Ok as i32
}

/// Which node (index into `nodes`) owns `value`, by the same ring the nodes build.
fn owner(nodes: &[Ratekeeper], value: &str) -> usize {
    let members: Vec<String> = nodes
        .iter()
        .map(|node| node.peer_addr().to_string())
        .collect();
    crate::support::edge_owner_of(&members, value)
}

/// The sum of every `/metrics` sample starting with `prefix` (all label sets).
fn metric_sum(node: &Ratekeeper, prefix: &str) -> f64 {
    crate::support::metric_sum(node.http_addr(), prefix)
}

fn fallbacks(nodes: &[Ratekeeper]) -> f64 {
    crate::support::metric_total(nodes, "ratekeeper_cluster_fallbacks_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_round_robin_is_admitted_exactly_the_limit_in_total() {
    let dir = TempDir::new("cluster-exact");
    write_config(dir.path(), "edge.yaml", &limits(10));
    let nodes = start_cluster(dir.path(), 3, PEER_ARGS);
    let mut clients = crate::support::grpc_clients(&nodes).await;
    let mut total = 0;
    for n in 0..30 {
        if admitted(&mut clients[n % 3], "round-robin").await {
            total += 1;
        }
    }
    assert_eq!(total, 10, "the limit holds across the three nodes");
    assert_eq!(fallbacks(&nodes), 0.0);
    let forwarded: f64 = nodes
        .iter()
        .map(|node| metric_sum(node, "ratekeeper_peer_forwarded_total"))
        .sum();
    assert_eq!(
        forwarded, 20.0,
        "the two non-owners forwarded their 10 requests each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_spread_over_all_owners_and_each_holds_its_limit() {
    let dir = TempDir::new("cluster-spread");
    write_config(dir.path(), "edge.yaml", &limits(2));
    let nodes = start_cluster(dir.path(), 3, PEER_ARGS);
    let mut clients = crate::support::grpc_clients(&nodes).await;
    let values: Vec<String> = (0..120).map(|n| format!("user-{n}")).collect();
    let mut owned = [0usize; 3];
    for value in &values {
        owned[owner(&nodes, value)] += 1;
        let mut results = Vec::new();
        for client in clients.iter_mut() {
            results.push(admitted(client, value).await);
        }
        assert_eq!(results, [true, true, false], "key {value}");
    }
    assert!(
        owned.iter().all(|count| *count > 20),
        "keys spread over owners: {owned:?}"
    );
    for (index, node) in nodes.iter().enumerate() {
        let live: f64 = (0..8)
            .map(|shard| {
                metric(
                    node,
                    &format!(r#"ratekeeper_shard_live_keys{{shard="{shard}"}}"#),
                )
            })
            .sum();
        assert_eq!(
            live, owned[index] as f64,
            "node {index} holds exactly the keys it owns"
        );
    }
    assert_eq!(fallbacks(&nodes), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_keys_live_on_different_owners_gets_every_status_right() {
    let dir = TempDir::new("cluster-multi");
    write_config(dir.path(), "edge.yaml", &limits(3));
    let nodes = start_cluster(dir.path(), 3, PEER_ARGS);
    // Ports (so ring placement) differ per run: pick values covering every owner, 2 or 3 each.
    let mut per_owner = [0usize; 3];
    let picked: Vec<String> = (0..1000)
        .map(|n| format!("m-{n}"))
        .filter(|value| {
            let owner = owner(&nodes, value);
            per_owner[owner] += 1;
            per_owner[owner] <= 3
        })
        .take(8)
        .collect();
    let values: Vec<&str> = picked.iter().map(String::as_str).collect();
    let owners: std::collections::BTreeSet<usize> =
        values.iter().map(|value| owner(&nodes, value)).collect();
    assert_eq!(owners.len(), 3, "the request spans all three owners");
    let mut clients = crate::support::grpc_clients(&nodes).await;
    // One extra hit on the first key, through another node, so the statuses differ.
    assert!(admitted(&mut clients[1], values[0]).await);
    for round in 0..3 {
        let response = clients[0]
            .should_rate_limit(request(&values))
            .await
            .expect("answers")
            .into_inner();
        let remaining: Vec<u32> = response
            .statuses
            .iter()
            .map(|status| status.limit_remaining)
            .collect();
        let codes: Vec<i32> = response.statuses.iter().map(|status| status.code).collect();
        let ok = Code::Ok as i32;
        let over = Code::OverLimit as i32;
        match round {
            0 => assert_eq!((remaining[0], &remaining[1..]), (1, &[2u32; 7][..])),
            1 => assert_eq!((remaining[0], &remaining[1..]), (0, &[1u32; 7][..])),
            _ => {
                assert_eq!(codes[0], over, "the first key ran out a request earlier");
                assert_eq!(&codes[1..], &[ok; 7][..]);
                assert_eq!(&remaining[1..], &[0u32; 7][..]);
            }
        }
    }
    assert_eq!(fallbacks(&nodes), 0.0);
}

/// Sends requests for `value` through `clients` in turn until `done` holds (checked after
/// every round, bounded by [`WAIT`]); answers how many were admitted.
async fn admit_until(
    clients: &mut [RateLimitServiceClient<Channel>],
    value: &str,
    mut done: impl FnMut() -> bool,
) -> usize {
    let deadline = Instant::now() + WAIT;
    let mut admitted_here = 0;
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting");
        for client in clients.iter_mut() {
            admitted_here += usize::from(admitted(client, value).await);
        }
    }
    admitted_here
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_is_taken_off_every_ring_and_costs_at_most_its_lost_window() {
    const LIMIT: usize = 30;
    let dir = TempDir::new("cluster-kill");
    write_config(dir.path(), "edge.yaml", &limits(LIMIT as u32));
    let mut nodes = start_cluster(dir.path(), 3, PEER_ARGS);
    let victim_peer = nodes[2].peer_addr();
    let value = (0..400)
        .map(|n| format!("k-{n}"))
        .find(|value| owner(&nodes, value) == 2)
        .expect("a key owned by node 2");
    let mut clients = crate::support::grpc_clients(&nodes[..2]).await;
    // The victim counts 20 hits, then dies with them (its lost window).
    let mut before = 0;
    for n in 0..20 {
        before += usize::from(admitted(&mut clients[n % 2], &value).await);
    }
    assert_eq!(before, 20);
    nodes[2].process().signal("-KILL");
    let killed = Instant::now();
    assert!(eventually(WAIT, || nodes[2].process().exited().is_some()));

    // Traffic goes on while the survivors notice: every request is answered, by the
    // fallback (this node's share of the limit) until the ring changes.
    let survivors = &nodes[..2];
    let mut after = admit_until(&mut clients, &value, || {
        survivors
            .iter()
            .all(|node| metric(node, "ratekeeper_cluster_members") == 2.0)
    })
    .await;
    let detected = killed.elapsed();
    eprintln!("the dead node was off both rings after {detected:?}");
    assert!(
        detected < Duration::from_secs(3),
        "off every ring within 3 s: {detected:?}"
    );
    for node in survivors {
        let up = metric(
            node,
            &format!(r#"ratekeeper_peer_up{{peer="{victim_peer}"}}"#),
        );
        assert_eq!(up, 0.0, "the detector reports it down");
        assert!(node.stderr().contains("peer down"), "{}", node.stderr());
    }
    // The new owner merges what the other survivor counted on its fallback share; then
    // the key is used up for good.
    for _ in 0..LIMIT {
        for client in clients.iter_mut() {
            after += usize::from(admitted(client, &value).await);
        }
    }
    let share = LIMIT / 3;
    eprintln!(
        "limit {LIMIT}: {before} admitted before the kill (lost with the node), {after} after"
    );
    assert!(
        after <= LIMIT + share,
        "after a kill -9 the survivors admit at most the limit, plus a fallback share \
         counted before the handoff landed: {after}\n{}",
        survivors
            .iter()
            .map(|node| format!(
                "node {}: fallbacks {}, handoff sent {} received {}\n{}",
                node.peer_addr(),
                metric(node, "ratekeeper_cluster_fallbacks_total"),
                metric(node, "ratekeeper_cluster_handoff_sent_total"),
                metric(node, "ratekeeper_cluster_handoff_received_total"),
                node.stderr()
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        after >= LIMIT,
        "the survivors admit the whole limit: {after}"
    );

    // The node returns on the same address: back on every ring, and the key's counter
    // moves to it with the survivors' count.
    let returned = start_member(
        dir.path(),
        &victim_peer.to_string(),
        &[nodes[0].peer_addr(), nodes[1].peer_addr()],
        PEER_ARGS,
    );
    wait_for_members(&nodes[..2], 3);
    wait_for_members(std::slice::from_ref(&returned), 3);
    let handed = eventually(WAIT, || {
        metric(&returned, "ratekeeper_cluster_handoff_received_total") > 0.0
    });
    assert!(handed, "the counters moved back: {}", returned.stderr());
    let mut all = clients;
    all.extend(crate::support::grpc_clients(std::slice::from_ref(&returned)).await);
    for client in all.iter_mut() {
        assert!(
            !admitted(client, &value).await,
            "still used up on its owner"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_counters_over_and_a_rolling_restart_keeps_the_limit() {
    let dir = TempDir::new("cluster-handoff");
    write_config(dir.path(), "edge.yaml", &limits(20));
    let mut nodes = start_cluster(dir.path(), 3, PEER_ARGS);
    // A key owned by the node we will restart.
    let value = (0..400)
        .map(|n| format!("h-{n}"))
        .find(|value| owner(&nodes, value) == 2)
        .expect("some key is owned by node 2");
    let mut clients = crate::support::grpc_clients(&nodes[..2]).await;
    let mut total = 0;
    for n in 0..10 {
        total += usize::from(admitted(&mut clients[n % 2], &value).await);
    }
    assert_eq!(total, 10);
    let restarted_peer = nodes[2].peer_addr();

    nodes[2].process().signal("-TERM");
    let exited =
        crate::support::eventually_some(WAIT, || nodes[2].process().exited()).expect("exits");
    assert!(exited.success(), "{}", nodes[2].stderr());
    wait_for_members(&nodes[..2], 2);
    let received: f64 = nodes[..2]
        .iter()
        .map(|node| metric(node, "ratekeeper_cluster_handoff_received_total"))
        .sum();
    assert!(received >= 1.0, "the leaving node handed its counters over");
    for n in 0..20 {
        total += usize::from(admitted(&mut clients[n % 2], &value).await);
    }
    assert_eq!(
        total, 20,
        "the new owner continued from the handed-over count"
    );

    // The node comes back: ownership returns to it, with the count.
    let returned = start_member(
        dir.path(),
        &restarted_peer.to_string(),
        &[nodes[0].peer_addr(), nodes[1].peer_addr()],
        PEER_ARGS,
    );
    wait_for_members(&nodes[..2], 3);
    let moved_back = eventually(WAIT, || {
        metric(&returned, "ratekeeper_cluster_handoff_received_total") >= 1.0
    });
    assert!(
        moved_back,
        "the key's counter moved back to its owner: {}",
        returned.stderr()
    );
    let mut all = clients;
    all.extend(crate::support::grpc_clients(std::slice::from_ref(&returned)).await);
    for n in 0..9 {
        total += usize::from(admitted(&mut all[n % 3], &value).await);
    }
    assert_eq!(
        total, 20,
        "nothing more is admitted across the whole rolling restart"
    );
    assert_eq!(
        fallbacks(&nodes[..2]) + fallbacks(std::slice::from_ref(&returned)),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_shares_the_cluster_wide_limit() {
    let dir = TempDir::new("cluster-http");
    write_config(dir.path(), "edge.yaml", &limits(10));
    let nodes = start_cluster(dir.path(), 3, PEER_ARGS);
    let mut statuses = Vec::new();
    for n in 0..30 {
        let response = crate::support::http_post(
            nodes[n % 3].http_addr(),
            "/rate/edge/per_key/over-http",
            &[],
            "",
        )
        .expect("answers");
        statuses.push(response.status);
    }
    assert_eq!(
        statuses.iter().filter(|status| **status == 200).count(),
        10,
        "{statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|status| **status == 429).count(), 20);
    // And gRPC sees the same counter: the key is used up.
    let mut clients = crate::support::grpc_clients(&nodes[..1]).await;
    assert!(!admitted(&mut clients[0], "over-http").await);
    assert_eq!(fallbacks(&nodes), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reports_the_owners_counter_and_fails_rather_than_guess_without_it() {
    let dir = TempDir::new("cluster-explain");
    write_config(dir.path(), "edge.yaml", &limits(10));
    let mut nodes = start_cluster(dir.path(), 3, PEER_ARGS);
    let value = (0..400)
        .map(|n| format!("e-{n}"))
        .find(|value| owner(&nodes, value) == 1)
        .expect("a key owned by node 1");
    let mut clients = crate::support::grpc_clients(&nodes[..1]).await;
    for _ in 0..3 {
        assert!(admitted(&mut clients[0], &value).await);
    }
    let body = serde_json::json!({
        "domain": "edge",
        "descriptors": [{"entries": [{"key": "api_key", "value": value}]}]
    })
    .to_string();
    let explain = |node: &Ratekeeper| {
        let response = crate::support::http_post(node.admin_addr(), "/debug/explain", &[], &body)
            .expect("answers");
        let parsed: serde_json::Value =
            serde_json::from_str(&response.body).expect("a JSON answer");
        (response.status, parsed)
    };
    let owner_peer = nodes[1].peer_addr().to_string();
    for asked in [0, 2, 0] {
        let (status, answer) = explain(&nodes[asked]);
        assert_eq!(status, 200, "{answer}");
        let descriptor = &answer["descriptors"][0];
        assert_eq!(descriptor["owner"], owner_peer.as_str(), "{answer}");
        assert_eq!(descriptor["local"], false);
        assert_eq!(
            descriptor.get("shard"),
            None,
            "the owner's shards are its own"
        );
        let limit = &descriptor["limits"][0];
        assert_eq!(
            (&limit["used"], &limit["remaining"]),
            (&serde_json::json!(3), &serde_json::json!(7)),
            "{answer}"
        );
    }
    // The owner weighs the asked hits (Peek carries them): 8 do not fit in the 7 left and
    // pass again when the window resets; 11 never fit.
    for (hits, retry) in [(8, true), (11, false)] {
        let (_, answer) = crate::support::edge_explain_hits(&nodes[0], &value, Some(hits));
        let descriptor = &answer["descriptors"][0];
        assert_eq!(descriptor["would_reject"], true, "{answer}");
        assert_eq!(descriptor["local"], false, "{answer}");
        let limit = &descriptor["limits"][0];
        assert_eq!(limit["remaining"], 7, "nothing consumed: {answer}");
        if retry {
            assert!(limit["retry_after_ms"].as_u64().is_some(), "{answer}");
            assert_eq!(limit["retry_after_ms"], limit["reset_after_ms"], "{answer}");
        } else {
            assert_eq!(limit["retry_after_ms"], serde_json::Value::Null, "{answer}");
        }
    }
    let (_, answer) = explain(&nodes[1]);
    assert_eq!(answer["descriptors"][0]["local"], true, "{answer}");
    assert!(answer["descriptors"][0]["shard"].is_u64(), "{answer}");
    assert_eq!(fallbacks(&nodes), 0.0);

    nodes[1].process().signal("-KILL");
    assert!(eventually(WAIT, || nodes[1].process().exited().is_some()));
    let (status, answer) = explain(&nodes[0]);
    assert_eq!(status, 503, "{answer}");
    assert_eq!(
        answer["error"],
        format!("owner {owner_peer} did not answer").as_str()
    );
    assert_eq!(
        metric(&nodes[0], "ratekeeper_cluster_fallbacks_total"),
        0.0,
        "an explanation never falls back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_failing_at_a_full_owner_consumes_nothing_on_its_other_descriptors() {
    const LIMIT: usize = 5;
    let dir = TempDir::new("cluster-no-partial");
    write_config(dir.path(), "edge.yaml", &limits(LIMIT as u32));
    // Node 1 holds one key at most.
    let first = start_member(dir.path(), "127.0.0.1:0", &[], PEER_ARGS);
    let full_args = [PEER_ARGS, &["--shards", "1", "--max-keys", "1"]].concat();
    let second = start_member(dir.path(), "127.0.0.1:0", &[first.peer_addr()], &full_args);
    let nodes = [first, second];
    wait_for_members(&nodes, 2);
    let owned_by = |node: usize, prefix: &str| {
        (0..400)
            .map(|n| format!("{prefix}-{n}"))
            .find(|value| owner(&nodes, value) == node)
            .expect("a key owned by the node")
    };
    let (mine, theirs, new) = (owned_by(0, "m"), owned_by(1, "t"), owned_by(1, "n"));
    let mut client = crate::support::grpc_client(&nodes[0]).await;
    assert!(admitted(&mut client, &theirs).await, "node 1's only key");
    for _ in 0..3 {
        let status = client
            .should_rate_limit(request(&[&mine, &new]))
            .await
            .expect_err("node 1 cannot hold the new key");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    let mut total = 0;
    for _ in 0..2 * LIMIT {
        total += usize::from(admitted(&mut client, &mine).await);
    }
    assert_eq!(
        total, LIMIT,
        "the failed requests consumed nothing of node 0's descriptor"
    );
    assert_eq!(fallbacks(&nodes), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_node_taken_off_the_rings_by_mistake_is_back_within_3s_and_the_limit_is_exact() {
    const LIMIT: usize = 12;
    let dir = TempDir::new("cluster-false-down");
    write_config(dir.path(), "edge.yaml", &limits(LIMIT as u32));
    // The failure detector's defaults: pings every 500 ms, down after 3 missed, up after 2.
    let mut nodes = start_cluster(dir.path(), 3, PEER_ARGS);
    // Node 2 stops answering (SIGSTOP) long enough to be found down, though it never
    // left: a false failure detection, as a long GC pause or a partition would cause.
    nodes[2].process().signal("-STOP");
    wait_for_members(&nodes[..2], 2);
    nodes[2].process().signal("-CONT");
    let reachable = Instant::now();
    let healed = eventually(WAIT, || {
        nodes
            .iter()
            .all(|node| metric(node, "ratekeeper_cluster_members") == 3.0)
    });
    let took = reachable.elapsed();
    assert!(
        healed,
        "{}",
        crate::support::cluster_diagnosis(&nodes, &["a", "b", "c"])
    );
    eprintln!("back on every ring {took:?} after it was reachable");
    assert!(
        took < Duration::from_secs(3),
        "back on every member's ring within 3 s: {took:?}"
    );
    // The handoffs that follow the ring change land; then a fresh key holds its limit
    // exactly across the three nodes.
    let mut clients = crate::support::grpc_clients(&nodes).await;
    for value in ["fresh-0", "fresh-1", "fresh-2"] {
        let mut total = 0;
        for n in 0..3 * LIMIT {
            total += usize::from(admitted(&mut clients[n % 3], value).await);
        }
        assert_eq!(total, LIMIT, "{value}: the limit is exact again");
    }
    assert_eq!(fallbacks(&nodes), 0.0);
}
