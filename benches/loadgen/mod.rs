//! Pieces the gRPC and cluster benchmarks share: a no-op RLS server for the same-run
//! baseline, request framing, runtimes, and the CPU, load and statistics readings; and the
//! project's own closed-loop gRPC load generator ([`client`], with the requests it sends in
//! [`workload`] and its latency [`histogram`]).
#![allow(dead_code)]

pub mod client;
pub mod histogram;
pub mod workload;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::process::Output;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

/// Which server a run measures: the no-op baseline or the real one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Target {
    Noop,
    Ratekeeper,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Noop => "no-op",
            Target::Ratekeeper => "ratekeeper",
        }
    }
}

/// The do-nothing baseline: OK for every request, without looking at it.
pub struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        }))
    }
}

/// The gRPC wire frame h2load sends: uncompressed flag, big-endian length, message.
pub fn grpc_frame(request: &RateLimitRequest) -> Vec<u8> {
    let message = request.encode_to_vec();
    let len = u32::try_from(message.len()).expect("a small request");
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&message);
    frame
}

pub fn runtime(name: &str, workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

pub async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

pub fn start_noop(runtime: &Runtime, stop: watch::Receiver<bool>) -> SocketAddr {
    let listener = runtime
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind the no-op server");
    let addr = listener.local_addr().expect("a bound address");
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    runtime.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Noop))
            .serve_with_incoming_shutdown(incoming, stopped(stop))
            .await
            .expect("the no-op server runs");
    });
    addr
}

/// This process's user + system CPU time so far, from `/proc/self/stat`.
pub fn process_cpu(ticks_per_second: f64) -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_secs_f64(ticks as f64 / ticks_per_second)
}

/// Busy CPU time of the whole machine so far (everything but idle and iowait).
pub fn machine_busy(ticks_per_second: f64) -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").expect("read /proc/stat");
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.parse().ok())
        .collect();
    let busy: u64 = fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(index, _)| *index != 3 && *index != 4)
        .map(|(_, ticks)| ticks)
        .sum();
    Duration::from_secs_f64(busy as f64 / ticks_per_second)
}

pub fn print_load(when: &str) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M:%S UTC"])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_default();
    println!("{when}: {date}, load average {}", load.trim());
}

pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|output| String::from_utf8_lossy(&output.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

pub fn percentile(sorted: &[u64], fraction: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 * fraction).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.is_empty() {
        f64::NAN
    } else if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

/// h2load's req/s and every request's latency (us, sorted), from its summary and its
/// `--log-file`. Panics unless every request succeeded with HTTP 200.
pub fn parse_h2load(output: &Output, log: &Path, requests: u64) -> (f64, Vec<u64>) {
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "h2load failed:\n{text}");
    // "finished in 4.21s, 47501.20 req/s, 3.11MB/s"
    let requests_per_second: f64 = text
        .lines()
        .find_map(|line| line.strip_prefix("finished in "))
        .and_then(|rest| rest.split(", ").nth(1))
        .and_then(|field| field.strip_suffix(" req/s"))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no req/s in h2load's output:\n{text}"));
    // "requests: 200000 total, 200000 started, 200000 done, 200000 succeeded, 0 failed, ..."
    let expected_ok = format!("{requests} succeeded, 0 failed, 0 errored");
    assert!(
        text.contains(&expected_ok),
        "not every request succeeded:\n{text}"
    );
    let log_text = std::fs::read_to_string(log).expect("read h2load's log");
    let mut latencies: Vec<u64> = log_text
        .lines()
        .filter_map(|line| {
            let mut columns = line.split('\t');
            let status = columns.nth(1)?;
            let elapsed = columns.next()?;
            assert_eq!(status, "200", "a request failed: {line}");
            elapsed.trim().parse().ok()
        })
        .collect();
    assert_eq!(latencies.len() as u64, requests, "one log line per request");
    latencies.sort_unstable();
    (requests_per_second, latencies)
}

/// One `api_key` limit far above any rate reachable here, so every answer is OK.
pub const API_KEY_LIMITS: &str = "\
domain: bench
descriptors:
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
";

/// Starts the real ratekeeper server (default settings, `shards` shards if given) with the
/// limits in `yaml` on `runtime`, both listeners on `127.0.0.1:0`; returns the gRPC address.
pub fn start_ratekeeper(
    runtime: &Runtime,
    yaml: &str,
    shards: Option<usize>,
    stop: watch::Receiver<bool>,
) -> SocketAddr {
    let localhost = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut options = ratekeeper::server::ServerOptions::new(localhost, localhost);
    if let Some(shards) = shards {
        options.engine.shards = shards;
    }
    start_ratekeeper_with(runtime, yaml, &options, stop)
}

/// [`start_ratekeeper`] with `options` (listening on their addresses).
pub fn start_ratekeeper_with(
    runtime: &Runtime,
    yaml: &str,
    options: &ratekeeper::server::ServerOptions,
    stop: watch::Receiver<bool>,
) -> SocketAddr {
    start_ratekeeper_listening(runtime, yaml, options, stop).0
}

/// [`start_ratekeeper_with`], answering the gRPC and the HTTP (admin) addresses.
pub fn start_ratekeeper_listening(
    runtime: &Runtime,
    yaml: &str,
    options: &ratekeeper::server::ServerOptions,
    stop: watch::Receiver<bool>,
) -> (SocketAddr, SocketAddr) {
    let limits =
        ratekeeper::limits::Limits::parse_str("bench.yaml", yaml).expect("the bench limits parse");
    let server = runtime
        .block_on(ratekeeper::server::Server::bind(options, limits, 0))
        .expect("bind ratekeeper");
    let addr = server.grpc_addr().expect("grpc on tcp");
    let http = server.http_addr();
    runtime.spawn(async move {
        server.run(stopped(stop)).await.expect("ratekeeper runs");
    });
    (addr, http)
}

/// The body of `GET path` on a server's HTTP listener (HTTP/1.1, one connection per call);
/// an error unless it answers 200.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(5);
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!("GET {path}: {head}")));
    }
    Ok(body.to_owned())
}
