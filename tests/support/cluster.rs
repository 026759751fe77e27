//! The cluster tests' shared vocabulary: starting a cluster of real processes on
//! 127.0.0.1, one hit on `edge` / `api_key = value` through gRPC (and the failures a load of
//! them saw), which node owns a value, what `/debug/explain` says of it, and each node's
//! view of the cluster for a failure message.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratekeeper::cluster::ring::{DEFAULT_VNODES, Ring};
use ratekeeper::key::KeyBuilder;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use super::http::{http_get, metric};
use super::poll::eventually;
use super::ratekeeper::Ratekeeper;

/// How long one gRPC hit may take before the test fails.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// How long the members of a new cluster get to see each other.
pub const FORM_WITHIN: Duration = Duration::from_secs(20);

/// A cluster member on 127.0.0.1: its peer listener on `peer_addr`, joining `peers`, with
/// `extra_args`.
pub fn start_member(
    config: &Path,
    peer_addr: &str,
    peers: &[SocketAddr],
    extra_args: &[&str],
) -> Ratekeeper {
    let peers: Vec<String> = peers.iter().map(ToString::to_string).collect();
    let joined = peers.join(",");
    let mut args = vec!["--peer-addr", peer_addr];
    if !peers.is_empty() {
        args.extend(["--peers", joined.as_str()]);
    }
    args.extend_from_slice(extra_args);
    Ratekeeper::start(config, &args)
}

/// `n` members, each joining the ones started before it, with `extra_args`; returns once
/// every one sees all `n`.
pub fn start_cluster(config: &Path, n: usize, extra_args: &[&str]) -> Vec<Ratekeeper> {
    let mut nodes: Vec<Ratekeeper> = Vec::new();
    for _ in 0..n {
        let peers: Vec<SocketAddr> = nodes.iter().map(Ratekeeper::peer_addr).collect();
        nodes.push(start_member(config, "127.0.0.1:0", &peers, extra_args));
    }
    wait_for_members(&nodes, n);
    nodes
}

/// Waits (up to [`FORM_WITHIN`]) until each of `nodes` has `n` members on its ring; fails
/// with the node's stderr otherwise.
pub fn wait_for_members(nodes: &[Ratekeeper], n: usize) {
    for node in nodes {
        let agreed = eventually(FORM_WITHIN, || {
            metric(node.http_addr(), "ratekeeper_cluster_members") == n as f64
        });
        assert!(agreed, "a node never saw {n} members: {}", node.stderr());
    }
}

/// A gRPC client of `node`.
pub async fn grpc_client(node: &Ratekeeper) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", node.grpc_addr()))
        .await
        .unwrap_or_else(|error| panic!("connect to {}: {error}", node.grpc_addr()))
}

/// A gRPC client per node.
pub async fn grpc_clients(nodes: &[Ratekeeper]) -> Vec<RateLimitServiceClient<Channel>> {
    let mut clients = Vec::new();
    for node in nodes {
        clients.push(grpc_client(node).await);
    }
    clients
}

/// One hit on `edge` / `api_key = value`.
pub fn edge_request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".to_owned(),
                value: value.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// One hit on `value` within [`ANSWER_WITHIN`]: admitted (`true`) or over the limit; an
/// error, no answer or another code is the problem, in words.
pub async fn edge_try(
    client: &mut RateLimitServiceClient<Channel>,
    value: &str,
) -> Result<bool, String> {
    let call = client.should_rate_limit(edge_request(value));
    match tokio::time::timeout(ANSWER_WITHIN, call).await {
        Ok(Ok(response)) => match response.into_inner().overall_code {
            code if code == Code::Ok as i32 => Ok(true),
            code if code == Code::OverLimit as i32 => Ok(false),
            code => Err(format!("answered code {code}")),
        },
        Ok(Err(status)) => Err(format!("error {status}")),
        Err(_) => Err(format!("no answer within {ANSWER_WITHIN:?}")),
    }
}

/// The overall code for one hit on `value`; an error or no answer within
/// [`ANSWER_WITHIN`] fails the test.
pub async fn edge_decide(client: &mut RateLimitServiceClient<Channel>, value: &str) -> Code {
    match edge_try(client, value).await {
        Ok(true) => Code::Ok,
        Ok(false) => Code::OverLimit,
        Err(problem) => panic!("{value}: {problem}"),
    }
}

/// The requests of a load that got an error or no answer: how many, and the first few.
#[derive(Debug, Default)]
pub struct Failures {
    count: AtomicU64,
    first: Mutex<Vec<String>>,
}

impl Failures {
    pub fn record(&self, problem: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self
            .first
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if first.len() < 10 {
            first.push(problem);
        }
    }

    /// Fails the test, listing the first failures, if there was any.
    pub fn assert_none(&self) {
        let first = self
            .first
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        assert!(
            first.is_empty(),
            "{} requests got an error or no answer, first ones:\n{}",
            self.count.load(Ordering::Relaxed),
            first.join("\n")
        );
    }
}

/// Phases a [`Load`] tells apart (before, during, after what a test does to the cluster).
pub const LOAD_PHASES: usize = 3;
/// Nodes a [`Load`] sends through at most.
pub const LOAD_NODES: usize = 3;

/// What a [`Load`] saw, per node it sent through and per phase.
#[derive(Debug, Default)]
pub struct Tally {
    /// Answers (OK or OVER_LIMIT).
    answered: [[AtomicU64; LOAD_PHASES]; LOAD_NODES],
    /// Admitted hits of the keys whose admissions are counted.
    admitted: [[AtomicU64; LOAD_PHASES]; LOAD_NODES],
    pub failures: Failures,
}

impl Tally {
    pub fn answered(&self, node: usize, phase: usize) -> u64 {
        self.answered[node][phase].load(Ordering::Relaxed)
    }

    /// The counted keys' admitted hits on `node`, per phase.
    pub fn admitted_by_phase(&self, node: usize) -> Vec<u64> {
        self.admitted[node]
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .collect()
    }

    /// The counted keys' admitted hits on `node`, in all phases.
    pub fn admitted(&self, node: usize) -> u64 {
        self.admitted_by_phase(node).iter().sum()
    }
}

/// Requests sent all along by tasks (one per node and key, each pacing itself), every answer
/// recorded in a [`Tally`] under the phase set when it was sent.
#[derive(Default)]
pub struct Load {
    phase: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    pub tally: Arc<Tally>,
    tasks: Vec<JoinHandle<()>>,
}

impl Load {
    /// Sends `value` through every client (client `i` is node `names[i]`), one request per
    /// `pace`, until stopped; `count_admitted` counts its admitted hits.
    pub fn spawn(
        &mut self,
        clients: &[RateLimitServiceClient<Channel>],
        names: &[&'static str],
        value: &str,
        pace: Duration,
        count_admitted: bool,
    ) {
        assert!(
            clients.len() <= LOAD_NODES,
            "a load sends through at most {LOAD_NODES} nodes"
        );
        for ((node, client), name) in clients.iter().enumerate().zip(names) {
            let (mut client, value, name) = (client.clone(), value.to_owned(), *name);
            let (phase, stop, tally) = (
                Arc::clone(&self.phase),
                Arc::clone(&self.stop),
                Arc::clone(&self.tally),
            );
            self.tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Acquire) {
                    let phase = phase.load(Ordering::Acquire);
                    match edge_try(&mut client, &value).await {
                        Ok(admitted) => {
                            if admitted && count_admitted {
                                tally.admitted[node][phase].fetch_add(1, Ordering::Relaxed);
                            }
                            tally.answered[node][phase].fetch_add(1, Ordering::Relaxed);
                        }
                        Err(problem) => tally
                            .failures
                            .record(format!("{name} {value} (phase {phase}): {problem}")),
                    }
                    tokio::time::sleep(pace).await;
                }
            }));
        }
    }

    /// Records the answers from now on under `phase` (below [`LOAD_PHASES`]).
    pub fn set_phase(&self, phase: usize) {
        assert!(phase < LOAD_PHASES);
        self.phase.store(phase, Ordering::Release);
    }

    /// Stops every task and returns what they saw.
    pub async fn stop(self) -> Arc<Tally> {
        self.stop.store(true, Ordering::Release);
        for task in self.tasks {
            if let Err(error) = task.await {
                panic!("a load task failed: {error}");
            }
        }
        self.tally
    }
}

/// The first `<prefix>-<n>` for which `wanted` holds.
pub fn edge_key_where(prefix: &str, wanted: impl Fn(&str) -> bool) -> String {
    (0..10_000)
        .map(|n| format!("{prefix}-{n}"))
        .find(|value| wanted(value))
        .unwrap_or_else(|| panic!("no {prefix}-N key fits"))
}

/// Which of `members` owns `api_key = value`, by the ring the nodes build from them.
pub fn edge_owner_of(members: &[String], value: &str) -> usize {
    let ring = Ring::new(members, DEFAULT_VNODES);
    let mut key = KeyBuilder::new("edge");
    key.entry("api_key", value);
    let owner = ring
        .owner(key.route())
        .expect("a ring with members has an owner");
    members
        .iter()
        .position(|member| **member == **owner)
        .expect("the owner is a member")
}

/// `POST /debug/explain` for `value` on `node`: the counter's `used` (None unless it
/// answered 200 with one) and the whole answer.
pub fn edge_explain(node: &Ratekeeper, value: &str) -> (Option<u64>, Value) {
    edge_explain_hits(node, value, None)
}

/// [`edge_explain`] weighing `hits` hits (`hits_addend`; `None`: the request's default).
pub fn edge_explain_hits(
    node: &Ratekeeper,
    value: &str,
    hits: Option<u32>,
) -> (Option<u64>, Value) {
    let mut body = json!({
        "domain": "edge",
        "descriptors": [{"entries": [{"key": "api_key", "value": value}]}]
    });
    if let Some(hits) = hits {
        body["hits_addend"] = json!(hits);
    }
    let Ok(response) = node.admin_request("POST", "/debug/explain", &body.to_string()) else {
        return (None, json!("no answer"));
    };
    let answer: Value = serde_json::from_str(&response.body).unwrap_or(json!(response.body));
    let used = (response.status == 200)
        .then(|| answer["descriptors"][0]["limits"][0]["used"].as_u64())
        .flatten();
    (used, answer)
}

/// A day: the window of the limits of tests that count exactly for longer than a moment,
/// so that a window's end (which resets the counts) is rarely near.
pub const DAY: Duration = Duration::from_secs(86_400);

/// What is left of the current `window` (a whole number of seconds): fixed windows are
/// aligned to the epoch.
pub fn left_of_window(window: Duration) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let window = window.as_secs().max(1);
    Duration::from_secs(window - now.as_secs() % window)
}

/// A test across a window's end would see its counts reset: when less than `margin` of the
/// current `window` is left, waits for the next one.
pub async fn away_from_a_window_end(window: Duration, margin: Duration) {
    let left = left_of_window(window);
    if left < margin {
        eprintln!("waiting {left:?} for the next window, so no count is cut in two");
        tokio::time::sleep(left + Duration::from_secs(1)).await;
    }
}

/// `ratekeeper_cluster_members` on `node`'s `/metrics` (None if it did not answer).
pub fn cluster_members(node: &Ratekeeper) -> Option<f64> {
    super::http::metric_sample(node.http_addr(), "ratekeeper_cluster_members ")
}

/// The sum over `nodes` of every `/metrics` sample starting with `prefix` (all label sets).
pub fn metric_total(nodes: &[Ratekeeper], prefix: &str) -> f64 {
    nodes
        .iter()
        .map(|node| super::http::metric_sum(node.http_addr(), prefix))
        .sum()
}

/// Fails, with [`cluster_diagnosis`], unless each node's time (`times[i]`, for `names[i]`)
/// is within `bound`; `what` says what the node did (`"show 2 members after the kill"`).
pub fn assert_all_within(
    times: &[Option<Duration>],
    bound: Duration,
    what: &str,
    nodes: &[Ratekeeper],
    names: &[&str],
) {
    for (time, name) in times.iter().zip(names) {
        assert!(
            time.is_some_and(|elapsed| elapsed <= bound),
            "{name} did not {what} within {bound:?} (seen after {time:?})\n{}",
            cluster_diagnosis(nodes, names)
        );
    }
}

/// The `/metrics` lines of `node` starting with any of `prefixes`.
pub fn metric_lines(node: &Ratekeeper, prefixes: &[&str]) -> Vec<String> {
    http_get(node.http_addr(), "/metrics", &[])
        .map(|response| {
            response
                .body
                .lines()
                .filter(|line| prefixes.iter().any(|prefix| line.starts_with(prefix)))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Each node's view of the cluster and its last peer log lines, for a failure message.
pub fn cluster_diagnosis(nodes: &[Ratekeeper], names: &[&str]) -> String {
    let mut out = String::new();
    for (node, name) in nodes.iter().zip(names) {
        let prefixes = [
            "ratekeeper_cluster_",
            "ratekeeper_peer_up",
            "ratekeeper_peer_circuit_open",
        ];
        let lines = metric_lines(node, &prefixes);
        let stderr = node.stderr();
        let logs: Vec<&str> = stderr
            .lines()
            .filter(|line| line.contains("peer") || line.contains("ring"))
            .collect();
        let tail = &logs[logs.len().saturating_sub(12)..];
        out.push_str(&format!(
            "--- {name}: {}\n{}\n",
            lines.join("\n"),
            tail.join("\n")
        ));
    }
    out
}
