use smallvec::smallvec;

use super::*;
use crate::algorithm::{Rate, Unit};
use crate::check::{Check, Counter};
use crate::key::KeyBuilder;

fn check_for(value: &str, limit: u32) -> Check {
    let rate = Rate::fixed(limit, Unit::Hour);
    Check {
        counters: smallvec![Counter {
            key: KeyBuilder::new("d").entry("k", value).key(&rate),
            rate,
        }],
        cost: 1,
        wait: None,
        charge: crate::check::Charge::Admitted,
    }
}

fn engine(shards: usize) -> Engine {
    Engine::spawn(
        EngineConfig {
            shards,
            max_keys: 10_000,
            max_waiters: 10,
            rule_key_share: 1.0,
        },
        Clock::starting_at(1_704_326_400 * crate::algorithm::NANOS_PER_SEC),
    )
}

#[tokio::test(start_paused = true)]
async fn decisions_come_back_in_request_order_across_shards() {
    let engine = engine(4);
    // Each descriptor gets its own limit, so its remaining count identifies it.
    let checks: Checks = (0..40)
        .map(|n| check_for(&format!("v{n}"), 100 + n))
        .collect();
    let used: std::collections::HashSet<usize> = checks
        .iter()
        .map(|check| check.counters[0].key.shard(4))
        .collect();
    assert!(used.len() > 1, "the test spreads over several shards");
    let decisions = engine.check(checks).await.expect("answers");
    let remaining: Vec<u32> = decisions
        .iter()
        .map(|decision| decision.remaining)
        .collect();
    let expected: Vec<u32> = (0..40).map(|n| 99 + n).collect();
    assert_eq!(remaining, expected);
}

/// A request visits shards back and forth (its keys on each shard are looked up together on
/// the first visit): a key named twice still counts twice, in request order.
#[tokio::test(start_paused = true)]
async fn a_key_named_twice_in_one_request_counts_each_time() {
    let engine = engine(2);
    let values: Vec<String> = (0..100).map(|n| format!("v{n}")).collect();
    let on = |shard: usize| {
        values
            .iter()
            .find(|value| check_for(value, 1).counters[0].key.shard(2) == shard)
            .expect("a value on each of two shards")
    };
    let (a, b) = (on(0), on(1));
    let checks: Checks = smallvec![
        check_for(a, 1),
        check_for(b, 5),
        check_for(a, 1),
        check_for(b, 5),
    ];
    let decisions = engine.check(checks).await.expect("answers");
    let seen: Vec<(bool, u32)> = decisions
        .iter()
        .map(|decision| (decision.allowed, decision.remaining))
        .collect();
    assert_eq!(seen, [(true, 0), (true, 4), (false, 0), (true, 3)]);
}

#[tokio::test(start_paused = true)]
async fn the_same_key_counts_once_per_hit_across_concurrent_callers() {
    let engine = engine(2);
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            engine
                .check(smallvec![check_for("hot", 150)])
                .await
                .map(|d| d[0].allowed)
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        if task.await.expect("task").expect("answers") {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 150);
}

/// Callers on several threads step the same shards at once: the lock keeps every step
/// whole, so a limit admits exactly its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_on_many_threads_admit_exactly_the_limit() {
    let engine = engine(2);
    let mut tasks = Vec::new();
    for task in 0..8 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u32;
            for n in 0..2_000 {
                // One hot key shared by everyone, one key of this task's own, per request.
                let checks = smallvec![
                    check_for("hot", 5_000),
                    check_for(&format!("own-{task}-{}", n % 10), 1_000_000)
                ];
                let decisions = engine.check(checks).await.expect("answers");
                assert!(
                    decisions[1].allowed,
                    "the own keys are far from their limit"
                );
                admitted += u32::from(decisions[0].allowed);
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.expect("task");
    }
    assert_eq!(admitted, 5_000, "16,000 tries at a limit of 5,000");
    let own = engine
        .check(smallvec![check_for("own-0-0", 1_000_000)])
        .await
        .expect("answers");
    assert_eq!(
        own[0].remaining,
        1_000_000 - 201,
        "200 hits before, one now"
    );
}

#[tokio::test]
async fn an_empty_request_needs_no_shard() {
    let engine = engine(2);
    assert_eq!(engine.check(Checks::new()).await, Ok(Decisions::new()));
}

#[tokio::test(start_paused = true)]
async fn the_timer_tasks_end_when_the_last_handle_drops() {
    let engine = engine(3);
    let cells: Vec<std::sync::Weak<Cell>> = engine.inner.cells.iter().map(Arc::downgrade).collect();
    let copy = engine.clone();
    drop(engine);
    tokio::task::yield_now().await;
    assert!(
        cells.iter().all(|cell| cell.upgrade().is_some()),
        "a handle is left"
    );
    drop(copy);
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    assert!(cells.iter().all(|cell| cell.upgrade().is_none()));
}

#[tokio::test(start_paused = true)]
async fn a_reset_forgets_only_the_keys_named() {
    let engine = engine(4);
    let rate = Rate::fixed(1, Unit::Hour);
    let check = |route: u64| {
        let key = KeyId {
            route,
            id: [route, 7],
        };
        let mut checks = Checks::new();
        checks.push(Check {
            counters: smallvec![Counter { key, rate }],
            cost: 1,
            wait: None,
            charge: crate::check::Charge::Admitted,
        });
        (key, checks)
    };
    for route in 1..=8 {
        let (_, checks) = check(route);
        assert!(engine.check(checks).await.expect("decided")[0].allowed);
    }
    let (key, blocked) = check(3);
    assert!(!engine.check(blocked).await.expect("decided")[0].allowed);
    assert_eq!(
        engine.reset(&[key, key]),
        1,
        "a key held once is removed once"
    );
    assert_eq!(engine.reset(&[key]), 0);
    let (_, again) = check(3);
    assert!(
        engine.check(again).await.expect("decided")[0].allowed,
        "room again"
    );
    let (_, untouched) = check(4);
    assert!(!engine.check(untouched).await.expect("decided")[0].allowed);
    let live: usize = engine
        .figures()
        .iter()
        .map(|figures| figures.live_keys)
        .sum();
    assert_eq!(live, 8);
}
