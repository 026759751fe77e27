use super::*;
use crate::algorithm::{Rate, Unit};
use crate::key::KeyBuilder;
use crate::shard::Counter;

fn check_for(value: &str, limit: u32) -> Check {
    let rate = Rate::fixed(limit, Unit::Hour);
    Check {
        counters: vec![Counter {
            key: KeyBuilder::new("d").entry("k", value).key(&rate),
            rate,
        }],
        cost: 1,
        wait: None,
    }
}

fn engine(shards: usize, queue_capacity: usize) -> Engine {
    Engine::spawn(
        EngineConfig {
            shards,
            queue_capacity,
            max_keys: 10_000,
            max_waiters: 10,
        },
        Clock::starting_at(1_704_326_400 * crate::algorithm::NANOS_PER_SEC),
    )
}

#[tokio::test(start_paused = true)]
async fn decisions_come_back_in_request_order_across_shards() {
    let engine = engine(4, 16);
    // Each descriptor gets its own limit, so its remaining count identifies it.
    let checks: Vec<Check> = (0..40)
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

#[tokio::test(start_paused = true)]
async fn the_same_key_counts_once_per_hit_across_concurrent_callers() {
    let engine = engine(2, 1024);
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            engine
                .check(vec![check_for("hot", 150)])
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

#[tokio::test(start_paused = true)]
async fn a_full_mailbox_fails_fast_and_is_counted() {
    let engine = engine(1, 2);
    // On this single-threaded test runtime the shard cannot run between these sends.
    let first = engine.send(0, vec![check_for("a", 10)]).expect("room");
    let second = engine.send(0, vec![check_for("a", 10)]).expect("room");
    let third = engine.send(0, vec![check_for("a", 10)]);
    assert_eq!(third.err(), Some(EngineError::Overloaded { shard: 0 }));
    assert_eq!(engine.stats()[0].overloads.load(Ordering::Relaxed), 1);
    assert!(first.recv().await.is_ok());
    assert!(second.recv().await.is_ok());
    assert!(
        engine.check(vec![check_for("a", 10)]).await.is_ok(),
        "room again"
    );
}

#[tokio::test]
async fn an_empty_request_needs_no_shard() {
    let engine = engine(2, 2);
    assert_eq!(engine.check(Vec::new()).await, Ok(Vec::new()));
}
