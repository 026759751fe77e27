//! Engine throughput (`Engine::check`: shards stepped by the caller), plus micro-benchmarks
//! of the pure parts.
//!
//! `engine/*` drive [`Engine::check`] on a multi-thread tokio runtime with the default
//! engine config (one shard per core), from many concurrent caller tasks, the way the gRPC
//! handlers do. Each iteration is one request; throughput is reported in decisions (one per
//! counter). Every limit is a fixed window far above what the machine can reach, so every
//! answer is "allowed" (checked: a denial fails the benchmark).
//!
//! `algorithm/*` time one [`algorithm::decide`] call per algorithm; `key/*` time building one
//! [`KeyId`] with [`KeyBuilder`].
//!
//! Run with `cargo bench --bench engine`; see BENCHMARKS.md for figures.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use ratekeeper::algorithm::{self, Algorithm, Rate, Unit};
use ratekeeper::check::{Check, Checks, Counter};
use ratekeeper::clock::Clock;
use ratekeeper::key::{KeyBuilder, KeyId};
use ratekeeper::store::memory::{Engine, EngineConfig};
use tokio::runtime::Runtime;

/// Concurrent caller tasks, like concurrent gRPC calls in flight.
const CALLERS: u64 = 64;
/// Distinct keys in the spread workloads.
const SPREAD_KEYS: usize = 100_000;

/// A limit no benchmark can reach: every decision is "allowed".
fn high_rate() -> Rate {
    Rate::new(Algorithm::FixedWindow, u32::MAX, Unit::Second, None)
}

fn api_key(index: usize) -> KeyId {
    let mut builder = KeyBuilder::new("bench");
    builder.entry("api_key", &format!("key-{index}"));
    builder.key(&high_rate())
}

/// What each request of a workload asks.
#[derive(Clone)]
struct Workload {
    keys: Arc<[KeyId]>,
    /// Descriptors (one counter each) per request.
    per_request: usize,
}

impl Workload {
    /// The `n`-th request of caller `caller`: `per_request` consecutive keys of the pool,
    /// each caller starting at its own offset so callers spread over the pool.
    fn request(&self, caller: u64, n: u64) -> Checks {
        let len = self.keys.len() as u64;
        let start = caller * (len / CALLERS).max(1) + n * self.per_request as u64;
        (0..self.per_request as u64)
            .map(|d| Check {
                counters: smallvec::smallvec![Counter {
                    key: self.keys[((start + d) % len) as usize],
                    rate: high_rate(),
                }],
                cost: 1,
                wait: None,
                charge: ratekeeper::check::Charge::Admitted,
            })
            .collect()
    }
}

/// Runs `iters` requests split over `callers` tasks; returns the wall time they took.
fn run(
    runtime: &Runtime,
    engine: &Engine,
    workload: &Workload,
    callers: u64,
    iters: u64,
) -> Duration {
    runtime.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..callers)
            .map(|caller| {
                let share = iters / callers + u64::from(caller < iters % callers);
                let engine = engine.clone();
                let workload = workload.clone();
                tokio::spawn(async move {
                    for n in 0..share {
                        let decisions = engine
                            .check(workload.request(caller, n))
                            .await
                            .expect("the engine answers");
                        assert!(
                            decisions.iter().all(|decision| decision.allowed),
                            "a limit of u32::MAX per second denied a request"
                        );
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a caller task panicked");
        }
        start.elapsed()
    })
}

fn engine_throughput(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let config = EngineConfig::default();
    let engine = runtime.block_on(async { Engine::spawn(config, Clock::system()) });
    let spread: Arc<[KeyId]> = (0..SPREAD_KEYS).map(api_key).collect();
    let hot: Arc<[KeyId]> = Arc::new([api_key(0)]);
    eprintln!(
        "engine: {} shards, {} worker threads, {CALLERS} caller tasks; load average {}",
        engine.shard_count(),
        runtime.metrics().num_workers(),
        load_average()
    );

    let mut group = c.benchmark_group("engine");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    let cases = [
        ("spread_1_descriptor", Arc::clone(&spread), 1, CALLERS),
        ("spread_4_descriptors", Arc::clone(&spread), 4, CALLERS),
        ("hot_key", hot, 1, CALLERS),
        // One caller at a time: the round trip through a shard, not throughput.
        ("single_caller", spread, 1, 1),
    ];
    for (name, keys, per_request, callers) in cases {
        let workload = Workload { keys, per_request };
        group.throughput(Throughput::Elements(per_request as u64));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| run(&runtime, &engine, &workload, callers, iters));
        });
    }
    group.finish();
    eprintln!("engine: done; load average {}", load_average());
}

/// The machine's load average: a busy neighbour on this shared machine shows up here.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    for algorithm in Algorithm::ALL {
        // Windows: never reached. Buckets: one token per microsecond, which is exactly
        // the pace of the loop below, so each call refills and takes one token.
        let rate = match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                Rate::new(algorithm, u32::MAX, Unit::Second, None)
            }
            Algorithm::TokenBucket | Algorithm::Gcra => {
                Rate::new(algorithm, 1_000_000, Unit::Second, Some(1_000))
            }
        };
        let mut now = Clock::system().now();
        let mut state = algorithm::init(&rate, now);
        group.bench_function(algorithm.as_str(), |b| {
            b.iter(|| {
                now += 1_000;
                algorithm::decide(black_box(&rate), &mut state, black_box(now), black_box(1))
            });
        });
    }
    group.finish();
}

fn key_hashing(c: &mut Criterion) {
    let mut group = c.benchmark_group("key");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    let rate = high_rate();
    // A typical API-key descriptor: domain + one short entry (~30 hashed bytes).
    group.bench_function("one_entry", |b| {
        b.iter(|| {
            let mut builder = KeyBuilder::new(black_box("bench"));
            builder.entry(black_box("api_key"), black_box("key-1234567"));
            builder.key(black_box(&rate))
        });
    });
    // A longer descriptor: client address and a request path (~100 hashed bytes).
    group.bench_function("three_entries", |b| {
        b.iter(|| {
            let mut builder = KeyBuilder::new(black_box("edge"));
            builder
                .entry(black_box("remote_address"), black_box("203.0.113.217"))
                .entry(black_box("header_match"), black_box("mobile"))
                .entry(
                    black_box("path"),
                    black_box("/api/v2/orders/8e1f2c3a/items"),
                );
            builder.key(black_box(&rate))
        });
    });
    group.finish();
}

criterion_group!(benches, engine_throughput, decide, key_hashing);
criterion_main!(benches);
