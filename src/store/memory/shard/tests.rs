use std::sync::atomic::Ordering;
use std::time::Duration;

use smallvec::smallvec;

use super::*;
use crate::algorithm::{Algorithm, NANOS_PER_SEC, Rate, Unit};
use crate::check::{Charge, WaitPolicy};
use crate::clock::Clock;
use crate::key::KeyBuilder;
use crate::store::memory::engine::{Engine, EngineConfig};

const S: u64 = NANOS_PER_SEC;
/// 2024-01-04T00:00:00Z: every window boundary.
const MIDNIGHT: u64 = 1_704_326_400 * S;

fn engine_at(start: u64, max_keys: usize) -> Engine {
    Engine::spawn(
        EngineConfig {
            shards: 1,
            max_keys,
            max_waiters: 100,
            rule_key_share: 1.0,
        },
        Clock::starting_at(start),
    )
}

fn counter(value: &str, rate: Rate) -> Counter {
    Counter {
        key: KeyBuilder::new("test").entry("user", value).key(&rate),
        rate,
    }
}

fn check(counters: Vec<Counter>, cost: u64, wait: Option<WaitPolicy>) -> Check {
    Check {
        counters: counters.into(),
        cost,
        wait,
        charge: crate::check::Charge::Admitted,
    }
}

fn shard_stats(engine: &Engine) -> Arc<ShardStats> {
    Arc::clone(engine.stats().next().expect("one shard"))
}

async fn allowed(engine: &Engine, check: Check) -> bool {
    let decisions = engine
        .check(smallvec![check])
        .await
        .expect("engine answers");
    decisions.iter().all(|decision| decision.allowed)
}

#[tokio::test(start_paused = true)]
async fn all_limits_of_a_descriptor_decide_together() {
    let engine = engine_at(MIDNIGHT, 1000);
    let per_second = Rate::fixed(2, Unit::Second);
    let per_day = Rate::fixed(5, Unit::Day);
    let both = || {
        check(
            vec![counter("ann", per_second), counter("ann", per_day)],
            1,
            None,
        )
    };
    assert!(allowed(&engine, both()).await);
    assert!(allowed(&engine, both()).await);
    // Over the per-second limit: the daily quota must not be charged for it.
    for _ in 0..10 {
        let decisions = engine.check(smallvec![both()]).await.expect("answers");
        assert!(!decisions[0].allowed, "per second is over");
        assert_eq!(decisions[1].remaining, 3, "the day still has 3 left");
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(allowed(&engine, both()).await);
    let decisions = engine.check(smallvec![both()]).await.expect("answers");
    assert_eq!(decisions[1].remaining, 1);
}

/// Counting rejected hits (`--count-rejected-hits`), each limit of a descriptor counts on
/// its own, as the reference increments each key: over the per-second limit, the day is
/// charged too. Neither a counted check nor a refund ever waits, even with a wait policy.
#[tokio::test(start_paused = true)]
async fn a_counted_rejection_charges_every_limit_and_a_refund_gives_back_to_each() {
    let engine = engine_at(MIDNIGHT, 1000);
    let per_second = Rate::fixed(2, Unit::Second);
    let per_day = Rate::fixed(5, Unit::Day);
    let waits = Some(WaitPolicy {
        max_wait: Duration::from_secs(5),
        max_queue: 10,
    });
    let both = |cost, charge| Check {
        charge,
        ..check(
            vec![counter("bo", per_second), counter("bo", per_day)],
            cost,
            waits,
        )
    };
    assert!(allowed(&engine, both(2, Charge::Always)).await);
    let decisions = engine
        .check(smallvec![both(1, Charge::Always)])
        .await
        .expect("answers at once, without waiting");
    assert!(!decisions[0].allowed, "per second is over");
    assert!(decisions[1].allowed, "the day had room, and counted it");
    assert_eq!(decisions[1].remaining, 2);
    let back = engine
        .check(smallvec![both(4, Charge::Refund)])
        .await
        .expect("answers");
    assert!(back.iter().all(|decision| decision.allowed));
    assert_eq!(
        (back[0].remaining, back[1].remaining),
        (2, 5),
        "never above capacity"
    );
    assert_eq!(
        shard_stats(&engine).waits_rejected.load(Ordering::Relaxed),
        0
    );
}

/// A refund to keys the shard does not hold gives nothing back and creates no key, so a
/// full shard still answers it.
#[tokio::test(start_paused = true)]
async fn a_refund_to_an_unknown_key_creates_none_even_when_the_shard_is_full() {
    let engine = engine_at(MIDNIGHT, 1);
    let rate = Rate::fixed(5, Unit::Hour);
    assert!(allowed(&engine, check(vec![counter("held", rate)], 1, None)).await);
    let refund = Check {
        charge: Charge::Refund,
        ..check(vec![counter("other", rate)], 3, None)
    };
    let decisions = engine.check(smallvec![refund]).await.expect("answered");
    assert_eq!((decisions[0].allowed, decisions[0].remaining), (true, 5));
    assert_eq!(engine.figures()[0].live_keys, 1, "no key created");
}

#[tokio::test(start_paused = true)]
async fn zero_cost_checks_do_not_create_keys() {
    let engine = engine_at(MIDNIGHT, 1000);
    let rate = Rate::fixed(1, Unit::Minute);
    for n in 0..50 {
        let decisions = engine
            .check(smallvec![check(
                vec![counter(&n.to_string(), rate)],
                0,
                None
            )])
            .await
            .expect("answers");
        assert!(decisions[0].allowed);
    }
    assert_eq!(engine.figures()[0].live_keys, 0);
}

fn waiting(max_wait_ms: u64, max_queue: u32) -> Option<WaitPolicy> {
    Some(WaitPolicy {
        max_wait: Duration::from_millis(max_wait_ms),
        max_queue,
    })
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_is_admitted_when_the_window_turns() {
    // 0.9 s into a second: the next window opens in 100 ms, inside a 150 ms wait.
    let engine = engine_at(MIDNIGHT + 900_000_000, 1000);
    let rate = Rate::fixed(1, Unit::Second);
    assert!(
        allowed(
            &engine,
            check(vec![counter("a", rate)], 1, waiting(150, 10))
        )
        .await
    );
    let started = tokio::time::Instant::now();
    assert!(
        allowed(
            &engine,
            check(vec![counter("a", rate)], 1, waiting(150, 10))
        )
        .await
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(100),
        "admitted right at the boundary"
    );
    assert_eq!(
        shard_stats(&engine).waits_admitted.load(Ordering::Relaxed),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_be_admitted_in_time_is_rejected_at_once() {
    let engine = engine_at(MIDNIGHT + 500_000_000, 1000);
    let rate = Rate::fixed(1, Unit::Second);
    assert!(allowed(&engine, check(vec![counter("a", rate)], 1, waiting(50, 10))).await);
    let started = tokio::time::Instant::now();
    assert!(!allowed(&engine, check(vec![counter("a", rate)], 1, waiting(50, 10))).await);
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "500 ms to wait is over the 50 ms bound"
    );
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order_and_the_queue_is_bounded() {
    // A bucket of 1 refilling every 100 ms; waits up to 250 ms; at most 3 waiters.
    let engine = engine_at(MIDNIGHT, 1000);
    let rate = Rate::new(Algorithm::TokenBucket, 10, Unit::Second, Some(1));
    let policy = waiting(250, 3);
    assert!(allowed(&engine, check(vec![counter("q", rate)], 1, policy)).await);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for n in 0..4 {
        let engine = engine.clone();
        let done = done_tx.clone();
        tokio::spawn(async move {
            let ok = allowed(&engine, check(vec![counter("q", rate)], 1, policy)).await;
            let _ = done.send((n, ok, tokio::time::Instant::now()));
        });
        // Arrive in order.
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
    }
    drop(done_tx);
    let start = tokio::time::Instant::now();
    let mut finished = Vec::new();
    while let Some((n, ok, at)) = done_rx.recv().await {
        finished.push((n, ok, (at - start).as_millis()));
    }
    finished.sort_by_key(|(_, _, at)| *at);
    assert_eq!(
        finished,
        [
            (3, false, 0),
            (0, true, 100),
            (1, true, 200),
            (2, false, 250)
        ],
        "the 4th finds the queue full; two are admitted in order; the 3rd times out"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_caller_left_consumes_nothing() {
    let engine = engine_at(MIDNIGHT + 900_000_000, 1000);
    let rate = Rate::fixed(1, Unit::Second);
    assert!(
        allowed(
            &engine,
            check(vec![counter("a", rate)], 1, waiting(200, 10))
        )
        .await
    );
    let gone = tokio::time::timeout(
        Duration::from_millis(50),
        allowed(
            &engine,
            check(vec![counter("a", rate)], 1, waiting(200, 10)),
        ),
    )
    .await;
    assert!(gone.is_err(), "still waiting when the caller gave up");
    tokio::time::advance(Duration::from_millis(60)).await;
    // The new window's one hit is still there for the next caller.
    assert!(allowed(&engine, check(vec![counter("a", rate)], 1, None)).await);
}

#[tokio::test(start_paused = true)]
async fn live_keys_are_capped_and_a_key_goes_once_its_window_is_over() {
    let engine = engine_at(MIDNIGHT, 3);
    let rate = Rate::fixed(10, Unit::Second);
    for user in ["a", "b", "c"] {
        assert!(allowed(&engine, check(vec![counter(user, rate)], 1, None)).await);
    }
    let full = engine
        .check(smallvec![check(vec![counter("d", rate)], 1, None)])
        .await;
    assert_eq!(
        full,
        Err(StoreError::KeyCapacity {
            shard: 0,
            max_keys: 3
        })
    );
    // Known keys still work while full.
    assert!(allowed(&engine, check(vec![counter("a", rate)], 1, None)).await);
    let stats = shard_stats(&engine);
    assert_eq!(stats.key_capacity_hits.load(Ordering::Relaxed), 1);
    // The window ends at 1 s: kept until then, forgotten within a sweep (0.5 s) after.
    tokio::time::sleep(Duration::from_millis(999)).await;
    assert_eq!(
        engine.figures()[0].live_keys,
        3,
        "kept while the window lasts"
    );
    tokio::time::sleep(Duration::from_millis(502)).await;
    assert_eq!(engine.figures()[0].live_keys, 0);
    assert_eq!(stats.expired_keys.load(Ordering::Relaxed), 3);
    assert!(allowed(&engine, check(vec![counter("d", rate)], 1, None)).await);
}

#[tokio::test(start_paused = true)]
async fn each_algorithms_key_is_kept_while_its_state_matters_and_forgotten_soon_after() {
    // 2 a minute, both taken 10 s into the minute: the state matters until the window ends
    // (60 s), the following window ends (120 s), or the bucket is full again (70 s).
    for (algorithm, matters_until) in [
        (Algorithm::FixedWindow, 60),
        (Algorithm::SlidingWindow, 120),
        (Algorithm::TokenBucket, 70),
        (Algorithm::Gcra, 70),
    ] {
        let engine = engine_at(MIDNIGHT + 10 * S, 100);
        let rate = Rate::new(algorithm, 2, Unit::Minute, Some(2));
        assert!(
            allowed(&engine, check(vec![counter("a", rate)], 2, None)).await,
            "{algorithm:?}: the first 2"
        );
        let live = |engine: &Engine| engine.figures()[0].live_keys;
        tokio::time::sleep(Duration::from_millis((matters_until - 10) * 1000 - 1)).await;
        assert_eq!(
            live(&engine),
            1,
            "{algorithm:?}: kept while its state matters"
        );
        assert!(
            !allowed(&engine, check(vec![counter("a", rate)], 2, None)).await,
            "{algorithm:?}: and it still limits then"
        );
        // Forgotten within one sweep of the table (0.5 s).
        tokio::time::sleep(Duration::from_millis(502)).await;
        assert_eq!(live(&engine), 0, "{algorithm:?}: forgotten soon after");
    }
}

#[test]
fn a_key_and_its_state_take_40_bytes_in_the_map() {
    assert_eq!(std::mem::size_of::<KeyId>(), 24);
    assert_eq!(std::mem::size_of::<Slot>(), 16);
}

#[tokio::test(start_paused = true)]
async fn a_denied_multi_limit_check_reports_when_it_would_pass() {
    let engine = engine_at(MIDNIGHT + 250_000_000, 1000);
    let per_second = Rate::fixed(1, Unit::Second);
    let per_day = Rate::fixed(100, Unit::Day);
    let both = || {
        check(
            vec![counter("r", per_day), counter("r", per_second)],
            1,
            None,
        )
    };
    assert!(allowed(&engine, both()).await);
    let decisions = engine.check(smallvec![both()]).await.expect("answers");
    assert!(decisions[0].allowed, "the day has room");
    assert!(!decisions[1].allowed, "the second is used up");
    assert_eq!(
        decisions[1].retry_after,
        Some(750_000_000),
        "the next second starts in 750 ms"
    );
}

/// The finding: at the key cap, a request naming a known descriptor and a new one got
/// UNAVAILABLE, yet the known descriptor's quota was spent. A request that fails consumes
/// nothing on any of its descriptors, whatever the algorithm.
#[tokio::test(start_paused = true)]
async fn a_request_failing_at_the_key_cap_consumes_nothing_on_any_descriptor() {
    for algorithm in Algorithm::ALL {
        let engine = engine_at(MIDNIGHT, 2);
        let rate = Rate::new(algorithm, 3, Unit::Hour, Some(3));
        assert!(allowed(&engine, check(vec![counter("known", rate)], 1, None)).await);
        let request = smallvec![
            check(vec![counter("known", rate)], 2, None),
            check(vec![counter("new", rate)], 3, None),
            check(vec![counter("newer", rate)], 1, None),
        ];
        assert!(
            matches!(
                engine.check(request).await,
                Err(StoreError::KeyCapacity { .. })
            ),
            "{algorithm}: the third key does not fit"
        );
        let left = engine
            .check(smallvec![
                check(vec![counter("known", rate)], 0, None),
                check(vec![counter("new", rate)], 0, None),
            ])
            .await
            .expect("a check of known keys");
        assert_eq!(
            (left[0].remaining, left[1].remaining),
            (2, 3),
            "{algorithm}: nothing of the failed request was counted"
        );
        assert!(allowed(&engine, check(vec![counter("known", rate)], 2, None)).await);
        assert!(!allowed(&engine, check(vec![counter("known", rate)], 1, None)).await);
    }
}

#[tokio::test(start_paused = true)]
async fn what_a_request_consumed_is_given_back_in_the_windows_it_was_counted_in() {
    // 0.5 s into a second.
    let engine = engine_at(MIDNIGHT + 500_000_000, 100);
    let window = Rate::fixed(2, Unit::Second);
    // A bucket of 1 refilling every 100 ms, emptied first: the request's second check waits.
    let bucket = Rate::new(Algorithm::TokenBucket, 10, Unit::Second, Some(1));
    assert!(allowed(&engine, check(vec![counter("b", bucket)], 1, None)).await);
    let request = [
        check(vec![counter("w", window)], 1, None),
        check(vec![counter("b", bucket)], 1, waiting(250, 3)),
    ];
    let started = engine.begin(&request).expect("room for both keys");
    let (decisions, consumed) = started.finish_consumed().await.expect("admitted");
    assert!(decisions.iter().all(|decision| decision.allowed));
    assert_eq!(
        consumed
            .iter()
            .map(|(position, _)| *position)
            .collect::<Vec<_>>(),
        [0, 1],
        "both consumed, the waiter when it was admitted"
    );
    // The request failed elsewhere: both counters are as if it had never been admitted.
    engine.give_back(&request, &consumed);
    assert!(allowed(&engine, check(vec![counter("b", bucket)], 1, None)).await);
    assert!(allowed(&engine, check(vec![counter("w", window)], 2, None)).await);

    // Given back after its window ended, a hit takes nothing off the next window's count.
    tokio::time::advance(Duration::from_millis(200)).await;
    let late = [check(vec![counter("late", window)], 2, None)];
    let (_, consumed) = engine
        .begin(&late)
        .expect("room")
        .finish_consumed()
        .await
        .expect("admitted");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(allowed(&engine, check(vec![counter("late", window)], 1, None)).await);
    engine.give_back(&late, &consumed);
    assert!(allowed(&engine, check(vec![counter("late", window)], 1, None)).await);
    assert!(
        !allowed(&engine, check(vec![counter("late", window)], 1, None)).await,
        "the new window's limit of 2 holds"
    );
}

/// Two rules as the limits files would tag them: "flood" without a `max_keys` of its own,
/// "capped" with `max_keys: 3`.
struct TwoRules;

const FLOOD: u32 = 0xf100d;
const CAPPED: u32 = 0xcab;

impl Rules for TwoRules {
    fn max_keys(&self, rule: u32) -> Option<u32> {
        (rule == CAPPED).then_some(3)
    }

    fn name(&self, rule: u32) -> Option<Arc<str>> {
        match rule {
            FLOOD => Some(Arc::from("edge > remote_address")),
            CAPPED => Some(Arc::from("edge > api_key")),
            _ => None,
        }
    }
}

fn rule_counter(rule: u32, value: &str, rate: Rate) -> Counter {
    Counter {
        key: KeyBuilder::new("edge")
            .entry("k", &format!("{rule}:{value}"))
            .rule_key(&rate, rule),
        rate,
    }
}

fn budget_engine(start: u64, max_keys: usize, share: f64) -> Engine {
    Engine::spawn_with_rules(
        EngineConfig {
            shards: 1,
            max_keys,
            max_waiters: 100,
            rule_key_share: share,
        },
        Clock::starting_at(start),
        Some(Arc::new(TwoRules)),
    )
}

async fn admit(engine: &Engine, rule: u32, value: &str, rate: Rate) -> Result<bool, StoreError> {
    let decisions = engine
        .check(smallvec![check(
            vec![rule_counter(rule, value, rate)],
            1,
            None
        )])
        .await?;
    Ok(decisions.iter().all(|decision| decision.allowed))
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_new_values_on_one_rule_leaves_the_other_rules_their_room() {
    // 10 keys in all; a rule without max_keys may hold half of them.
    let engine = budget_engine(MIDNIGHT, 10, 0.5);
    let rate = Rate::fixed(2, Unit::Minute);
    for n in 0..5 {
        assert_eq!(admit(&engine, FLOOD, &n.to_string(), rate).await, Ok(true));
    }
    for n in 5..50 {
        assert_eq!(
            admit(&engine, FLOOD, &n.to_string(), rate).await,
            Err(StoreError::RuleKeyBudget {
                shard: 0,
                rule: FLOOD,
                max_keys: 5
            }),
            "the flooded rule's new keys are refused at its budget"
        );
    }
    // Its known keys still count, and exactly.
    assert_eq!(admit(&engine, FLOOD, "0", rate).await, Ok(true));
    assert_eq!(admit(&engine, FLOOD, "0", rate).await, Ok(false));
    // Another rule's new clients are admitted and limited exactly; its own max_keys of 3
    // binds before the table's cap.
    for user in ["ann", "bob", "cat"] {
        assert_eq!(admit(&engine, CAPPED, user, rate).await, Ok(true));
        assert_eq!(admit(&engine, CAPPED, user, rate).await, Ok(true));
        assert_eq!(admit(&engine, CAPPED, user, rate).await, Ok(false));
    }
    assert!(matches!(
        admit(&engine, CAPPED, "dan", rate).await,
        Err(StoreError::RuleKeyBudget {
            rule: CAPPED,
            max_keys: 3,
            ..
        })
    ));
    let keys = engine.rule_keys();
    assert_eq!(
        keys,
        vec![
            (
                CAPPED,
                RuleKeys {
                    live: 3,
                    refused: 1,
                    budget: 3
                }
            ),
            (
                FLOOD,
                RuleKeys {
                    live: 5,
                    refused: 45,
                    budget: 5
                }
            ),
        ]
    );
    assert_eq!(&*engine.rule_name(FLOOD), "edge > remote_address");
    // The window ends: the rule's keys go, and with them its use of the budget.
    tokio::time::sleep(Duration::from_millis(60_600)).await;
    assert_eq!(engine.rule(FLOOD).live, 0);
    assert_eq!(engine.rule(CAPPED).live, 0);
    assert_eq!(admit(&engine, FLOOD, "new", rate).await, Ok(true));
    assert_eq!(engine.rule(FLOOD).live, 1);
}

#[tokio::test(start_paused = true)]
async fn a_rules_key_count_follows_resets_handoffs_and_imports() {
    let engine = budget_engine(MIDNIGHT, 100, 1.0);
    let rate = Rate::fixed(5, Unit::Hour);
    for user in ["ann", "bob", "cat"] {
        assert_eq!(admit(&engine, CAPPED, user, rate).await, Ok(true));
    }
    let ann = rule_counter(CAPPED, "ann", rate).key;
    assert_eq!(engine.reset(&[ann]), 1);
    assert_eq!(engine.rule(CAPPED).live, 2);
    assert_eq!(admit(&engine, CAPPED, "dan", rate).await, Ok(true));
    // A handoff takes every key away, and its rule's count with it.
    let exported = engine.export(Arc::new(|_| false));
    assert_eq!(exported.len(), 3);
    assert_eq!(engine.rule(CAPPED).live, 0);
    // Taken back, they count again; past the rule's budget an import keeps no more.
    let mut more = exported.clone();
    let extra = rule_counter(CAPPED, "eve", rate).key;
    more.push((extra, exported[0].1));
    assert_eq!(
        engine.import(more),
        3,
        "the rule's budget of 3 holds on import too"
    );
    assert_eq!(engine.rule(CAPPED).live, 3);
}

fn big_shard() -> Shard {
    let config = ShardConfig {
        max_keys: 1_000_000,
        max_waiters: 10,
        rule_max_keys: 1_000_000,
        shards: 1,
    };
    Shard::new(0, config, None, Arc::new(ShardStats::default()))
}

/// Checks one key of `rate` for each of `values` at `now`.
fn fill(shard: &mut Shard, rate: Rate, values: std::ops::Range<u64>, now: u64) {
    let mut out = Decisions::new();
    for n in values {
        let check = check(vec![counter(&n.to_string(), rate)], 1, None);
        assert!(matches!(
            shard.check(&check, now, &mut out),
            Ok(Stepped::Decided)
        ));
        out.clear();
    }
}

fn swept_keys(shard: &Shard) -> u64 {
    shard.counters.stats.swept_keys.load(Ordering::Relaxed)
}

#[test]
fn a_sweep_step_looks_at_a_bounded_number_of_keys_however_large_the_table() {
    let mut shard = big_shard();
    fill(
        &mut shard,
        Rate::fixed(10, Unit::Second),
        0..300_000,
        MIDNIGHT,
    );
    // A whole cycle late, every key is due, yet one step looks at no more than
    // SWEEP_STEP_KEYS keys (a part is about 300 here) and asks to run again at once, lock
    // released.
    let late = MIDNIGHT + 2 * S;
    let mut steps = 0;
    let mut parts = 0;
    loop {
        let (before, looked) = (shard.sweep_part, swept_keys(&shard));
        let next = shard.tick(late);
        let swept = (shard.sweep_part + table::PARTS - before) % table::PARTS;
        let looked = swept_keys(&shard) - looked;
        assert!(swept >= 1, "step {steps} swept no part");
        assert!(
            looked <= SWEEP_STEP_KEYS as u64,
            "step {steps} looked at {looked} keys"
        );
        parts += swept;
        steps += 1;
        if next > late {
            break;
        }
    }
    assert!(
        (table::PARTS..table::PARTS + 2 * SWEEP_AHEAD as usize).contains(&parts),
        "the late cycle caught up, part by part: {parts}"
    );
    assert!(steps >= 300_000 / SWEEP_STEP_KEYS, "{steps} steps");
    assert_eq!(shard.live_keys(), 0, "every second's key went");
    assert_eq!(swept_keys(&shard), 300_000, "each looked at once");
}

#[test]
fn keys_of_long_limits_are_looked_at_when_due_not_on_every_sweep() {
    let mut shard = big_shard();
    // 100,000 keys of an hourly limit beside 100 of a per-second one, swept for a minute.
    fill(
        &mut shard,
        Rate::fixed(10, Unit::Hour),
        0..100_000,
        MIDNIGHT,
    );
    let second = Rate::fixed(10, Unit::Second);
    let sweep_until = |shard: &mut Shard, from: u64, to: u64| {
        let (mut at, mut next_fill) = (from, from);
        while at < to {
            if at >= next_fill {
                fill(shard, second, 0..100, at);
                next_fill = at + S / 2;
            }
            at = shard.tick(at).max(at + 1);
        }
    };
    sweep_until(&mut shard, MIDNIGHT, MIDNIGHT + 60 * S);
    let looked = swept_keys(&shard);
    assert!(
        looked < 50_000,
        "the hourly keys were passed over: {looked} keys looked at in a minute"
    );
    assert_eq!(shard.live_keys(), 100_000 + 100);
    // When the hour ends they are all due, and all go within the sweep's cycle.
    let hour = MIDNIGHT + 3_600 * S;
    sweep_until(&mut shard, hour, hour + 9 * S / 10);
    assert_eq!(shard.live_keys(), 100, "only this second's keys are left");
    assert!(swept_keys(&shard) - looked >= 100_000);
}

#[test]
fn a_refund_that_fills_a_bucket_again_lets_its_key_go_at_once() {
    let mut shard = big_shard();
    // A token bucket of 10 a minute, emptied: it matters until it is full again, a minute
    // on; its part is due then.
    let rate = Rate::new(Algorithm::TokenBucket, 10, Unit::Minute, None);
    let counter = counter("alice", rate);
    let mut out = Decisions::new();
    let spend = check(vec![counter], 10, None);
    assert!(matches!(
        shard.check(&spend, MIDNIGHT, &mut out),
        Ok(Stepped::Decided)
    ));
    assert!(out[0].allowed);
    // Given back a second later (its request failed): full again, nothing left to keep.
    out.clear();
    let refund = Check {
        charge: Charge::Refund,
        ..spend
    };
    let at = MIDNIGHT + S;
    assert!(matches!(
        shard.check(&refund, at, &mut out),
        Ok(Stepped::Decided)
    ));
    assert_eq!(shard.live_keys(), 1);
    // Within one sweep cycle it is gone, not a minute later.
    let mut now = at;
    while now < at + S {
        now = shard.tick(now).max(now + 1);
    }
    assert_eq!(shard.live_keys(), 0, "the refunded key went with the sweep");
}
