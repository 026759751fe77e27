//! Soak (issue 20): a 3-node cluster of real `ratekeeper` release processes on 127.0.0.1
//! under half of its saturation for a long time, with key churn, a hot reload every
//! interval and a graceful (SIGTERM) restart of one node at a time, rotating; samples every
//! node's RSS and open file descriptors (from `/proc`), p99 latency and errors every
//! interval; writes a CSV, an SVG plot and a summary against the targets.
//!
//! The run, in order:
//! 1. Three nodes (`a`, `b`, `c`), each with its own limits file in its own directory, in
//!    cluster mode (`--peers`: each joins the ones started before it); once every node sees 3
//!    members their addresses are fixed: a restarted node comes back on the same ones, seeded
//!    with the other two peers.
//! 2. Saturation: the project's load generator ([`loadgen::client`], one child process per
//!    node, closed loop, 8 connections x 32 streams each) for `--saturation-secs`; the sum
//!    of the three rates is the closed loop's saturation. Then the soak's own load (open
//!    loop, below) runs at a quarter of that for as long, and the share of the machine's
//!    CPU it takes gives the rate at which that load would saturate the machine: the
//!    saturation the soak halves (requests sent one at a time cost more each than a closed
//!    loop's batches; see `open_loop_saturation`).
//! 3. The soak, `--minutes` long, in intervals of `--interval-secs`: each interval runs three
//!    open-loop load generators (one per node) at a third of half of saturation each, 2
//!    descriptors per request (so requests span owners) over a key space that slides by
//!    half its width every interval: new keys appear all the time, old ones are never asked
//!    again and expire (the limits have second and minute windows). At the start of every
//!    interval every node's limits file is rewritten (the minute limit alternating between
//!    two values) and renamed over the old one, and RSS, descriptors and
//!    `config_loads_total` are read.
//! 4. Every `--restart-every-secs` (plus 3/10 of an interval, so the SIGTERM lands inside one)
//!    a restart thread restarts the next node: before it, a key
//!    the node owns gets half its limit (`exact-*`: 20 a day) admitted, asked round-robin
//!    through all nodes, one request at a time (so no lease); SIGTERM (the node hands its
//!    counters over), wait for the exit, start it again on the same addresses, wait until
//!    every node sees 3 members and the returned node has received counters back (plus a
//!    second for the remaining handoff batches, as `tests/it/cluster.rs` waits for the
//!    handoff); then the carried key must admit exactly the other half, and a fresh key
//!    exactly its limit, asked round-robin through all nodes.
//!
//! Targets (after the warm-up): RSS net of the key tables (which follow the live keys by
//! design; raw RSS is reported too) and descriptors grow less than 5 % (per node: the mean
//! of each whole life of its process, from one of its restarts to the next, and the trend
//! of a least-squares line through those means, which is the target; reported beside the
//! trend through every steady sample and first against last of the samples just before
//! each restart, all of one age), the worst
//! interval's p99 (worst node) stays within 2x of the first minute's (median interval), no
//! errors, restarts included (each node's load lists the other nodes as fallbacks and sends
//! a call the node never took there, as Envoy's retry policy does; an interval overlapping a
//! restart, from SIGTERM until 3 members again plus a second, is reported apart), and every
//! exactness check exact.
//!
//! Run with `cargo bench --bench soak -- --minutes 30` (the defaults are the real ones).
//! A quick run: `cargo bench --bench soak -- --minutes 3 --warmup-secs 20
//! --restart-every-secs 40`. Output in `--out` (default `target/soak`): `soak.csv`,
//! `soak.svg`, `summary.txt`, `restarts.csv` and each node's log. The run stops by itself
//! (every step is bounded; a watchdog kills the nodes and exits 1 at twice the planned
//! time plus 5 minutes) and stops its nodes on the way out, panics included.

mod loadgen;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use loadgen::client::{self, Report, Stop};
use loadgen::workload::{DOMAIN, KEY, Workload};
use ratekeeper::cluster::ring::{DEFAULT_VNODES, Ring};
use ratekeeper::key::KeyBuilder;
use ratekeeper::limits::Limits;

const NAMES: [&str; 3] = ["a", "b", "c"];
/// Bytes one slot of a shard's key table takes: a 24-byte key, its 16-byte state and a
/// control byte (see `ratekeeper_shard_key_slots`).
const KEY_SLOT_BYTES: u64 = 41;
/// The `exact-*` keys' limit (a day window: no window ends during a check).
const EXACT_LIMIT: u64 = 20;
/// The churned keys' minute limit alternates between these on every reload.
const MINUTE_LIMITS: [u64; 2] = [100, 120];
const PER_SECOND_LIMIT: u64 = 10;
/// Keys one interval draws from; the next interval's range starts half of it further on.
const KEY_SPACE: u64 = 200_000;
const DESCRIPTORS: usize = 2;
const START_WITHIN: Duration = Duration::from_secs(20);
const FORM_WITHIN: Duration = Duration::from_secs(30);
const EXIT_WITHIN: Duration = Duration::from_secs(30);
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// Seconds after a restart's cluster was whole that still count as the restart.
const RESTART_SLACK: f64 = 1.0;
/// How long a returned node may take to receive its keys' counters back.
const HANDBACK_WITHIN: Duration = Duration::from_secs(10);

struct Settings {
    minutes: f64,
    warmup: Duration,
    restart_every: Duration,
    interval: Duration,
    saturation: Duration,
    out: PathBuf,
}

impl Settings {
    /// `--minutes`, `--warmup-secs`, `--restart-every-secs`, `--interval-secs`,
    /// `--saturation-secs`, `--out`; anything else (cargo's `--bench`) is ignored.
    fn from_args() -> Settings {
        let mut settings = Settings {
            minutes: 30.0,
            warmup: Duration::from_secs(120),
            restart_every: Duration::from_secs(120),
            interval: Duration::from_secs(10),
            saturation: Duration::from_secs(10),
            out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/soak"),
        };
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut index = 0;
        while index < args.len() {
            let value = args.get(index + 1).cloned().unwrap_or_default();
            let seconds = || {
                Duration::try_from_secs_f64(value.parse().unwrap_or(f64::NAN))
                    .unwrap_or_else(|_| panic!("{}: {value:?} is not seconds", args[index]))
            };
            match args[index].as_str() {
                "--minutes" => {
                    settings.minutes = value
                        .parse()
                        .unwrap_or_else(|_| panic!("--minutes: {value:?} is not a number"))
                }
                "--warmup-secs" => settings.warmup = seconds(),
                "--restart-every-secs" => settings.restart_every = seconds(),
                "--interval-secs" => settings.interval = seconds(),
                "--saturation-secs" => settings.saturation = seconds(),
                "--out" => settings.out = PathBuf::from(&value),
                _ => {
                    index += 1;
                    continue;
                }
            }
            index += 2;
        }
        assert!(
            settings.minutes > 0.0 && settings.minutes <= 24.0 * 60.0,
            "--minutes must be in (0, 1440]"
        );
        assert!(
            settings.interval >= Duration::from_secs(1),
            "--interval-secs must be at least 1"
        );
        settings
    }

    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.minutes * 60.0)
    }
}

/// A node's fixed addresses (after its first start).
#[derive(Clone, Copy, Debug)]
struct Addrs {
    grpc: SocketAddr,
    http: SocketAddr,
    admin: SocketAddr,
    peer: SocketAddr,
}

/// One running `ratekeeper serve`.
struct Node {
    name: &'static str,
    dir: PathBuf,
    addrs: Addrs,
    child: Child,
}

impl Node {
    fn config(dir: &Path) -> PathBuf {
        dir.join("limits.yaml")
    }

    /// Starts `ratekeeper serve` for node `name` in `dir`, on `addrs` (port 0 for a first
    /// start) joining `peers`; returns once it printed its serving line and `/healthcheck`
    /// answers 200.
    fn start(name: &'static str, dir: &Path, addrs: Addrs, peers: &[SocketAddr]) -> Node {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("node.log"))
            .expect("open the node's log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_ratekeeper"));
        for (key, _) in std::env::vars() {
            if key.starts_with("RATEKEEPER_") {
                command.env_remove(key);
            }
        }
        command
            .arg("serve")
            .arg("--config")
            .arg(Node::config(dir))
            .args(["--grpc-addr", &addrs.grpc.to_string()])
            .args(["--http-addr", &addrs.http.to_string()])
            .args(["--admin-addr", &addrs.admin.to_string()])
            .args(["--peer-addr", &addrs.peer.to_string()]);
        if !peers.is_empty() {
            let peers: Vec<String> = peers.iter().map(ToString::to_string).collect();
            command.args(["--peers", &peers.join(",")]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start ratekeeper");
        let stdout = child.stdout.take().expect("a piped stdout");
        let (lines, line) = mpsc::channel();
        // Reads the serving line, then drains stdout so the node never blocks on it.
        thread::spawn(move || {
            for text in BufReader::new(stdout).lines() {
                let Ok(text) = text else { break };
                let _ = lines.send(text);
            }
        });
        let mut node = Node {
            name,
            dir: dir.to_owned(),
            addrs,
            child,
        };
        let serving = line
            .recv_timeout(START_WITHIN)
            .unwrap_or_else(|_| panic!("node {name} printed no serving line; see its node.log"));
        node.addrs = parse_serving(&serving)
            .unwrap_or_else(|| panic!("node {name} printed {serving:?}, not its serving line"));
        let http = node.addrs.http;
        assert!(
            poll(START_WITHIN, || loadgen::http_get(http, "/healthcheck")
                .is_ok()),
            "node {name} never answered /healthcheck"
        );
        node
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits for the exit (SIGKILL after [`EXIT_WITHIN`]); whether it exited
    /// by itself, with status 0.
    fn stop(mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = Instant::now() + EXIT_WITHIN;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Only a node still running when the run ends (or panics) gets here running.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `ratekeeper serving grpc=ADDR http=ADDR admin=ADDR peer=ADDR`.
fn parse_serving(line: &str) -> Option<Addrs> {
    let fields: BTreeMap<&str, SocketAddr> = line
        .strip_prefix("ratekeeper serving ")?
        .split_whitespace()
        .filter_map(|field| {
            let (key, value) = field.split_once('=')?;
            Some((key, value.parse().ok()?))
        })
        .collect();
    Some(Addrs {
        grpc: *fields.get("grpc")?,
        http: *fields.get("http")?,
        admin: *fields.get("admin")?,
        peer: *fields.get("peer")?,
    })
}

fn poll(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn limits_yaml(minute_limit: u64) -> String {
    format!(
        "domain: {DOMAIN}
descriptors:
  - key: {KEY}
    value: exact-*
    rate_limit: {{unit: day, requests_per_unit: {EXACT_LIMIT}}}
  - key: {KEY}
    rate_limits:
      - {{unit: second, requests_per_unit: {PER_SECOND_LIMIT}}}
      - {{unit: minute, requests_per_unit: {minute_limit}}}
"
    )
}

/// Writes `yaml` next to `config` and renames it over it (one change event, never a torn
/// file).
fn write_atomically(config: &Path, yaml: &str) {
    let temporary = config.with_extension("yaml.tmp");
    std::fs::write(&temporary, yaml).expect("write the limits");
    std::fs::rename(&temporary, config).expect("rename the limits into place");
}

/// The sum of the `/metrics` samples whose line starts with `prefix` (None: no answer, or
/// no such sample).
fn metric(http: SocketAddr, prefix: &str) -> Option<f64> {
    let body = loadgen::http_get(http, "/metrics").ok()?;
    let values: Vec<f64> = body
        .lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// A process's user + system CPU time so far (s), from `/proc/PID/stat`.
fn cpu_seconds(pid: u32, ticks_per_second: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / ticks_per_second)
}

fn members_everywhere(nodes: &[Addrs]) -> bool {
    nodes
        .iter()
        .all(|node| metric(node.http, "ratekeeper_cluster_members ") == Some(3.0))
}

/// Resident set (KiB) and open descriptors of `pid`.
fn proc_sample(pid: u32) -> (Option<u64>, Option<u64>) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        });
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|entries| entries.count() as u64);
    (rss, fds)
}

/// The index (into `peers`) of the owner of `api_key = value`, by the ring the nodes build.
fn owner_of(peers: &[String], value: &str) -> usize {
    let ring = Ring::new(peers, DEFAULT_VNODES);
    let mut key = KeyBuilder::new(DOMAIN);
    key.entry(KEY, value);
    let owner = ring.owner(key.route()).expect("a ring with members");
    peers
        .iter()
        .position(|peer| **peer == **owner)
        .expect("the owner is a member")
}

/// Sends `count` hits on `api_key = value`, one at a time, round-robin through `grpc`;
/// answers how many were admitted, or the first error.
fn admitted(grpc: &[SocketAddr], value: &str, count: u64) -> Result<u64, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("runtime: {error}"))?;
    runtime.block_on(async {
        let mut clients = Vec::new();
        for addr in grpc {
            let connect = RateLimitServiceClient::connect(format!("http://{addr}"));
            let client = tokio::time::timeout(ANSWER_WITHIN, connect)
                .await
                .map_err(|_| format!("connect to {addr}: no answer"))?
                .map_err(|error| format!("connect to {addr}: {error}"))?;
            clients.push(client);
        }
        let request = RateLimitRequest {
            domain: DOMAIN.to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: KEY.to_owned(),
                    value: value.to_owned(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let mut admitted = 0;
        for hit in 0..count {
            let client = &mut clients[hit as usize % grpc.len()];
            let call = client.should_rate_limit(request.clone());
            let answer = tokio::time::timeout(ANSWER_WITHIN, call)
                .await
                .map_err(|_| format!("{value}: no answer within {ANSWER_WITHIN:?}"))?
                .map_err(|status| format!("{value}: {status}"))?;
            match answer.into_inner().overall_code {
                code if code == Code::Ok as i32 => admitted += 1,
                code if code == Code::OverLimit as i32 => {}
                code => return Err(format!("{value}: code {code}")),
            }
        }
        Ok(admitted)
    })
}

/// One restart, as the restart thread saw it (seconds since the soak began).
#[derive(Clone, Debug)]
struct Restart {
    node: &'static str,
    sigterm_at: f64,
    /// When every node saw 3 members again (None: never, within [`FORM_WITHIN`]).
    whole_at: Option<f64>,
    clean_exit: bool,
    /// The key carried over the restart: admitted after it, of the half left.
    carried: Result<u64, String>,
    /// A fresh key after the restart: admitted of `2 x EXACT_LIMIT` asked.
    fresh: Result<u64, String>,
}

impl Restart {
    /// `whole again after 0.5 s, clean exit true, carried Ok(10), fresh Ok(20)`.
    fn outcome(&self) -> String {
        let whole = self.whole_at.map_or("never".to_owned(), |at| {
            format!("{:.1} s", at - self.sigterm_at)
        });
        format!(
            "whole again after {whole}, clean exit {}, carried {:?}, fresh {:?}",
            self.clean_exit, self.carried, self.fresh
        )
    }

    fn exact(&self) -> bool {
        self.carried == Ok(EXACT_LIMIT / 2) && self.fresh == Ok(EXACT_LIMIT)
    }
}

/// The cluster, shared by the restart thread and the sampler.
struct Cluster {
    nodes: Mutex<Vec<Option<Node>>>,
    addrs: Vec<Addrs>,
}

impl Cluster {
    fn pids(&self) -> Vec<Option<u32>> {
        let nodes = self
            .nodes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        nodes
            .iter()
            .map(|node| node.as_ref().map(Node::pid))
            .collect()
    }

    fn grpc(&self) -> Vec<SocketAddr> {
        self.addrs.iter().map(|addrs| addrs.grpc).collect()
    }

    fn peers(&self) -> Vec<String> {
        self.addrs
            .iter()
            .map(|addrs| addrs.peer.to_string())
            .collect()
    }

    fn stop_all(&self) {
        let mut nodes = self
            .nodes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        for node in nodes.iter_mut() {
            if let Some(node) = node.take() {
                node.stop();
            }
        }
    }

    /// Restarts node `index` (see the module doc, step 4); `number` makes its keys unique.
    fn restart(&self, index: usize, number: usize, soak_start: Instant) -> Restart {
        let grpc = self.grpc();
        let peers = self.peers();
        let run = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let unique = |what: &str| -> String {
            (0..100_000)
                .map(|n| format!("exact-{run}-{number}-{what}-{n}"))
                .find(|value| owner_of(&peers, value) == index)
                .expect("some key is owned by each node")
        };
        let carried_key = unique("carried");
        let fresh_key = unique("fresh");
        let before = admitted(&grpc, &carried_key, EXACT_LIMIT / 2);
        let since = |at: Instant| (at - soak_start).as_secs_f64();
        let sigterm_at = since(Instant::now());
        let node = self
            .nodes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())[index]
            .take()
            .expect("the node runs");
        let (name, dir) = (node.name, node.dir.clone());
        let clean_exit = node.stop();
        let others: Vec<SocketAddr> = self
            .addrs
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != index)
            .map(|(_, addrs)| addrs.peer)
            .collect();
        let node = Node::start(name, &dir, self.addrs[index], &others);
        self.nodes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())[index] = Some(node);
        let whole = poll(FORM_WITHIN, || members_everywhere(&self.addrs));
        let whole_at = whole.then(|| since(Instant::now()));
        // The counters moved back to the returned node: it has received some, and no more
        // for a second (the last batch landed). Until then a key it owns counts from zero
        // where its counter has not arrived yet (docs/cluster.md, "The guarantee"): exactness is
        // checked after the handoff.
        let http = self.addrs[index].http;
        let received = || metric(http, "ratekeeper_cluster_handoff_received_total");
        let (mut last, mut still_since) = (None, Instant::now());
        poll(HANDBACK_WITHIN, || {
            let now = received();
            if now != last {
                (last, still_since) = (now, Instant::now());
            }
            last.is_some_and(|n| n > 0.0) && still_since.elapsed() >= Duration::from_secs(1)
        });
        let carried = match before {
            Ok(admitted_before) if admitted_before == EXACT_LIMIT / 2 => {
                admitted(&grpc, &carried_key, EXACT_LIMIT)
            }
            Ok(admitted_before) => Err(format!(
                "{carried_key}: {admitted_before} of {} admitted before the restart",
                EXACT_LIMIT / 2
            )),
            Err(error) => Err(format!("before the restart: {error}")),
        };
        let fresh = admitted(&grpc, &fresh_key, 2 * EXACT_LIMIT);
        Restart {
            node: name,
            sigterm_at,
            whole_at,
            clean_exit,
            carried,
            fresh,
        }
    }
}

/// Stops every node still running when dropped.
struct StopOnDrop(Arc<Cluster>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop_all();
    }
}

/// One interval's readings.
#[derive(Clone, Debug, Default)]
struct Sample {
    start: f64,
    end: f64,
    rss_kib: [Option<u64>; 3],
    fds: [Option<u64>; 3],
    config_loads: [Option<f64>; 3],
    /// Each node's live keys and key table capacity (`ratekeeper_shard_live_keys`,
    /// `ratekeeper_shard_key_slots`, summed over its shards): what its RSS follows.
    live_keys: [Option<f64>; 3],
    key_slots: [Option<f64>; 3],
    /// What explains a slow interval, each the change over the interval: per node, the
    /// checks that waited for a busy shard and how long in all (ms), the forwards slower
    /// than 20 ms, and its CPU time (s); the whole machine's busy CPU time (s), so that
    /// others' work on the machine shows (busy minus the nodes' and the load's).
    contended: [Option<f64>; 3],
    lock_wait_ms: [Option<f64>; 3],
    slow_forwards: [Option<f64>; 3],
    node_cpu_s: [Option<f64>; 3],
    machine_busy_s: f64,
    load_cpu_s: f64,
    reports: [Report; 3],
    /// Overlaps a restart (from its SIGTERM until the cluster was whole, plus [`RESTART_SLACK`]).
    restart: bool,
}

impl Sample {
    fn errors(&self) -> u64 {
        self.reports.iter().map(|report| report.errors).sum()
    }

    fn requests(&self) -> u64 {
        self.reports.iter().map(|report| report.all_requests).sum()
    }

    /// The worst node's p99 (ms); None if no node measured anything.
    fn p99_ms(&self) -> Option<f64> {
        self.reports
            .iter()
            .filter(|report| report.requests > 0)
            .map(|report| report.p99_us / 1000.0)
            .reduce(f64::max)
    }
}

fn load_config(addr: SocketAddr, workload: Workload, seed: u64) -> client::Config {
    let mut config = client::Config::new(addr, workload);
    config.seed = seed;
    config.statuses = Some(DESCRIPTORS);
    config.timeout = Duration::from_secs(10);
    config
}

/// Closed loop against all three nodes at once: the sum of their rates (req/s).
fn saturation(grpc: &[SocketAddr], seconds: Duration) -> (f64, Vec<Report>) {
    let workload = Workload {
        descriptors: DESCRIPTORS,
        keys: KEY_SPACE,
        first: 0,
    };
    let handles: Vec<_> = grpc
        .iter()
        .enumerate()
        .map(|(index, addr)| {
            let mut config = load_config(*addr, workload, 1000 + index as u64);
            config.warmup = Duration::from_secs(2);
            config.stop = Stop::After(seconds);
            thread::spawn(move || client::spawn(&config))
        })
        .collect();
    let reports: Vec<Report> = handles
        .into_iter()
        .map(|handle| handle.join().expect("a load thread"))
        .collect();
    for report in &reports {
        report.assert_answered("saturation run failed");
    }
    let total = reports
        .iter()
        .map(|report| report.requests_per_second)
        .sum();
    (total, reports)
}

/// The open-loop trial's rate, as a share of the closed loop's saturation.
const OPEN_LOOP_TRIAL: f64 = 4.0;

/// Starts the soak's load on every node: open loop at `per_node_rate` requests a second
/// each, for `length`, over `workload`'s keys (one load generator process per node).
fn open_loop(
    grpc: &[SocketAddr],
    workload: Workload,
    per_node_rate: u64,
    length: Duration,
    seed: u64,
) -> Vec<thread::JoinHandle<Report>> {
    grpc.iter()
        .enumerate()
        .map(|(index, addr)| {
            let mut config = load_config(*addr, workload, seed + index as u64);
            // The other nodes, as Envoy's cluster lists them: a call a stopping node never
            // took is sent again there, as Envoy's retry policy sends it.
            config.fallbacks = grpc
                .iter()
                .filter(|other| *other != addr)
                .copied()
                .collect();
            config.warmup = Duration::ZERO;
            config.stop = Stop::After(length);
            config.rate = per_node_rate;
            config.connections = 2;
            config.streams = 64;
            thread::spawn(move || client::spawn(&config))
        })
        .collect()
}

/// The rate at which the soak's own load (open loop: each request sent when due, so one
/// at a time, never in the batches a closed loop's queue makes) would keep the whole
/// machine busy: measured at a quarter of the closed loop's saturation, from the share of
/// the machine's CPU it takes (nodes, load generators and all; `/proc/stat`). Answers it
/// and that share. A closed loop at saturation packs many requests into each write and
/// wake-up; sent one by one they cost the machine much more each, so half of the closed
/// loop's rate, open loop, kept this machine 95 % busy (2026-11-26): queueing, not the
/// server, then made the p99.
fn open_loop_saturation(grpc: &[SocketAddr], closed: f64, length: Duration) -> (f64, f64) {
    let ticks = loadgen::clock_ticks();
    let cores = thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let trial = (closed / OPEN_LOOP_TRIAL).max(3.0);
    let workload = Workload {
        descriptors: DESCRIPTORS,
        keys: KEY_SPACE,
        first: 1 << 40,
    };
    // A second to open connections and warm up, then the measured part.
    let warm = Duration::from_secs(1);
    let loads = open_loop(
        grpc,
        workload,
        (trial / 3.0).ceil() as u64,
        warm + length,
        7000,
    );
    thread::sleep(warm);
    let busy_before = loadgen::machine_busy(ticks);
    let measured = Instant::now();
    for load in loads {
        load.join()
            .expect("a load thread")
            .assert_answered("open-loop trial failed");
    }
    let busy = (loadgen::machine_busy(ticks) - busy_before).as_secs_f64()
        / (measured.elapsed().as_secs_f64() * cores);
    let busy = busy.clamp(0.01, 1.0);
    ((trial / busy).min(closed), busy)
}

fn main() {
    client::run_if_asked();
    let settings = Settings::from_args();
    let duration = settings.duration();
    std::fs::create_dir_all(&settings.out).expect("create the output directory");
    let started = Instant::now();
    let mut summary = String::new();
    let mut say = |line: String| {
        println!("{line}");
        summary.push_str(&line);
        summary.push('\n');
    };
    say(format!(
        "soak: {} min, warm-up {} s, a restart every {} s, interval {} s; started {}",
        settings.minutes,
        settings.warmup.as_secs_f64(),
        settings.restart_every.as_secs_f64(),
        settings.interval.as_secs_f64(),
        utc_now()
    ));
    loadgen::print_load("load before");
    // Both limits files the reloads alternate between must load, or every reload would
    // fail quietly (the old limits stay live).
    for minute_limit in MINUTE_LIMITS {
        if let Err(error) = Limits::parse_str("soak.yaml", &limits_yaml(minute_limit)) {
            panic!("the soak's limits do not load: {error}");
        }
    }

    // Step 1: the cluster.
    let zero = SocketAddr::from(([127, 0, 0, 1], 0));
    let any = Addrs {
        grpc: zero,
        http: zero,
        admin: zero,
        peer: zero,
    };
    let mut nodes: Vec<Option<Node>> = Vec::new();
    let mut addrs: Vec<Addrs> = Vec::new();
    for name in NAMES {
        let dir = settings.out.join(format!("node-{name}"));
        std::fs::create_dir_all(&dir).expect("create the node's directory");
        let _ = std::fs::remove_file(dir.join("node.log"));
        write_atomically(&Node::config(&dir), &limits_yaml(MINUTE_LIMITS[0]));
        let peers: Vec<SocketAddr> = addrs.iter().map(|addrs| addrs.peer).collect();
        let node = Node::start(name, &dir, any, &peers);
        addrs.push(node.addrs);
        nodes.push(Some(node));
    }
    let cluster = Arc::new(Cluster {
        nodes: Mutex::new(nodes),
        addrs,
    });
    // Stops the nodes however main ends (a panic included); the watchdog holds the cluster
    // too, so its own drop would come too late.
    let _stop_nodes = StopOnDrop(Arc::clone(&cluster));
    assert!(
        poll(FORM_WITHIN, || members_everywhere(&cluster.addrs)),
        "the cluster never formed"
    );
    // The watchdog: whatever hangs, the nodes stop and the run ends.
    {
        let cluster = Arc::clone(&cluster);
        let limit = settings.saturation + duration * 2 + Duration::from_secs(300);
        thread::spawn(move || {
            thread::sleep(limit);
            eprintln!("soak: the watchdog fired after {limit:?}; stopping the nodes");
            for pid in cluster.pids().into_iter().flatten() {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            std::process::exit(1);
        });
    }
    let grpc = cluster.grpc();

    // Step 2: saturation, closed loop, then of the soak's own open-loop load (see
    // `open_loop_saturation`).
    let (saturated, reports) = saturation(&grpc, settings.saturation);
    let (open_saturated, trial_busy) = open_loop_saturation(&grpc, saturated, settings.saturation);
    let rate = (open_saturated / 2.0).round().max(3.0) as u64;
    say(format!(
        "saturation: {saturated:.0} req/s closed loop; {open_saturated:.0} req/s open loop \
         (the machine {:.0} % busy at {:.0} req/s); soak rate {rate} req/s, half of the open \
         loop's (closed loop: 3 x 8 x 32 streams, {} s; per node {}; p99 per node {} ms)",
        trial_busy * 100.0,
        saturated / OPEN_LOOP_TRIAL,
        settings.saturation.as_secs_f64(),
        reports
            .iter()
            .map(|report| format!("{:.0}", report.requests_per_second))
            .collect::<Vec<_>>()
            .join(" / "),
        reports
            .iter()
            .map(|report| format!("{:.2}", report.p99_us / 1000.0))
            .collect::<Vec<_>>()
            .join(" / "),
    ));

    // Step 4's thread.
    let soak_start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let restarts: Arc<Mutex<Vec<Restart>>> = Arc::default();
    let restarter = {
        let (cluster, stop, restarts) = (
            Arc::clone(&cluster),
            Arc::clone(&stop),
            Arc::clone(&restarts),
        );
        let (every, interval) = (settings.restart_every, settings.interval);
        thread::spawn(move || {
            let mut number = 0;
            loop {
                // Within an interval (not at the readings, which are mid-interval): the
                // restarting node's load sees the SIGTERM, the next interval's finds it back.
                let due = soak_start + every * (number as u32 + 1) + interval * 3 / 10;
                while Instant::now() < due {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    thread::sleep(Duration::from_millis(100));
                }
                // No restart that could not finish before the end.
                if stop.load(Ordering::Acquire) || due + FORM_WITHIN > soak_start + duration {
                    return;
                }
                let restart = cluster.restart(number % 3, number, soak_start);
                println!(
                    "restart {number}: node {} at {:.0} s, {}",
                    restart.node,
                    restart.sigterm_at,
                    restart.outcome()
                );
                restarts
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner())
                    .push(restart);
                number += 1;
            }
        })
    };

    // Step 3: the intervals.
    let ticks = loadgen::clock_ticks();
    let mut samples: Vec<Sample> = Vec::new();
    let per_node_rate = rate.div_ceil(3);
    let mut interval_number: u64 = 0;
    while soak_start.elapsed() + settings.interval / 2 < duration {
        let start = soak_start.elapsed().as_secs_f64();
        let workload = Workload {
            descriptors: DESCRIPTORS,
            keys: KEY_SPACE,
            first: interval_number * (KEY_SPACE / 2),
        };
        let loads = open_loop(
            &grpc,
            workload,
            per_node_rate,
            settings.interval,
            interval_number * 3,
        );
        // The reload, then the readings.
        let yaml = limits_yaml(MINUTE_LIMITS[(interval_number as usize + 1) % 2]);
        for addrs_dir in NAMES {
            write_atomically(
                &Node::config(&settings.out.join(format!("node-{addrs_dir}"))),
                &yaml,
            );
        }
        let mut sample = Sample {
            start,
            ..Sample::default()
        };
        // Read mid-interval, when the interval's load connections are open and the last
        // interval's are closed.
        let middle = soak_start + Duration::from_secs_f64(start) + settings.interval / 2;
        thread::sleep(middle.saturating_duration_since(Instant::now()));
        for (index, pid) in cluster.pids().into_iter().enumerate() {
            if let Some(pid) = pid {
                (sample.rss_kib[index], sample.fds[index]) = proc_sample(pid);
            }
            let http = cluster.addrs[index].http;
            sample.config_loads[index] =
                metric(http, "ratekeeper_config_loads_total{result=\"success\"}");
            sample.live_keys[index] = metric(http, "ratekeeper_shard_live_keys{");
            sample.key_slots[index] = metric(http, "ratekeeper_shard_key_slots{");
        }
        for (index, load) in loads.into_iter().enumerate() {
            sample.reports[index] = load.join().expect("a load thread");
        }
        // The cumulative figures at the interval's end (the CSV has their differences).
        for (index, pid) in cluster.pids().into_iter().enumerate() {
            let http = cluster.addrs[index].http;
            sample.contended[index] = metric(http, "ratekeeper_shard_contended_total{");
            sample.lock_wait_ms[index] =
                metric(http, "ratekeeper_shard_lock_wait_seconds_sum{").map(|s| s * 1000.0);
            sample.slow_forwards[index] = metric(http, "ratekeeper_peer_slow_total");
            sample.node_cpu_s[index] = pid.and_then(|pid| cpu_seconds(pid, ticks));
        }
        sample.machine_busy_s = loadgen::machine_busy(ticks).as_secs_f64();
        sample.load_cpu_s = loadgen::process_cpu(ticks).as_secs_f64();
        sample.end = soak_start.elapsed().as_secs_f64();
        let p99 = sample
            .p99_ms()
            .map_or("-".to_owned(), |p99| format!("{p99:.2}"));
        println!(
            "t={:>6.0}s rss KiB {:?} keys {:?} slots {:?} fds {:?} req {} p99 {p99} ms errors {}{}",
            sample.start,
            sample.rss_kib.map(|rss| rss.unwrap_or(0)),
            sample.live_keys.map(|keys| keys.unwrap_or(0.0) as u64),
            sample.key_slots.map(|slots| slots.unwrap_or(0.0) as u64),
            sample.fds.map(|fds| fds.unwrap_or(0)),
            sample.requests(),
            sample.errors(),
            sample
                .reports
                .iter()
                .filter_map(|report| report.first_error.as_deref())
                .map(|error| format!(" ({error})"))
                .collect::<String>()
        );
        samples.push(sample);
        interval_number += 1;
    }
    stop.store(true, Ordering::Release);
    if restarter.join().is_err() {
        say(
            "the restart thread panicked (see above): the restarts after it did not happen"
                .to_owned(),
        );
    }
    let restarts = restarts
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .clone();
    let final_loads: Vec<Option<f64>> = cluster
        .addrs
        .iter()
        .map(|addrs| {
            metric(
                addrs.http,
                "ratekeeper_config_loads_total{result=\"failure\"}",
            )
        })
        .collect();
    cluster.stop_all();

    // Which intervals overlap a restart.
    for sample in &mut samples {
        sample.restart = restarts.iter().any(|restart| {
            let until = restart.whole_at.unwrap_or(f64::INFINITY) + RESTART_SLACK;
            sample.start < until && sample.end > restart.sigterm_at
        });
    }

    write_csv(&settings.out.join("soak.csv"), &samples);
    write_restarts(&settings.out.join("restarts.csv"), &restarts);
    let svg = plot(&samples, &restarts, settings.warmup.as_secs_f64(), rate);
    std::fs::write(settings.out.join("soak.svg"), svg).expect("write the plot");
    let verdict = judge(&samples, &restarts, &settings, &mut say);
    say(format!(
        "config loads failed (per node, since its last start): {final_loads:?}; ended {}; \
         {:.1} min in all",
        utc_now(),
        started.elapsed().as_secs_f64() / 60.0
    ));
    say(format!(
        "verdict: {}",
        if verdict {
            "all targets met"
        } else {
            "TARGETS MISSED (see above)"
        }
    ));
    std::fs::write(settings.out.join("summary.txt"), &summary).expect("write the summary");
    loadgen::print_load("load after");
    println!("output in {}", settings.out.display());
}

fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M:%S UTC"])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Prints each target's figures; whether all were met.
fn judge(
    samples: &[Sample],
    restarts: &[Restart],
    settings: &Settings,
    say: &mut impl FnMut(String),
) -> bool {
    let warmup = settings.warmup.as_secs_f64();
    let mut met = true;
    // Growth per node: the sample just before each of its restarts (after the warm-up),
    // and the last one. The key tables follow the live keys by design (docs/keys.md, "How long a
    // key lives"), and how many keys are live at a sample depends on where in its minute
    // windows it falls and on how much the node just took over: the target is RSS net of
    // the key tables (their room times a slot's bytes), the rest of the process; raw RSS is
    // reported beside it.
    type Read = fn(&Sample, usize) -> Option<u64>;
    let rows: [(&str, Read, bool); 3] = [
        ("RSS (KiB)", |s: &Sample, i: usize| s.rss_kib[i], false),
        (
            "RSS net of the key tables (KiB)",
            |s: &Sample, i: usize| {
                let table = s.key_slots[i]? as u64 * KEY_SLOT_BYTES / 1024;
                Some(s.rss_kib[i]?.saturating_sub(table))
            },
            true,
        ),
        ("open fds", |s: &Sample, i: usize| s.fds[i], true),
    ];
    for (what, read, is_target) in rows {
        let mut worst: f64 = f64::NEG_INFINITY;
        for (index, name) in NAMES.iter().enumerate() {
            // The last sample before each of the node's restarts: all of one age (three
            // restart periods) except the first life's, which began with the run.
            let own: Vec<&Restart> = restarts
                .iter()
                .filter(|restart| restart.node == *name)
                .collect();
            let before_each: Vec<(f64, u64)> = own
                .iter()
                .filter_map(|restart| {
                    let before = samples
                        .iter()
                        .rev()
                        .find(|sample| sample.end <= restart.sigterm_at)?;
                    Some((before.start, read(before, index)?))
                })
                .collect();
            let mut series: Vec<(f64, u64)> = if before_each.len() >= 3 {
                before_each[1..].to_vec()
            } else {
                // A short run: the samples after the warm-up before each restart, and the
                // last one (ages differ).
                let mut series: Vec<(f64, u64)> = before_each
                    .into_iter()
                    .filter(|(at, _)| *at >= warmup)
                    .collect();
                if let Some(last) = samples.last()
                    && let Some(value) = read(last, index)
                {
                    series.push((last.start, value));
                }
                series
            };
            series.dedup();
            let post_warmup: Vec<u64> = samples
                .iter()
                .filter(|sample| sample.start >= warmup)
                .filter_map(|sample| read(sample, index))
                .collect();
            let (Some(first), Some(last)) = (series.first(), series.last()) else {
                continue;
            };
            if series.len() < 2 {
                worst = f64::INFINITY;
                say(format!(
                    "{what} node {name}: fewer than 2 readings to compare (a run too short)"
                ));
                continue;
            }
            // The trend over every sample after the warm-up outside restart intervals (a
            // least-squares line, from its value at the first such sample to its value at
            // the last), next to first against last of the same-age samples: a handful of
            // readings taken at different points of the keys' windows is noisy, a leak is
            // a slope.
            let steady: Vec<(f64, f64)> = samples
                .iter()
                .filter(|sample| sample.start >= warmup && !sample.restart)
                .filter_map(|sample| Some((sample.start, read(sample, index)? as f64)))
                .collect();
            let trend = trend_growth(&steady);
            let growth = (last.1 as f64 / first.1 as f64 - 1.0) * 100.0;
            // The target: per whole life of the node's process (from one of its restarts
            // to the next, all of one length), the mean of its steady samples, and the
            // trend of those means. A process warms up over its life (allocator, buffers:
            // 2026-11-26, RSS net of the tables climbed from about 22 to 26 MB over its six
            // minutes, alike in every life), so a line through every sample also measures
            // where the restarts fall in the run; whole lives compare like with like, and a
            // leak is later lives holding more.
            // A node lives three restart periods; the run's end closes its last life, kept if
            // (nearly) whole.
            let life = 3.0 * settings.restart_every.as_secs_f64();
            let ends: Vec<f64> = own
                .iter()
                .map(|restart| restart.sigterm_at)
                .chain(samples.last().map(|sample| sample.end))
                .collect();
            let lives: Vec<(f64, f64)> = ends
                .windows(2)
                .filter(|pair| pair[1] - pair[0] >= 0.9 * life)
                .filter_map(|pair| {
                    let (from, to) = (pair[0], pair[1]);
                    let values: Vec<f64> = samples
                        .iter()
                        .filter(|s| s.start >= from.max(warmup) && s.end <= to && !s.restart)
                        .filter_map(|s| Some(read(s, index)? as f64))
                        .collect();
                    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
                    (!values.is_empty()).then_some(((from + to) / 2.0, mean))
                })
                .collect();
            let by_life = trend_growth(&lives);
            worst = worst.max(by_life.or(trend).unwrap_or(growth));
            say(format!(
                "{what} node {name}: by life {} over {} whole lives (means {}); trend {} over \
                 {} steady samples; before its restarts {} -> {growth:+.1} % (all samples \
                 after warm-up: min {}, max {})",
                by_life.map_or("-".to_owned(), |trend| format!("{trend:+.1} %")),
                lives.len(),
                lives
                    .iter()
                    .map(|(at, mean)| format!("{mean:.0}@{at:.0}s"))
                    .collect::<Vec<_>>()
                    .join(", "),
                trend.map_or("-".to_owned(), |trend| format!("{trend:+.1} %")),
                steady.len(),
                series
                    .iter()
                    .map(|(at, value)| format!("{value}@{at:.0}s"))
                    .collect::<Vec<_>>()
                    .join(", "),
                post_warmup.iter().min().copied().unwrap_or(0),
                post_warmup.iter().max().copied().unwrap_or(0),
            ));
        }
        let ok = worst < 5.0;
        if !is_target {
            say(format!(
                "{what}: worst node {worst:+.1} % (follows the live keys: not a target)"
            ));
            continue;
        }
        met &= ok;
        say(format!(
            "target {what} growth < 5 %: worst node {worst:+.1} % -> {}",
            if ok { "met" } else { "MISSED" }
        ));
    }
    // p99.
    let mut first_minute: Vec<f64> = samples
        .iter()
        .filter(|sample| sample.start < 60.0)
        .filter_map(Sample::p99_ms)
        .collect();
    let baseline = loadgen::median(&mut first_minute);
    let later: Vec<&Sample> = samples
        .iter()
        .filter(|sample| sample.start >= warmup)
        .collect();
    let mut quiet: Vec<f64> = later
        .iter()
        .filter(|sample| !sample.restart)
        .filter_map(|sample| sample.p99_ms())
        .collect();
    let mut all: Vec<f64> = later.iter().filter_map(|sample| sample.p99_ms()).collect();
    let worst_quiet = quiet.iter().copied().fold(0.0, f64::max);
    let worst_all = all.iter().copied().fold(0.0, f64::max);
    let ok = worst_quiet <= 2.0 * baseline;
    met &= ok;
    say(format!(
        "target p99 within 2x of the first minute's: first minute {baseline:.2} ms (median \
         interval, worst node); after warm-up outside restarts worst {worst_quiet:.2} ms, median \
         {:.2} ms ({} intervals); with restart intervals worst {worst_all:.2} ms, median {:.2} ms \
         -> {}",
        loadgen::median(&mut quiet),
        quiet.len(),
        loadgen::median(&mut all),
        if ok { "met" } else { "MISSED" }
    ));
    // Errors.
    let outside: u64 = samples
        .iter()
        .filter(|sample| !sample.restart)
        .map(Sample::errors)
        .sum();
    let during: u64 = samples
        .iter()
        .filter(|sample| sample.restart)
        .map(Sample::errors)
        .sum();
    let requests: u64 = samples.iter().map(Sample::requests).sum();
    let retried: u64 = samples
        .iter()
        .flat_map(|sample| &sample.reports)
        .map(|report| report.retried)
        .sum();
    let ok = outside == 0 && during == 0;
    met &= ok;
    say(format!(
        "target no errors, restarts included: {outside} outside restarts, {during} in restart \
         intervals, of {requests} requests; {retried} calls a stopping node never took were sent \
         again to another node, as Envoy's retry policy sends them -> {}",
        if ok { "met" } else { "MISSED" }
    ));
    for sample in samples.iter().filter(|sample| sample.errors() > 0) {
        say(format!(
            "  errors at {:.0}-{:.0} s ({}): {}",
            sample.start,
            sample.end,
            if sample.restart {
                "restart"
            } else {
                "OUTSIDE a restart"
            },
            sample
                .reports
                .iter()
                .zip(NAMES)
                .filter(|(report, _)| report.errors > 0)
                .map(|(report, name)| format!(
                    "{name}: {} ({})",
                    report.errors,
                    report.first_error.as_deref().unwrap_or("")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    // Exactness.
    let exact = restarts.iter().filter(|restart| restart.exact()).count();
    let ok = exact == restarts.len() && !restarts.is_empty();
    met &= ok;
    say(format!(
        "target limits exact after each restart: {exact} of {} restarts exact (carried key {} \
         of {} left, fresh key {} of {} asked) -> {}",
        restarts.len(),
        EXACT_LIMIT / 2,
        EXACT_LIMIT / 2,
        EXACT_LIMIT,
        2 * EXACT_LIMIT,
        if ok { "met" } else { "MISSED" }
    ));
    for restart in restarts {
        say(format!(
            "  restart node {} at {:.0} s: {}",
            restart.node,
            restart.sigterm_at,
            restart.outcome()
        ));
    }
    met
}

/// The growth (%) of the least-squares line through `points` from the first point's time to
/// the last's, relative to its start; `None` with fewer than 3 points.
fn trend_growth(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let (mean_t, mean_v) = points
        .iter()
        .fold((0.0, 0.0), |(t, v), (pt, pv)| (t + pt / n, v + pv / n));
    let (mut covariance, mut variance) = (0.0, 0.0);
    for (t, v) in points {
        covariance += (t - mean_t) * (v - mean_v);
        variance += (t - mean_t) * (t - mean_t);
    }
    let slope = if variance > 0.0 {
        covariance / variance
    } else {
        0.0
    };
    let (first, last) = (points.first()?.0, points.last()?.0);
    let start = mean_v + slope * (first - mean_t);
    (start > 0.0).then(|| slope * (last - first) / start * 100.0)
}

fn cell<T: ToString>(value: Option<T>) -> String {
    value.map(|value| value.to_string()).unwrap_or_default()
}

fn write_csv(path: &Path, samples: &[Sample]) {
    let mut csv = String::from(
        "start_s,end_s,restart,requests,errors,p99_ms_worst_node,\
         rss_kib_a,rss_kib_b,rss_kib_c,fds_a,fds_b,fds_c,\
         p99_ms_a,p99_ms_b,p99_ms_c,errors_a,errors_b,errors_c,over_limit,\
         config_loads_a,config_loads_b,config_loads_c,\
         live_keys_a,live_keys_b,live_keys_c,key_slots_a,key_slots_b,key_slots_c,\
         contended_a,contended_b,contended_c,lock_wait_ms_a,lock_wait_ms_b,lock_wait_ms_c,\
         slow_forwards_a,slow_forwards_b,slow_forwards_c,node_cpu_s_a,node_cpu_s_b,node_cpu_s_c,\
         load_cpu_s,machine_busy_s,others_cpu_s\n",
    );
    // A cumulative figure's change since the previous interval; a node that restarted
    // counts from 0 again.
    let change = |now: Option<f64>, before: Option<f64>| match (now, before) {
        (Some(now), Some(before)) if now >= before => Some(now - before),
        (now, _) => now,
    };
    let mut previous: Option<&Sample> = None;
    for sample in samples {
        let _ = write!(
            csv,
            "{:.1},{:.1},{},{},{},{}",
            sample.start,
            sample.end,
            u8::from(sample.restart),
            sample.requests(),
            sample.errors(),
            cell(sample.p99_ms().map(|p99| format!("{p99:.3}")))
        );
        for index in 0..3 {
            let _ = write!(csv, ",{}", cell(sample.rss_kib[index]));
        }
        for index in 0..3 {
            let _ = write!(csv, ",{}", cell(sample.fds[index]));
        }
        for report in &sample.reports {
            let _ = write!(csv, ",{:.3}", report.p99_us / 1000.0);
        }
        for report in &sample.reports {
            let _ = write!(csv, ",{}", report.errors);
        }
        let over: u64 = sample.reports.iter().map(|report| report.over_limit).sum();
        let _ = write!(csv, ",{over}");
        for figures in [&sample.config_loads, &sample.live_keys, &sample.key_slots] {
            for figure in figures {
                let _ = write!(csv, ",{}", cell(*figure));
            }
        }
        let mut nodes_cpu = 0.0;
        for (index, figures) in [
            &sample.contended,
            &sample.lock_wait_ms,
            &sample.slow_forwards,
            &sample.node_cpu_s,
        ]
        .into_iter()
        .enumerate()
        {
            for (node, figure) in figures.iter().enumerate() {
                let before = previous.and_then(|previous| {
                    [
                        &previous.contended,
                        &previous.lock_wait_ms,
                        &previous.slow_forwards,
                        &previous.node_cpu_s,
                    ][index][node]
                });
                let delta = change(*figure, before);
                if index == 3 {
                    nodes_cpu += delta.unwrap_or(0.0);
                }
                let _ = write!(csv, ",{}", cell(delta.map(|d| format!("{d:.2}"))));
            }
        }
        let load = change(Some(sample.load_cpu_s), previous.map(|p| p.load_cpu_s)).unwrap_or(0.0);
        let busy = change(
            Some(sample.machine_busy_s),
            previous.map(|p| p.machine_busy_s),
        )
        .unwrap_or(0.0);
        let others = (busy - nodes_cpu - load).max(0.0);
        let _ = write!(csv, ",{load:.2},{busy:.2},{others:.2}");
        csv.push('\n');
        previous = Some(sample);
    }
    std::fs::write(path, csv).expect("write the CSV");
}

fn write_restarts(path: &Path, restarts: &[Restart]) {
    let mut csv = String::from("node,sigterm_s,whole_s,clean_exit,carried,fresh,exact\n");
    for restart in restarts {
        let result = |result: &Result<u64, String>| match result {
            Ok(count) => count.to_string(),
            Err(error) => format!("\"{}\"", error.replace('"', "'")),
        };
        let _ = writeln!(
            csv,
            "{},{:.1},{},{},{},{},{}",
            restart.node,
            restart.sigterm_at,
            cell(restart.whole_at.map(|at| format!("{at:.1}"))),
            restart.clean_exit,
            result(&restart.carried),
            result(&restart.fresh),
            restart.exact()
        );
    }
    std::fs::write(path, csv).expect("write the restarts");
}

/// One SVG: four panels sharing the time axis (RSS, fds, p99, errors), restart windows
/// shaded, the end of the warm-up dashed.
fn plot(samples: &[Sample], restarts: &[Restart], warmup: f64, rate: u64) -> String {
    const WIDTH: f64 = 1000.0;
    const PANEL: f64 = 170.0;
    const GAP: f64 = 45.0;
    const LEFT: f64 = 80.0;
    const RIGHT: f64 = 110.0;
    const TOP: f64 = 60.0;
    let colors = ["#1f77b4", "#d62728", "#2ca02c"];
    let end = samples.last().map_or(1.0, |sample| sample.end).max(1.0);
    let x = |t: f64| LEFT + (WIDTH - LEFT - RIGHT) * t / end;
    let height = TOP + 4.0 * (PANEL + GAP) + 20.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="18" font-size="14">ratekeeper soak: 3-node cluster at {rate} req/s (half of saturation), key churn, a reload every interval</text><text x="{LEFT}" y="34" font-size="11">pink line: a node's SIGTERM restart (label: the node); dashed: end of the warm-up; one point per interval</text>"#
    );
    type Series = Box<dyn Fn(&Sample) -> [Option<f64>; 3]>;
    let panels: Vec<(&str, Series)> = vec![
        (
            "RSS (MiB)",
            Box::new(|s: &Sample| s.rss_kib.map(|v| v.map(|v| v as f64 / 1024.0))),
        ),
        (
            "open fds",
            Box::new(|s: &Sample| s.fds.map(|v| v.map(|v| v as f64))),
        ),
        (
            "p99 (ms) per node's load",
            Box::new(|s: &Sample| {
                [0, 1, 2].map(|i| (s.reports[i].requests > 0).then(|| s.reports[i].p99_us / 1000.0))
            }),
        ),
        (
            "errors per interval",
            Box::new(|s: &Sample| [0, 1, 2].map(|i| Some(s.reports[i].errors as f64))),
        ),
    ];
    for (number, (title, series)) in panels.iter().enumerate() {
        let top = TOP + number as f64 * (PANEL + GAP);
        let bottom = top + PANEL;
        let values: Vec<[Option<f64>; 3]> = samples.iter().map(series).collect();
        let high = values
            .iter()
            .flatten()
            .flatten()
            .copied()
            .fold(0.0, f64::max)
            .max(1.0)
            * 1.1;
        let y = |v: f64| bottom - PANEL * v / high;
        let _ = writeln!(
            svg,
            r##"<text x="{LEFT}" y="{:.1}" font-weight="bold">{title}</text><rect x="{LEFT}" y="{top}" width="{:.1}" height="{PANEL}" fill="none" stroke="#888"/>"##,
            top - 6.0,
            WIDTH - LEFT - RIGHT
        );
        for restart in restarts {
            let until = restart.whole_at.unwrap_or(end).min(end);
            let _ = writeln!(
                svg,
                r##"<rect x="{:.1}" y="{top}" width="{:.1}" height="{PANEL}" fill="#e0408a" fill-opacity="0.6"/>"##,
                x(restart.sigterm_at),
                (x(until) - x(restart.sigterm_at)).max(1.5)
            );
            if number == 0 {
                let _ = writeln!(
                    svg,
                    r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#a05">{}</text>"##,
                    x(restart.sigterm_at),
                    top + 12.0,
                    restart.node
                );
            }
        }
        let _ = writeln!(
            svg,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{top}" y2="{bottom}" stroke="#555" stroke-dasharray="4 3"/>"##,
            x(warmup)
        );
        for tick in 0..=4 {
            let v = high / 1.1 * f64::from(tick) / 4.0;
            let _ = writeln!(
                svg,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><line x1="{LEFT}" x2="{:.1}" y1="{2:.1}" y2="{2:.1}" stroke="#eee"/>"##,
                LEFT - 5.0,
                y(v) + 4.0,
                if v >= 100.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.2}")
                },
                WIDTH - RIGHT
            );
        }
        for (index, color) in colors.iter().enumerate() {
            let mut path = String::new();
            let mut pen_up = true;
            for (sample, value) in samples.iter().zip(&values) {
                match value[index] {
                    Some(v) => {
                        let _ = write!(
                            path,
                            "{}{:.1},{:.1} ",
                            if pen_up { "M" } else { "L" },
                            x((sample.start + sample.end) / 2.0),
                            y(v)
                        );
                        pen_up = false;
                    }
                    None => pen_up = true,
                }
            }
            let _ = writeln!(
                svg,
                r#"<path d="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>"#
            );
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" fill="{color}">node {}</text>"#,
                WIDTH - RIGHT + 10.0,
                top + 20.0 + 16.0 * index as f64,
                NAMES[index]
            );
        }
        let step = if end > 600.0 { 5 } else { 1 };
        for minute in (0..=(end / 60.0) as u64).step_by(step) {
            let t = minute as f64 * 60.0;
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{minute} min</text>"#,
                x(t),
                bottom + 14.0
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}
