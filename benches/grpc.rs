//! End-to-end gRPC throughput: ratekeeper against a no-op RLS server, both driven by h2load.
//!
//! Starts, in this process and each on its own multi-thread tokio runtime:
//! - the real ratekeeper server ([`Server::bind`] + [`Server::run`]) with the limits below;
//! - a no-op `RateLimitService` that answers OK at once, served by tonic with the same
//!   transport settings as ratekeeper (TCP_NODELAY, default HTTP/2 settings).
//!
//! Both listen on `127.0.0.1:0`. Each request body is a pre-encoded gRPC frame (the 5-byte
//! prefix, then the protobuf `RateLimitRequest`) in a temp file that h2load POSTs to
//! `ShouldRateLimit`.
//! h2load counts HTTP 200 as success even when the gRPC status is an error, so before any
//! load each body is sent once with a tonic client (checking the decoded response) and
//! once with `nghttp` (checking `grpc-status: 0` on the exact bytes h2load will send).
//!
//! Runs alternate between the servers (the order flips every round) so drift on this shared
//! machine hits both alike. h2load runs on the same cores as the servers. Per run: req/s from
//! h2load's summary, p50/p99 from its per-request log, and the CPU this process (i.e. the
//! server under test; the other one idles) used per request, from `/proc/self/stat`.
//!
//! Run with `cargo bench --bench grpc`. `GRPC_BENCH_ROUNDS` (default 6) and
//! `GRPC_BENCH_REQUESTS` (default 200000) override the run sizes; `GRPC_BENCH_PERF=1`
//! attaches `perf stat` to this process during each run and prints syscalls and context
//! switches per request (the servers' side only: h2load is another process); any other value
//! is taken as the perf event list.

mod loadgen;

use loadgen::*;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::sync::watch;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const CONNECTIONS: u32 = 8;
const STREAMS_PER_CONNECTION: u32 = 32;

/// Added to [`API_KEY_LIMITS`] (whose `api_key` limit keeps the hot path answering OK):
/// `tenant`, one per day, so after the first request every answer is OVER_LIMIT.
const TENANT_LIMIT: &str = "  - key: tenant
    rate_limit:
      unit: day
      requests_per_unit: 1
";

/// One request body and what ratekeeper must answer to it.
struct Body {
    name: &'static str,
    request: RateLimitRequest,
    file: PathBuf,
    /// Ratekeeper's expected overall code once the body has been sent before.
    expected: Code,
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

fn bodies(dir: &Path) -> Vec<Body> {
    let specs = [
        (
            "1 descriptor, allowed",
            request(vec![descriptor(&[("api_key", "key-1")])]),
            Code::Ok,
        ),
        (
            "4 descriptors, allowed",
            request(
                ["key-1", "key-2", "key-3", "key-4"]
                    .iter()
                    .map(|key| descriptor(&[("api_key", key)]))
                    .collect(),
            ),
            Code::Ok,
        ),
        (
            "1 descriptor, over limit",
            request(vec![descriptor(&[("tenant", "acme")])]),
            Code::OverLimit,
        ),
    ];
    specs
        .into_iter()
        .enumerate()
        .map(|(index, (name, request, expected))| {
            let file = dir.join(format!("body-{index}.bin"));
            std::fs::write(&file, grpc_frame(&request)).expect("write a body file");
            Body {
                name,
                request,
                file,
                expected,
            }
        })
        .collect()
}

/// Sends each body's request with a real gRPC client and checks the decoded answer.
fn check_with_tonic(target: Target, addr: SocketAddr, bodies: &[Body]) {
    let client_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    client_runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect a gRPC client");
        for body in bodies {
            // Twice: the second answer is the steady state h2load will see.
            let mut response = None;
            for _ in 0..2 {
                response = Some(
                    client
                        .should_rate_limit(body.request.clone())
                        .await
                        .unwrap_or_else(|status| {
                            panic!("{} answered {status} to {:?}", target.name(), body.name)
                        })
                        .into_inner(),
                );
            }
            let response = response.expect("two calls were made");
            let expected = match target {
                Target::Noop => Code::Ok,
                Target::Ratekeeper => body.expected,
            };
            assert_eq!(
                response.overall_code,
                expected as i32,
                "{} answered {response:?} to {:?}",
                target.name(),
                body.name
            );
            if target == Target::Ratekeeper {
                assert_eq!(
                    response.statuses.len(),
                    body.request.descriptors.len(),
                    "one status per descriptor"
                );
                assert!(
                    response
                        .statuses
                        .iter()
                        .all(|status| status.current_limit.is_some()),
                    "every descriptor matched a limit: {response:?}"
                );
            }
            println!(
                "check: {} answers {:?} with {:?} ({} statuses)",
                target.name(),
                body.name,
                Code::try_from(response.overall_code).unwrap_or(Code::Unknown),
                response.statuses.len()
            );
        }
    });
}

/// Sends the exact bytes of each body file with nghttp and checks the gRPC status trailer.
fn check_with_nghttp(target: Target, addr: SocketAddr, bodies: &[Body]) {
    for body in bodies {
        let output = Command::new("nghttp")
            .arg("-v")
            .arg("-d")
            .arg(&body.file)
            .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
            .arg(format!("http://{addr}{PATH}"))
            .output()
            .expect("run nghttp (package nghttp2-client)");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && text.contains("grpc-status: 0"),
            "{} did not answer grpc-status 0 to the {:?} body file:\n{text}",
            target.name(),
            body.name
        );
    }
    println!(
        "check: {} answers grpc-status 0 to every body file (nghttp)",
        target.name()
    );
}

struct Run {
    target: Target,
    body: usize,
    requests_per_second: f64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
    cpu_us_per_request: f64,
    /// CPU used by everything else on the machine per request: h2load, plus any noise.
    other_us_per_request: f64,
    /// With `GRPC_BENCH_PERF=1`: perf counters of this process, per request.
    per_request: Vec<(String, f64)>,
}

/// `perf stat` attached to this process for one h2load run (opt-in: `GRPC_BENCH_PERF=1` for
/// the default events, or a comma-separated perf event list).
struct Perf {
    child: std::process::Child,
    output: PathBuf,
}

impl Perf {
    const EVENTS: &str = "raw_syscalls:sys_enter,context-switches,cpu-migrations";

    fn start(log: &Path) -> Option<Perf> {
        let events = match std::env::var("GRPC_BENCH_PERF") {
            Ok(events) if events == "1" => Perf::EVENTS.to_owned(),
            Ok(events) => events,
            Err(_) => return None,
        };
        let output = log.with_extension("perf");
        let child = Command::new("perf")
            .args(["stat", "-x", ",", "-e", &events, "-o"])
            .arg(&output)
            .args(["-p", &std::process::id().to_string()])
            .spawn()
            .expect("run perf stat");
        // perf needs a moment to attach before the load starts.
        std::thread::sleep(Duration::from_millis(300));
        Some(Perf { child, output })
    }

    /// Stops perf (SIGINT makes it print its counts) and reads `(event, count)` pairs.
    fn finish(mut self) -> Vec<(String, f64)> {
        let stopped = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .is_ok_and(|status| status.success());
        assert!(stopped, "could not stop perf stat");
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.output).unwrap_or_default();
        // CSV lines: count,unit,event,...
        text.lines()
            .filter_map(|line| {
                let mut fields = line.split(',');
                let count = fields.next()?.parse::<f64>().ok()?;
                let event = fields.nth(1)?.to_owned();
                Some((event, count))
            })
            .collect()
    }
}

fn h2load(
    target: Target,
    addr: SocketAddr,
    body_index: usize,
    body: &Body,
    requests: u64,
    log: &Path,
    ticks: f64,
) -> Run {
    // h2load appends to its log file.
    let _ = std::fs::remove_file(log);
    let perf = Perf::start(log);
    let cpu_before = process_cpu(ticks);
    let busy_before = machine_busy(ticks);
    let output = Command::new("h2load")
        .args(["-c", &CONNECTIONS.to_string()])
        .args(["-m", &STREAMS_PER_CONNECTION.to_string()])
        .args(["-n", &requests.to_string()])
        .arg("-d")
        .arg(&body.file)
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg(format!("--log-file={}", log.display()))
        .arg(format!("http://{addr}{PATH}"))
        .output()
        .expect("run h2load (package nghttp2-client)");
    let cpu = process_cpu(ticks).saturating_sub(cpu_before);
    let busy = machine_busy(ticks).saturating_sub(busy_before);
    let counters = perf.map(Perf::finish).unwrap_or_default();
    let (requests_per_second, latencies) = parse_h2load(&output, log, requests);
    Run {
        target,
        body: body_index,
        requests_per_second,
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        max_us: latencies.last().copied().unwrap_or(0),
        cpu_us_per_request: cpu.as_secs_f64() * 1e6 / requests as f64,
        other_us_per_request: busy.saturating_sub(cpu).as_secs_f64() * 1e6 / requests as f64,
        per_request: counters
            .into_iter()
            .map(|(event, count)| (event, count / requests as f64))
            .collect(),
    }
}

fn main() {
    let rounds = env_or("GRPC_BENCH_ROUNDS", 6);
    let requests = env_or("GRPC_BENCH_REQUESTS", 200_000);
    let ticks = clock_ticks();
    print_load("start");
    let dir = std::env::temp_dir().join(format!("ratekeeper-grpc-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    let bodies = bodies(&dir);
    let log = dir.join("h2load.log");

    let (stop_tx, stop_rx) = watch::channel(false);
    let noop_runtime = runtime("noop-rt", 2);
    let ratekeeper_runtime = runtime("ratekeeper-rt", 2);
    let noop = start_noop(&noop_runtime, stop_rx.clone());
    let limits = format!("{API_KEY_LIMITS}{TENANT_LIMIT}");
    let ratekeeper = start_ratekeeper(&ratekeeper_runtime, &limits, None, stop_rx);
    let addr = |target| match target {
        Target::Noop => noop,
        Target::Ratekeeper => ratekeeper,
    };

    for target in [Target::Noop, Target::Ratekeeper] {
        check_with_tonic(target, addr(target), &bodies);
        check_with_nghttp(target, addr(target), &bodies);
    }

    // (target, body) pairs of one round. The no-op server gets the allowed bodies only: the
    // over-limit body is the same size, and it answers OK to everything.
    let pairs: Vec<(Target, usize)> = vec![
        (Target::Noop, 0),
        (Target::Ratekeeper, 0),
        (Target::Noop, 1),
        (Target::Ratekeeper, 1),
        (Target::Ratekeeper, 2),
    ];
    println!(
        "h2load -c {CONNECTIONS} -m {STREAMS_PER_CONNECTION} -n {requests}, {rounds} rounds, \
         servers on two 2-worker runtimes in this process, h2load on the same 2 cores"
    );
    // Warm-up, not counted: connections, allocator, the engine's key.
    for &(target, body) in &pairs {
        h2load(
            target,
            addr(target),
            body,
            &bodies[body],
            requests / 10,
            &log,
            ticks,
        );
    }
    println!();
    println!(
        "| round | server | body | req/s | p50 | p99 | max | server CPU/req | h2load+other CPU/req |"
    );
    println!("|---:|---|---|---:|---:|---:|---:|---:|---:|");
    let mut runs = Vec::new();
    for round in 0..rounds {
        let mut order = pairs.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for (target, body) in order {
            let run = h2load(
                target,
                addr(target),
                body,
                &bodies[body],
                requests,
                &log,
                ticks,
            );
            let counters: Vec<String> = run
                .per_request
                .iter()
                .map(|(event, count)| format!(" {event} {count:.2}/req |"))
                .collect();
            println!(
                "| {} | {} | {} | {:.0} | {} us | {} us | {} us | {:.1} us | {:.1} us |{}",
                round + 1,
                target.name(),
                bodies[body].name,
                run.requests_per_second,
                run.p50_us,
                run.p99_us,
                run.max_us,
                run.cpu_us_per_request,
                run.other_us_per_request,
                counters.concat()
            );
            runs.push(run);
        }
    }

    println!();
    println!("Medians over {rounds} runs each:");
    println!();
    println!("| server | body | req/s | p50 | p99 | server CPU/req | vs no-op (same body) |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let summary = |target: Target, body: usize| {
        let mine: Vec<&Run> = runs
            .iter()
            .filter(|run| run.target == target && run.body == body)
            .collect();
        let mut rps: Vec<f64> = mine.iter().map(|run| run.requests_per_second).collect();
        let mut p50: Vec<f64> = mine.iter().map(|run| run.p50_us as f64).collect();
        let mut p99: Vec<f64> = mine.iter().map(|run| run.p99_us as f64).collect();
        let mut cpu: Vec<f64> = mine.iter().map(|run| run.cpu_us_per_request).collect();
        (
            median(&mut rps),
            median(&mut p50),
            median(&mut p99),
            median(&mut cpu),
        )
    };
    let mut ratios = Vec::new();
    for &(target, body) in &pairs {
        let (rps, p50, p99, cpu) = summary(target, body);
        let ratio = match target {
            Target::Noop => "-".to_owned(),
            Target::Ratekeeper if body < 2 => {
                let (noop_rps, ..) = summary(Target::Noop, body);
                ratios.push((body, rps / noop_rps));
                format!("{:.1}%", 100.0 * rps / noop_rps)
            }
            Target::Ratekeeper => {
                let (noop_rps, ..) = summary(Target::Noop, 0);
                format!("{:.1}% (of 1-descriptor no-op)", 100.0 * rps / noop_rps)
            }
        };
        println!(
            "| {} | {} | {rps:.0} | {p50:.0} us | {p99:.0} us | {cpu:.1} us | {ratio} |",
            target.name(),
            bodies[body].name,
        );
    }
    println!();
    if let Some(&(_, ratio)) = ratios.iter().find(|(body, _)| *body == 0) {
        let verdict = if ratio >= 0.85 { "met" } else { "NOT met" };
        println!(
            "target: ratekeeper >= 85% of the no-op server's throughput (1 descriptor): {:.1}%, {verdict}",
            100.0 * ratio
        );
    }

    print_load("end");
    let _ = stop_tx.send(true);
    drop(noop_runtime);
    drop(ratekeeper_runtime);
    let _ = std::fs::remove_dir_all(&dir);
}
