//! End-to-end `ShouldRateLimit` throughput and latency: ratekeeper against a no-op RLS server
//! in the same run, driven by the project's own load generator ([`loadgen::client`]) in a
//! process of its own.
//!
//! Starts, in this process and each on its own 2-worker tokio runtime, the real ratekeeper
//! server ([`Server::bind`] + [`Server::run`], limits below: `api_key` far above any reachable
//! rate, so every answer is OK) and the no-op server of `loadgen`. Then, per workload:
//! - `hot`: 1 descriptor, one key (every request hits the same counter);
//! - `spread`: 1 descriptor, 100k keys;
//! - `multi`: 4 descriptors with 4 different keys, 100k keys;
//!
//! it runs the load generator (this binary re-executed with `RK_LOADGEN` set) against the
//! no-op server and ratekeeper alternately, the order flipping every round so drift on this
//! shared machine hits both alike. Each run has its own warm-up (checked, not measured).
//! Every answer is checked by the load generator (HTTP 200, `grpc-status: 0`, overall code,
//! and from ratekeeper one status per descriptor); one failed request fails the benchmark.
//! Before any load, each workload's request is sent once with a tonic client and the decoded
//! answers are checked field by field.
//!
//! Run with `cargo bench --bench rls [-- FILTER]`, FILTER picking workloads by name
//! (`hot`, `spread`, `multi`). Environment: `RLS_BENCH_ROUNDS` (default 5),
//! `RLS_BENCH_SECONDS` (4), `RLS_BENCH_WARMUP` (1), `RLS_BENCH_CONNECTIONS` (8),
//! `RLS_BENCH_STREAMS` (32), `RLS_BENCH_BODY` (`build`: write each request's bytes, the
//! cheapest; `pool`: pick from pre-encoded frames), `RLS_BENCH_UI_POLL_MS` (the dashboard
//! open: ratekeeper keeps `--counter-names 10000` and a thread fetches `/ui/data` that
//! often, as the page does every 2000 ms). `RLS_BENCH_SERVE=SECONDS` only starts the two servers and
//! prints their addresses, to drive or profile them by hand (`client::command_line` shows
//! how to run the load generator alone).

mod loadgen;

use loadgen::client::{self, Config, Report, Stop};
use loadgen::workload::{BodyMode, Rng, Workload};
use loadgen::*;

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::sync::watch;

const API_KEY_LIMIT: u32 = 1_000_000_000;

struct Scenario {
    name: &'static str,
    about: &'static str,
    workload: Workload,
}

const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "hot",
        about: "1 descriptor, 1 hot key",
        workload: Workload {
            descriptors: 1,
            keys: 1,
            first: 0,
        },
    },
    Scenario {
        name: "spread",
        about: "1 descriptor, 100k keys",
        workload: Workload {
            descriptors: 1,
            keys: 100_000,
            first: 0,
        },
    },
    Scenario {
        name: "multi",
        about: "4 descriptors (4 different keys), 100k keys",
        workload: Workload {
            descriptors: 4,
            keys: 100_000,
            first: 0,
        },
    },
];

struct Settings {
    rounds: u64,
    seconds: f64,
    warmup: f64,
    connections: usize,
    streams: usize,
    body: BodyMode,
}

impl Settings {
    fn from_env() -> Settings {
        let seconds = |name: &str, default: f64| {
            std::env::var(name)
                .ok()
                .and_then(|value| value.parse::<f64>().ok())
                .filter(|value| value.is_finite() && *value >= 0.0)
                .unwrap_or(default)
        };
        let body = std::env::var("RLS_BENCH_BODY")
            .ok()
            .map(|value| BodyMode::parse(&value).unwrap_or_else(|error| panic!("{error}")))
            .unwrap_or(BodyMode::Build);
        Settings {
            rounds: env_or("RLS_BENCH_ROUNDS", 5).max(1),
            seconds: seconds("RLS_BENCH_SECONDS", 4.0),
            warmup: seconds("RLS_BENCH_WARMUP", 1.0),
            connections: env_or("RLS_BENCH_CONNECTIONS", 8).max(1) as usize,
            streams: env_or("RLS_BENCH_STREAMS", 32).max(1) as usize,
            body,
        }
    }

    fn config(&self, target: Target, addr: SocketAddr, workload: Workload) -> Config {
        Config {
            connections: self.connections,
            streams: self.streams,
            warmup: Duration::from_secs_f64(self.warmup),
            stop: Stop::After(Duration::from_secs_f64(self.seconds)),
            body: self.body,
            statuses: Some(match target {
                Target::Noop => 0,
                Target::Ratekeeper => workload.descriptors,
            }),
            ..Config::new(addr, workload)
        }
    }
}

/// Sends one request of each workload with a real gRPC client and checks the decoded answer:
/// OK overall and, from ratekeeper, one OK status per descriptor carrying the `api_key` limit.
fn check_with_tonic(target: Target, addr: SocketAddr, scenarios: &[&Scenario]) {
    let client_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    client_runtime.block_on(async {
        let mut grpc = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect a gRPC client");
        for scenario in scenarios {
            let workload = scenario.workload;
            let mut keys = vec![0; 16];
            workload.draw(&mut Rng::new(42), &mut keys);
            let request = workload.request(&keys[..workload.descriptors]);
            let response = grpc
                .should_rate_limit(request.clone())
                .await
                .unwrap_or_else(|status| {
                    panic!("{} answered {status} to {request:?}", target.name())
                })
                .into_inner();
            assert_eq!(
                response.overall_code,
                Code::Ok as i32,
                "{} answered {response:?} to {request:?}",
                target.name()
            );
            if target == Target::Ratekeeper {
                assert_eq!(
                    response.statuses.len(),
                    workload.descriptors,
                    "one status per descriptor: {response:?}"
                );
                for status in &response.statuses {
                    assert_eq!(status.code, Code::Ok as i32, "{response:?}");
                    let limit = status
                        .current_limit
                        .as_ref()
                        .unwrap_or_else(|| panic!("no current_limit: {response:?}"));
                    assert_eq!(limit.requests_per_unit, API_KEY_LIMIT, "{response:?}");
                    assert_eq!(limit.unit, Unit::Second as i32, "{response:?}");
                }
            }
            println!(
                "check: {} answers {} ({}) with {:?} and {} statuses",
                target.name(),
                scenario.name,
                scenario.about,
                Code::try_from(response.overall_code).unwrap_or(Code::Unknown),
                response.statuses.len()
            );
        }
    });
}

struct Run {
    report: Report,
    /// CPU of this process (the server under test; the other one idles) per request sent.
    server_cpu_us_per_request: f64,
}

fn measure(settings: &Settings, target: Target, addr: SocketAddr, scenario: &Scenario) -> Run {
    let ticks = clock_ticks();
    let config = settings.config(target, addr, scenario.workload);
    let cpu_before = process_cpu(ticks);
    let report = client::spawn(&config);
    let cpu = process_cpu(ticks).saturating_sub(cpu_before);
    assert!(
        report.errors == 0,
        "{} failed {} of {} requests of workload {}; first error: {}\nrerun the load alone: {}",
        target.name(),
        report.errors,
        report.all_requests,
        scenario.name,
        report.first_error.as_deref().unwrap_or("?"),
        client::command_line(&config)
    );
    assert!(report.requests > 0, "no request measured: {report:?}");
    assert_eq!(
        (report.ok, report.over_limit),
        (report.requests, 0),
        "{} must answer OK to everything under this limit",
        target.name()
    );
    Run {
        server_cpu_us_per_request: cpu.as_secs_f64() * 1e6 / report.all_requests.max(1) as f64,
        report,
    }
}

fn print_machine() {
    let cores = std::thread::available_parallelism().map_or(0, |cores| cores.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map_or("unknown", |(_, model)| model.trim());
    // Field 19 of /proc/self/stat, counting the command name (in parentheses) as field 2.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let nice = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(16))
        .unwrap_or("?");
    println!("machine: {cores} cores (nproc), {model}; this process runs at nice {nice}");
    print_load("start");
    let argv: Vec<String> = std::env::args().collect();
    println!("command: {}", argv.join(" "));
    let filter: Vec<&str> = argv
        .iter()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .map(String::as_str)
        .collect();
    let settings: Vec<String> = std::env::vars()
        .filter(|(name, _)| name.starts_with("RLS_BENCH_"))
        .map(|(name, value)| format!("{name}={value} "))
        .collect();
    let filter = if filter.is_empty() {
        String::new()
    } else {
        format!(" -- {}", filter.join(" "))
    };
    println!("as: {}cargo bench --bench rls{filter}", settings.concat());
}

fn us(value: f64) -> String {
    format!("{value:.0} us")
}

/// Runs every round of one workload and prints its tables; returns the summary row.
fn bench_workload(
    settings: &Settings,
    scenario: &Scenario,
    addr: impl Fn(Target) -> SocketAddr,
) -> String {
    println!();
    println!(
        "## {}: {}, {} connections x {} streams, {} s per run after {} s warm-up, {} rounds",
        scenario.name,
        scenario.about,
        settings.connections,
        settings.streams,
        settings.seconds,
        settings.warmup,
        settings.rounds
    );
    println!(
        "load: {}",
        client::command_line(&settings.config(
            Target::Ratekeeper,
            addr(Target::Ratekeeper),
            scenario.workload
        ))
    );
    println!();
    println!(
        "| round | server | req/s | p50 | p90 | p99 | p99.9 | max | server CPU/req | loadgen CPU/req |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rounds: Vec<(Run, Run)> = Vec::new();
    for round in 0..settings.rounds {
        let mut order = [Target::Noop, Target::Ratekeeper];
        if round % 2 == 1 {
            order.reverse();
        }
        let mut noop = None;
        let mut ratekeeper = None;
        for target in order {
            let run = measure(settings, target, addr(target), scenario);
            let report = &run.report;
            println!(
                "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {:.1} us | {:.1} us |",
                round + 1,
                target.name(),
                report.requests_per_second,
                us(report.p50_us),
                us(report.p90_us),
                us(report.p99_us),
                us(report.p999_us),
                us(report.max_us),
                run.server_cpu_us_per_request,
                report.cpu_us_per_request
            );
            match target {
                Target::Noop => noop = Some(run),
                Target::Ratekeeper => ratekeeper = Some(run),
            }
        }
        if let (Some(noop), Some(ratekeeper)) = (noop, ratekeeper) {
            rounds.push((noop, ratekeeper));
        }
    }

    println!();
    println!(
        "| round | no-op req/s | ratekeeper req/s | req/s ratio | no-op p99 | ratekeeper p99 | p99 ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut columns: [Vec<f64>; 6] = Default::default();
    for (round, (noop, ratekeeper)) in rounds.iter().enumerate() {
        let (noop, ratekeeper) = (&noop.report, &ratekeeper.report);
        let row = [
            noop.requests_per_second,
            ratekeeper.requests_per_second,
            ratekeeper.requests_per_second / noop.requests_per_second,
            noop.p99_us,
            ratekeeper.p99_us,
            ratekeeper.p99_us / noop.p99_us,
        ];
        println!("{}", ratio_row(&(round + 1).to_string(), &row, false));
        for (column, value) in columns.iter_mut().zip(row) {
            column.push(value);
        }
    }
    let medians = columns.map(|mut column| median(&mut column));
    println!("{}", ratio_row("median", &medians, true));
    format!(
        "| {} {}",
        scenario.name,
        ratio_row(scenario.about, &medians, false)
    )
}

/// `| label | no-op req/s | ratekeeper req/s | ratio | no-op p99 | ratekeeper p99 | ratio |`,
/// the ratios in bold when `bold`.
fn ratio_row(label: &str, values: &[f64; 6], bold: bool) -> String {
    let mark = if bold { "**" } else { "" };
    format!(
        "| {label} | {:.0} | {:.0} | {mark}{:.3}{mark} | {} | {} | {mark}{:.3}{mark} |",
        values[0],
        values[1],
        values[2],
        us(values[3]),
        us(values[4]),
        values[5]
    )
}

fn main() {
    // When re-executed as the load generator, this runs it and exits.
    client::run_if_asked();
    histogram::check();
    workload::check_build_matches_pool();
    client::config::check();

    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let scenarios: Vec<&Scenario> = SCENARIOS
        .iter()
        .filter(|scenario| {
            filters.is_empty()
                || filters
                    .iter()
                    .any(|filter| scenario.name.contains(filter.as_str()))
        })
        .collect();
    let names: Vec<&str> = SCENARIOS.iter().map(|scenario| scenario.name).collect();
    assert!(
        !scenarios.is_empty(),
        "no workload matches {filters:?}; the workloads are {names:?}"
    );
    let settings = Settings::from_env();
    print_machine();

    let (stop_tx, stop_rx) = watch::channel(false);
    let noop_runtime = runtime("noop-rt", 2);
    let ratekeeper_runtime = runtime("ratekeeper-rt", 2);
    let noop = start_noop(&noop_runtime, stop_rx.clone());
    // With RLS_BENCH_UI_POLL_MS, the dashboard is open: ratekeeper keeps counter names (for
    // its hottest counters) and a thread fetches `/ui/data` that often for the whole run.
    let ui_poll = std::env::var("RLS_BENCH_UI_POLL_MS")
        .ok()
        .map(|ms| Duration::from_millis(ms.parse().expect("RLS_BENCH_UI_POLL_MS is a number")));
    let mut options = ratekeeper::server::ServerOptions::new(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    );
    if ui_poll.is_some() {
        options.admin.counter_names = 10_000;
    }
    let (ratekeeper, ratekeeper_http) =
        start_ratekeeper_listening(&ratekeeper_runtime, API_KEY_LIMITS, &options, stop_rx);
    let polls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    if let Some(every) = ui_poll {
        let polls = std::sync::Arc::clone(&polls);
        std::thread::spawn(move || {
            loop {
                let body = http_get(ratekeeper_http, "/ui/data").expect("/ui/data answers");
                assert!(body.contains("\"limits\""), "the dashboard's data: {body}");
                polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(every);
            }
        });
        println!("the dashboard is open: /ui/data fetched every {every:?}, counter names kept");
    }
    let addr = |target| match target {
        Target::Noop => noop,
        Target::Ratekeeper => ratekeeper,
    };
    for target in [Target::Noop, Target::Ratekeeper] {
        check_with_tonic(target, addr(target), &scenarios);
    }
    if let Ok(seconds) = std::env::var("RLS_BENCH_SERVE") {
        // Servers only, to drive or profile by hand.
        println!("serving: no-op on {noop}, ratekeeper on {ratekeeper}, for {seconds} s");
        let seconds = seconds
            .parse()
            .expect("RLS_BENCH_SERVE is a number of seconds");
        std::thread::sleep(Duration::from_secs_f64(seconds));
        return;
    }
    println!(
        "servers: two 2-worker runtimes in this process; load generator: 1 thread in its own \
         process, same cores; request bodies: {}",
        settings.body.name()
    );

    let summary: Vec<String> = scenarios
        .iter()
        .map(|scenario| bench_workload(&settings, scenario, addr))
        .collect();

    println!();
    println!("## Summary: medians over {} rounds", settings.rounds);
    println!();
    println!(
        "| workload | requests | no-op req/s | ratekeeper req/s | req/s ratio | no-op p99 | ratekeeper p99 | p99 ratio |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for row in summary {
        println!("{row}");
    }
    if ui_poll.is_some() {
        println!();
        println!(
            "/ui/data was fetched {} times during the run",
            polls.load(std::sync::atomic::Ordering::Relaxed)
        );
    }
    println!();
    print_load("end");
    let _ = stop_tx.send(true);
    drop(noop_runtime);
    drop(ratekeeper_runtime);
}
