//! A closed-loop HTTP/2 gRPC load generator for `ShouldRateLimit`, built to cost its host
//! as little CPU as possible: it speaks HTTP/2 through the `h2` crate directly (no tonic
//! client, no tower stack), sends request bodies that are already gRPC frames (`Bytes`), and
//! decodes of each answer only the overall code and the number of statuses.
//!
//! `connections` HTTP/2 connections each carry `streams` workers; a worker sends one request,
//! waits for its whole answer, records it, and sends the next, so exactly
//! `connections * streams` requests are in flight. Everything runs on one thread by default
//! (like h2load), leaving the other cores to the server under test.
//!
//! Every answer is checked: HTTP 200, one length-prefixed message, `grpc-status: 0` in the
//! trailers, an overall code of OK or OVER_LIMIT and, when `statuses` is given, that many
//! descriptor statuses. Anything else counts as an error, and the first one is reported.
//!
//! It runs as its own process: a benchmark binary calls [`run_if_asked`] first thing in
//! `main`, and [`spawn`] re-executes the current binary with [`ENV`] set to the arguments, so
//! the server under test and the load never share a process. By hand, `examples/loadgen.rs`:
//! `cargo run --release --example loadgen -- addr=127.0.0.1:8081 seconds=10 descriptors=4 keys=100000`
//! prints one JSON line ([`Report`]).

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
// Wall-clock latency of real sockets: tokio's Instant adds nothing here but a lookup of
// the (never paused) test clock on every read.
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use h2::client::SendRequest;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

pub mod config;

pub use config::{Config, Stop};

use super::histogram::Histogram;
use super::workload::{Bodies, BodyMode};
use super::{clock_ticks, process_cpu};

/// The environment variable that turns a benchmark binary into the load generator.
pub const ENV: &str = "RK_LOADGEN";
pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// HTTP/2 windows as h2load's defaults (2^30 - 1), so answers never wait for a window update.
const WINDOW: u32 = (1 << 30) - 1;
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `RateLimitResponse.Code`.
const CODE_OK: i32 = 1;
const CODE_OVER_LIMIT: i32 = 2;

/// One run's result: the load generator's one line of output.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Requests started in the measured window (after the warm-up).
    pub requests: u64,
    /// Every request sent, warm-up included.
    pub all_requests: u64,
    pub seconds: f64,
    pub requests_per_second: f64,
    /// Measured answers by overall code.
    pub ok: u64,
    pub over_limit: u64,
    /// Failed requests, warm-up included; any is a failed run.
    pub errors: u64,
    /// Calls that never reached their endpoint and were sent again on another connection
    /// (only with `fallbacks`): not errors, as Envoy's retry makes them none.
    #[serde(default)]
    pub retried: u64,
    pub first_error: Option<String>,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// The load generator's own CPU (user + system) per measured request.
    pub cpu_us_per_request: f64,
}

impl Report {
    /// Panics, naming `what` and the first error, unless every request was answered.
    pub fn assert_answered(&self, what: &str) {
        assert_eq!(self.errors, 0, "{what}: {:?}", self.first_error);
    }
}

/// Runs the load generator and exits the process if [`ENV`] is set; returns otherwise.
pub fn run_if_asked() {
    if let Ok(args) = std::env::var(ENV) {
        run_and_exit(&args, ENV);
    }
}

/// Runs the load `args` ([`Config::parse`]'s form) describes, prints the [`Report`] as one
/// JSON line and exits: 0, or 1 if any request failed, or 2 (naming `source`, where the
/// settings came from) if `args` is not a valid load.
pub fn run_and_exit(args: &str, source: &str) -> ! {
    let config = match Config::parse(args) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{source}: {error}");
            std::process::exit(2);
        }
    };
    let report = run(&config);
    match serde_json::to_string(&report) {
        Ok(line) => println!("{line}"),
        Err(error) => {
            eprintln!("{source}: cannot print the report: {error}");
            std::process::exit(2);
        }
    }
    std::process::exit(if report.errors == 0 { 0 } else { 1 });
}

/// The shell command that runs `config` as its own process.
pub fn command_line(config: &Config) -> String {
    let exe = std::env::current_exe()
        .map(|path| path.display().to_string())
        .unwrap_or_else(|_| "<this benchmark binary>".to_owned());
    format!("{ENV}='{}' {exe}", config.to_args())
}

/// Runs `config` in a child process (this binary again, see [`run_if_asked`]) and returns
/// its report. Panics if the child prints none; a report with errors is returned as it is.
pub fn spawn(config: &Config) -> Report {
    let exe = std::env::current_exe().expect("the path of this binary");
    let output = Command::new(&exe)
        .env(ENV, config.to_args())
        .stdin(Stdio::null())
        .output()
        .expect("start the load generator");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find(|line| line.starts_with('{'));
    let report = line.and_then(|line| serde_json::from_str(line).ok());
    report.unwrap_or_else(|| {
        panic!(
            "the load generator ({}) printed no report ({}):\nstdout:\n{stdout}\nstderr:\n{}",
            command_line(config),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// Runs the load in this process (see [`spawn`] for a process of its own).
pub fn run(config: &Config) -> Report {
    let runtime = if config.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.threads)
            .enable_all()
            .build()
    }
    .expect("a tokio runtime");
    runtime
        .block_on(drive(config))
        .unwrap_or_else(|error| Report {
            errors: 1,
            first_error: Some(error),
            ..Report::default()
        })
}

/// When a worker may send, and whether what it sends is measured.
struct Schedule {
    measure_from: Instant,
    stop: Stop,
    /// Measured requests still to start ([`Stop::Count`]).
    remaining: AtomicU64,
    /// Open loop: the next request's number, and the time between two requests.
    slot: AtomicU64,
    interval: Option<Duration>,
    start: Instant,
}

impl Schedule {
    /// Closed loop: now. Open loop: waits until the next request is due, and returns
    /// when it was.
    async fn due(&self) -> Instant {
        let Some(interval) = self.interval else {
            return Instant::now();
        };
        let slot = self.slot.fetch_add(1, Ordering::Relaxed);
        let due = self.start + interval.saturating_mul(u32::try_from(slot).unwrap_or(u32::MAX));
        tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
        due
    }
}

impl Schedule {
    /// `None`: stop. `Some(measured)`: send, and measure it if `measured`.
    fn claim(&self, now: Instant) -> Option<bool> {
        if now < self.measure_from {
            return Some(false);
        }
        match self.stop {
            Stop::After(duration) => (now < self.measure_from + duration).then_some(true),
            Stop::Count(_) => self
                .remaining
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                    left.checked_sub(1)
                })
                .is_ok()
                .then_some(true),
        }
    }
}

async fn drive(config: &Config) -> Result<Report, String> {
    let ticks = clock_ticks();
    let pool = (config.body == BodyMode::Pool).then(|| config.workload.pool(config.seed));
    let uri: Uri = format!("http://{}{PATH}", config.addr)
        .parse()
        .map_err(|error| format!("bad uri: {error}"))?;
    let mut links = Vec::with_capacity(config.connections);
    for _ in 0..config.connections {
        links.push(Link::open(config).await?);
    }

    let start = Instant::now();
    let schedule = Arc::new(Schedule {
        measure_from: start + config.warmup,
        stop: config.stop,
        remaining: AtomicU64::new(match config.stop {
            Stop::Count(count) => count,
            Stop::After(_) => 0,
        }),
        slot: AtomicU64::new(0),
        interval: (config.rate > 0).then(|| Duration::from_secs_f64(1.0 / config.rate as f64)),
        start,
    });
    let cpu_at_start = {
        let at = tokio::time::Instant::from_std(schedule.measure_from);
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            process_cpu(ticks)
        })
    };
    let latencies = Arc::new(Histogram::default());
    let mut workers = Vec::with_capacity(config.connections * config.streams);
    for (connection, link) in links.iter().enumerate() {
        for stream in 0..config.streams {
            let index = (connection * config.streams + stream) as u64;
            let seed = config
                .seed
                .wrapping_mul(0x0000_0100_0000_01b3)
                .wrapping_add(index);
            let bodies = match &pool {
                Some(pool) => Bodies::pool(pool.clone(), seed),
                None => Bodies::build(config.workload, seed),
            };
            let worker = Worker {
                sender: link.sender.clone(),
                generation: 0,
                link: link.fails_over().then(|| Arc::clone(link)),
                uri: uri.clone(),
                bodies,
                schedule: schedule.clone(),
                latencies: latencies.clone(),
                statuses: config.statuses,
            };
            workers.push(tokio::spawn(worker.run()));
        }
    }
    // The connections close once the workers' handles are gone.
    drop(links);

    let give_up = match config.stop {
        Stop::After(duration) => schedule.measure_from + duration + config.timeout,
        Stop::Count(_) => schedule.measure_from + config.timeout,
    };
    let join = async {
        let mut total = Tally::default();
        for worker in workers {
            let tally = worker
                .await
                .map_err(|error| format!("a worker panicked: {error}"))?;
            total.merge(tally);
        }
        Ok::<Tally, String>(total)
    };
    let total = tokio::time::timeout_at(tokio::time::Instant::from_std(give_up), join)
        .await
        .map_err(|_| {
            format!(
                "the run went {} s past its planned end (timeout=): some request was never \
                 answered",
                config.timeout.as_secs_f64()
            )
        })??;
    let cpu = process_cpu(ticks).saturating_sub(
        cpu_at_start
            .await
            .map_err(|error| format!("the CPU reader panicked: {error}"))?,
    );
    let seconds = match config.stop {
        Stop::After(duration) => duration.as_secs_f64(),
        Stop::Count(_) => total
            .last_end
            .map_or(0.0, |end| (end - schedule.measure_from).as_secs_f64()),
    };
    let measured = total.measured;
    let micros = |nanos: u64| (nanos as f64 / 100.0).round() / 10.0;
    Ok(Report {
        requests: measured,
        all_requests: total.all,
        seconds,
        // JSON has no NaN: a run that measured nothing reports 0.
        requests_per_second: if seconds > 0.0 {
            measured as f64 / seconds
        } else {
            0.0
        },
        ok: total.ok,
        over_limit: total.over_limit,
        errors: total.errors,
        retried: total.retried,
        first_error: total.first_error,
        p50_us: micros(latencies.quantile(0.50)),
        p90_us: micros(latencies.quantile(0.90)),
        p99_us: micros(latencies.quantile(0.99)),
        p999_us: micros(latencies.quantile(0.999)),
        max_us: micros(latencies.max()),
        cpu_us_per_request: cpu.as_secs_f64() * 1e6 / measured.max(1) as f64,
    })
}

/// How long a new connection may take, with fallbacks (then the next endpoint is tried).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// One of the load's connections; with fallbacks, replaced when it breaks.
struct Link {
    /// The first connection, cloned by the workers.
    sender: SendRequest<Bytes>,
    /// `addr`, then the fallbacks: the order new connections try.
    endpoints: Vec<SocketAddr>,
    /// The connection now and its generation (0 for the first); replaced by one worker.
    current: tokio::sync::Mutex<(u64, SendRequest<Bytes>)>,
}

impl Link {
    /// Whether `fallbacks` were given: a broken connection is replaced, a refused call sent
    /// again.
    fn fails_over(&self) -> bool {
        self.endpoints.len() > 1
    }

    async fn open(config: &Config) -> Result<Arc<Link>, String> {
        let sender = connect(config.addr).await?;
        Ok(Arc::new(Link {
            current: tokio::sync::Mutex::new((0, sender.clone())),
            sender,
            endpoints: std::iter::once(config.addr)
                .chain(config.fallbacks.iter().copied())
                .collect(),
        }))
    }

    /// The connection that follows generation `seen`: if `seen` is still the current one (it
    /// broke), a new one to the first endpoint that accepts; else the one another worker
    /// made meanwhile.
    async fn replace(&self, seen: u64) -> Result<(u64, SendRequest<Bytes>), String> {
        let mut current = self.current.lock().await;
        if current.0 == seen {
            let mut last_error = String::from("no endpoint");
            let mut fresh = None;
            for addr in &self.endpoints {
                match tokio::time::timeout(CONNECT_TIMEOUT, connect(*addr)).await {
                    Ok(Ok(sender)) => {
                        fresh = Some(sender);
                        break;
                    }
                    Ok(Err(error)) => last_error = error,
                    Err(_) => last_error = format!("connect to {addr}: timed out"),
                }
            }
            *current = (seen + 1, fresh.ok_or(last_error)?);
        }
        Ok((current.0, current.1.clone()))
    }
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Bytes>, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|error| format!("connect to {addr}: {error}"))?;
    tcp.set_nodelay(true)
        .map_err(|error| format!("TCP_NODELAY: {error}"))?;
    let (sender, connection) = h2::client::Builder::new()
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .handshake::<_, Bytes>(tcp)
        .await
        .map_err(|error| format!("HTTP/2 handshake with {addr}: {error}"))?;
    // A broken connection fails its streams, which is where it is counted.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    all: u64,
    ok: u64,
    over_limit: u64,
    errors: u64,
    retried: u64,
    first_error: Option<String>,
    /// Measured requests.
    measured: u64,
    last_end: Option<Instant>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.all += other.all;
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.errors += other.errors;
        self.retried += other.retried;
        self.first_error = self.first_error.take().or(other.first_error);
        self.measured += other.measured;
        self.last_end = self.last_end.max(other.last_end);
    }

    fn fail(&mut self, error: String) {
        self.errors += 1;
        self.first_error.get_or_insert(error);
    }
}

struct Worker {
    sender: SendRequest<Bytes>,
    /// The generation of `link`'s connection that `sender` is.
    generation: u64,
    /// Its connection, when broken connections are replaced (with fallbacks).
    link: Option<Arc<Link>>,
    uri: Uri,
    bodies: Bodies,
    schedule: Arc<Schedule>,
    /// Shared by all workers: see [`Histogram`].
    latencies: Arc<Histogram>,
    statuses: Option<usize>,
}

/// Why a request failed; a broken connection also ends the worker (without fallbacks).
enum Failure {
    Request(String),
    Connection(String),
    /// The call never reached the server: its connection was gone before it was sent, or
    /// the server refused its stream (`REFUSED_STREAM`, or past a graceful GOAWAY's last
    /// stream). Safe to send again; an error without fallbacks.
    Refused(String),
}

impl From<h2::Error> for Failure {
    fn from(error: h2::Error) -> Failure {
        let graceful = error.reason() == Some(h2::Reason::NO_ERROR);
        if error.reason() == Some(h2::Reason::REFUSED_STREAM)
            || (error.is_go_away() && error.is_remote() && graceful)
        {
            Failure::Refused(format!("refused: {error}"))
        } else if error.is_reset() && !error.is_go_away() {
            Failure::Request(format!("stream reset: {error}"))
        } else {
            Failure::Connection(format!("HTTP/2: {error}"))
        }
    }
}

/// The fields of `RateLimitResponse` the load generator looks at; prost skips the rest
/// without allocating (a `Vec` of an empty struct holds no heap memory).
#[derive(Clone, PartialEq, prost::Message)]
struct ResponseView {
    #[prost(int32, tag = "1")]
    overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    statuses: Vec<Skipped>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Skipped {}

impl Worker {
    async fn run(mut self) -> Tally {
        let mut tally = Tally::default();
        loop {
            let started = self.schedule.due().await;
            let Some(measured) = self.schedule.claim(started) else {
                break;
            };
            let body = self.bodies.next_body();
            let mut outcome = self.call(body.clone()).await;
            if matches!(outcome, Err(Failure::Refused(_))) && self.link.is_some() {
                tally.retried += 1;
                outcome = match self.reconnect().await {
                    Ok(()) => self.call(body).await,
                    Err(error) => Err(Failure::Connection(error)),
                };
            }
            tally.all += 1;
            match outcome {
                Ok(code) => {
                    if measured {
                        let ended = Instant::now();
                        self.latencies.record((ended - started).as_nanos() as u64);
                        tally.measured += 1;
                        tally.last_end = Some(ended);
                        if code == CODE_OK {
                            tally.ok += 1;
                        } else {
                            tally.over_limit += 1;
                        }
                    }
                }
                Err(Failure::Request(error)) => tally.fail(error),
                Err(Failure::Connection(error) | Failure::Refused(error)) => {
                    tally.fail(error);
                    if self.link.is_none() || self.reconnect().await.is_err() {
                        break;
                    }
                }
            }
        }
        tally
    }

    /// Moves to the link's next connection (see [`Link::replace`]).
    async fn reconnect(&mut self) -> Result<(), String> {
        let link = self.link.as_ref().ok_or("no fallbacks")?;
        (self.generation, self.sender) = link.replace(self.generation).await?;
        Ok(())
    }

    /// Sends one request and checks its answer; returns the overall code.
    async fn call(&mut self, body: Bytes) -> Result<i32, Failure> {
        // Nothing was sent yet: any failure here is a refusal.
        let refused = |error: h2::Error| Failure::Refused(format!("not sent: {error}"));
        std::future::poll_fn(|cx| self.sender.poll_ready(cx))
            .await
            .map_err(refused)?;
        let mut request = Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        let (response, mut stream) = self.sender.send_request(request, false).map_err(refused)?;
        stream.send_data(body, true)?;

        let (head, mut body) = response.await?.into_parts();
        if head.status != StatusCode::OK {
            return Err(Failure::Request(format!("HTTP {}", head.status)));
        }
        if head.headers.contains_key(GRPC_STATUS) {
            // A trailers-only answer: an error, or OK without a message.
            return Err(Failure::Request(grpc_error(&head.headers)));
        }
        let mut data = Bytes::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            body.flow_control().release_capacity(chunk.len())?;
            data = if data.is_empty() {
                chunk
            } else {
                let mut joined = BytesMut::from(&data[..]);
                joined.extend_from_slice(&chunk);
                joined.freeze()
            };
        }
        let trailers = body
            .trailers()
            .await?
            .ok_or_else(|| Failure::Request("no trailers".to_owned()))?;
        if trailers.get(GRPC_STATUS).map(HeaderValue::as_bytes) != Some(b"0") {
            return Err(Failure::Request(grpc_error(&trailers)));
        }
        let response = decode(&data).map_err(Failure::Request)?;
        if response.overall_code != CODE_OK && response.overall_code != CODE_OVER_LIMIT {
            return Err(Failure::Request(format!(
                "overall_code {} is neither OK nor OVER_LIMIT",
                response.overall_code
            )));
        }
        if let Some(expected) = self.statuses
            && response.statuses.len() != expected
        {
            return Err(Failure::Request(format!(
                "{} descriptor statuses, expected {expected}",
                response.statuses.len()
            )));
        }
        Ok(response.overall_code)
    }
}

/// Decodes one uncompressed gRPC message frame.
fn decode(data: &[u8]) -> Result<ResponseView, String> {
    let Some((&[flag, a, b, c, d], message)) = data.split_first_chunk::<5>() else {
        return Err(format!("a {}-byte body is no gRPC frame", data.len()));
    };
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if flag != 0 || len != message.len() {
        return Err(format!(
            "bad gRPC frame: flag {flag}, length {len}, {} bytes follow",
            message.len()
        ));
    }
    ResponseView::decode(message).map_err(|error| format!("bad RateLimitResponse: {error}"))
}

fn grpc_error(headers: &HeaderMap) -> String {
    let text = |name: HeaderName| {
        headers
            .get(name)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
            .unwrap_or_default()
    };
    format!(
        "grpc-status {:?}: {}",
        text(GRPC_STATUS),
        text(GRPC_MESSAGE)
    )
}
