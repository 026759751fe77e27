//! Heap bytes per active key, measured through the real engine.
//!
//! A counting global allocator (from `benches/support/counting-alloc`, a separate package
//! because ratekeeper forbids `unsafe`) tracks live heap bytes. For each size, a fresh
//! runtime and engine (default config: one shard per core) are started, warmed up with
//! checks that consume nothing (cost 0, so no key is stored), then `n` distinct keys are
//! inserted through [`Engine::check`] by concurrent callers: each key is its own `api_key`
//! value under a fixed window of 1000 per day, so it stays live for the whole run. Bytes
//! per key is the growth of live heap bytes divided by `n`, read once every call returned.
//! The peak column is the high-water mark during insertion: a hash table that grows holds
//! its old and new arrays at once.
//!
//! Run with `cargo bench --bench memory`; see BENCHMARKS.md for figures.

use std::time::{Duration, Instant};

use counting_alloc::Counting;
use ratekeeper::algorithm::{Algorithm, Rate, Unit};
use ratekeeper::check::{Check, Checks, Counter};
use ratekeeper::clock::Clock;
use ratekeeper::key::KeyBuilder;
use ratekeeper::store::memory::{Engine, EngineConfig};

#[global_allocator]
static ALLOC: Counting = Counting::new();

const SIZES: [usize; 6] = [100_000, 250_000, 500_000, 1_000_000, 1_500_000, 2_000_000];
const CALLERS: usize = 16;
/// The target: live heap bytes per active key at one million keys.
const TARGET_BYTES_PER_KEY: f64 = 128.0;
/// Bytes of one map entry: `KeyId` (24) + the shard's slot (16).
const ENTRY_BYTES: usize = 40;
/// hashbrown's control bytes: one per bucket plus one SIMD group of padding.
const GROUP_WIDTH: usize = 16;

fn rate() -> Rate {
    Rate::new(Algorithm::FixedWindow, 1_000, Unit::Day, None)
}

fn check(index: usize, cost: u64) -> Checks {
    let mut builder = KeyBuilder::new("bench");
    builder.entry("api_key", &format!("user-{index:08}"));
    let rate = rate();
    smallvec::smallvec![Check {
        counters: smallvec::smallvec![Counter {
            key: builder.key(&rate),
            rate,
        }],
        cost,
        wait: None,
        charge: ratekeeper::check::Charge::Admitted,
    }]
}

/// Calls the engine for indices `0..n`, split over concurrent callers.
async fn drive(engine: &Engine, n: usize, cost: u64) {
    let tasks: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let engine = engine.clone();
            tokio::spawn(async move {
                for index in (caller..n).step_by(CALLERS) {
                    let decisions = engine
                        .check(check(index, cost))
                        .await
                        .expect("the engine answers");
                    assert!(decisions[0].allowed, "a fresh key was denied");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a caller task panicked");
    }
}

/// The bytes hashbrown allocates for a map that grew by inserts to hold `len` entries.
fn model_bytes(len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let buckets = if len < 4 {
        4
    } else if len < 8 {
        8
    } else {
        (len * 8).div_ceil(7).next_power_of_two()
    };
    buckets * (ENTRY_BYTES + 1) + GROUP_WIDTH
}

struct Row {
    keys: usize,
    grown: usize,
    peak: usize,
    model: usize,
    per_shard: Vec<u64>,
}

fn measure(keys: usize) -> Row {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let config = EngineConfig {
        max_keys: keys * 4,
        ..EngineConfig::default()
    };
    let engine = runtime.block_on(async { Engine::spawn(config, Clock::system()) });
    // Warm up the runtime, the channels and the shards without storing any key.
    runtime.block_on(drive(&engine, 10_000, 0));
    let before = ALLOC.live();
    ALLOC.reset_peak();
    runtime.block_on(drive(&engine, keys, 1));
    let after = ALLOC.live();
    let peak = ALLOC.peak();
    let live_keys = || -> Vec<u64> {
        engine
            .figures()
            .iter()
            .map(|figures| figures.live_keys as u64)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while live_keys().iter().sum::<u64>() != keys as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let per_shard = live_keys();
    let stored: u64 = per_shard.iter().sum();
    assert_eq!(stored, keys as u64, "every inserted key is live");
    let model = per_shard.iter().map(|&len| model_bytes(len as usize)).sum();
    drop(engine);
    drop(runtime);
    Row {
        keys,
        grown: after.saturating_sub(before),
        peak: peak.saturating_sub(before),
        model,
        per_shard,
    }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let shards = EngineConfig::default().shards;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("memory: live heap bytes per active key, {shards} shards, fixed window per day");
    println!("load average at start: {}", load.trim());
    println!();
    println!(
        "| keys | live heap growth | bytes/key | peak during inserts | peak bytes/key | hashbrown model | keys per shard |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---|");
    let mut at_million = None;
    for keys in SIZES {
        let row = measure(keys);
        let per_key = row.grown as f64 / row.keys as f64;
        if row.keys == 1_000_000 {
            at_million = Some(per_key);
        }
        let shards: Vec<String> = row.per_shard.iter().map(u64::to_string).collect();
        println!(
            "| {} | {:.1} MiB | {:.1} | {:.1} MiB | {:.1} | {:.1} MiB | {} |",
            row.keys,
            mib(row.grown),
            per_key,
            mib(row.peak),
            row.peak as f64 / row.keys as f64,
            mib(row.model),
            shards.join(" / "),
        );
    }
    println!();
    if let Some(per_key) = at_million {
        let verdict = if per_key < TARGET_BYTES_PER_KEY {
            "met"
        } else {
            "NOT met"
        };
        println!(
            "target: < {TARGET_BYTES_PER_KEY} bytes/key at 1,000,000 keys: {per_key:.1} bytes/key, {verdict}"
        );
    }
}
