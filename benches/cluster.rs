//! Cluster forwarding cost: a 3-node ratekeeper cluster driven through node A by h2load, with
//! keys A owns (decided locally) against keys B (and C) own (forwarded, or admitted from a
//! lease their owner granted A: the limit is far above the load, so the keys are hot with
//! room to spare), next to a no-op RLS server as the same-run baseline.
//!
//! Starts, in this process and each on its own small multi-thread tokio runtime (threads
//! named `node-a-rt`, `node-b-rt`, `node-c-rt`, `noop-rt`, so profiles tell them apart):
//! - three ratekeeper servers ([`Server::bind`] + [`Server::run`]) on `127.0.0.1:0`, in
//!   cluster mode with the production forwarding defaults (`ClusterOptions::new("")`: 10 ms
//!   deadline, batches of up to 128 groups, 200 us window), peer listeners on `127.0.0.1:0`
//!   advertising their bound address; B joins A, C joins A and B. The bench waits until every
//!   node's `ratekeeper_cluster_members` is 3;
//! - a no-op `RateLimitService` answering OK at once (as in `benches/grpc.rs`).
//!
//! Keys are chosen by computing owners with the same [`Ring`] the nodes build (over their peer
//! addresses) and [`KeyBuilder`] routes, and shards with [`shard_of`]: a single key sits on
//! shard 0 of its owner, and the four keys of a 4-descriptor body on both shards of each
//! owner (2 + 2 on A; or one per shard on B and on C), so runs compare from one start to the
//! next. Each run asserts from node A's `/metrics` that every remote check was forwarded or
//! leased, at most one group per remote owner per request (none for local keys). A run
//! counts only if node
//! A's `ratekeeper_cluster_fallbacks_total` did not move (a fallback means a forward failed
//! and the request was decided locally); otherwise it is reported and retried once.
//!
//! Bodies are pre-encoded gRPC frames in temp files; each is checked once with a tonic client
//! (decoded `overall_code` OK, one status with a `current_limit` per descriptor) and once with
//! `nghttp` (`grpc-status: 0` on the exact bytes h2load sends). Then the configurations
//! alternate over the rounds (order reversed every other round), each run being
//! `h2load -c 8 -m 32 -n 200000` like `benches/grpc.rs`. Last, the forward's own latency: one
//! tonic client sends sequential requests (no concurrency), local and remote keys interleaved.
//!
//! Run with `cargo bench --bench cluster`. Options: `CLUSTER_BENCH_ROUNDS` (default 5),
//! `CLUSTER_BENCH_REQUESTS` (default 200000), `CLUSTER_BENCH_WORKERS` (worker threads per
//! node, default 2), `CLUSTER_BENCH_SEQUENTIAL` (sequential requests per key, default 2000),
//! `CLUSTER_BENCH_CONFIGS` (comma-separated configuration ids to run, e.g. `remote-1`, for
//! profiling one of them; default all).

mod loadgen;

use loadgen::*;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratekeeper::cluster::ClusterOptions;
use ratekeeper::cluster::ring::{DEFAULT_VNODES, Ring};
use ratekeeper::key::{KeyBuilder, shard_of};
use ratekeeper::limits::Limits;
use ratekeeper::server::{Server, ServerOptions};
use ratekeeper::store::StoreOptions;
use ratekeeper::store::memory::EngineConfig;
use tokio::runtime::Runtime;
use tokio::sync::watch;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// Appended to [`API_KEY_LIMITS`] (a fixed window far above any reachable rate, so owners
/// lend hits of a hot key): `pair_key`, two limits on one descriptor as far above; owners
/// never lend a check of several counters, so a remote one is forwarded on every request.
const PAIR_KEY_LIMITS: &str = "\
  - key: pair_key
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000}
      - {unit: minute, requests_per_unit: 1000000000}
";
const CONNECTIONS: u32 = 8;
const STREAMS_PER_CONNECTION: u32 = 32;
const DOMAIN: &str = "bench";
/// How long the nodes get to agree on the membership.
const FORM_TIMEOUT: Duration = Duration::from_secs(20);

/// One cluster node, serving on its own runtime.
struct Node {
    name: &'static str,
    /// Runs the node; dropping it stops the node.
    _runtime: Runtime,
    grpc: SocketAddr,
    http: SocketAddr,
    peer: SocketAddr,
}

/// One request body (one api_key value per descriptor).
struct Body {
    request: RateLimitRequest,
    file: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    Noop,
    NodeA,
}

/// One measured configuration: where h2load sends which body.
struct Config {
    id: &'static str,
    label: &'static str,
    target: Target,
    body: usize,
    /// Forwarded groups node A must count per request (one per remote owner).
    groups_per_request: u64,
    /// The configuration the ratio column compares against (the no-op with as many
    /// descriptors), and for remote keys the local-key run of the same cluster.
    baseline: Option<&'static str>,
    local: Option<&'static str>,
}

/// The descriptor of `entry` (`key=value`).
fn descriptor(entry: &str) -> RateLimitDescriptor {
    let (key, value) = entry.split_once('=').expect("key=value");
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        }],
        ..Default::default()
    }
}

fn request(values: &[String]) -> RateLimitRequest {
    RateLimitRequest {
        domain: DOMAIN.to_owned(),
        descriptors: values.iter().map(|value| descriptor(value)).collect(),
        hits_addend: 0,
    }
}

/// Where the descriptor `entry` (`key=value`) lives: its owner (index into `members`, by the
/// ring the nodes build) and the shard of that owner's engine (of `shards`).
fn placement(ring: &Ring, members: &[String], shards: usize, entry: &str) -> (usize, usize) {
    let (name, value) = entry.split_once('=').expect("key=value");
    let mut key = KeyBuilder::new(DOMAIN);
    key.entry(name, value);
    let owner = ring.owner(key.route()).expect("a non-empty ring");
    let owner = members
        .iter()
        .position(|member| **member == **owner)
        .expect("the owner is a node");
    (owner, shard_of(key.route(), shards))
}

/// The first entry `name=key-N` owned by `members[owner]` on shard `shard` (modulo `shards`)
/// that is not in `taken`.
fn value_at(
    ring: &Ring,
    members: &[String],
    shards: usize,
    (name, owner, shard): (&str, usize, usize),
    taken: &[String],
) -> String {
    (0..)
        .map(|n| format!("{name}=key-{n}"))
        .find(|value| {
            !taken.contains(value)
                && placement(ring, members, shards, value) == (owner, shard % shards)
        })
        .expect("some key lands there")
}

/// Starts a cluster node that joins `peers` (the earlier nodes' peer addresses).
fn start_node(
    name: &'static str,
    workers: usize,
    peers: &[SocketAddr],
    stop: watch::Receiver<bool>,
) -> Node {
    let runtime = runtime(&format!("{name}-rt"), workers);
    let yaml = format!("{API_KEY_LIMITS}{PAIR_KEY_LIMITS}");
    let limits = Limits::parse_str("bench.yaml", &yaml).expect("the bench limits parse");
    let localhost = SocketAddr::from(([127, 0, 0, 1], 0));
    let cluster = ClusterOptions {
        peers: peers.iter().map(ToString::to_string).collect(),
        // Empty `advertise`: the bound peer address.
        ..ClusterOptions::new("")
    };
    let options = ServerOptions {
        store: StoreOptions::Cluster {
            peer_addr: localhost,
            options: cluster,
        },
        shutdown_grace: Duration::from_secs(1),
        ..ServerOptions::new(localhost, localhost)
    };
    let server = runtime
        .block_on(Server::bind(&options, limits, 0))
        .expect("bind a ratekeeper node");
    let grpc = server.grpc_addr().expect("grpc on tcp");
    let http = server.http_addr();
    let peer = server
        .peer_addr()
        .expect("cluster mode has a peer listener");
    runtime.spawn(async move {
        server.run(stopped(stop)).await.expect("ratekeeper runs");
    });
    Node {
        name,
        _runtime: runtime,
        grpc,
        http,
        peer,
    }
}

/// Node A's cluster counters at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    members: f64,
    fallbacks: f64,
    forwarded: f64,
    /// Checks of keys owned elsewhere admitted from a lease, without a forward.
    leased: f64,
    batches: f64,
    errors: f64,
}

/// Sums every sample of the metric `name` (all label sets) in a `/metrics` text.
fn sample_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn scrape(node: &Node) -> Counters {
    let text = http_get(node.http, "/metrics")
        .unwrap_or_else(|error| panic!("scrape {}'s /metrics: {error}", node.name));
    Counters {
        members: sample_sum(&text, "ratekeeper_cluster_members"),
        fallbacks: sample_sum(&text, "ratekeeper_cluster_fallbacks_total"),
        forwarded: sample_sum(&text, "ratekeeper_peer_forwarded_total"),
        leased: sample_sum(&text, "ratekeeper_cluster_lease_hits_total"),
        batches: sample_sum(&text, "ratekeeper_peer_batches_total"),
        errors: sample_sum(&text, "ratekeeper_peer_errors_total"),
    }
}

/// Waits until every node sees `n` members.
fn wait_for_members(nodes: &[Node], n: usize) {
    let started = Instant::now();
    for node in nodes {
        loop {
            let members = http_get(node.http, "/metrics")
                .map(|text| sample_sum(&text, "ratekeeper_cluster_members"))
                .unwrap_or(0.0);
            if members == n as f64 {
                break;
            }
            assert!(
                started.elapsed() < FORM_TIMEOUT,
                "{} sees {members} members, not {n}, after {FORM_TIMEOUT:?}",
                node.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    println!(
        "cluster formed: every node sees {n} members after {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
}

fn client_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Sends each body's request twice with a real gRPC client and checks the decoded answer.
fn check_with_tonic(target: Target, addr: SocketAddr, configs: &[Config], bodies: &[Body]) {
    client_runtime().block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect a gRPC client");
        for config in configs.iter().filter(|config| config.target == target) {
            let body = &bodies[config.body];
            let mut response = None;
            for _ in 0..2 {
                response = Some(
                    client
                        .should_rate_limit(body.request.clone())
                        .await
                        .unwrap_or_else(|status| panic!("{} answered {status}", config.id))
                        .into_inner(),
                );
            }
            let response = response.expect("two calls were made");
            assert_eq!(
                response.overall_code,
                Code::Ok as i32,
                "{}: {response:?}",
                config.id
            );
            if target == Target::NodeA {
                assert_eq!(
                    response.statuses.len(),
                    body.request.descriptors.len(),
                    "{}: one status per descriptor",
                    config.id
                );
                assert!(
                    response
                        .statuses
                        .iter()
                        .all(|status| status.current_limit.is_some()),
                    "{}: every descriptor matched a limit: {response:?}",
                    config.id
                );
            }
            println!(
                "check: {} answers OK ({} statuses, tonic)",
                config.id,
                response.statuses.len()
            );
        }
    });
}

/// Sends the exact bytes of a body file with nghttp and checks the gRPC status trailer.
fn check_with_nghttp(config: &Config, addr: SocketAddr, body: &Body) {
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
        "{} did not answer grpc-status 0 to its body file:\n{text}",
        config.id
    );
    println!("check: {} answers grpc-status 0 (nghttp)", config.id);
}

struct Run {
    config: usize,
    requests_per_second: f64,
    p50_us: u64,
    p99_us: u64,
    /// CPU of this process (all nodes; the idle ones use ~nothing) per request.
    cpu_us_per_request: f64,
    /// Everyone else's CPU per request: h2load, plus any noise.
    other_us_per_request: f64,
    /// Node A's counter deltas over the run.
    delta: Counters,
}

/// One h2load run of `requests` against `addr`.
fn h2load(addr: SocketAddr, body: &Body, requests: u64, log: &Path, ticks: f64) -> Run {
    // h2load appends to its log file.
    let _ = std::fs::remove_file(log);
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
    let (requests_per_second, latencies) = parse_h2load(&output, log, requests);
    Run {
        config: 0,
        requests_per_second,
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        cpu_us_per_request: cpu.as_secs_f64() * 1e6 / requests as f64,
        other_us_per_request: busy.saturating_sub(cpu).as_secs_f64() * 1e6 / requests as f64,
        delta: Counters::default(),
    }
}

/// What every h2load run needs besides its configuration.
struct Harness<'a> {
    node_a: &'a Node,
    noop: SocketAddr,
    bodies: &'a [Body],
    log: PathBuf,
    ticks: f64,
}

impl Harness<'_> {
    fn addr(&self, target: Target) -> SocketAddr {
        match target {
            Target::Noop => self.noop,
            Target::NodeA => self.node_a.grpc,
        }
    }

    /// One counted run of `config` (`index` into the configurations): h2load plus node A's
    /// counters around it. A run during which node A fell back (a forward failed) is reported
    /// and retried once; None if the retry fell back too.
    fn measure(&self, index: usize, config: &Config, requests: u64) -> Option<Run> {
        for attempt in 0..2 {
            let before = scrape(self.node_a);
            let mut run = h2load(
                self.addr(config.target),
                &self.bodies[config.body],
                requests,
                &self.log,
                self.ticks,
            );
            let after = scrape(self.node_a);
            run.config = index;
            run.delta = Counters {
                members: after.members,
                fallbacks: after.fallbacks - before.fallbacks,
                forwarded: after.forwarded - before.forwarded,
                leased: after.leased - before.leased,
                batches: after.batches - before.batches,
                errors: after.errors - before.errors,
            };
            if run.delta.fallbacks == 0.0 {
                // Every group went to its owner (at most one per remote owner per request),
                // unless all its checks were admitted from leases the owners granted.
                let most = (config.groups_per_request * requests) as f64;
                assert!(
                    run.delta.forwarded <= most,
                    "{}: node A forwarded {} groups, at most {most}",
                    config.id,
                    run.delta.forwarded
                );
                assert!(
                    config.groups_per_request > 0 || run.delta.forwarded + run.delta.leased == 0.0,
                    "{}: local keys are neither forwarded nor leased",
                    config.id
                );
                assert!(
                    config.groups_per_request == 0
                        || run.delta.forwarded + run.delta.leased >= most,
                    "{}: every remote check is forwarded or leased",
                    config.id
                );
                return Some(run);
            }
            // Forwarded counts groups sent in a batch; groups refused by an open circuit
            // breaker (or a full queue) go straight to the fallback and are not in it.
            println!(
                "FALLBACK: {} (attempt {}): node A fell back on {} groups; {} failed batches, \
                 {} groups sent in {} batches; this attempt: {:.0} req/s, p50 {} us, p99 {} us; {}",
                config.id,
                attempt + 1,
                run.delta.fallbacks,
                run.delta.errors,
                run.delta.forwarded,
                run.delta.batches,
                run.requests_per_second,
                run.p50_us,
                run.p99_us,
                if attempt == 0 {
                    "retrying once"
                } else {
                    "not counted"
                }
            );
        }
        None
    }
}

/// Sequential latencies (one request at a time) of several bodies, interleaved so drift hits
/// them alike.
fn sequential(
    clients: &[(&str, SocketAddr, RateLimitRequest)],
    count: usize,
) -> Vec<(String, Vec<u64>)> {
    client_runtime().block_on(async {
        let mut connected = Vec::new();
        for (name, addr, request) in clients {
            let client = RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect a gRPC client");
            connected.push((*name, client, request.clone(), Vec::with_capacity(count)));
        }
        // Warm-up: connections, the keys, the peer channels.
        for (name, client, request, _) in &mut connected {
            for _ in 0..200 {
                let response = client
                    .should_rate_limit(request.clone())
                    .await
                    .unwrap_or_else(|status| panic!("{name}: {status}"))
                    .into_inner();
                assert_eq!(response.overall_code, Code::Ok as i32, "{name}");
            }
        }
        for _ in 0..count {
            for (name, client, request, latencies) in &mut connected {
                let started = Instant::now();
                let response = client
                    .should_rate_limit(request.clone())
                    .await
                    .unwrap_or_else(|status| panic!("{name}: {status}"))
                    .into_inner();
                latencies.push(started.elapsed().as_nanos() as u64);
                assert_eq!(response.overall_code, Code::Ok as i32, "{name}");
            }
        }
        connected
            .into_iter()
            .map(|(name, _, _, mut latencies)| {
                latencies.sort_unstable();
                (name.to_owned(), latencies)
            })
            .collect()
    })
}

fn main() {
    let started = Instant::now();
    // Ratekeeper's warnings (a peer's circuit breaker opening, with the forward's error) go
    // to stderr; RUST_LOG overrides the filter.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("ratekeeper=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let rounds = env_or("CLUSTER_BENCH_ROUNDS", 5);
    let requests = env_or("CLUSTER_BENCH_REQUESTS", 200_000);
    let workers = usize::try_from(env_or("CLUSTER_BENCH_WORKERS", 2))
        .unwrap_or(2)
        .max(1);
    let sequential_count = usize::try_from(env_or("CLUSTER_BENCH_SEQUENTIAL", 2000)).unwrap_or(0);
    let only: Option<Vec<String>> = std::env::var("CLUSTER_BENCH_CONFIGS")
        .ok()
        .map(|list| list.split(',').map(|id| id.trim().to_owned()).collect());
    let ticks = clock_ticks();
    print_load("start");
    let dir = std::env::temp_dir().join(format!("ratekeeper-cluster-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temp dir");

    // The cluster: A alone, then B joining A, then C joining A and B.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut nodes: Vec<Node> = Vec::new();
    for name in ["node-a", "node-b", "node-c"] {
        let peers: Vec<SocketAddr> = nodes.iter().map(|node| node.peer).collect();
        nodes.push(start_node(name, workers, &peers, stop_rx.clone()));
    }
    wait_for_members(&nodes, 3);
    let noop_runtime = runtime("noop-rt", workers);
    let noop = start_noop(&noop_runtime, stop_rx);
    for node in &nodes {
        println!(
            "{}: grpc {}, http {}, peer {} ({workers} workers)",
            node.name, node.grpc, node.http, node.peer
        );
    }

    // Keys by owner, from the ring the nodes build over their advertised peer addresses.
    let members: Vec<String> = nodes.iter().map(|node| node.peer.to_string()).collect();
    let ring = Ring::new(&members, DEFAULT_VNODES);
    // Fixed placements, so runs compare: one key on shard 0 of its owner, and 4-descriptor
    // requests with their keys on both shards of each owner (as key-1..4 in `benches/grpc.rs`
    // usually are; all four on one shard is cheaper, see BENCHMARKS.md).
    let shards = EngineConfig::default().shards;
    let mut taken: Vec<String> = Vec::new();
    let mut pick = |name: &str, spots: &[(usize, usize)]| -> Vec<String> {
        spots
            .iter()
            .map(|&(owner, shard)| {
                let value = value_at(&ring, &members, shards, (name, owner, shard), &taken);
                taken.push(value.clone());
                value
            })
            .collect()
    };
    let (a, b, c) = (0, 1, 2);
    let body_values: Vec<Vec<String>> = vec![
        pick("api_key", &[(a, 0)]),
        pick("api_key", &[(b, 0)]),
        pick("api_key", &[(a, 0), (a, 1), (a, 0), (a, 1)]),
        pick("api_key", &[(b, 0), (b, 1), (c, 0), (c, 1)]),
        // Two limits on one descriptor: owners lend no hits of it, so every request is
        // forwarded.
        pick("pair_key", &[(a, 0)]),
        pick("pair_key", &[(b, 0)]),
    ];
    for values in &body_values {
        let places: Vec<String> = values
            .iter()
            .map(|value| {
                let (owner, shard) = placement(&ring, &members, shards, value);
                format!("{value} on {} shard {shard}", nodes[owner].name)
            })
            .collect();
        println!("body: {}", places.join(", "));
    }
    let bodies: Vec<Body> = body_values
        .iter()
        .enumerate()
        .map(|(index, values)| {
            let request = request(values);
            let file = dir.join(format!("body-{index}.bin"));
            std::fs::write(&file, grpc_frame(&request)).expect("write a body file");
            Body { request, file }
        })
        .collect();

    let all_configs = vec![
        Config {
            id: "noop-1",
            label: "no-op, 1 descriptor",
            target: Target::Noop,
            body: 0,
            groups_per_request: 0,
            baseline: None,
            local: None,
        },
        Config {
            id: "local-1",
            label: "node A, 1 descriptor owned by A (local)",
            target: Target::NodeA,
            body: 0,
            groups_per_request: 0,
            baseline: Some("noop-1"),
            local: None,
        },
        Config {
            id: "remote-1",
            label: "node A, 1 descriptor owned by B (forwarded)",
            target: Target::NodeA,
            body: 1,
            groups_per_request: 1,
            baseline: Some("noop-1"),
            local: Some("local-1"),
        },
        Config {
            id: "local-pair",
            label: "node A, 1 descriptor with 2 limits owned by A (local)",
            target: Target::NodeA,
            body: 4,
            groups_per_request: 0,
            baseline: Some("noop-1"),
            local: None,
        },
        Config {
            id: "remote-pair",
            label: "node A, 1 descriptor with 2 limits owned by B (forwarded, never leased)",
            target: Target::NodeA,
            body: 5,
            groups_per_request: 1,
            baseline: Some("noop-1"),
            local: Some("local-pair"),
        },
        Config {
            id: "noop-4",
            label: "no-op, 4 descriptors",
            target: Target::Noop,
            body: 2,
            groups_per_request: 0,
            baseline: None,
            local: None,
        },
        Config {
            id: "local-4",
            label: "node A, 4 descriptors owned by A (local)",
            target: Target::NodeA,
            body: 2,
            groups_per_request: 0,
            baseline: Some("noop-4"),
            local: None,
        },
        Config {
            id: "remote-4",
            label: "node A, 4 descriptors, 2 on B + 2 on C (forwarded)",
            target: Target::NodeA,
            body: 3,
            groups_per_request: 2,
            baseline: Some("noop-4"),
            local: Some("local-4"),
        },
    ];
    let configs: Vec<Config> = all_configs
        .into_iter()
        .filter(|config| {
            only.as_ref()
                .is_none_or(|ids| ids.iter().any(|id| id == config.id))
        })
        .collect();
    assert!(!configs.is_empty(), "CLUSTER_BENCH_CONFIGS matched nothing");
    let harness = Harness {
        node_a: &nodes[0],
        noop,
        bodies: &bodies,
        log: dir.join("h2load.log"),
        ticks,
    };
    let addr = |target| harness.addr(target);

    for target in [Target::Noop, Target::NodeA] {
        check_with_tonic(target, addr(target), &configs, &bodies);
    }
    for config in &configs {
        check_with_nghttp(config, addr(config.target), &bodies[config.body]);
    }
    let node_a = &nodes[0];
    let checked = scrape(node_a);
    assert_eq!(checked.fallbacks, 0.0, "node A fell back during the checks");

    println!(
        "h2load -c {CONNECTIONS} -m {STREAMS_PER_CONNECTION} -n {requests}, {rounds} rounds; \
         3 nodes + no-op on {workers}-worker runtimes in this process, h2load on the same cores"
    );
    // Warm-up, not counted.
    for (index, config) in configs.iter().enumerate() {
        let warm = harness.measure(index, config, requests / 10);
        if warm.is_none() {
            println!("warm-up of {} fell back twice", config.id);
        }
    }
    println!();
    println!(
        "| round | configuration | req/s | p50 | p99 | process CPU/req | h2load+other CPU/req | \
         forwarded groups | leased checks | batches | mean batch |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut runs: Vec<Run> = Vec::new();
    let mut not_counted = 0;
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..configs.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for index in order {
            let config = &configs[index];
            let Some(run) = harness.measure(index, config, requests) else {
                not_counted += 1;
                continue;
            };
            let mean_batch = if run.delta.batches > 0.0 {
                format!("{:.2}", run.delta.forwarded / run.delta.batches)
            } else {
                "-".to_owned()
            };
            println!(
                "| {} | {} | {:.0} | {} us | {} us | {:.1} us | {:.1} us | {:.0} | {:.0} | {:.0} | {mean_batch} |",
                round + 1,
                config.id,
                run.requests_per_second,
                run.p50_us,
                run.p99_us,
                run.cpu_us_per_request,
                run.other_us_per_request,
                run.delta.forwarded,
                run.delta.leased,
                run.delta.batches,
            );
            runs.push(run);
        }
    }
    if not_counted > 0 {
        println!("{not_counted} runs not counted: node A fell back during them and their retry");
    }

    println!();
    println!("Medians over the counted runs:");
    println!();
    println!(
        "| configuration | runs | req/s | p50 | p99 | process CPU/req | mean batch | vs no-op | \
         vs local (same cluster) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let summary = |index: usize| {
        let mine: Vec<&Run> = runs.iter().filter(|run| run.config == index).collect();
        let mut rps: Vec<f64> = mine.iter().map(|run| run.requests_per_second).collect();
        let mut p50: Vec<f64> = mine.iter().map(|run| run.p50_us as f64).collect();
        let mut p99: Vec<f64> = mine.iter().map(|run| run.p99_us as f64).collect();
        let mut cpu: Vec<f64> = mine.iter().map(|run| run.cpu_us_per_request).collect();
        let forwarded: f64 = mine.iter().map(|run| run.delta.forwarded).sum();
        let batches: f64 = mine.iter().map(|run| run.delta.batches).sum();
        (
            mine.len(),
            median(&mut rps),
            median(&mut p50),
            median(&mut p99),
            median(&mut cpu),
            if batches > 0.0 {
                forwarded / batches
            } else {
                f64::NAN
            },
        )
    };
    let position = |id: &str| configs.iter().position(|config| config.id == id);
    for (index, config) in configs.iter().enumerate() {
        let (count, rps, p50, p99, cpu, batch) = summary(index);
        let ratio = |other: Option<&str>| {
            other
                .and_then(position)
                .map(|other| summary(other).1)
                .filter(|other_rps| other_rps.is_finite())
                .map_or("-".to_owned(), |other_rps| {
                    format!("{:.1}%", 100.0 * rps / other_rps)
                })
        };
        let batch = if batch.is_finite() {
            format!("{batch:.2}")
        } else {
            "-".to_owned()
        };
        println!(
            "| {} ({}) | {count} | {rps:.0} | {p50:.0} us | {p99:.0} us | {cpu:.1} us | {batch} | {} | {} |",
            config.label,
            config.id,
            ratio(config.baseline),
            ratio(config.local),
        );
    }

    if sequential_count > 0 {
        let mut sequences = vec![("no-op, 1 descriptor", noop, bodies[0].request.clone())];
        let a = node_a.grpc;
        sequences.push((
            "node A, local key (owned by A)",
            a,
            bodies[0].request.clone(),
        ));
        sequences.push((
            "node A, remote key (owned by B)",
            a,
            bodies[1].request.clone(),
        ));
        sequences.push((
            "node A, 4 remote keys (2 on B, 2 on C)",
            a,
            bodies[3].request.clone(),
        ));
        let before = scrape(node_a);
        let latencies = sequential(&sequences, sequential_count);
        let after = scrape(node_a);
        println!();
        println!(
            "Sequential latency: one tonic client per server, {sequential_count} requests per \
             row one at a time, rows interleaved (client on this process's current thread):"
        );
        println!();
        println!("| request | p50 | p99 | mean | p50 vs local key |");
        println!("|---|---:|---:|---:|---:|");
        let p50_of = |latencies: &[u64]| percentile(latencies, 0.50) as f64 / 1e3;
        let local_p50 = latencies
            .iter()
            .find(|(name, _)| name.contains("local key"))
            .map(|(_, latencies)| p50_of(latencies));
        for (name, latencies) in &latencies {
            let mean = latencies.iter().sum::<u64>() as f64 / latencies.len().max(1) as f64 / 1e3;
            let p50 = p50_of(latencies);
            let added = match local_p50 {
                Some(local) if name.contains("remote") => format!("+{:.1} us", p50 - local),
                _ => "-".to_owned(),
            };
            println!(
                "| {name} | {p50:.1} us | {:.1} us | {mean:.1} us | {added} |",
                percentile(latencies, 0.99) as f64 / 1e3,
            );
        }
        let fallbacks = after.fallbacks - before.fallbacks;
        let batches = after.batches - before.batches;
        let forwarded = after.forwarded - before.forwarded;
        println!();
        println!(
            "during the sequential runs node A forwarded {forwarded:.0} groups in {batches:.0} \
             batches (mean {:.2}), fallbacks {fallbacks:.0}{}",
            if batches > 0.0 {
                forwarded / batches
            } else {
                f64::NAN
            },
            if fallbacks > 0.0 {
                " (FALLBACKS: the remote rows include locally decided requests)"
            } else {
                ""
            }
        );
    }

    let end = scrape(node_a);
    println!();
    println!(
        "node A totals: {:.0} fallbacks, {:.0} failed batches, {:.0} members",
        end.fallbacks, end.errors, end.members
    );
    print_load("end");
    println!("bench took {:.0} s", started.elapsed().as_secs_f64());
    // Dropping the runtimes stops the servers where they are: no graceful leave or counter
    // handoff between nodes that are all going away. `stop_tx` outlives them, as a dropped
    // sender would start the graceful shutdown.
    drop(noop_runtime);
    drop(nodes);
    drop(stop_tx);
    let _ = std::fs::remove_dir_all(&dir);
}
