//! The store contract: what every `Store` must do, run against each of them — the in-memory
//! store, a 3-node cluster of in-process nodes (real peer gRPC over loopback), a real
//! redis-server and a real 3-master Redis Cluster.
//!
//! 1. **Answers.** A seeded random sequence of requests (every algorithm, several limits on
//!    one descriptor, several descriptors per call, costs from 0 to 2^64 - 1, each check
//!    charged as by default, counting a rejection (`--count-rejected-hits`) or as a refund
//!    (Envoy's `is_negative_hits`), clock steps within and across windows) is answered by the store exactly as by the in-memory store
//!    on the same clock: the in-memory store is the reference (its algorithms are checked
//!    against a model in `crates/core/src/algorithm/tests/model.rs`), so every store counts alike.
//! 2. **All or nothing.** A descriptor whose second limit is exhausted consumes nothing on
//!    its first; a cost above every capacity consumes nothing.
//! 3. **Peek** reads without consuming and agrees with the next check. **Charges:** a refund
//!    gives back, is allowed, and never lifts a counter above its capacity (nor below zero
//!    used); a counted rejection takes what is left.
//! 4. **Reset** forgets a descriptor's counters wherever they live.
//! 5. **The failure policy** (`failure`): with what it counts on gone (Redis down, a
//!    key's owner unreachable), `deny` answers over the limit with the store's cooldown as
//!    the retry, `allow` admits with the whole capacity left, the same in every store.
//!
//! A new store adds one `Subject` here (see ARCHITECTURE.md, "Where a new kind of thing
//! goes").

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::support::{RedisCluster, RedisServer, TempDir};
use ratekeeper::algorithm::{Algorithm, Rate, Unit};
use ratekeeper::check::{Charge, Check, Checks, Counter, Decisions};
use ratekeeper::clock::Clock;
use ratekeeper::cluster::{ClusterOptions, Fallback};
use ratekeeper::failure::FailurePolicy;
use ratekeeper::key::KeyBuilder;
use ratekeeper::store::Store;
use ratekeeper::store::cluster::Cluster;
use ratekeeper::store::memory::{Engine, EngineConfig, MemoryStore};
use ratekeeper::store::redis::{RedisOptions, RedisStore, Target};

/// A manual clock of its own (tests run in parallel), starting at `start`.
fn clock_at(start: u64) -> (Clock, &'static AtomicU64) {
    let time: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(start)));
    (Clock::manual(time), time)
}

/// 2027-01-15T08:00:00.123456789Z: inside every window, none about to end.
const START: u64 = 1_800_000_000_123_456_789;

fn memory(clock: Clock) -> MemoryStore {
    MemoryStore::new(Engine::spawn(
        EngineConfig {
            shards: 2,
            max_keys: 100_000,
            max_waiters: 10,
            rule_key_share: 1.0,
        },
        clock,
    ))
}

fn redis_options(url: &str) -> RedisOptions {
    RedisOptions {
        timeout: Duration::from_secs(5),
        // The suite's clock is a test clock, but Redis expires keys in real time: the
        // longest margin keeps a key a stall on a busy machine could outlast.
        ttl_margin: Duration::from_secs(3600),
        ..RedisOptions::new(Target::parse(url).expect("a redis url"))
    }
}

/// `n` cluster nodes in this process, each serving the peer protocol on a loopback port,
/// every one seeing all `n` before this returns.
struct LocalCluster {
    nodes: Vec<Cluster>,
    servers: Vec<tokio::task::JoinHandle<()>>,
}

impl LocalCluster {
    async fn start(n: usize, clock: Clock) -> LocalCluster {
        let mut listeners = Vec::new();
        for _ in 0..n {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("binds");
            let address = listener.local_addr().expect("bound").to_string();
            listeners.push((listener, address));
        }
        let addresses: Vec<String> = listeners.iter().map(|(_, a)| a.clone()).collect();
        let mut nodes = Vec::new();
        let mut servers = Vec::new();
        for (listener, address) in listeners {
            let mut options = ClusterOptions::new(&address);
            options.peers = addresses
                .iter()
                .filter(|a| **a != address)
                .cloned()
                .collect();
            options.timeout = Duration::from_secs(5);
            let node = Cluster::join(memory(clock), options);
            let service = node.peer_service(None, None);
            servers.push(tokio::spawn(async move {
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming(incoming)
                    .await;
            }));
            nodes.push(node);
        }
        for _ in 0..500 {
            if nodes.iter().all(|node| node.runtime().members().len() == n) {
                return LocalCluster { nodes, servers };
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the {n} in-process nodes did not meet within 5 s");
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for server in &self.servers {
            server.abort();
        }
    }
}

/// One descriptor (`user` in `domain`) with a counter per rate (the other store tests use
/// it too).
pub(crate) fn check(domain: &str, user: &str, rates: &[Rate], cost: u64) -> Check {
    let mut key = KeyBuilder::new(domain);
    key.entry("user", user);
    Check {
        counters: rates
            .iter()
            .map(|rate| Counter {
                key: key.key(rate),
                rate: *rate,
            })
            .collect(),
        cost,
        wait: None,
        charge: Charge::Admitted,
    }
}

/// [`check`] charged as `charge` says.
fn charged(domain: &str, user: &str, rates: &[Rate], cost: u64, charge: Charge) -> Check {
    Check {
        charge,
        ..check(domain, user, rates, cost)
    }
}

async fn decide(store: &dyn Store, checks: impl IntoIterator<Item = Check>) -> Decisions {
    let checks: Checks = checks.into_iter().collect();
    store.check(checks).wait().await.expect("the store answers")
}

/// A tiny deterministic generator (xorshift64*), so a failing step can be replayed.
struct Steps(u64);

impl Steps {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % below.max(1)
    }
}

/// Part 1: `subjects` answer the seeded sequence exactly as `reference` does, all on the
/// clock `time` drives. Each call goes to the subjects in turn (for a cluster: its nodes
/// in turn, so requests arrive at owners and at non-owners alike).
async fn answers_like_the_reference(
    name: &str,
    reference: &dyn Store,
    subjects: &[&dyn Store],
    time: &AtomicU64,
) {
    let bucket = |algorithm, per_unit, unit, burst| Rate::new(algorithm, per_unit, unit, burst);
    let descriptors: Vec<Vec<Rate>> = vec![
        vec![Rate::fixed(5, Unit::Second)],
        vec![Rate::fixed(3, Unit::Minute)],
        vec![Rate::fixed(0, Unit::Second)],
        vec![bucket(Algorithm::SlidingWindow, 7, Unit::Second, None)],
        vec![bucket(Algorithm::SlidingWindow, 4, Unit::Minute, None)],
        vec![bucket(Algorithm::TokenBucket, 5, Unit::Second, Some(3))],
        vec![bucket(Algorithm::TokenBucket, 10, Unit::Minute, None)],
        vec![bucket(Algorithm::Gcra, 4, Unit::Second, Some(2))],
        vec![bucket(Algorithm::Gcra, 3, Unit::Minute, None)],
        vec![
            Rate::fixed(6, Unit::Second),
            bucket(Algorithm::SlidingWindow, 20, Unit::Minute, None),
            bucket(Algorithm::Gcra, 3, Unit::Second, Some(2)),
        ],
        // `unit_multiplier`: windows and refill periods of several units.
        vec![every(Rate::fixed(4, Unit::Second), 10)],
        vec![every(
            bucket(Algorithm::SlidingWindow, 5, Unit::Second, None),
            90,
        )],
        vec![every(
            bucket(Algorithm::TokenBucket, 6, Unit::Second, Some(2)),
            10,
        )],
        vec![every(bucket(Algorithm::Gcra, 3, Unit::Minute, Some(2)), 5)],
        // Two limits that differ only in their windows' lengths.
        vec![
            Rate::fixed(3, Unit::Second),
            every(Rate::fixed(5, Unit::Second), 10),
        ],
    ];
    let costs = [
        0,
        1,
        1,
        1,
        1,
        2,
        3,
        9,
        u64::from(u32::MAX),
        1 << 32,
        (1 << 53) + 1,
        u64::MAX,
    ];
    let mut steps = Steps(0x5eed_1234_abcd_ef01);
    let mut denied = 0;
    for step in 0..1500 {
        let advance = match steps.next(20) {
            0..=3 => 0,
            4 => 61_000_000_000,
            _ => steps.next(300_000_000),
        };
        time.fetch_add(advance, Ordering::SeqCst);
        let mut checks = Checks::new();
        // Distinct descriptors per call: the same key twice in one call may be lent for
        // (cluster leases), which admits the same hits but reports what the loan left.
        let mut used = Vec::new();
        for _ in 0..=steps.next(2) {
            let which = steps.next(descriptors.len() as u64) as usize;
            let user = steps.next(3).to_string();
            if used.contains(&(which, user.clone())) {
                continue;
            }
            used.push((which, user.clone()));
            let cost = costs[steps.next(costs.len() as u64) as usize];
            let charge = match steps.next(5) {
                0..=2 => Charge::Admitted,
                3 => Charge::Always,
                _ => Charge::Refund,
            };
            checks.push(charged(name, &user, &descriptors[which], cost, charge));
        }
        let expected = decide(reference, checks.clone()).await;
        let subject = subjects[step % subjects.len()];
        let got = decide(subject, checks.clone()).await;
        assert_eq!(
            got,
            expected,
            "{name}: step {step} at {} with {checks:?}",
            time.load(Ordering::SeqCst)
        );
        denied += expected.iter().filter(|decision| !decision.allowed).count();
    }
    assert!(denied > 150, "{name}: the limits are hit often ({denied})");
}

/// `rate` with a window of `multiplier` units (`unit_multiplier`).
fn every(rate: Rate, multiplier: u32) -> Rate {
    rate.every(multiplier).expect("a window within a year")
}

/// Parts 2 to 4 on `store` (a cluster: through `via`, another node than the owner at
/// times), with its own domain so stores sharing a backend do not meet.
async fn properties(name: &str, store: &dyn Store, via: &[&dyn Store]) {
    let hour = Rate::fixed(3, Unit::Hour);
    let tight = Rate::new(Algorithm::TokenBucket, 1, Unit::Hour, Some(1));
    let both = [hour, tight];
    // All or nothing: the bucket is spent after one; the hour window keeps 2.
    let one = |store| async move { decide(store, [check(name, "a", &both, 1)]).await };
    assert!(one(store).await.iter().all(|d| d.allowed), "{name}");
    let denied = one(via[0]).await;
    assert!(!denied[1].allowed, "{name}: the bucket is spent");
    let alone = decide(via[1 % via.len()], [check(name, "a", &[hour], 1)]).await;
    assert_eq!(
        (alone[0].allowed, alone[0].remaining),
        (true, 1),
        "{name}: the denied check took nothing from the window"
    );
    // A cost no limit admits consumes nothing.
    let huge = decide(store, [check(name, "b", &[hour], u64::MAX)]).await;
    assert!(!huge[0].allowed && huge[0].retry_after.is_none(), "{name}");
    let after = decide(store, [check(name, "b", &[hour], 3)]).await;
    assert!(after[0].allowed, "{name}: all 3 still there");
    // Peek reads without consuming, and agrees with the check that follows.
    let c = [check(name, "c", &[hour], 2)];
    decide(store, c.clone()).await;
    for _ in 0..3 {
        let peeked = store
            .peek(c.clone().into_iter().collect())
            .wait()
            .await
            .expect("the store peeks");
        assert_eq!(
            (peeked[0].allowed, peeked[0].remaining),
            (false, 1),
            "{name}: 2 of 3 used, a cost of 2 does not fit, nothing consumed by looking"
        );
    }
    let next = decide(store, [check(name, "c", &[hour], 1)]).await;
    assert_eq!((next[0].allowed, next[0].remaining), (true, 0), "{name}");
    charges(name, store, via).await;
    // Reset forgets the descriptor's counters.
    let keys: Vec<_> = [check(name, "c", &[hour], 1)][0]
        .counters
        .iter()
        .map(|counter| counter.key)
        .collect();
    let held = store.reset(keys).await.expect("the store resets");
    assert_eq!(held, 1, "{name}: one counter was held");
    let fresh = decide(via[0], [check(name, "c", &[hour], 3)]).await;
    assert!(fresh[0].allowed, "{name}: all 3 back after the reset");
}

/// Part 3, charges: refunds and counted rejections, on every algorithm; through `via` at times.
async fn charges(name: &str, store: &dyn Store, via: &[&dyn Store]) {
    let other = via[via.len() - 1];
    for algorithm in Algorithm::ALL {
        let rate = Rate::new(algorithm, 3, Unit::Hour, Some(3));
        let user = format!("refund-{algorithm}");
        let take = |cost| check(name, &user, &[rate], cost);
        let refund = |cost| charged(name, &user, &[rate], cost, Charge::Refund);
        let spent = decide(store, [take(3)]).await;
        assert_eq!(
            (spent[0].allowed, spent[0].remaining),
            (true, 0),
            "{name} {algorithm}"
        );
        // Exhausted (a Redis store now answers it from its blocked cache): the refund
        // still reaches the counter.
        assert!(
            !decide(store, [take(1)]).await[0].allowed,
            "{name} {algorithm}"
        );
        let back = decide(other, [refund(2)]).await;
        assert_eq!(
            (back[0].allowed, back[0].remaining),
            (true, 2),
            "{name} {algorithm}: a refund is allowed and gives back"
        );
        let all = decide(store, [refund(u64::MAX)]).await;
        assert_eq!(
            (all[0].allowed, all[0].remaining),
            (true, 3),
            "{name} {algorithm}: never above capacity"
        );
        let mut again = Vec::new();
        for cost in [2, 1, 1] {
            again.push(decide(store, [take(cost)]).await[0].allowed);
        }
        assert_eq!(
            again,
            [true, true, false],
            "{name} {algorithm}: 3 left, no more"
        );
        // Counting a rejection: 1 left, a cost of 2 takes it.
        let user = format!("counted-{algorithm}");
        assert!(decide(store, [check(name, &user, &[rate], 2)]).await[0].allowed);
        let counted = charged(name, &user, &[rate], 2, Charge::Always);
        let rejected = decide(other, [counted]).await;
        assert_eq!(
            (rejected[0].allowed, rejected[0].remaining),
            (false, 0),
            "{name} {algorithm}: the rejected hit took what was left"
        );
        let one = decide(store, [check(name, &user, &[rate], 1)]).await;
        assert!(
            !one[0].allowed,
            "{name} {algorithm}: the 1 left was counted"
        );
    }
}

/// Part 5: `store` stands in by `policy` for a backend that is gone, with `cooldown`.
async fn stands_in_by_policy(
    name: &str,
    store: &dyn Store,
    policy: FailurePolicy,
    cooldown: Duration,
) {
    let rate = Rate::fixed(4, Unit::Hour);
    let checks: Checks = (0..20)
        .map(|n| check(name, &format!("gone-{n}"), &[rate], 1))
        .collect();
    let expected = policy.decide(&checks, cooldown);
    let got = decide(store, checks).await;
    assert_eq!(got.len(), 20);
    // A cluster stands in only for keys whose owner is gone: compare those.
    let stood_in: Vec<_> = got
        .iter()
        .zip(&expected)
        .filter(|(got, _)| match policy {
            FailurePolicy::Deny => !got.allowed,
            FailurePolicy::Allow => got.remaining == 4,
        })
        .collect();
    assert!(!stood_in.is_empty(), "{name}: some keys stood in for");
    for (got, expected) in stood_in {
        assert_eq!(got, expected, "{name}: {policy:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_memory_store_is_its_own_reference_and_keeps_the_properties() {
    let (clock, _) = clock_at(START);
    let store = memory(clock);
    properties("memory", &store, &[&store]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_cluster_answers_like_one_node() {
    let (clock, time) = clock_at(START);
    let reference = memory(clock);
    let cluster = LocalCluster::start(3, clock).await;
    let nodes: Vec<&dyn Store> = cluster.nodes.iter().map(|n| n as &dyn Store).collect();
    answers_like_the_reference("cluster", &reference, &nodes, time).await;
    properties("cluster-props", nodes[0], &nodes[1..]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_answers_like_the_in_memory_store() {
    let dir = TempDir::new("contract-redis");
    let server = RedisServer::start(dir.path(), &[]);
    let (clock, time) = clock_at(START);
    let reference = memory(clock);
    let redis = RedisStore::new(redis_options(&server.url()), clock).expect("a redis store");
    answers_like_the_reference("redis", &reference, &[&redis], time).await;
    properties("redis-props", &redis, &[&redis]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_answers_like_the_in_memory_store() {
    let dir = TempDir::new("contract-redis-cluster");
    let masters = RedisCluster::start(dir.path(), 3);
    let (clock, time) = clock_at(START);
    let reference = memory(clock);
    let redis = RedisStore::new(redis_options(&masters.url()), clock).expect("a redis store");
    answers_like_the_reference("redis-cluster", &reference, &[&redis], time).await;
    properties("redis-cluster-props", &redis, &[&redis]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_stands_in_alike_when_its_backend_is_gone() {
    let (clock, _) = clock_at(START);
    for policy in [FailurePolicy::Deny, FailurePolicy::Allow] {
        // Redis: nothing listens on the port.
        let down = format!("redis://127.0.0.1:{}", crate::support::free_port());
        let mut options = redis_options(&down);
        options.failure = policy;
        options.cooldown = Duration::from_secs(3);
        let redis = RedisStore::new(options, clock).expect("a redis store");
        stands_in_by_policy("redis", &redis, policy, Duration::from_secs(3)).await;
        // A cluster node whose only peer never answers (nothing listens there).
        let mut options = ClusterOptions::new("127.0.0.1:1");
        options.peers = vec![format!("127.0.0.1:{}", crate::support::free_port())];
        options.fallback = Fallback::Policy(policy);
        options.timeout = Duration::from_millis(200);
        let node = Cluster::join(memory(clock), options);
        stands_in_by_policy("cluster", &node, policy, node_cooldown()).await;
    }
}

/// The cluster's breaker cooldown, which its `deny` stand-in tells clients to wait.
fn node_cooldown() -> Duration {
    ClusterOptions::new("127.0.0.1:1").breaker_cooldown
}
