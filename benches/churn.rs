//! Keys under churn, through the real engine (issue 25): memory follows what the windows
//! need, expiry makes no long pauses, and a flood on one rule starves no other.
//!
//! Three parts, each printed as it runs (figures in BENCHMARKS.md, "Keys under churn"):
//! 1. **size**: a paced load of fresh keys (`--rate` requests a second, one 1-second fixed
//!    window descriptor each, so the sweep forgets keys all the time) beside a background of
//!    long-lived keys (a 1-hour window), first 0.3 million of them, then 4 million; the
//!    latency of each `Engine::check` call is recorded for `--size-secs` at each size. Target:
//!    p99 and p999 at 4 million within 1.2x of those at 0.3 million.
//! 2. **churn**: `--minutes` of the load an edge sees: `--rate` requests a second, each with
//!    4 descriptors of fresh values (a 1-minute and a 1-second fixed window, a token bucket of
//!    10 per second and a 1-second sliding window), default settings (`--max-keys`
//!    4,000,000, half of it per rule). Every 10 s: live keys against the keys the windows
//!    need (counted from what was sent: each key until its lifetime ends), refusals, RSS,
//!    p99 and p999. Targets: no refusal, live keys within 1.1x of the need, RSS flat after
//!    the first minute.
//! 3. **flood**: `--flood` (10 million) random values on one rule as fast as the engine
//!    takes them, while one new client of another rule (3 per hour) is checked after every
//!    1,000 flood requests: 4 calls, which must answer OK, OK, OK, over the limit. Target:
//!    every such client limited exactly, none answered UNAVAILABLE.
//!
//! Run with `cargo bench --bench churn` (all three with the real sizes: about 14 minutes),
//! or one part: `cargo bench --bench churn -- --only flood`. Quick: `--minutes 1
//! --size-secs 10 --flood 1000000`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use ratekeeper::algorithm::{self, NANOS_PER_SEC};
use ratekeeper::check::{Check, Checks, Counter, Rules};
use ratekeeper::clock::Clock;
use ratekeeper::error::StoreError;
use ratekeeper::key::KeyBuilder;
use ratekeeper::limits::{Limit, Limits};
use ratekeeper::store::memory::{Engine, EngineConfig};

#[path = "loadgen/histogram.rs"]
#[allow(dead_code)]
mod histogram;
use histogram::Histogram;

const LIMITS: &str = "\
domain: churn
descriptors:
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: second
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket}
  - key: sliding
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: sliding_window}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 100, max_keys: 5000000}
  - key: flooded
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: victim
    rate_limit: {unit: hour, requests_per_unit: 3}
";

/// The churn part's descriptors, in the order sent.
const CHURN_KEYS: [&str; 4] = ["minute", "second", "bucket", "sliding"];

struct Settings {
    rate: u64,
    minutes: f64,
    size_secs: u64,
    flood: u64,
    only: Option<String>,
}

impl Settings {
    fn from_args() -> Settings {
        let mut settings = Settings {
            rate: 22_000,
            minutes: 10.0,
            size_secs: 30,
            flood: 10_000_000,
            only: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .unwrap_or_else(|| panic!("{flag} needs a value"))
            };
            match flag.as_str() {
                "--rate" => settings.rate = value().parse().expect("--rate: a number"),
                "--minutes" => settings.minutes = value().parse().expect("--minutes: a number"),
                "--size-secs" => settings.size_secs = value().parse().expect("--size-secs"),
                "--flood" => settings.flood = value().parse().expect("--flood: a number"),
                "--only" => settings.only = Some(value()),
                _ => {}
            }
        }
        settings
    }

    fn runs(&self, part: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == part)
    }
}

/// The limits, the rules they tag, and how to build each descriptor's check.
struct Workload {
    limits: Arc<ArcSwap<Limits>>,
}

impl Workload {
    fn new() -> Workload {
        let limits = Limits::parse_str("churn.yaml", LIMITS).expect("the bench's limits load");
        Workload {
            limits: Arc::new(ArcSwap::from_pointee(limits)),
        }
    }

    fn limit(&self, key: &str) -> Limit {
        let limits = self.limits.load();
        let domain = limits.domain("churn").expect("domain");
        let walk = domain.walk([(key, "v")]).expect("a configured key");
        walk.node().limits[0].clone()
    }

    fn engine(&self, config: EngineConfig) -> Engine {
        let rules: Arc<dyn Rules> = Arc::clone(&self.limits) as _;
        Engine::spawn_with_rules(config, Clock::system(), Some(rules))
    }
}

/// One descriptor's check: `key = value` under `limit`, costing one hit.
fn check(limit: &Limit, key: &str, value: u64) -> Check {
    let rate = limit.rate.expect("a rate");
    let mut builder = KeyBuilder::new("churn");
    builder.entry(key, &value.to_string());
    Check {
        counters: [Counter {
            key: builder.rule_key(&rate, limit.rule),
            rate,
        }]
        .into_iter()
        .collect(),
        cost: 1,
        wait: None,
        charge: ratekeeper::check::Charge::Admitted,
    }
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

fn micros(nanos: u64) -> f64 {
    nanos as f64 / 1000.0
}

/// Steps that found their shard busy, and how long they waited in all, so far.
fn lock_waits(engine: &Engine) -> (u64, Duration) {
    engine
        .stats()
        .fold((0, Duration::ZERO), |(count, sum), stats| {
            (
                count + stats.contended.load(std::sync::atomic::Ordering::Relaxed),
                sum + stats.lock_wait.sum(),
            )
        })
}

/// Keys the sweep has looked at so far, over all shards.
fn swept_keys(engine: &Engine) -> u64 {
    engine
        .stats()
        .map(|stats| stats.swept_keys.load(std::sync::atomic::Ordering::Relaxed))
        .sum()
}

fn live_keys(engine: &Engine) -> usize {
    engine.figures().iter().map(|shard| shard.live_keys).sum()
}

/// Sends `rate` requests a second for `length`, each made by `request(n)`, timing each call
/// into `histogram`; calls `every_10s` after each 10 seconds. Answers the errors seen.
async fn paced(
    engine: &Engine,
    rate: u64,
    length: Duration,
    histogram: &mut Histogram,
    mut request: impl FnMut(u64) -> Checks,
    mut every_10s: impl FnMut(&Engine, u64, &mut Histogram),
) -> Vec<StoreError> {
    let started = Instant::now();
    let mut errors = Vec::new();
    let mut sent = 0u64;
    let mut next_report = Duration::from_secs(10);
    while started.elapsed() < length {
        let due = started + Duration::from_nanos(sent * NANOS_PER_SEC / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        let checks = request(sent);
        let at = Instant::now();
        let answer = engine.check(checks).await;
        histogram.record(at.elapsed().as_nanos() as u64);
        if let Err(error) = answer {
            errors.push(error);
        }
        sent += 1;
        if started.elapsed() >= next_report {
            every_10s(engine, next_report.as_secs(), histogram);
            next_report += Duration::from_secs(10);
        }
    }
    errors
}

/// Part 1: latency at 0.3 and at 4 million live keys.
async fn size(settings: &Settings, workload: &Workload) {
    let engine = workload.engine(EngineConfig {
        max_keys: 5_000_000,
        ..EngineConfig::default()
    });
    let hour = workload.limit("hour");
    let second = workload.limit("second");
    let mut filled = 0u64;
    let mut results = Vec::new();
    for target in [300_000u64, 4_000_000] {
        while filled < target {
            let batch: Checks = (filled..(filled + 64).min(target))
                .map(|n| check(&hour, "hour", n))
                .collect();
            filled += batch.len() as u64;
            engine
                .check(batch)
                .await
                .expect("room for the background keys");
        }
        // Let the fill's table growth settle before measuring.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut histogram = Histogram::default();
        let waits_before = lock_waits(&engine);
        let swept_before = swept_keys(&engine);
        let base = target * 10;
        let errors = paced(
            &engine,
            settings.rate,
            Duration::from_secs(settings.size_secs),
            &mut histogram,
            |n| [check(&second, "second", base + n)].into_iter().collect(),
            |_, _, _| {},
        )
        .await;
        let live = live_keys(&engine);
        let (waits_after, waited_after) = lock_waits(&engine);
        let (waits, waited) = (
            waits_after - waits_before.0,
            waited_after.saturating_sub(waits_before.1),
        );
        println!(
            "size: {live:>9} live keys: {waits} steps found their shard busy (requests or the sweep), {:.1} us each on average; the sweep looked at {:.0} keys a second",
            waited.as_secs_f64() * 1e6 / waits.max(1) as f64,
            (swept_keys(&engine) - swept_before) as f64 / settings.size_secs as f64
        );
        let (p99, p999, max) = (
            histogram.quantile(0.99),
            histogram.quantile(0.999),
            histogram.max(),
        );
        println!(
            "size: {live:>9} live keys: p50 {:.1} us, p99 {:.1} us, p999 {:.1} us, max {:.1} us over {} calls, {} errors",
            micros(histogram.quantile(0.5)),
            micros(p99),
            micros(p999),
            micros(max),
            histogram.count(),
            errors.len()
        );
        results.push((p99, p999));
    }
    let (small, large) = (results[0], results[1]);
    println!(
        "size: 4M / 0.3M: p99 {:.2}x, p999 {:.2}x (target: within 1.2x)",
        large.0 as f64 / small.0.max(1) as f64,
        large.1 as f64 / small.1.max(1) as f64
    );
}

/// What the windows need: per rule, the keys sent whose lifetime has not ended, as
/// `(end, count)` runs in sending order (a rule's ends never go backwards).
struct Need {
    runs: Vec<VecDeque<(u64, u64)>>,
}

impl Need {
    fn add(&mut self, rule: usize, end: u64) {
        let runs = &mut self.runs[rule];
        match runs.back_mut() {
            Some((last, count)) if *last == end => *count += 1,
            _ => runs.push_back((end, 1)),
        }
    }

    fn at(&mut self, now: u64) -> u64 {
        self.runs
            .iter_mut()
            .map(|runs| {
                while runs.front().is_some_and(|&(end, _)| end <= now) {
                    runs.pop_front();
                }
                runs.iter().map(|&(_, count)| count).sum::<u64>()
            })
            .sum()
    }
}

/// Part 2: the churn of fresh keys for `--minutes`.
async fn churn(settings: &Settings, workload: &Workload) {
    let engine = workload.engine(EngineConfig::default());
    let limits: Vec<Limit> = CHURN_KEYS.iter().map(|key| workload.limit(key)).collect();
    let clock = Clock::system();
    let mut need = Need {
        runs: vec![VecDeque::new(); CHURN_KEYS.len()],
    };
    let need = std::cell::RefCell::new(&mut need);
    let mut histogram = Histogram::default();
    let mut worst_ratio = 0.0f64;
    let mut rss_after_minute: Vec<f64> = Vec::new();
    let mut p999s = Vec::new();
    println!("churn: t(s)  live keys   need    live/need  refused  RSS MiB  p99 us  p999 us");
    let errors = paced(
        &engine,
        settings.rate,
        Duration::from_secs_f64(settings.minutes * 60.0),
        &mut histogram,
        |n| {
            let now = clock.now();
            let mut need = need.borrow_mut();
            limits
                .iter()
                .zip(CHURN_KEYS)
                .enumerate()
                .map(|(index, (limit, key))| {
                    let rate = limit.rate.expect("a rate");
                    // A fresh key's first hit: what the shard computes as its lifetime.
                    let mut state = algorithm::init(&rate, now);
                    let decision = algorithm::decide(&rate, &mut state, now, 1);
                    need.add(
                        index,
                        now.saturating_add(algorithm::lifetime(&rate, decision.reset_after)),
                    );
                    check(limit, key, n)
                })
                .collect()
        },
        |engine, at, histogram| {
            let live = live_keys(engine) as u64;
            let needed = need.borrow_mut().at(clock.now()).max(1);
            let ratio = live as f64 / needed as f64;
            let refused: u64 = engine.rule_keys().iter().map(|(_, keys)| keys.refused).sum();
            let rss = rss_mib();
            let (p99, p999) = (histogram.quantile(0.99), histogram.quantile(0.999));
            println!(
                "churn: {at:>5} {live:>10} {needed:>10} {ratio:>9.3} {refused:>8} {rss:>8.0} {:>7.1} {:>8.1}",
                micros(p99),
                micros(p999)
            );
            if at > 60 {
                worst_ratio = worst_ratio.max(ratio);
                rss_after_minute.push(rss);
                p999s.push(p999);
            }
            *histogram = Histogram::default();
        },
    )
    .await;
    let (first, last) = (
        rss_after_minute.first().copied().unwrap_or(0.0),
        rss_after_minute.last().copied().unwrap_or(0.0),
    );
    p999s.sort_unstable();
    println!(
        "churn: {} calls refused; after the first minute: live/need at most {worst_ratio:.3} (target 1.1), RSS {first:.0} -> {last:.0} MiB, median interval p999 {:.1} us",
        errors.len(),
        micros(p999s.get(p999s.len() / 2).copied().unwrap_or(0))
    );
}

/// Part 3: a flood of random values on one rule while another rule's new clients are
/// checked.
async fn flood(settings: &Settings, workload: &Workload) {
    let engine = workload.engine(EngineConfig::default());
    let flooded = workload.limit("flooded");
    let victim = workload.limit("victim");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let (mut flood_refused, mut clients, mut exact, mut unavailable) = (0u64, 0u64, 0u64, 0u64);
    let started = Instant::now();
    let mut sent = 0u64;
    while sent < settings.flood {
        let batch: Checks = (0..64)
            .map(|_| {
                // xorshift: random values, as an attacker-controlled header would carry.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                check(&flooded, "flooded", seed)
            })
            .collect();
        sent += batch.len() as u64;
        for single in batch {
            if engine.check([single].into_iter().collect()).await.is_err() {
                flood_refused += 1;
            }
        }
        if sent.is_multiple_of(1024) {
            clients += 1;
            let mut answers = Vec::new();
            for _ in 0..4 {
                let one: Checks = [check(&victim, "victim", clients)].into_iter().collect();
                answers.push(
                    engine
                        .check(one)
                        .await
                        .map(|decisions| decisions[0].allowed),
                );
            }
            if answers.iter().any(Result::is_err) {
                unavailable += 1;
            } else if answers == [Ok(true), Ok(true), Ok(true), Ok(false)] {
                exact += 1;
            }
        }
    }
    let live = live_keys(&engine);
    println!(
        "flood: {sent} random values on one rule in {:.0} s: {flood_refused} refused at its budget, {live} keys live; {clients} new clients of another rule: {exact} limited exactly, {unavailable} answered UNAVAILABLE",
        started.elapsed().as_secs_f64()
    );
}

fn main() {
    let settings = Settings::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let workload = Workload::new();
    runtime.block_on(async {
        if settings.runs("size") {
            size(&settings, &workload).await;
        }
        if settings.runs("churn") {
            churn(&settings, &workload).await;
        }
        if settings.runs("flood") {
            flood(&settings, &workload).await;
        }
    });
}
