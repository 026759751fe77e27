//! DNS discovery in cluster mode, with three real nodes A, B and C, each in its own Linux
//! network namespace ([`crate::support::Netns`]). No node is given `--peers`: they find each other
//! only through `--peer-dns rk-peers:8091`, a name that resolves in every namespace to all
//! three peer addresses, as a Kubernetes headless Service's name does.
//!
//! What a user notices, and this test asserts: the nodes form one ring from the DNS answer
//! at start; C killed with SIGKILL, while the name still resolves to its address (as a
//! headless Service's does until the endpoint is removed), is taken off A's and B's rings
//! by the failure detector within 3 s, as in static mode (`tests/it/cluster.rs`), and every
//! request sent through A and B meanwhile is answered; C restarted on the same address is
//! back on every ring within 5 s; and the key's counter moves back to C, which decides the
//! key's requests again, without a fallback.
//!
//! Timings are measured and printed (`cargo test --test it cluster_dns:: -- --nocapture`).
//! Needs root (CAP_NET_ADMIN, and writing `/etc/netns`) and `ip` (iproute2, installed when
//! missing): without root the test fails saying so; it is never skipped.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{
    DAY, Load, NODE_PEER_PORT, Netns, Ratekeeper, TempDir, assert_all_within,
    away_from_a_window_end, cluster_diagnosis, cluster_members as members, edge_decide as decide,
    edge_explain as explain, edge_key_where as key_where, edge_owner_of as owner_of, eventually,
    eventually_some, first_times, grpc_clients as clients, metric_total as sum, write_config,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// 10 000 per day: more than the test sends, also on one node's fallback share (a third),
/// so every request must be admitted.
const LIMITS: &str = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 10000}\n";
const NAMES: [&str; 3] = ["A", "B", "C"];
/// The node that is killed and restarted.
const C: usize = 2;
/// The name every node resolves for its peers.
const PEER_NAME: &str = "rk-peers";
/// Requests for the key through A and B before the kill, one at a time (so no lease: C
/// counts each of them as it goes).
const BEFORE: u64 = 10;
/// Requests for the key through A, B and C in turn once C is back.
const AFTER: u64 = 30;
/// How soon after the kill A and B must have dropped C from their rings.
const DETECT_WITHIN: Duration = Duration::from_secs(3);
/// How soon after the restart the ring must be whole again.
const REJOIN_WITHIN: Duration = Duration::from_secs(5);
/// How long a poll watches before giving up (longer than the bounds above, so a slow
/// detector's time is measured and shown rather than just "not within").
const OBSERVE: Duration = Duration::from_secs(10);
/// How long the nodes get to agree at the start.
const WAIT: Duration = Duration::from_secs(15);
/// The pause between two requests of one load task (about 100 a second per node).
const PACE: Duration = Duration::from_millis(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_found_through_dns_is_dropped_within_3s_then_rejoins_and_owns_its_keys() {
    let mut net = Netns::new(3);
    net.resolve_to_all(PEER_NAME);
    away_from_a_window_end(DAY, Duration::from_secs(60)).await;
    let dir = TempDir::new("cluster-dns");
    write_config(dir.path(), "edge.yaml", LIMITS);
    let full: Vec<String> = (0..3).map(|node| net.peer(node)).collect();
    let survivors: Vec<String> = full[..2].to_vec();

    // 1. All three start at once (as a Deployment's pods do) and form one ring from what
    //    the name resolves to.
    // Declared after `net`, so the processes stop before their namespaces go.
    let (shared, config) = (&net, dir.path());
    let mut nodes: Vec<Ratekeeper> = std::thread::scope(|scope| {
        let starting: Vec<_> = (0..3)
            .map(|node| scope.spawn(move || start(shared, node, config)))
            .collect();
        starting
            .into_iter()
            .map(|started| {
                started
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let started = Instant::now();
    for (node, name) in nodes.iter().zip(NAMES) {
        let agreed = eventually(WAIT, || members(node) == Some(3.0));
        assert!(agreed, "{name} never saw 3 members:\n{}", node.stderr());
    }
    eprintln!(
        "start: all three showed 3 members after {:?}",
        started.elapsed()
    );
    for (node, name) in nodes.iter().zip(NAMES) {
        let stderr = node.stderr();
        assert!(
            !stderr.contains("peer discovery failed"),
            "{name} could not resolve {PEER_NAME}:\n{stderr}"
        );
    }

    // 2. A key owned by C, sent through A and B: forwarded to C, which counts each hit.
    let value = key_where("k", |value| owner_of(&full, value) == C);
    let heir = owner_of(&survivors, &value);
    eprintln!("{value} is owned by C, and by {} without C", NAMES[heir]);
    let mut clients = clients(&nodes).await;
    for n in 0..BEFORE {
        let node = usize::from(n % 2 == 1);
        let code = decide(&mut clients[node], &value).await;
        assert_eq!(code, Code::Ok, "request {n} for {value} on {}", NAMES[node]);
    }
    let (used, answer) = explain(&nodes[C], &value);
    assert_eq!(used, Some(BEFORE), "C counted every hit: {answer}");
    assert_eq!(
        sum(&nodes, "ratekeeper_cluster_fallbacks_total"),
        0.0,
        "no fallback while all three are up"
    );

    // 3. Requests for the key go on through A and B all along; C is killed.
    let mut load = Load::default();
    load.spawn(&clients[..2], &NAMES, &value, PACE, true);
    let flowing = eventually(WAIT, || (0..2).all(|node| load.tally.answered(node, 0) > 0));
    assert!(flowing, "A and B answer the load before the kill");
    let admitted_before_kill = load.tally.admitted(0) + load.tally.admitted(1);
    nodes[C].process().kill();
    let killed = Instant::now();

    // 4. A and B drop C within 3 s (its address still resolves).
    let detected = first_times(killed, OBSERVE, 2, |node| {
        members(&nodes[node]) == Some(2.0)
    })
    .await;
    for (node, name) in NAMES[..2].iter().enumerate() {
        eprintln!("kill: {name} showed 2 members after {:?}", detected[node]);
    }
    load.tally.failures.assert_none();
    let what = "show ratekeeper_cluster_members 2 after the kill";
    assert_all_within(&detected, DETECT_WITHIN, what, &nodes, &NAMES[..2]);
    for (node, name) in NAMES[..2].iter().enumerate() {
        let up = crate::support::metric_sample(
            nodes[node].http_addr(),
            &format!(r#"ratekeeper_peer_up{{peer="{}"}}"#, full[C]),
        );
        assert_eq!(
            up,
            Some(0.0),
            "{name} reports C down\n{}",
            cluster_diagnosis(&nodes, &NAMES)
        );
        let stderr = nodes[node].stderr();
        assert!(stderr.contains("peer down"), "{name}:\n{stderr}");
    }

    // 5. C comes back on the same address, with the same flags: whole again within 5 s.
    let restarted = Instant::now();
    nodes[C] = start(&net, C, dir.path());
    let rejoined = first_times(restarted, OBSERVE, 3, |node| {
        members(&nodes[node]) == Some(3.0)
    })
    .await;
    let during = load.stop().await;
    let admitted = during.admitted(0) + during.admitted(1);
    for (node, name) in NAMES.iter().enumerate() {
        eprintln!(
            "restart: {name} showed 3 members after {:?}",
            rejoined[node]
        );
    }
    eprintln!(
        "load through A and B from before the kill until C was back: {} and {} answered, \
         {} admitted",
        during.answered(0, 0),
        during.answered(1, 0),
        admitted
    );
    during.failures.assert_none();
    assert_eq!(
        admitted,
        during.answered(0, 0) + during.answered(1, 0),
        "every request is admitted (the limit, even a fallback's share of it, is far off)"
    );
    let what = "show 3 members after the restart";
    assert_all_within(&rejoined, REJOIN_WITHIN, what, &nodes, &NAMES);

    // 6. The key's counter moves back to C, which decides its requests from then on.
    let handed = eventually_some(OBSERVE, || {
        let received = crate::support::metric(
            nodes[C].http_addr(),
            "ratekeeper_cluster_handoff_received_total",
        );
        (received > 0.0).then(|| restarted.elapsed())
    });
    eprintln!("handoff: C received counters after {handed:?} (from the restart)");
    assert!(
        handed.is_some(),
        "the counters moved back to C\n{}",
        cluster_diagnosis(&nodes, &NAMES)
    );
    // Leases lent during the load are given back within their TTL: C's count settles.
    let settled = settled_count(&nodes, &value);
    eprintln!(
        "C counts {settled:?} hits of {value} once settled ({} admitted since the kill; the \
         {} before it died with C)",
        admitted - admitted_before_kill,
        BEFORE + admitted_before_kill
    );
    let Some(settled) = settled else {
        panic!(
            "C's count of {value} never settled\n{}",
            cluster_diagnosis(&nodes, &NAMES)
        );
    };
    // Not exactly equal in general: hits a survivor counts for a key it no longer owns,
    // while the two survivors' rings disagree (each puts C back on its own detector's
    // schedule), stay there until its next rebalance.
    let since_kill = admitted - admitted_before_kill;
    assert!(
        settled > 0 && settled <= since_kill,
        "C carries on the survivors' count, counting no hit twice: {settled} of the \
         {since_kill} admitted since the kill"
    );
    clients[C] = crate::support::grpc_client(&nodes[C]).await;
    let fallbacks = sum(&nodes, "ratekeeper_cluster_fallbacks_total");
    for n in 0..AFTER {
        let node = usize::try_from(n % 3).unwrap_or_default();
        let code = decide(&mut clients[node], &value).await;
        assert_eq!(code, Code::Ok, "request {n} for {value} on {}", NAMES[node]);
    }
    assert_eq!(
        sum(&nodes, "ratekeeper_cluster_fallbacks_total"),
        fallbacks,
        "no fallback once C is back\n{}",
        cluster_diagnosis(&nodes, &NAMES)
    );
    let counted = eventually(OBSERVE, || {
        explain(&nodes[C], &value).0 == Some(settled + AFTER)
    });
    let answers: Vec<String> = nodes
        .iter()
        .zip(NAMES)
        .map(|(node, name)| format!("{name}: {}", explain(node, &value).1))
        .collect();
    assert!(
        counted,
        "C counts each of the {AFTER} requests once, on top of its {settled}:\n{}",
        answers.join("\n")
    );
    for (node, name) in nodes.iter().zip(NAMES) {
        let (_, answer) = explain(node, &value);
        assert_eq!(
            answer["descriptors"][0]["owner"],
            full[C].as_str(),
            "{name} sends {value} to C: {answer}"
        );
    }
}

/// Starts node `node` in its namespace, finding its peers only through DNS.
fn start(net: &Netns, node: usize, config: &Path) -> Ratekeeper {
    let dns = format!("{PEER_NAME}:{NODE_PEER_PORT}");
    net.start_node(node, NAMES[node], config, &["--peer-dns", &dns])
}

/// C's count of `value` once no node holds a lease any more (their unspent hits are back):
/// the same on two polls in a row, the later at least 100 ms after the earlier.
fn settled_count(nodes: &[Ratekeeper], value: &str) -> Option<u64> {
    let mut last: Option<(u64, Instant)> = None;
    eventually_some(OBSERVE, || {
        if sum(nodes, "ratekeeper_cluster_leases ") > 0.0 {
            last = None;
            return None;
        }
        let used = explain(&nodes[C], value).0?;
        match last {
            Some((earlier, at))
                if earlier == used && at.elapsed() >= Duration::from_millis(100) =>
            {
                Some(used)
            }
            Some((earlier, _)) if earlier == used => None,
            _ => {
                last = Some((used, Instant::now()));
                None
            }
        }
    })
}
