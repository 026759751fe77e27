use super::*;
use crate::algorithm::{Algorithm, Unit};

#[test]
fn fnv1a_golden_vectors() {
    // From the FNV reference test suite.
    assert_eq!(fnv1a64(FNV64_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(FNV64_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(FNV64_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
    assert_eq!(
        fnv1a128(FNV128_OFFSET, b"a"),
        0xd228_cb69_6f1a_8caf_7891_2b70_4e4a_8964
    );
}

#[test]
fn fmix64_golden_vectors() {
    assert_eq!(fmix64(0), 0);
    assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
}

fn key_of(domain: &str, entries: &[(&str, &str)], rate: &Rate) -> KeyId {
    let mut builder = KeyBuilder::new(domain);
    for (key, value) in entries {
        builder.entry(key, value);
    }
    builder.key(rate)
}

#[test]
fn fields_are_length_prefixed_so_boundaries_matter() {
    let rate = Rate::fixed(1, Unit::Second);
    let ab_c = key_of("d", &[("ab", "c")], &rate);
    let a_bc = key_of("d", &[("a", "bc")], &rate);
    assert_ne!(ab_c, a_bc);
    assert_ne!(ab_c.route, a_bc.route);
    let one = key_of("d", &[("k", "v1"), ("x", "")], &rate);
    let two = key_of("d", &[("k", "v"), ("1x", "")], &rate);
    assert_ne!(one, two);
    assert_ne!(
        key_of("da", &[("k", "v")], &rate),
        key_of("d", &[("ak", "v")], &rate)
    );
}

#[test]
fn limits_of_one_descriptor_share_a_route_but_not_an_identity() {
    let entries = [("api_key", "abc")];
    let per_second = key_of("edge", &entries, &Rate::fixed(10, Unit::Second));
    let per_day = key_of("edge", &entries, &Rate::fixed(1000, Unit::Day));
    let bucket = key_of(
        "edge",
        &entries,
        &Rate::new(Algorithm::TokenBucket, 10, Unit::Second, None),
    );
    assert_eq!(per_second.route, per_day.route);
    assert_eq!(per_second.route, bucket.route);
    assert_ne!(per_second.id, per_day.id);
    assert_ne!(per_second.id, bucket.id);
    // The limit's size is not identity: changing requests_per_unit keeps the counter.
    assert_eq!(
        per_second,
        key_of("edge", &entries, &Rate::fixed(99, Unit::Second))
    );
}

#[test]
fn keys_of_minute_and_longer_units_are_marked_long_lived_and_keep_their_rule() {
    let entries = [("api_key", "abc")];
    let mut builder = KeyBuilder::new("edge");
    builder.entry("api_key", "abc");
    for unit in Unit::ALL {
        let long_lived = unit != Unit::Second;
        for algorithm in Algorithm::ALL {
            let rate = Rate::new(algorithm, 10, unit, None);
            for rule in [0, 1, u32::MAX] {
                let key = builder.rule_key(&rate, rule);
                assert_eq!(key.long_lived(), long_lived, "{unit:?} {algorithm:?}");
                assert_eq!(key.rule(), rule, "the mark leaves the rule tag alone");
            }
        }
    }
    // The mark is part of the identity, so it never makes two units one counter.
    assert_ne!(
        key_of("edge", &entries, &Rate::fixed(1, Unit::Second)).id,
        key_of("edge", &entries, &Rate::fixed(1, Unit::Minute)).id
    );
}

/// Keys are stored (Redis key names, counters handed between nodes of two releases): a
/// limit without `unit_multiplier` keeps the id it has always had.
#[test]
fn the_key_of_a_limit_without_a_multiplier_is_what_it_always_was() {
    let key = key_of("edge", &[("api_key", "abc")], &Rate::fixed(5, Unit::Minute));
    assert_eq!(
        (key.route, key.id),
        (
            16_213_451_075_493_399_090,
            [8_369_064_600_279_328_132, 1_125_060_391_060_111_360]
        )
    );
}

#[test]
fn a_limit_is_its_window_so_equal_windows_share_a_key_and_others_do_not() {
    let entries = [("api_key", "abc")];
    let key = |rate: Rate| key_of("edge", &entries, &rate);
    let every = |unit, multiplier| Rate::fixed(5, unit).every(multiplier).expect("a window");
    // Without a multiplier (or with 1) a key is what it always was: the slot is the unit
    // and the algorithm, nothing more.
    assert_eq!(
        key(Rate::fixed(5, Unit::Second)),
        key(every(Unit::Second, 1))
    );
    // Equal windows, whatever the unit they are written in.
    assert_eq!(key(every(Unit::Day, 7)), key(Rate::fixed(5, Unit::Week)));
    assert_eq!(key(every(Unit::Day, 30)), key(Rate::fixed(5, Unit::Month)));
    assert_eq!(
        key(every(Unit::Second, 60)),
        key(Rate::fixed(5, Unit::Minute))
    );
    assert_eq!(key(every(Unit::Second, 7_200)), key(every(Unit::Hour, 2)));
    // Different windows (or algorithms) are different counters.
    let windows = [
        key(Rate::fixed(5, Unit::Second)),
        key(every(Unit::Second, 10)),
        key(every(Unit::Second, 30)),
        key(Rate::fixed(5, Unit::Minute)),
        key(every(Unit::Minute, 5)),
        key(every(Unit::Hour, 2)),
        key(Rate::new(Algorithm::TokenBucket, 5, Unit::Second, None)
            .every(10)
            .expect("10 s")),
    ];
    for (index, one) in windows.iter().enumerate() {
        for other in &windows[index + 1..] {
            assert_ne!(one.id, other.id);
            assert_eq!(one.route, other.route, "a descriptor has one owner");
        }
    }
    // A 10-second window's state is looked at every second; a 2-minute one's is long-lived.
    assert!(!key(every(Unit::Second, 10)).long_lived());
    assert!(key(every(Unit::Second, 120)).long_lived());
}

/// Counts keys per shard and checks every shard is within 4.5 standard deviations of the
/// mean of a fair random assignment (a skewed hash misses this by far; the inputs are fixed,
/// so the test is deterministic).
fn assert_spread(routes: &[u64], shards: usize, what: &str) {
    let mut counts = vec![0usize; shards];
    for route in routes {
        counts[shard_of(*route, shards)] += 1;
    }
    let mean = routes.len() as f64 / shards as f64;
    let sigma = (mean * (1.0 - 1.0 / shards as f64)).sqrt();
    for (shard, count) in counts.iter().enumerate() {
        let off = (*count as f64 - mean).abs() / mean;
        assert!(
            (*count as f64 - mean).abs() <= 4.5 * sigma,
            "{what}: shard {shard} of {shards} got {count}, mean {mean:.0} ({:.1}% off): {counts:?}",
            off * 100.0
        );
    }
}

fn routes(values: impl Iterator<Item = String>) -> Vec<u64> {
    values
        .map(|value| {
            let mut builder = KeyBuilder::new("edge");
            builder.entry("api_key", &value);
            builder.route()
        })
        .collect()
}

#[test]
fn adversarial_keys_spread_evenly_over_shards() {
    let sequential = routes((0..20_000).map(|n| format!("user-{n}")));
    let last_byte = routes((0..=255u8).flat_map(|b| {
        (0..40).map(move |prefix| format!("{prefix:04}{}", char::from(b % 94 + 33)))
    }));
    // 26^3 distinct values, each made of doubled characters: the pairs cancel under XOR, so the
    // low bit of the raw FNV-1a hash is the same for every key.
    let doubled = routes((0..17_576u32).map(|n| {
        let a = char::from(b'a' + (n % 26) as u8);
        let b = char::from(b'a' + (n / 26 % 26) as u8);
        let c = char::from(b'A' + (n / 676 % 26) as u8);
        format!("{a}{a}{b}{b}{c}{c}")
    }));
    let ips =
        routes((0..20_000u32).map(|n| format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255)));
    for shards in [2, 3, 4, 8, 16, 25] {
        assert_spread(&sequential, shards, "sequential user ids");
        assert_spread(&doubled, shards, "doubled characters");
        assert_spread(&ips, shards, "ip addresses");
    }
    assert_spread(&last_byte, 8, "values differing in the last byte");
    // Without the mix, the doubled keys would all land on one of two shards, which the same
    // check catches.
    let raw_even = doubled.iter().filter(|route| *route % 2 == 0).count();
    assert!(
        raw_even == 0 || raw_even == doubled.len(),
        "raw FNV low bit is constant here"
    );
}

#[test]
fn key_hasher_spreads_ids_over_buckets() {
    let ids: Vec<u64> = (0..10_000u64)
        .map(|n| {
            KeyHasher::default().hash_one(key_of(
                "d",
                &[("k", &n.to_string())],
                &Rate::fixed(1, Unit::Second),
            ))
        })
        .collect();
    // Low bits pick the bucket, the top 7 bits the control byte: both must vary.
    let low: std::collections::HashSet<u64> = ids.iter().map(|h| h & 0x3ff).collect();
    let high: std::collections::HashSet<u64> = ids.iter().map(|h| h >> 57).collect();
    assert!(low.len() > 1000, "{} distinct low values", low.len());
    assert_eq!(high.len(), 128);
}

#[test]
fn a_shared_pattern_is_not_the_same_key_as_a_value_spelled_like_it() {
    let rate = Rate::fixed(1, Unit::Second);
    let mut shared = KeyBuilder::new("d");
    shared.shared_entry("path", "/files/*");
    let literal = key_of("d", &[("path", "/files/*")], &rate);
    assert_ne!(shared.key(&rate), literal);
    assert_ne!(shared.route(), literal.route);
    // The same pattern always gives the same key.
    let mut again = KeyBuilder::new("d");
    again.shared_entry("path", "/files/*");
    assert_eq!(shared.key(&rate), again.key(&rate));
}
