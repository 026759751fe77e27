//! The Redis store against the in-memory store, in the same run: `ShouldRateLimit`
//! throughput and latency with 1 and 4 descriptors (100k keys each), then p99 at half of
//! the Redis store's saturation, then Redis memory per live key.
//!
//! Starts a `redis-server` (from `PATH`; `apt-get install redis-server`) on a free port
//! and, in this process, two real ratekeeper servers on 2-worker runtimes: `--store memory`
//! and `--store redis://`. The load generator ([`loadgen::client`], this binary re-executed)
//! runs against each alternately, the order flipping every round. Everything shares this
//! machine's cores: Redis, both servers, the load generator.
//!
//! Run with `cargo bench --bench redis`. Environment: `REDIS_BENCH_ROUNDS` (default 3),
//! `REDIS_BENCH_SECONDS` (4), `REDIS_BENCH_CONNECTIONS` (4), `REDIS_BENCH_STREAMS` (16),
//! `REDIS_BENCH_HZ` (10, Redis's default `hz`: how often it runs its expiry cycle),
//! `REDIS_BENCH_POOL` (the store's `--store-pool`, default 4).

mod loadgen;

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loadgen::client::{self, Config, Report, Stop};
use loadgen::workload::Workload;
use loadgen::*;
use ratekeeper::server::ServerOptions;
use ratekeeper::store::StoreOptions;
use ratekeeper::store::redis::{RedisOptions, Target};
use tokio::sync::watch;

const WORKLOADS: [(&str, Workload); 2] = [
    (
        "1 descriptor, 100k keys",
        Workload {
            descriptors: 1,
            keys: 100_000,
            first: 0,
        },
    ),
    (
        "4 descriptors (4 different keys), 100k keys",
        Workload {
            descriptors: 4,
            keys: 100_000,
            first: 0,
        },
    ),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    Memory,
    Redis,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::Redis => "redis",
        }
    }
}

/// A `redis-server` child, killed on drop.
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start() -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--hz", &env_or("REDIS_BENCH_HZ", 10).to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (apt-get install redis-server)");
        let server = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while server.query(&["PING"]).is_none() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn query(&self, args: &[&str]) -> Option<redis::Value> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).ok()?;
        let mut connection = client.get_connection().ok()?;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command.query(&mut connection).ok()
    }

    fn number(&self, args: &[&str]) -> u64 {
        match self.query(args) {
            Some(redis::Value::Int(value)) => u64::try_from(value).unwrap_or(0),
            _ => 0,
        }
    }

    fn info(&self, field: &str) -> u64 {
        let text = match self.query(&["INFO", "memory"]) {
            Some(redis::Value::VerbatimString { text, .. }) => text,
            Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            _ => String::new(),
        };
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{field}:")))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Settings {
    rounds: u64,
    seconds: f64,
    connections: usize,
    streams: usize,
}

impl Settings {
    fn config(&self, addr: SocketAddr, workload: Workload, rate: u64) -> Config {
        Config {
            connections: self.connections,
            streams: self.streams,
            stop: Stop::After(Duration::from_secs_f64(self.seconds)),
            statuses: Some(workload.descriptors),
            rate,
            ..Config::new(addr, workload)
        }
    }
}

fn measure(
    settings: &Settings,
    store: Store,
    addr: SocketAddr,
    workload: Workload,
    rate: u64,
) -> Report {
    let config = settings.config(addr, workload, rate);
    let report = client::spawn(&config);
    assert!(
        report.errors == 0,
        "{} failed {} of {} requests; first error: {}\nrerun the load alone: {}",
        store.name(),
        report.errors,
        report.all_requests,
        report.first_error.as_deref().unwrap_or("?"),
        client::command_line(&config)
    );
    assert_eq!(
        report.ok, report.requests,
        "every answer OK under this limit"
    );
    report
}

fn us(value: f64) -> String {
    format!("{value:.0} us")
}

fn main() {
    client::run_if_asked();
    let settings = Settings {
        rounds: env_or("REDIS_BENCH_ROUNDS", 3).max(1),
        seconds: env_or("REDIS_BENCH_SECONDS", 4).max(1) as f64,
        connections: env_or("REDIS_BENCH_CONNECTIONS", 4).max(1) as usize,
        streams: env_or("REDIS_BENCH_STREAMS", 16).max(1) as usize,
    };
    let cores = std::thread::available_parallelism().map_or(0, |cores| cores.get());
    println!(
        "machine: {cores} cores (nproc); redis-server, both ratekeepers and the load generator share them"
    );
    print_load("start");
    let redis = RedisServer::start();
    let empty = redis.info("used_memory");
    let (stop_tx, stop_rx) = watch::channel(false);
    let memory_runtime = runtime("memory-rt", 2);
    let redis_runtime = runtime("redis-rt", 2);
    let localhost = SocketAddr::from(([127, 0, 0, 1], 0));
    let memory = start_ratekeeper(&memory_runtime, API_KEY_LIMITS, None, stop_rx.clone());
    let target = Target::parse(&format!("redis://127.0.0.1:{}", redis.port)).expect("a redis url");
    let options = ServerOptions {
        store: StoreOptions::Redis(RedisOptions {
            pool: env_or("REDIS_BENCH_POOL", 4).max(1) as usize,
            ..RedisOptions::new(target)
        }),
        ..ServerOptions::new(localhost, localhost)
    };
    let on_redis = start_ratekeeper_with(&redis_runtime, API_KEY_LIMITS, &options, stop_rx);
    let addr = |store| match store {
        Store::Memory => memory,
        Store::Redis => on_redis,
    };
    println!(
        "load: {} connections x {} streams, closed loop, {} s per run, {} rounds; then open loop at half the redis store's rate",
        settings.connections, settings.streams, settings.seconds, settings.rounds
    );
    let mut summary = Vec::new();
    for (about, workload) in WORKLOADS {
        println!();
        println!("## {about}");
        println!();
        println!("| round | store | req/s | p50 | p99 | max |");
        println!("|---:|---|---:|---:|---:|---:|");
        let mut columns: [Vec<f64>; 4] = Default::default();
        for round in 0..settings.rounds {
            let mut order = [Store::Memory, Store::Redis];
            if round % 2 == 1 {
                order.reverse();
            }
            for store in order {
                let report = measure(&settings, store, addr(store), workload, 0);
                println!(
                    "| {} | {} | {:.0} | {} | {} | {} |",
                    round + 1,
                    store.name(),
                    report.requests_per_second,
                    us(report.p50_us),
                    us(report.p99_us),
                    us(report.max_us)
                );
                let at = if store == Store::Memory { 0 } else { 2 };
                columns[at].push(report.requests_per_second);
                columns[at + 1].push(report.p99_us);
            }
        }
        let [memory_rps, memory_p99, redis_rps, redis_p99] =
            columns.map(|mut column| median(&mut column));
        let half = (redis_rps / 2.0) as u64;
        let mut half_p99 = [0.0; 2];
        for (index, store) in [Store::Memory, Store::Redis].into_iter().enumerate() {
            let report = measure(&settings, store, addr(store), workload, half);
            println!(
                "| half load ({half} req/s) | {} | {:.0} | {} | {} | {} |",
                store.name(),
                report.requests_per_second,
                us(report.p50_us),
                us(report.p99_us),
                us(report.max_us)
            );
            half_p99[index] = report.p99_us;
        }
        summary.push(format!(
            "| {about} | {memory_rps:.0} | {redis_rps:.0} | **{:.2}** | {} | {} | {half} | {} | **{}** |",
            redis_rps / memory_rps,
            us(memory_p99),
            us(redis_p99),
            us(half_p99[0]),
            us(half_p99[1]),
        ));
    }
    println!();
    println!("## Summary: medians over {} rounds", settings.rounds);
    println!();
    println!(
        "| workload | memory req/s | redis req/s | ratio | memory p99 | redis p99 | half load req/s | memory p99 at half | redis p99 at half |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in summary {
        println!("{row}");
    }
    let keys = redis.number(&["DBSIZE"]);
    let used = redis.info("used_memory");
    println!();
    println!(
        "redis memory: {keys} live keys, used_memory {used} bytes, {empty} when empty: {:.0} bytes per key",
        used.saturating_sub(empty) as f64 / keys.max(1) as f64
    );
    print_load("end");
    let _ = stop_tx.send(true);
    drop(memory_runtime);
    drop(redis_runtime);
}
