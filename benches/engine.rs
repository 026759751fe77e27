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
//! Each bench is warmed up, then timed in batches of iterations sized to take about
//! [`BATCH`] each; it prints the median of [`SAMPLES`] batches (and the slowest and fastest).
//! Run with `cargo bench --bench engine` (`-- engine/` runs the benches whose names contain
//! `engine/`); see BENCHMARKS.md for figures.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

fn engine_throughput(bench: &Bench) {
    if !bench.any_selected("engine/") {
        return;
    }
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
    let cases = [
        ("spread_1_descriptor", Arc::clone(&spread), 1, CALLERS),
        ("spread_4_descriptors", Arc::clone(&spread), 4, CALLERS),
        ("hot_key", hot, 1, CALLERS),
        // One caller at a time: the round trip through a shard, not throughput.
        ("single_caller", spread, 1, 1),
    ];
    for (name, keys, per_request, callers) in cases {
        let workload = Workload { keys, per_request };
        bench.run(
            &format!("engine/{name}"),
            Duration::from_secs(2),
            Some(per_request as u64),
            |iters| run(&runtime, &engine, &workload, callers, iters),
        );
    }
    eprintln!("engine: done; load average {}", load_average());
}

/// The machine's load average: a busy neighbour on this shared machine shows up here.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn decide(bench: &Bench) {
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
        let name = format!("algorithm/{}", algorithm.as_str());
        bench.run(&name, Duration::from_secs(1), None, |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                now += 1_000;
                black_box(algorithm::decide(
                    black_box(&rate),
                    &mut state,
                    black_box(now),
                    black_box(1),
                ));
            }
            start.elapsed()
        });
    }
}

fn key_hashing(bench: &Bench) {
    let rate = high_rate();
    // A typical API-key descriptor: domain + one short entry (~30 hashed bytes).
    bench.run("key/one_entry", Duration::from_secs(1), None, |iters| {
        let start = Instant::now();
        for _ in 0..iters {
            let mut builder = KeyBuilder::new(black_box("bench"));
            builder.entry(black_box("api_key"), black_box("key-1234567"));
            black_box(builder.key(black_box(&rate)));
        }
        start.elapsed()
    });
    // A longer descriptor: client address and a request path (~100 hashed bytes).
    bench.run("key/three_entries", Duration::from_secs(1), None, |iters| {
        let start = Instant::now();
        for _ in 0..iters {
            let mut builder = KeyBuilder::new(black_box("edge"));
            builder
                .entry(black_box("remote_address"), black_box("203.0.113.217"))
                .entry(black_box("header_match"), black_box("mobile"))
                .entry(
                    black_box("path"),
                    black_box("/api/v2/orders/8e1f2c3a/items"),
                );
            black_box(builder.key(black_box(&rate)));
        }
        start.elapsed()
    });
}

/// Timed batches per bench.
const SAMPLES: usize = 20;
/// About how long one timed batch runs.
const BATCH: Duration = Duration::from_millis(200);

/// Which benches run: those whose names contain one of the command line's words (all
/// without any; `cargo bench`'s own `--bench` flag is not a word).
struct Bench {
    filters: Vec<String>,
}

impl Bench {
    fn from_args() -> Bench {
        Bench {
            filters: std::env::args()
                .skip(1)
                .filter(|arg| !arg.starts_with("--"))
                .collect(),
        }
    }

    fn selected(&self, name: &str) -> bool {
        self.filters.is_empty()
            || self
                .filters
                .iter()
                .any(|filter| name.contains(filter.as_str()))
    }

    /// Whether any bench whose name starts with `group` may be selected.
    fn any_selected(&self, group: &str) -> bool {
        self.filters.is_empty()
            || self
                .filters
                .iter()
                .any(|filter| group.contains(filter.as_str()) || filter.starts_with(group))
    }

    /// Times `timed(iters)`, which runs `iters` iterations and answers how long they took:
    /// first for `warmup` (which also sizes a batch to take about [`BATCH`]), then
    /// [`SAMPLES`] batches. Prints the median time per iteration and, given the `decisions`
    /// one iteration makes, the median decisions per second.
    fn run(
        &self,
        name: &str,
        warmup: Duration,
        decisions: Option<u64>,
        mut timed: impl FnMut(u64) -> Duration,
    ) {
        if !self.selected(name) {
            return;
        }
        let started = Instant::now();
        let mut iters = 1u64;
        let mut per_iter = Duration::ZERO;
        while started.elapsed() < warmup {
            let took = timed(iters);
            per_iter = took / u32::try_from(iters).unwrap_or(u32::MAX);
            if took < BATCH / 4 {
                iters = iters.saturating_mul(2);
            }
        }
        let batch = if per_iter.is_zero() {
            iters
        } else {
            (BATCH.as_nanos() / per_iter.as_nanos()).clamp(1, u128::from(u32::MAX)) as u64
        };
        let mut nanos: Vec<f64> = (0..SAMPLES)
            .map(|_| timed(batch).as_nanos() as f64 / batch as f64)
            .collect();
        nanos.sort_by(f64::total_cmp);
        let median = nanos[SAMPLES / 2];
        let rate = decisions
            .map(|decisions| format!(", {:.2} M decisions/s", decisions as f64 / median * 1e3))
            .unwrap_or_default();
        println!(
            "{name:<34} {} per iteration (fastest {}, slowest {}){rate}",
            show(median),
            show(nanos[0]),
            show(nanos[SAMPLES - 1]),
        );
    }
}

/// Nanoseconds, in the unit that reads best.
fn show(nanos: f64) -> String {
    if nanos >= 1e6 {
        format!("{:.2} ms", nanos / 1e6)
    } else if nanos >= 1e3 {
        format!("{:.2} us", nanos / 1e3)
    } else {
        format!("{nanos:.2} ns")
    }
}

fn main() {
    let bench = Bench::from_args();
    engine_throughput(&bench);
    decide(&bench);
    key_hashing(&bench);
}
