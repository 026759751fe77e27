//! The cluster tests' shared vocabulary: one hit on `edge` / `api_key = value` through gRPC,
//! which node owns a value, what `/debug/explain` says of it, and each node's view of the
//! cluster for a failure message.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratekeeper::key::KeyBuilder;
use ratekeeper::ring::{DEFAULT_VNODES, Ring};
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::http::{http_get, http_post};
use super::ratekeeper::Ratekeeper;

/// How long one gRPC hit may take before the test fails.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// A gRPC client per node.
pub async fn grpc_clients(nodes: &[Ratekeeper]) -> Vec<RateLimitServiceClient<Channel>> {
    let mut clients = Vec::new();
    for node in nodes {
        let client = RateLimitServiceClient::connect(format!("http://{}", node.grpc_addr()))
            .await
            .unwrap_or_else(|error| panic!("connect to {}: {error}", node.grpc_addr()));
        clients.push(client);
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

/// The overall code for one hit on `value`; an error or no answer within
/// [`ANSWER_WITHIN`] fails the test.
pub async fn edge_decide(client: &mut RateLimitServiceClient<Channel>, value: &str) -> Code {
    let call = client.should_rate_limit(edge_request(value));
    let answer = tokio::time::timeout(ANSWER_WITHIN, call)
        .await
        .unwrap_or_else(|_| panic!("no answer for {value} within {ANSWER_WITHIN:?}"))
        .unwrap_or_else(|status| panic!("an error for {value}: {status}"))
        .into_inner();
    Code::try_from(answer.overall_code).unwrap_or(Code::Unknown)
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
    let body = json!({
        "domain": "edge",
        "descriptors": [{"entries": [{"key": "api_key", "value": value}]}]
    });
    let Ok(response) = http_post(node.http_addr(), "/debug/explain", &[], &body.to_string()) else {
        return (None, json!("no answer"));
    };
    let answer: Value = serde_json::from_str(&response.body).unwrap_or(json!(response.body));
    let used = (response.status == 200)
        .then(|| answer["descriptors"][0]["limits"][0]["used"].as_u64())
        .flatten();
    (used, answer)
}

/// Windows are hours aligned to the epoch: a test across the top of the hour would see its
/// counts reset. When less than `margin` of this hour is left, starts in the next one.
pub async fn away_from_the_top_of_the_hour(margin: Duration) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let left = Duration::from_secs(3600 - now.as_secs() % 3600);
    if left < margin {
        eprintln!("waiting {left:?} for the next hour's window, so no count is cut in two");
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
