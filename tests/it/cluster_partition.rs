//! A network partition in cluster mode, with three real nodes A, B and C, each in its own
//! Linux network namespace ([`crate::support::Netns`]): C is cut off the peer network while every
//! node keeps answering the test over its own client link, then the link heals.
//!
//! What a user notices, and this test asserts: no client ever gets an error; the failure
//! detector (its defaults: a ping every 500 ms, a peer down after 3 missed, up after 2
//! answered) takes the unreachable node off each side's ring within 3 s; each side then
//! decides on its own ring, so one key admits at most 2 x limit + 2 x floor(limit / 3)
//! across the cut (each side the limit per window, plus the fallback shares before
//! detection); the ring is whole again within 5 s of the heal; and the two sides' counters
//! merge on the key's owner, which admits exactly what is left of the limit.
//!
//! Timings are measured and printed (`cargo test --test it cluster_partition:: -- --nocapture`).
//! Needs root (CAP_NET_ADMIN) and `ip` (iproute2, installed when missing): without root
//! the test fails saying so; it is never skipped.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{
    DAY, LOAD_PHASES, Load, Netns, Ratekeeper, Tally, TempDir, assert_all_within,
    away_from_a_window_end, cluster_diagnosis, cluster_members as members, edge_decide as decide,
    edge_explain as explain, edge_key_where as key_where, edge_owner_of as owner_of, eventually,
    first_times, grpc_clients as clients, metric_total as sum, write_config,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// The limit of every key: 100 per day.
const LIMIT: u64 = 100;
const LIMITS: &str = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: day, requests_per_unit: 100}\n";
const NAMES: [&str; 3] = ["A", "B", "C"];
/// The node that is cut off.
const C: usize = 2;
/// Forward deadline: half the default, so forwards into the cut give up sooner; still far
/// above what a forward takes at this load, so the counts below stay exact.
const PEER_TIMEOUT: &str = "500ms";
/// How soon after the cut each side must have dropped the other from its ring.
const DETECT_WITHIN: Duration = Duration::from_secs(3);
/// How soon after the heal the ring must be whole again.
const HEAL_WITHIN: Duration = Duration::from_secs(5);
/// How long a poll watches before giving up (longer than the bounds above, so a slow
/// detector's time is measured and shown rather than just "not within").
const OBSERVE: Duration = Duration::from_secs(15);
/// How long the nodes get to agree at the start.
const WAIT: Duration = Duration::from_secs(20);
/// The pause between two requests of one load task: 50 a second per node and key, and
/// 200 for the hot key, so each side of the cut runs into its limits within the cut.
const PACE: Duration = Duration::from_millis(20);
const HOT_PACE: Duration = Duration::from_millis(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_node_is_dropped_then_rejoins_and_the_limit_holds_within_the_bound() {
    let net = Netns::new(3);
    away_from_a_window_end(DAY, Duration::from_secs(120)).await;
    let dir = TempDir::new("cluster-partition");
    write_config(dir.path(), "edge.yaml", LIMITS);
    // Declared after `net`, so the processes stop before their namespaces go.
    let nodes = start(&net, dir.path());
    let full: Vec<String> = (0..3).map(|node| net.peer(node)).collect();
    let majority: Vec<String> = full[..2].to_vec();

    // 1. Everyone sees everyone, and forwards over the peer network work.
    for (node, name) in nodes.iter().zip(NAMES) {
        let agreed = eventually(WAIT, || members(node) == Some(3.0));
        assert!(agreed, "{name} never saw 3 members:\n{}", node.stderr());
    }
    let mut clients = clients(&nodes).await;
    let background: Vec<String> = (0..3)
        .map(|owner| key_where("bg", |value| owner_of(&full, value) == owner))
        .collect();
    for value in &background {
        for (client, name) in clients.iter_mut().zip(NAMES) {
            assert_eq!(decide(client, value).await, Code::Ok, "{value} on {name}");
        }
    }
    assert_eq!(
        sum(&nodes, "ratekeeper_cluster_fallbacks_total"),
        0.0,
        "no fallback while the peer network is whole"
    );
    assert_eq!(
        sum(&nodes, "ratekeeper_peer_forwarded_total"),
        6.0,
        "each key was forwarded by the two nodes that do not own it"
    );

    // 2. Requests flow to every node, all along; then C is cut off.
    let mut load = Load::default();
    for value in &background {
        load.spawn(&clients, &NAMES, value, PACE, false);
    }
    let flowing = eventually(WAIT, || (0..3).all(|node| load.tally.answered(node, 0) > 0));
    assert!(flowing, "every node answers the load before the cut");
    let fallbacks_before: Vec<f64> = nodes
        .iter()
        .map(|node| crate::support::metric(node.http_addr(), "ratekeeper_cluster_fallbacks_total"))
        .collect();
    net.cut(C);
    let cut = Instant::now();
    load.set_phase(1);
    // A key hammered on all three nodes from the cut on: its over-admission is measured.
    let hot = key_where("hot", |value| owner_of(&full, value) == C);
    load.spawn(&clients, &NAMES, &hot, HOT_PACE, true);

    // 3. The cut stops peer traffic but not client traffic; each side drops the other.
    let expected = [2.0, 2.0, 1.0];
    // Probes 0-2: each node shows its side's members; 3: C's forwards fail (it falls back).
    let mut seen = first_times(cut, OBSERVE, 4, |probe| match probe {
        3 => {
            crate::support::metric(nodes[C].http_addr(), "ratekeeper_cluster_fallbacks_total")
                > fallbacks_before[C]
        }
        node => members(&nodes[node]) == Some(expected[node]),
    })
    .await;
    let forwards_failed = seen.pop().flatten();
    let detected = seen;
    let answered_by_c = load.tally.answered(C, 1);
    eprintln!(
        "cut: C's forwards failed after {forwards_failed:?} (C fallbacks {} -> {}); C answered \
         {answered_by_c} load requests over its client link meanwhile",
        fallbacks_before[C],
        crate::support::metric(nodes[C].http_addr(), "ratekeeper_cluster_fallbacks_total"),
    );
    assert!(
        forwards_failed.is_some(),
        "the cut did not stop C's peer traffic: its fallbacks did not rise"
    );
    assert!(
        answered_by_c > 0,
        "C answered no client request during the cut"
    );
    load.tally.failures.assert_none();
    for (node, name) in NAMES.iter().enumerate() {
        eprintln!(
            "detection: {name} showed {} members after {:?}",
            expected[node], detected[node]
        );
    }
    let what = "show its side's ratekeeper_cluster_members (A, B: 2; C: 1) after the cut";
    assert_all_within(&detected, DETECT_WITHIN, what, &nodes, &NAMES);

    // 4. Each side decides on its own ring: a fresh key is admitted on both sides, each
    //    counting on its own owner (B for A's side, C itself).
    let value = key_where("k", |value| {
        owner_of(&full, value) == C && owner_of(&majority, value) == 1
    });
    for node in [0, C] {
        for n in 0..30 {
            let code = decide(&mut clients[node], &value).await;
            assert_eq!(code, Code::Ok, "request {n} for {value} on {}", NAMES[node]);
        }
    }
    for (node, owner) in [(0, &majority[1]), (C, &full[C])] {
        // The owner counts hits it lent A with a lease (the key is hot) until A gives back
        // what it did not spend, within the lease's TTL.
        eventually(OBSERVE, || explain(&nodes[node], &value).0 == Some(30));
        let (used, answer) = explain(&nodes[node], &value);
        assert_eq!(used, Some(30), "{} side: {answer}", NAMES[node]);
        assert_eq!(
            answer["descriptors"][0]["owner"],
            owner.as_str(),
            "{answer}"
        );
    }

    // 5. Heal: the ring is whole again.
    net.heal(C);
    let healed = Instant::now();
    eprintln!("the cut lasted {:?}", healed - cut);
    load.set_phase(2);
    let rejoined = first_times(healed, OBSERVE, 3, |node| {
        members(&nodes[node]) == Some(3.0)
    })
    .await;
    let tally = load.stop().await;
    for (node, name) in NAMES.iter().enumerate() {
        eprintln!("heal: {name} showed 3 members after {:?}", rejoined[node]);
    }
    report(&tally);
    tally.failures.assert_none();
    let (majority_side, c_side) = (tally.admitted(0) + tally.admitted(1), tally.admitted(C));
    let bound = 2 * LIMIT + 2 * (LIMIT / 3);
    eprintln!(
        "hot key {hot} (owned by C): admitted {majority_side} on the A+B side, {c_side} on C's, \
         {} in all (bound {bound})",
        majority_side + c_side
    );
    assert!(
        majority_side + c_side <= bound,
        "the cut over-admitted {hot}: {majority_side} + {c_side} > {bound}"
    );
    let what = "show 3 members after the heal";
    assert_all_within(&rejoined, HEAL_WITHIN, what, &nodes, &NAMES);

    // 6. The two sides' counts merge on the owner, which admits what is left, once.
    let started = Instant::now();
    let converged = eventually(OBSERVE, || {
        nodes.iter().all(|node| {
            let (used, answer) = explain(node, &value);
            used == Some(60) && answer["descriptors"][0]["owner"] == full[C].as_str()
        })
    });
    let answers: Vec<String> = nodes
        .iter()
        .zip(NAMES)
        .map(|(node, name)| format!("{name}: {}", explain(node, &value).1))
        .collect();
    eprintln!(
        "counters converged: {converged} after {:?}\n{}",
        started.elapsed(),
        answers.join("\n")
    );
    assert!(
        converged,
        "every node should report C's counter for {value} with used 60 (30 per side):\n{}\n{}",
        answers.join("\n"),
        cluster_diagnosis(&nodes, &NAMES)
    );
    let fallbacks = sum(&nodes, "ratekeeper_cluster_fallbacks_total");
    let mut admitted = 0;
    for n in 0..60 {
        admitted += usize::from(decide(&mut clients[n % 3], &value).await == Code::Ok);
    }
    assert_eq!(
        sum(&nodes, "ratekeeper_cluster_fallbacks_total"),
        fallbacks,
        "no fallback once healed (it would make the count below inexact)"
    );
    assert_eq!(admitted, 40, "what is left of the limit after the cut's 60");
    let (used, answer) = explain(&nodes[0], &value);
    assert_eq!(used, Some(LIMIT), "{answer}");
}

/// Starts one node per namespace, each listing the others as peers.
fn start(net: &Netns, config: &Path) -> Vec<Ratekeeper> {
    (0..3)
        .map(|node| {
            let others: Vec<String> = (0..3)
                .filter(|other| *other != node)
                .map(|other| net.peer(other))
                .collect();
            let others = others.join(",");
            let args = ["--peers", &others, "--peer-timeout", PEER_TIMEOUT];
            net.start_node(node, NAMES[node], config, &args)
        })
        .collect()
}

/// Phases of the load: 0 before the cut, 1 during it, 2 after the heal.
/// Prints what the load saw on each node.
fn report(tally: &Tally) {
    for (node, name) in NAMES.iter().enumerate() {
        let answered: Vec<u64> = (0..LOAD_PHASES)
            .map(|phase| tally.answered(node, phase))
            .collect();
        eprintln!(
            "load on {name}: answered {answered:?} (before, during, after the cut); hot key \
             admitted {:?}",
            tally.admitted_by_phase(node)
        );
    }
}
