use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;
use crate::algorithm::{NANOS_PER_SEC, Rate, Unit};
use crate::check::Check;
use crate::check::Counter;
use crate::clock::Clock;
use crate::cluster::Fallback;
use crate::cluster::ring::{DEFAULT_VNODES, Ring};
use crate::cluster::tests::{bind_peer, serve_peer, within_5s};
use crate::failure::FailurePolicy;
use crate::key::{KeyBuilder, shard_of};
use crate::store::memory::EngineConfig;
use crate::store::memory::tests::{check, engine};

#[tokio::test]
async fn a_lone_member_owns_every_key_and_keeps_its_counters() {
    let cluster = Cluster::join(
        MemoryStore::new(engine()),
        ClusterOptions::new("127.0.0.1:1"),
    );
    assert_eq!(
        cluster.runtime().members(),
        [Arc::<str>::from("127.0.0.1:1")]
    );
    let decisions = cluster
        .check(smallvec::smallvec![check("x"), check("x"), check("x")])
        .await
        .expect("answers");
    let allowed: Vec<bool> = decisions.iter().map(|decision| decision.allowed).collect();
    assert_eq!(allowed, [true, true, false]);
    // Handing over with nobody else to own anything keeps every counter here.
    cluster.hand_over_all().await;
    let again = cluster
        .check(smallvec::smallvec![check("x")])
        .await
        .expect("answers");
    assert!(!again[0].allowed, "the count survived");
}

#[tokio::test]
async fn fallback_policies_decide_for_an_unreachable_owner() {
    for (fallback, expected) in [
        (Fallback::Policy(FailurePolicy::Allow), true),
        (Fallback::Policy(FailurePolicy::Deny), false),
        (Fallback::Local, true),
    ] {
        let mut options = ClusterOptions::new("127.0.0.1:1");
        // A peer nobody listens on (port 9 is discard; nothing binds it here).
        options.peers = vec!["127.0.0.1:9".to_owned()];
        options.fallback = fallback;
        options.timeout = Duration::from_millis(200);
        let cooldown = u64::try_from(options.breaker_cooldown.as_nanos()).expect("small");
        let cluster = Cluster::join(MemoryStore::new(engine()), options);
        assert_eq!(cluster.runtime().members().len(), 2);
        // Keys owned by the dead peer get the policy's answer; there are plenty of those.
        let values: Vec<String> = (0..40).map(|n| format!("v{n}")).collect();
        let checks: Checks = values.iter().map(|value| check(value)).collect();
        let decisions = cluster
            .check(checks)
            .await
            .expect("answers without the owner");
        assert_eq!(decisions.len(), 40);
        let (stats, _) = cluster.runtime().stats();
        assert!(stats.fallbacks.load(Ordering::Relaxed) >= 1, "{fallback:?}");
        let ring = Ring::new(["127.0.0.1:1", "127.0.0.1:9"], DEFAULT_VNODES);
        for (value, decision) in values.iter().zip(&decisions) {
            let route = KeyBuilder::new("d").entry("k", value).route();
            if ring
                .owner(route)
                .is_some_and(|owner| &**owner == "127.0.0.1:9")
            {
                assert_eq!(decision.allowed, expected, "{fallback:?} for {value}");
                // The same stand-in answers as the Redis store's (`store::failure`).
                match fallback {
                    Fallback::Policy(FailurePolicy::Deny) => {
                        assert_eq!(decision.retry_after, Some(cooldown), "Retry-After sent");
                    }
                    Fallback::Policy(FailurePolicy::Allow) => {
                        assert!(decision.remaining > 0, "not counted as near the limit");
                    }
                    Fallback::Local => {}
                }
            } else {
                assert!(decision.allowed, "keys owned here are decided here");
            }
        }
    }
}

#[tokio::test]
async fn a_peek_reports_the_owner_and_never_falls_back_for_it() {
    let mut options = ClusterOptions::new("127.0.0.1:1");
    // A peer nobody listens on (port 9 is discard; nothing binds it here).
    options.peers = vec!["127.0.0.1:9".to_owned()];
    options.fallback = Fallback::Policy(FailurePolicy::Allow);
    options.timeout = Duration::from_millis(200);
    let cluster = Cluster::join(MemoryStore::new(engine()), options);
    assert_eq!(cluster.runtime().members().len(), 2);
    let ring = Ring::new(["127.0.0.1:1", "127.0.0.1:9"], DEFAULT_VNODES);
    let owned_by = |owner: &str| {
        (0..100)
            .map(|n| format!("v{n}"))
            .find(|value| {
                let route = KeyBuilder::new("d").entry("k", value).route();
                ring.owner(route).is_some_and(|found| &**found == owner)
            })
            .expect("a value owned by each member")
    };
    let (mine, theirs) = (owned_by("127.0.0.1:1"), owned_by("127.0.0.1:9"));
    let route = |value: &str| KeyBuilder::new("d").entry("k", value).route();

    let here = cluster.placement(route(&mine));
    assert!(here.local);
    assert_eq!(here.owner.as_deref(), Some("127.0.0.1:1"));
    assert_eq!(here.shard, Some((shard_of(route(&mine), 2), 2)));
    let there = cluster.placement(route(&theirs));
    assert!(!there.local);
    assert_eq!(there.owner.as_deref(), Some("127.0.0.1:9"));
    assert_eq!(there.shard, None, "the owner's shards are its own");

    let peek = |value: &str| {
        let mut check = check(value);
        check.cost = 0;
        check
    };
    let decisions = cluster
        .peek(smallvec::smallvec![peek(&mine)])
        .wait()
        .await
        .expect("a key owned here is reported");
    assert_eq!(decisions[0].remaining, 2);
    let error = cluster
        .peek(smallvec::smallvec![peek(&mine), peek(&theirs)])
        .wait()
        .await
        .expect_err("no fallback may stand in for the owner");
    assert_eq!(error.to_string(), "owner 127.0.0.1:9 did not answer");
    assert_eq!(error.kind(), crate::error::ErrorKind::Unavailable);
    // The same check decided normally falls back (Allow) without an error.
    cluster
        .check(smallvec::smallvec![check(&theirs)])
        .await
        .expect("the fallback answers");
}

#[tokio::test]
async fn the_local_fallback_decides_on_this_nodes_share_of_the_limit() {
    let mut options = ClusterOptions::new("127.0.0.1:1");
    options.peers = vec!["127.0.0.1:9".to_owned()];
    // Keep the dead peer on the ring for this test.
    options.down_after = u32::MAX;
    let cluster = Cluster::join(MemoryStore::new(engine()), options);
    let ring = Ring::new(["127.0.0.1:1", "127.0.0.1:9"], DEFAULT_VNODES);
    let theirs = (0..100)
        .map(|n| format!("v{n}"))
        .find(|value| {
            let route = KeyBuilder::new("d").entry("k", value).route();
            ring.owner(route)
                .is_some_and(|owner| &**owner == "127.0.0.1:9")
        })
        .expect("a value owned by the dead peer");
    let rate = Rate::fixed(5, Unit::Hour);
    let check = || Check {
        counters: smallvec::smallvec![Counter {
            key: KeyBuilder::new("d").entry("k", &theirs).key(&rate),
            rate,
        }],
        cost: 1,
        wait: None,
        charge: crate::check::Charge::Admitted,
    };
    let mut admitted = 0;
    for _ in 0..5 {
        let decisions = cluster
            .check(smallvec::smallvec![check()])
            .await
            .expect("the fallback answers");
        admitted += usize::from(decisions[0].allowed);
    }
    assert_eq!(admitted, 2, "5 / 2 members, rounded down");
}

/// An engine whose clock reads `unix_secs` now, holding at most `max_keys` keys.
fn engine_at(unix_secs: u64, max_keys: usize) -> Engine {
    Engine::spawn(
        EngineConfig {
            shards: 1,
            max_keys,
            max_waiters: 10,
            rule_key_share: 1.0,
        },
        Clock::starting_at(unix_secs * NANOS_PER_SEC),
    )
}

/// Two members serving each other, and three unused values owned by each.
struct Pair {
    a: Cluster,
    b: Cluster,
    a_values: [String; 3],
    b_values: [String; 3],
    servers: [tokio::task::JoinHandle<()>; 2],
}

impl Drop for Pair {
    fn drop(&mut self) {
        for server in &self.servers {
            server.abort();
        }
    }
}

/// [`Pair`]: `a` on `a_engine`, `b` on `b_engine`, once each has both on its ring.
async fn two_members(a_engine: Engine, b_engine: Engine) -> Pair {
    let ((a_listener, a_address), (b_listener, b_address)) = (bind_peer().await, bind_peer().await);
    let options = |me: &str, peers: Vec<String>| {
        let mut options = ClusterOptions::new(me);
        options.peers = peers;
        // Generous, so a busy machine never turns a forward into a fallback.
        options.timeout = Duration::from_secs(5);
        options
    };
    let a = Cluster::join(
        MemoryStore::new(a_engine),
        options(&a_address, vec![b_address.clone()]),
    );
    let b = Cluster::join(
        MemoryStore::new(b_engine),
        options(&b_address, vec![a_address.clone()]),
    );
    let servers = [serve_peer(&a, a_listener), serve_peer(&b, b_listener)];
    assert!(
        within_5s(|| a.runtime().members().len() == 2 && b.runtime().members().len() == 2).await,
        "the two nodes meet"
    );
    let ring = Ring::new([a_address.as_str(), b_address.as_str()], DEFAULT_VNODES);
    let owned_by = |address: &str| -> [String; 3] {
        let mut values = (0..1000).map(|n| format!("v{n}")).filter(|value| {
            let route = KeyBuilder::new("d").entry("k", value).route();
            ring.owner(route).is_some_and(|owner| **owner == *address)
        });
        std::array::from_fn(|_| values.next().expect("enough values per owner"))
    };
    Pair {
        a_values: owned_by(&a_address),
        b_values: owned_by(&b_address),
        a,
        b,
        servers,
    }
}

/// How many of `tries` single checks of `value` `cluster` admits (limit: 2 an hour).
async fn admitted(cluster: &Cluster, value: &str, tries: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..tries {
        let decisions = cluster
            .check(smallvec::smallvec![check(value)])
            .await
            .expect("answers");
        admitted += usize::from(decisions[0].allowed);
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_failing_at_an_owners_key_cap_consumes_nothing_here() {
    // B holds one key at most.
    let pair = two_members(engine(), engine_at(1_704_326_400, 1)).await;
    let ([mine, ..], [theirs, new, _]) = (&pair.a_values, &pair.b_values);
    assert_eq!(admitted(&pair.b, theirs, 1).await, 1, "B's only key");
    // One descriptor this node owns, one B owns and cannot hold: the owner's key cap.
    let failed = pair
        .a
        .check(smallvec::smallvec![check(mine), check(new)])
        .await
        .expect_err("B is full");
    assert_eq!(failed.kind(), crate::error::ErrorKind::Full, "{failed}");
    assert_eq!(
        admitted(&pair.a, mine, 3).await,
        2,
        "the failed request consumed nothing of the limit of 2 here"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_failing_here_gives_back_what_its_owner_admitted_in_the_owners_window() {
    // A holds one key at most. B's clock is a quarter hour ahead of A's, across the top of
    // an hour: a window A named by its own clock would be the hour before B's.
    let top_of_an_hour = 1_704_326_400;
    let pair = two_members(
        engine_at(top_of_an_hour - 600, 1),
        engine_at(top_of_an_hour + 300, 100),
    )
    .await;
    let ([mine, full, _], [theirs, ..]) = (&pair.a_values, &pair.b_values);
    assert_eq!(admitted(&pair.a, full, 1).await, 1, "A's only key");
    // B admits its descriptor; this node cannot hold the new key of the other one.
    let failed = pair
        .a
        .check(smallvec::smallvec![check(theirs), check(mine)])
        .await
        .expect_err("A is full");
    assert_eq!(failed.kind(), crate::error::ErrorKind::Full, "{failed}");
    assert_eq!(
        admitted(&pair.a, theirs, 3).await,
        2,
        "B took back what it admitted for the failed request"
    );
}

/// A forward to an owner that stops answering fails only at its deadline; if this node took
/// that owner off its ring meanwhile (and so already handed over what it had counted on its
/// fallback share), deciding on the share then would count where the new owner never looks.
/// The check goes to the new owner instead: the limit (2) holds across both nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_whose_silent_owner_left_the_ring_meanwhile_goes_to_the_new_owner() {
    let ((a_listener, a_address), (b_listener, b_address)) = (bind_peer().await, bind_peer().await);
    // D accepts connections and never answers (a hung process): A's forward to it waits.
    let (_d_listener, d_address) = bind_peer().await;
    let options = |me: &str, peers: Vec<String>| {
        let mut options = ClusterOptions::new(me);
        options.peers = peers;
        options.timeout = Duration::from_millis(1500);
        options
    };
    let a = Cluster::join(
        MemoryStore::new(engine()),
        options(&a_address, vec![b_address.clone(), d_address.clone()]),
    );
    let b = Cluster::join(
        MemoryStore::new(engine()),
        options(&b_address, vec![a_address.clone()]),
    );
    let servers = [serve_peer(&a, a_listener), serve_peer(&b, b_listener)];
    assert!(
        within_5s(|| a.runtime().members().len() == 3 && b.runtime().members().len() >= 2).await,
        "A sees all three, B at least A"
    );
    // A value D owns on A's ring and B owns once D is gone.
    let three = Ring::new(
        [a_address.as_str(), b_address.as_str(), d_address.as_str()],
        DEFAULT_VNODES,
    );
    let two = Ring::new([a_address.as_str(), b_address.as_str()], DEFAULT_VNODES);
    let value = (0..1000)
        .map(|n| format!("v{n}"))
        .find(|value| {
            let route = KeyBuilder::new("d").entry("k", value).route();
            three
                .owner(route)
                .is_some_and(|owner| **owner == *d_address)
                && two.owner(route).is_some_and(|owner| **owner == *b_address)
        })
        .expect("a value moving from D to B");
    // The check is routed to D (polled once: routed and submitted), then D leaves A's ring
    // while the forward waits.
    let mut pending = std::pin::pin!(a.check(smallvec::smallvec![check(&value)]));
    std::future::poll_fn(|cx| {
        assert!(pending.as_mut().poll(cx).is_pending(), "waits for D");
        std::task::Poll::Ready(())
    })
    .await;
    a.runtime().left(&d_address);
    assert_eq!(a.runtime().members().len(), 2, "D is off A's ring");
    let decisions = pending.await.expect("answered");
    assert!(decisions[0].allowed, "the first hit is admitted");
    // B counted it: one more is admitted, then none, from either node.
    assert_eq!(admitted(&b, &value, 2).await, 1, "B saw the first hit");
    assert_eq!(admitted(&a, &value, 2).await, 0, "A asks B");
    let (stats, _) = a.runtime().stats();
    assert_eq!(stats.rerouted.load(Ordering::Relaxed), 1, "sent to B");
    assert_eq!(stats.fallbacks.load(Ordering::Relaxed), 0, "no fallback");
    for server in servers {
        server.abort();
    }
}

/// A rolling upgrade to the release with `unit_multiplier`: this node decides checks sent
/// as version 1 (by a node of the release before) and as version 2 (a check naming a
/// 10-second window, counted over 10 seconds, not one), and refuses versions it does not
/// know, as a version 1 node refuses version 2.
#[tokio::test(start_paused = true)]
async fn checks_of_both_protocol_versions_are_decided_and_a_multiplier_counts_its_window() {
    use crate::check::Charge;
    use crate::cluster::convert;
    use crate::cluster::proto::v1 as wire;
    use crate::cluster::proto::v1::peer_server::Peer;
    let cluster = Cluster::join(
        MemoryStore::new(engine_at(1_800_000_000, 1_000)),
        ClusterOptions::new("127.0.0.1:1"),
    );
    let service = cluster.unwrapped_peer_service(None, None);
    let ask = |version: u32, rate: Rate, value: &str| {
        let check = Check {
            counters: smallvec::smallvec![Counter {
                key: KeyBuilder::new("d").entry("k", value).key(&rate),
                rate,
            }],
            cost: 1,
            wait: None,
            charge: Charge::Admitted,
        };
        tonic::Request::new(wire::CheckBatch {
            version,
            sender: "127.0.0.1:2".to_owned(),
            groups: vec![wire::Group {
                checks: vec![convert::check_to_wire(&check)],
            }],
        })
    };
    let allowed = |reply: Result<tonic::Response<wire::CheckBatchReply>, tonic::Status>| {
        reply.expect("decided").into_inner().groups[0].decisions[0].allowed
    };
    let per_second = Rate::fixed(1, Unit::Second);
    let per_ten_seconds = per_second.every(10).expect("10 s");
    assert_eq!(convert::version_for([&per_second]), 1);
    assert_eq!(convert::version_for([&per_ten_seconds]), 2);
    for (value, rate) in [("old", per_second), ("new", per_ten_seconds)] {
        let version = convert::version_for([&rate]);
        assert!(allowed(service.check(ask(version, rate, value)).await));
        assert!(!allowed(service.check(ask(version, rate, value)).await));
    }
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(
        allowed(service.check(ask(1, per_second, "old")).await),
        "a new second"
    );
    assert!(
        !allowed(service.check(ask(2, per_ten_seconds, "new")).await),
        "the same 10-second window"
    );
    for version in [0, 3] {
        let refused = service
            .check(ask(version, per_second, "other"))
            .await
            .expect_err("an unknown version");
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(refused.message().contains("speaks 1 to 2"), "{refused:?}");
    }
}

/// A peer's batch refused as malformed (its second group names counters of two routes)
/// consumed nothing, its valid first group included: a request that fails has no effect.
#[tokio::test(start_paused = true)]
async fn a_malformed_batch_consumes_nothing_of_its_valid_groups() {
    use crate::check::Charge;
    use crate::cluster::convert;
    use crate::cluster::proto::v1 as wire;
    use crate::cluster::proto::v1::peer_server::Peer;
    let cluster = Cluster::join(
        MemoryStore::new(engine_at(1_800_000_000, 1_000)),
        ClusterOptions::new("127.0.0.1:1"),
    );
    let service = cluster.unwrapped_peer_service(None, None);
    let rate = Rate::fixed(1, Unit::Hour);
    let counter = |value: &str| Counter {
        key: KeyBuilder::new("d").entry("k", value).key(&rate),
        rate,
    };
    let group = |counters: Vec<Counter>| wire::Group {
        checks: vec![convert::check_to_wire(&Check {
            counters: counters.into_iter().collect(),
            cost: 1,
            wait: None,
            charge: Charge::Admitted,
        })],
    };
    let batch = |groups: Vec<wire::Group>| {
        tonic::Request::new(wire::CheckBatch {
            version: convert::OLDEST,
            sender: "127.0.0.1:2".to_owned(),
            groups,
        })
    };
    let refused = service
        .check(batch(vec![
            group(vec![counter("a")]),
            group(vec![counter("a"), counter("b")]),
        ]))
        .await
        .expect_err("two routes in one check");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    let reply = service
        .check(batch(vec![group(vec![counter("a")])]))
        .await
        .expect("decided")
        .into_inner();
    assert!(
        reply.groups[0].decisions[0].allowed,
        "the refused batch took nothing from a's limit of 1"
    );
}
