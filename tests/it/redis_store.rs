//! The Redis store against real Redis (Debian's `redis-server`, installed when missing);
//! the store contract (the same answers as the in-memory store for every algorithm, single
//! and Cluster) is `tests/it/store_contract.rs`. Here: one exact limit shared by
//! two processes, a 3-master Redis Cluster (exact, then a master killed and restarted),
//! Redis killed and restarted under load, the failure policy, and what the store refuses.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::store_contract::check;
use crate::support::{
    Ratekeeper, RedisCluster, RedisServer, TempDir, eventually, http_get, http_post, metric,
    metric_sample, run_ratekeeper, write_config,
};
use ratekeeper::algorithm::{Algorithm, Rate, Unit};
use ratekeeper::check::Checks;
use ratekeeper::clock::Clock;
use ratekeeper::store::Store;
use ratekeeper::store::redis::{RedisOptions, RedisStore, Target};

const WAIT: Duration = Duration::from_secs(20);

const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      unit: hour
      requests_per_unit: 10
";

fn body(value: &str) -> String {
    format!(
        r#"{{"domain": "edge", "descriptors": [{{"entries": [{{"key": "api_key", "value": "{value}"}}]}}]}}"#
    )
}

/// POSTs one `/json` request for `value`: `Some(true)` admitted (200), `Some(false)` over
/// the limit (429), `None` anything else.
fn ask(http: SocketAddr, value: &str) -> Option<bool> {
    ask_hits(http, value, 1)
}

/// [`ask`] with `hits` as the descriptor's `hits_addend`.
fn ask_hits(http: SocketAddr, value: &str, hits: u64) -> Option<bool> {
    let body = body(value).replace(
        r#""entries""#,
        &format!(r#""hits_addend": {hits}, "entries""#),
    );
    let response = http_post(http, "/json", &[], &body).ok()?;
    match response.status {
        200 => Some(true),
        429 => Some(false),
        _ => None,
    }
}

/// The TTL (ms) of the first counter key `server` holds.
fn first_key_ttl(server: &RedisServer) -> i64 {
    let keys = server.cli(&["--scan", "--pattern", "rk:*"]);
    let key = keys.lines().next().expect("one counter key").trim();
    server.cli(&["pttl", key]).trim().parse().expect("a ttl")
}

/// A Redis store on `server`, on the system clock, with a 5 s deadline.
fn store_on(server: &RedisServer) -> RedisStore {
    let target = Target::parse(&server.url()).expect("a redis url");
    let options = RedisOptions {
        timeout: Duration::from_secs(5),
        ..RedisOptions::new(target)
    };
    RedisStore::new(options, Clock::system()).expect("a redis store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_batched_together_admit_exactly_the_limit() {
    let dir = TempDir::new("redis-batched");
    let server = RedisServer::start(dir.path(), &[]);
    let store = Arc::new(store_on(&server));
    let rates = [
        Rate::fixed(50, Unit::Hour),
        Rate::new(Algorithm::Gcra, 1000, Unit::Hour, Some(80)),
    ];
    let check = check("batched", "one", &rates, 1);
    let tasks: Vec<_> = (0..400)
        .map(|_| {
            let (store, check) = (Arc::clone(&store), check.clone());
            tokio::spawn(async move {
                let checks: Checks = [check].into_iter().collect();
                let decisions = store.check(checks).wait().await.expect("decided");
                decisions.iter().all(|decision| decision.allowed)
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.expect("a task"));
    }
    assert_eq!(admitted, 50, "all or nothing, in one order, across batches");
}

#[test]
fn two_processes_sharing_one_redis_admit_one_exact_limit() {
    let dir = TempDir::new("redis-two-processes");
    let server = RedisServer::start(dir.path(), &[]);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let url = server.url();
    let nodes = [
        Ratekeeper::start(&config, &["--store", &url]),
        Ratekeeper::start(&config, &["--store", &url]),
    ];
    let admitted = AtomicUsize::new(0);
    let answered = AtomicUsize::new(0);
    thread::scope(|scope| {
        for node in &nodes {
            for _ in 0..3 {
                let http = node.http_addr();
                let (admitted, answered) = (&admitted, &answered);
                scope.spawn(move || {
                    for _ in 0..20 {
                        if let Some(ok) = ask(http, "shared") {
                            answered.fetch_add(1, Ordering::Relaxed);
                            admitted.fetch_add(usize::from(ok), Ordering::Relaxed);
                        }
                    }
                });
            }
        }
    });
    assert_eq!(
        answered.load(Ordering::Relaxed),
        120,
        "every request answered"
    );
    assert_eq!(
        admitted.load(Ordering::Relaxed),
        10,
        "one limit of 10 across both"
    );
    // A restart of both processes keeps the count: it lives in Redis.
    drop(nodes);
    let again = Ratekeeper::start(&config, &["--store", &url]);
    assert_eq!(ask(again.http_addr(), "shared"), Some(false));
    assert_eq!(ask(again.http_addr(), "other"), Some(true));
    // The sample itself: `metric` reads an absent one as 0.
    let hits = metric_sample(
        again.http_addr(),
        "ratekeeper_store_blocked_cache_hits_total",
    );
    assert!(
        hits.is_some_and(|hits| hits >= 0.0),
        "the blocked cache's hits are exported: {hits:?}"
    );
}

/// The metric families a `/metrics` scrape exports (from its `# TYPE` lines).
fn metric_families(http: SocketAddr) -> Vec<String> {
    let response = http_get(http, "/metrics", &[]).expect("/metrics answers");
    response
        .body
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split(' ').next())
        .map(str::to_owned)
        .collect()
}

/// Only the selected store is built: under `--store redis` no engine, shards or cluster
/// exist, so none of their metrics are exported (while the in-memory store exports its
/// shards' and not Redis's).
#[test]
fn only_the_selected_store_is_built_and_exports_metrics() {
    let dir = TempDir::new("redis-selected");
    let server = RedisServer::start(dir.path(), &[]);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let on_redis = Ratekeeper::start(&config, &["--store", &server.url()]);
    let in_memory = Ratekeeper::start(&config, &[]);
    for node in [&on_redis, &in_memory] {
        assert_eq!(ask(node.http_addr(), "counted"), Some(true));
    }
    let has = |families: &[String], prefix: &str| {
        families
            .iter()
            .any(|family| family.starts_with(&format!("ratekeeper_{prefix}")))
    };
    let expected = [
        (&on_redis, "store_calls", ["shard_", "cluster_", "peer_"]),
        (
            &in_memory,
            "shard_live_keys",
            ["store_", "cluster_", "peer_"],
        ),
    ];
    for (node, own, absent) in expected {
        let families = metric_families(node.http_addr());
        assert!(has(&families, own), "{own} is exported: {families:?}");
        for other in absent {
            assert!(
                !has(&families, other),
                "no {other}* family beside {own}: {families:?}"
            );
        }
    }
}

#[test]
fn a_flood_against_a_blocked_key_costs_no_redis_call() {
    let dir = TempDir::new("redis-blocked");
    let server = RedisServer::start(dir.path(), &[]);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let node = Ratekeeper::start(&config, &["--store", &server.url()]);
    let http = node.http_addr();
    for _ in 0..10 {
        assert_eq!(ask(http, "flood"), Some(true));
    }
    let calls = metric(http, "ratekeeper_store_calls_total");
    for _ in 0..200 {
        assert_eq!(ask(http, "flood"), Some(false));
    }
    assert_eq!(
        metric(http, "ratekeeper_store_calls_total"),
        calls,
        "no redis call for a key known to be over its limit"
    );
    assert!(metric(http, "ratekeeper_store_blocked_cache_hits_total") >= 200.0);
    let ttl = first_key_ttl(&server);
    assert!(
        ttl > 0 && ttl <= 3_602_000,
        "keys expire on their own, within the window and a margin: {ttl} ms"
    );
}

#[test]
fn a_redis_cluster_keeps_exact_limits_and_a_killed_master_costs_only_the_policy() {
    let dir = TempDir::new("redis-cluster");
    let mut cluster = RedisCluster::start(dir.path(), 3);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let node = Ratekeeper::start(
        &config,
        &["--store", &cluster.url(), "--store-cooldown", "200ms"],
    );
    let http = node.http_addr();
    // A cost no limit admits is over the limit and consumes nothing (the script is never
    // told a number a double would round); one above 2^32 - 1 is refused as invalid.
    assert_eq!(ask_hits(http, "huge", 3), Some(true));
    assert_eq!(ask_hits(http, "huge", u64::from(u32::MAX)), Some(false));
    assert_eq!(ask_hits(http, "huge", u64::MAX), None, "400: invalid");
    assert_eq!(ask_hits(http, "huge", 7), Some(true), "the 7 left pass");
    assert_eq!(ask_hits(http, "huge", 1), Some(false));
    // 30 keys spread over the three masters' slots: each admits exactly its 10.
    for key in 0..30 {
        let value = format!("k{key}");
        let admitted = (0..14)
            .filter(|_| ask(http, &value).expect("answered"))
            .count();
        assert_eq!(admitted, 10, "key {value}");
    }
    let keys: usize = cluster
        .masters
        .iter()
        .map(|master| master.cli(&["dbsize"]).trim().parse::<usize>().unwrap_or(0))
        .sum();
    assert_eq!(
        keys, 31,
        "one counter per key (and \"huge\"), spread over the masters"
    );
    assert!(
        cluster
            .masters
            .iter()
            .all(|master| master.cli(&["dbsize"]).trim() != "0"),
        "every master holds some keys"
    );
    // A master dies: its keys are decided by the failure policy (allow); nothing errors.
    cluster.masters[1].kill();
    let fresh: Vec<String> = (0..30).map(|key| format!("new{key}")).collect();
    for value in &fresh {
        assert!(
            ask(http, value).is_some(),
            "answered while a master is down"
        );
    }
    assert!(
        metric(http, "ratekeeper_store_policy_decisions_total") > 0.0,
        "{}",
        node.stderr()
    );
    // It comes back (empty): limits hold again, exactly.
    cluster.masters[1].restart();
    cluster.wait_ok();
    let recovered = eventually(WAIT, || {
        let value = format!("after{}", Instant::now().elapsed().as_nanos());
        (0..12).filter(|_| ask(http, &value) == Some(true)).count() == 10
            && (0..30).all(|key| {
                let value = format!("again{key}");
                (0..11).filter(|_| ask(http, &value) == Some(true)).count() == 10
            })
    });
    assert!(
        recovered,
        "exact limits after the master returned: {}",
        node.stderr()
    );
}

#[test]
fn redis_killed_and_restarted_under_load_never_errors_and_recovers_within_the_cooldown() {
    let dir = TempDir::new("redis-restart");
    let mut server = RedisServer::start(dir.path(), &[]);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let node = Ratekeeper::start(
        &config,
        &["--store", &server.url(), "--store-cooldown", "500ms"],
    );
    let http = node.http_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let load: Vec<_> = (0..3)
        .map(|worker| {
            let (stop, errors, answered) = (
                Arc::clone(&stop),
                Arc::clone(&errors),
                Arc::clone(&answered),
            );
            thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    match ask(http, &format!("w{worker}-{}", n % 50)) {
                        Some(_) => answered.fetch_add(1, Ordering::Relaxed),
                        None => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    let answered_before = |at_least: usize| {
        let start = answered.load(Ordering::Relaxed);
        eventually(WAIT, || {
            answered.load(Ordering::Relaxed) >= start + at_least
        })
    };
    assert!(answered_before(100));
    server.kill();
    assert!(
        answered_before(100),
        "requests are answered while redis is down"
    );
    assert!(metric(http, "ratekeeper_store_circuit_open") == 1.0);
    server.restart();
    let restarted = Instant::now();
    let closed = eventually(WAIT, || {
        metric(http, "ratekeeper_store_circuit_open") == 0.0
    });
    let recovery = restarted.elapsed();
    stop.store(true, Ordering::Relaxed);
    for worker in load {
        worker.join().expect("a load thread");
    }
    assert!(closed, "the breaker closed again: {}", node.stderr());
    assert!(
        recovery < Duration::from_secs(3),
        "recovered {recovery:?} after the restart (cooldown 500ms)"
    );
    assert_eq!(errors.load(Ordering::Relaxed), 0, "{}", node.stderr());
    // Limits hold again, exactly, on the restarted (empty) server.
    let admitted = (0..15).filter(|_| ask(http, "after") == Some(true)).count();
    assert_eq!(admitted, 10);
    let stderr = node.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        stderr.matches("circuit open").count(),
        1,
        "one log line per breaker change: {stderr}"
    );
}

#[test]
fn the_failure_policy_decides_while_redis_is_unreachable() {
    let dir = TempDir::new("redis-policy");
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    // Nothing listens on the port: every call fails fast.
    let down = format!("redis://127.0.0.1:{}", crate::support::free_port());
    let allow = Ratekeeper::start(&config, &["--store", &down]);
    for _ in 0..20 {
        assert_eq!(ask(allow.http_addr(), "k"), Some(true), "allow: fail open");
    }
    let deny = Ratekeeper::start(
        &config,
        &[
            "--store",
            &down,
            "--store-failure",
            "deny",
            "--store-cooldown",
            "7s",
        ],
    );
    let response = http_post(deny.http_addr(), "/json", &[], &body("k")).expect("answers");
    assert_eq!(response.status, 429, "deny: over the limit");
    assert!(
        response.body.contains(r#""durationUntilReset":"7s""#),
        "reset after the cooldown: {}",
        response.body
    );
    assert!(metric(deny.http_addr(), "ratekeeper_store_policy_decisions_total") >= 1.0);
}

#[test]
fn limits_the_redis_store_cannot_count_are_refused_with_file_and_place() {
    let dir = TempDir::new("redis-refused");
    write_config(
        dir.path(),
        "limits.yaml",
        "\
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: 10
      max_wait: 50ms
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 10000000
      algorithm: sliding_window
",
    );
    let (status, _, stderr) = run_ratekeeper(&[
        "validate".as_ref(),
        "--store".as_ref(),
        "redis://127.0.0.1:6379".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("limits.yaml"), "{stderr}");
    assert!(
        stderr.contains(
            "(key api_key) > rate_limit.max_wait: max_wait is not available with --store redis"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "rate_limit.requests_per_unit: a sliding_window limit can count at most 9007199"
        ),
        "{stderr}"
    );
    let (status, _, _) = run_ratekeeper(&["validate".as_ref(), dir.path().as_os_str()]);
    assert!(status.success(), "the in-memory store takes both");
    let (status, _, stderr) = run_ratekeeper(&[
        "serve".as_ref(),
        "--config".as_ref(),
        dir.path().as_os_str(),
        "--store".as_ref(),
        "redis://127.0.0.1:6379".as_ref(),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("max_wait is not available"), "{stderr}");
}

#[test]
fn a_sentinel_names_the_master_the_store_uses() {
    let dir = TempDir::new("redis-sentinel");
    let master = RedisServer::start(dir.path(), &[]);
    let sentinel_dir = dir.path().join("sentinel");
    std::fs::create_dir_all(&sentinel_dir).expect("sentinel dir");
    let sentinel_conf = sentinel_dir.join("sentinel.conf");
    std::fs::write(
        &sentinel_conf,
        format!(
            "sentinel monitor main 127.0.0.1 {} 1\nsentinel down-after-milliseconds main 1000\n",
            master.port()
        ),
    )
    .expect("write sentinel.conf");
    let sentinel = crate::support::Sentinel::start(&sentinel_conf);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let url = format!("redis-sentinel://127.0.0.1:{}/main", sentinel.port());
    let node = Ratekeeper::start(&config, &["--store", &url]);
    let admitted = (0..15)
        .filter(|_| ask(node.http_addr(), "s") == Some(true))
        .count();
    assert_eq!(admitted, 10, "{}", node.stderr());
    assert!(
        master.cli(&["dbsize"]).trim() != "0",
        "counters on the master"
    );
}

#[test]
fn explain_reads_the_counter_in_redis_and_says_so_when_redis_is_down() {
    let dir = TempDir::new("redis-explain");
    let mut server = RedisServer::start(dir.path(), &[]);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let node = Ratekeeper::start(&config, &["--store", &server.url()]);
    let http = node.http_addr();
    for _ in 0..3 {
        assert_eq!(ask(http, "seen"), Some(true));
    }
    let admin = node.admin_addr();
    let explain = || http_post(admin, "/debug/explain", &[], &body("seen")).expect("answers");
    let response = explain();
    assert_eq!(response.status, 200, "{}", response.body);
    let answer: serde_json::Value = serde_json::from_str(&response.body).expect("json");
    let limit = &answer["descriptors"][0]["limits"][0];
    assert_eq!(
        (&limit["used"], &limit["remaining"]),
        (&3.into(), &7.into()),
        "{answer}"
    );
    assert_eq!(ask(http, "seen"), Some(true), "explaining consumed nothing");
    // The asked hits are weighed against the state read, not sent to the script.
    let mut greedy: serde_json::Value = serde_json::from_str(&body("seen")).expect("json");
    greedy["hits_addend"] = 7.into();
    let response = http_post(admin, "/debug/explain", &[], &greedy.to_string()).expect("answers");
    let answer: serde_json::Value = serde_json::from_str(&response.body).expect("json");
    let limit = &answer["descriptors"][0]["limits"][0];
    assert_eq!(limit["remaining"], 6, "{answer}");
    assert_eq!(limit["would_reject"], true, "{answer}");
    assert!(limit["retry_after_ms"].as_u64().is_some(), "{answer}");
    assert_eq!(limit["retry_after_ms"], limit["reset_after_ms"], "{answer}");
    assert_eq!(ask(http, "seen"), Some(true), "still nothing consumed");
    server.kill();
    let response = explain();
    assert_eq!(response.status, 503, "no made-up state: {}", response.body);
    assert!(
        response.body.contains("did not answer"),
        "{}",
        response.body
    );
}

#[test]
fn nginx_rate_and_hot_reload_work_unchanged_on_the_redis_store() {
    let dir = TempDir::new("redis-front-ends");
    let server = RedisServer::start(dir.path(), &[]);
    let limits = |per_hour: u32| {
        format!(
            "\
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      name: per_key
      unit: hour
      requests_per_unit: {per_hour}
"
        )
    };
    let config = write_config(dir.path(), "limits.yaml", &limits(3));
    let node = Ratekeeper::start(&config, &["--store", &server.url()]);
    let http = node.http_addr();
    let nginx = |key: &str| {
        let descriptor = format!("api_key={key}");
        crate::support::http_get(
            http,
            "/nginx/edge",
            &[("X-Ratelimit-Descriptor", &descriptor)],
        )
        .expect("answers")
        .status
    };
    let rate = |key: &str| {
        http_post(http, &format!("/rate/edge/per_key/{key}"), &[], "")
            .expect("answers")
            .status
    };
    // One counter in Redis, whichever front end asks.
    assert_eq!([nginx("k"), rate("k"), nginx("k")], [204, 200, 204]);
    assert_eq!([rate("k"), nginx("k")], [429, 403]);
    // A reload raises the limit: the same counter, now with room.
    write_config(dir.path(), "limits.yaml", &limits(5));
    let reloaded = eventually(WAIT, || rate("k") == 200);
    assert!(reloaded, "the new limit applies: {}", node.stderr());
    assert_eq!(rate("k"), 200, "the fifth hit");
    assert_eq!(nginx("k"), 403, "5 of 5 used");
    assert!(metric(http, "ratekeeper_store_calls_total") >= 5.0);
}

#[test]
fn counters_counted_in_redis_are_listed_with_their_state() {
    let dir = TempDir::new("redis-counters");
    let server = RedisServer::start(dir.path(), &[]);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let node = Ratekeeper::start(
        &config,
        &["--store", &server.url(), "--counter-names", "100"],
    );
    let http = node.http_addr();
    for _ in 0..4 {
        assert_eq!(ask(http, "listed"), Some(true));
    }
    let response =
        crate::support::http_get(node.admin_addr(), "/counters/edge", &[]).expect("answers");
    assert_eq!(response.status, 200, "{}", response.body);
    let page: serde_json::Value = serde_json::from_str(&response.body).expect("json");
    let counter = &page["counters"][0];
    assert_eq!(counter["entries"][0]["value"], "listed", "{page}");
    assert_eq!(
        (
            &counter["limits"][0]["used"],
            &counter["limits"][0]["remaining"]
        ),
        (&4.into(), &6.into()),
        "the state in Redis: {page}"
    );
}

#[test]
fn keys_outlive_their_window_by_the_ttl_margin() {
    let dir = TempDir::new("redis-ttl");
    let server = RedisServer::start(dir.path(), &[]);
    let config = write_config(
        dir.path(),
        "limits.yaml",
        &LIMITS.replace("unit: hour", "unit: second"),
    );
    // The one key's TTL after one admitted request, in ms, plus the milliseconds between
    // the request and the TTL's read (the TTL has counted down by that much).
    let ttl_after_one_request = |extra: &[&str]| {
        server.cli(&["flushall"]);
        let node = Ratekeeper::start(&config, &[&["--store", &server.url()], extra].concat());
        let asked = Instant::now();
        assert_eq!(ask(node.http_addr(), "ttl"), Some(true));
        let ttl = first_key_ttl(&server);
        (
            ttl,
            i64::try_from(asked.elapsed().as_millis()).unwrap_or(i64::MAX),
        )
    };
    // The window (at most 1 s left of it) plus the default margin of 1 s.
    let (default, read_after) = ttl_after_one_request(&[]);
    assert!(
        default + read_after > 1_000 && default <= 2_002,
        "a per-second key lives at most 2 s: {default} ms (read {read_after} ms after)"
    );
    let (longer, read_after) = ttl_after_one_request(&["--store-ttl-margin", "30s"]);
    assert!(
        longer + read_after > 30_000 && longer <= 31_002,
        "--store-ttl-margin 30s keeps it 30 s past its window: {longer} ms (read {read_after} ms after)"
    );
}

/// A script call that fails part way (here a counter holding bytes that are no state)
/// writes nothing: the request's other descriptor, decided before the failure, is not
/// consumed, and the call is answered by the failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_call_that_fails_part_way_consumes_nothing() {
    let dir = TempDir::new("redis-partial");
    let server = RedisServer::start(dir.path(), &[]);
    let redis = store_on(&server);
    let rate = [Rate::fixed(5, Unit::Hour)];
    let broken = check("partial", "broken", &rate, 1);
    let first = check("partial", "first", &rate, 1);
    redis
        .check(Checks::from_iter([broken.clone()]))
        .wait()
        .await
        .expect("a counter for the broken descriptor");
    let keys = server.cli(&["--scan", "--pattern", "rk:*"]);
    let broken_key = keys.lines().next().expect("its key").trim().to_owned();
    server.cli(&["set", &broken_key, "not a state"]);

    let answered = redis.check(Checks::from_iter([first, broken])).wait().await;
    assert!(
        answered.is_ok_and(|decisions| decisions.iter().all(|decision| decision.allowed)),
        "the failure policy (allow) answers"
    );
    let keys = server.cli(&["--scan", "--pattern", "rk:*"]);
    assert_eq!(
        keys.lines().count(),
        1,
        "the first descriptor was not written: {keys}"
    );
}

/// Runs the Redis script on two checks (each `[cost, charge, counters, algorithm,
/// requests_per_unit, unit seconds, burst, interval]`, as `redis.rs` packs them) against
/// the keys `keys`: the call must fail naming `problem`, and neither key may exist after.
fn assert_script_refuses(label: &str, checks: [[f64; 8]; 2], keys: [&str; 2], problem: &str) {
    let dir = TempDir::new(label);
    let server = RedisServer::start(dir.path(), &[]);
    let client = redis::Client::open(server.url()).expect("a redis url");
    let mut connection = client.get_connection().expect("connects");
    let packed: Vec<u8> = checks
        .iter()
        .flatten()
        .flat_map(|number| number.to_le_bytes())
        .collect();
    let reply: redis::RedisResult<Vec<u8>> = redis::cmd("EVAL")
        .arg(ratekeeper::store::redis::script())
        .arg(2)
        .arg(keys[0])
        .arg(keys[1])
        .arg(1_704_326_400)
        .arg(0)
        .arg(1000)
        .arg(packed)
        .query(&mut connection);
    let error = reply.expect_err("the script refuses the call");
    assert!(error.to_string().contains(problem), "{error}");
    let exists: u32 = redis::cmd("EXISTS")
        .arg(keys[0])
        .arg(keys[1])
        .query(&mut connection)
        .expect("EXISTS");
    assert_eq!(exists, 0, "nothing written");
}

/// The script refuses an algorithm code it does not know (one a newer ratekeeper might send)
/// with an error naming it, before writing anything: an earlier check of the same call that
/// it admitted leaves no trace.
#[test]
fn the_script_refuses_an_unknown_algorithm_and_writes_nothing() {
    // Check 1: cost 1, charge 0 (admitted hits), one counter: fixed window, 5 per 60 s
    // (admitted); check 2: the same with algorithm code 7.
    assert_script_refuses(
        "redis-unknown-algorithm",
        [
            [1.0, 0.0, 1.0, 0.0, 5.0, 60.0, 5.0, 0.0],
            [1.0, 0.0, 1.0, 7.0, 5.0, 60.0, 5.0, 0.0],
        ],
        ["known", "unknown"],
        "unknown algorithm code 7",
    );
}

/// Likewise a charge code it does not know: refused naming it, nothing written (a check
/// that counts rejections or a refund is never decided as another charge).
#[test]
fn the_script_refuses_an_unknown_charge_and_writes_nothing() {
    // Check 1: a refund of 1 (charge 2), fixed window, 5 per 60 s; check 2: charge 3.
    assert_script_refuses(
        "redis-unknown-charge",
        [
            [1.0, 2.0, 1.0, 0.0, 5.0, 60.0, 5.0, 0.0],
            [1.0, 3.0, 1.0, 0.0, 5.0, 60.0, 5.0, 0.0],
        ],
        ["refunded", "unknown"],
        "unknown charge code 3",
    );
}
