//! Unit tests that need no Redis server; the store against real Redis is in
//! `tests/it/redis_store.rs`.

use super::blocked::{BlockedCache, SHARDS};
use super::metrics::RedisStats;
use super::*;
use crate::algorithm::{Algorithm, Unit};
use crate::check::Counter;
use crate::check::States;
use crate::key::KeyBuilder;

fn check(rate: Rate, cost: u64) -> Check {
    let key = KeyBuilder::new("d").key(&rate);
    Check {
        counters: [Counter { key, rate }].into_iter().collect(),
        cost,
        wait: None,
        charge: crate::check::Charge::Admitted,
    }
}

/// A key's value as the script writes it.
fn doubles(numbers: &[f64]) -> Vec<u8> {
    numbers
        .iter()
        .flat_map(|number| number.to_le_bytes())
        .collect()
}

#[test]
fn keys_keep_one_descriptor_in_one_cluster_slot() {
    let mut builder = KeyBuilder::new("edge");
    builder.entry("api_key", "a");
    let minute = builder.key(&Rate::fixed(10, Unit::Minute));
    let hour = builder.key(&Rate::fixed(100, Unit::Hour));
    let (a, b) = (redis_key(&minute), redis_key(&hour));
    assert_ne!(a, b);
    let tag = |key: &str| key[key.find('{').unwrap_or(0)..=key.find('}').unwrap_or(0)].to_owned();
    assert_eq!(tag(&a), tag(&b), "{a} {b}");
    assert_eq!(a.len(), 54);
}

#[test]
fn keys_are_spelled_as_earlier_versions_spelled_them() {
    // Processes of two versions share one Redis during a rolling update.
    let key = KeyId {
        route: 0x0123_4567_89ab_cdef,
        id: [0xfedc_ba98_7654_3210, 0x1],
    };
    assert_eq!(
        redis_key(&key),
        "rk:{0123456789abcdef}:fedcba98765432100000000000000001"
    );
}

#[test]
fn a_batch_reply_is_split_per_request_and_a_malformed_one_is_refused() {
    let rate = Rate::fixed(10, Unit::Minute);
    let first: Checks = [check(rate, 1)].into_iter().collect();
    let second: Checks = [check(rate, 2)].into_iter().collect();
    let time = 1_700_000_123 * NANOS_PER_SEC + 456;
    let stored = doubles(&[1_700_000_123.0, 456.0, 3.0]);
    // The first request: admitted, its key missing; the second: refused, its key holding 3.
    let mut reply = vec![1, 0, 0, 24];
    reply.extend_from_slice(&stored);
    assert_eq!(part_len(&first, &reply, 0), Some(2));
    assert_eq!(part_len(&second, &reply, 2), Some(26));
    assert_eq!(part_len(&second, &reply[..20], 2), None, "cut short");

    let mut at = 0;
    let (admitted, at_time, states) =
        read_states(&first[0], time, &reply, &mut at).expect("well formed");
    assert!(admitted);
    assert_eq!(at_time, time);
    assert_eq!(states[0], algorithm::init(&rate, time));
    let (admitted, _, states) =
        read_states(&second[0], time, &reply, &mut at).expect("well formed");
    assert!(!admitted);
    assert_eq!(states[0].b, 3);
    assert_eq!(at, reply.len());

    for malformed in [
        &[2, 0][..],
        &[1][..],
        &[1, 24, 0][..],
        &[1, 8, 0, 0, 0, 0, 0, 0, 0, 0][..],
    ] {
        assert!(
            read_states(&first[0], time, malformed, &mut 0).is_none(),
            "{malformed:?}"
        );
    }
}

#[test]
fn a_blocked_descriptor_is_answered_locally_until_it_has_room() {
    let cache = BlockedCache::new(100);
    let stats = RedisStats::default();
    let rate = Rate::fixed(2, Unit::Second);
    let check = check(rate, 1);
    let start = 10 * NANOS_PER_SEC;
    // Two hits consumed: no room left until the window ends.
    let mut states: States = [State { a: 10, b: 2 }].into_iter().collect();
    assert!(
        check
            .decide(&mut states, start, &mut Decisions::new())
            .is_some()
    );
    cache.remember(&check, &states, start, &stats);
    let local = cache.answer(&check, start + 500_000_000).expect("blocked");
    assert!(!local[0].allowed);
    assert_eq!(local[0].retry_after, Some(500_000_000));
    assert_eq!(
        cache.answer(&check, start + NANOS_PER_SEC),
        None,
        "the next window asks Redis"
    );
    assert_eq!(cache.len(), 0, "an expired entry is dropped");
}

#[test]
fn a_descriptor_with_room_is_not_cached_and_the_cache_is_bounded() {
    let cache = BlockedCache::new(SHARDS);
    let stats = RedisStats::default();
    let rate = Rate::fixed(5, Unit::Minute);
    let open = check(rate, 1);
    let mut states: States = [State { a: 0, b: 1 }].into_iter().collect();
    open.decide(&mut states, 0, &mut Decisions::new());
    cache.remember(&open, &states, 0, &stats);
    assert_eq!(cache.len(), 0);
    for value in 0..1000 {
        let mut builder = KeyBuilder::new("d");
        builder.entry("k", &value.to_string());
        let key = builder.key(&rate);
        let full = Check {
            counters: [Counter { key, rate }].into_iter().collect(),
            cost: 1,
            wait: None,
            charge: crate::check::Charge::Admitted,
        };
        let states: States = [State { a: 0, b: 5 }].into_iter().collect();
        cache.remember(&full, &states, 0, &stats);
    }
    assert!(cache.len() <= SHARDS, "{} entries", cache.len());
    assert!(stats.blocked_full.load(Ordering::Relaxed) > 0);
}

#[test]
fn stored_numbers_read_back_as_the_in_memory_state() {
    let time = 1_700_000_123 * NANOS_PER_SEC + 456;
    let stored = Stored {
        time,
        numbers: [3, 1_700_000_100, 789],
    };
    let fixed = Rate::fixed(10, Unit::Minute);
    assert_eq!(
        stored.state(&fixed),
        State {
            a: time / Unit::Minute.nanos(),
            b: 3
        }
    );
    let bucket = Rate::new(Algorithm::TokenBucket, 10, Unit::Second, None);
    assert_eq!(
        stored.state(&bucket),
        State {
            a: 1_700_000_100 * NANOS_PER_SEC + 789,
            b: 3
        }
    );
    assert!(matches!(Stored::read(&[]), Some(None)));
    let bytes = doubles(&[1_700_000_123.0, 456.0, 3.0]);
    let read = Stored::read(&bytes).flatten();
    assert_eq!(read.map(|stored| stored.time), Some(time));
    assert_eq!(read.map(|stored| stored.numbers[0]), Some(3));
    assert!(
        Stored::read(b"not ours").is_none(),
        "a value of another writer"
    );
}

/// The script Redis runs has every algorithm's branch, from its `.lua` beside its kernel,
/// in place of the marker, and nothing of the files' headers.
#[test]
fn the_script_holds_every_algorithms_branch() {
    let script = script();
    assert!(!script.contains("ALGORITHMS"), "the marker is replaced");
    for algorithm in Algorithm::ALL {
        let branch = format!("    elseif algorithm == {} then\n", algorithm.code());
        assert_eq!(script.matches(&branch).count(), 1, "{algorithm}'s branch");
    }
    assert!(!script.contains("One branch of src/store/redis.lua"));
    let ending = "    else\n      -- A code this script does not know";
    assert!(
        script.contains(&format!("      end\n{ending}")),
        "the chain ends in `else`"
    );
}
