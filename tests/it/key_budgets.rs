//! Key budgets through the real binary: a flood of new values on one rule takes at most
//! its share of the key table, and every other rule's new clients are still limited
//! exactly, with no UNAVAILABLE; the refusals are counted per rule and explained.

use std::net::SocketAddr;

use crate::support::{http_post, metric, serve_limits};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use tonic::transport::Channel;

/// Both rules count per day: a window that ended mid-test would free its keys' slots and
/// let more keys in (a minute's end did, once, on a loaded machine: 212 of 200), or start
/// a user's count again.
const LIMITS: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3, max_keys: 50}
";

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    key: &str,
    value: &str,
) -> Result<Code, tonic::Code> {
    let request = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    match client.should_rate_limit(request).await {
        Ok(response) => Ok(response.into_inner().overall_code()),
        Err(status) => Err(status.code()),
    }
}

fn explain(admin: SocketAddr, user: &str) -> Value {
    let body =
        json!({"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": user}]}]});
    let response = http_post(admin, "/debug/explain", &[], &body.to_string()).expect("answers");
    assert_eq!(response.status, 200, "{}", response.body);
    serde_json::from_str(&response.body).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_one_rule_leaves_every_other_rule_limited_exactly() {
    // 400 keys in all on 2 shards; a rule without max_keys may hold half of them.
    let (_dir, server) = serve_limits("budgets", LIMITS, &["--max-keys", "400", "--shards", "2"]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr()))
        .await
        .expect("connects");
    let (mut admitted, mut refused) = (0, 0);
    for n in 0..1000 {
        match ask(
            &mut client,
            "remote_address",
            &format!("10.{}.{}.1", n / 256, n % 256),
        )
        .await
        {
            Ok(Code::Ok) => admitted += 1,
            Err(tonic::Code::Unavailable) => refused += 1,
            other => panic!("flood request {n}: {other:?}"),
        }
    }
    assert!(
        (150..=200).contains(&admitted),
        "the flooded rule holds at most its budget of 200 keys (100 per shard): {admitted} admitted"
    );
    assert_eq!(admitted + refused, 1000);
    // Every new client of the other rule is admitted 3 times, then denied: limited exactly.
    for user in 0..20 {
        let user = format!("user-{user}");
        for hit in 0..3 {
            assert_eq!(
                ask(&mut client, "user", &user).await,
                Ok(Code::Ok),
                "{user} hit {hit}"
            );
        }
        assert_eq!(
            ask(&mut client, "user", &user).await,
            Ok(Code::OverLimit),
            "{user}"
        );
    }
    let http = server.http_addr();
    let flood = r#"{rule="edge > remote_address"}"#;
    assert_eq!(
        metric(http, &format!("ratekeeper_rule_key_refusals_total{flood}")),
        f64::from(refused)
    );
    assert_eq!(
        metric(http, &format!("ratekeeper_rule_keys{flood}")),
        f64::from(admitted)
    );
    assert_eq!(
        metric(http, &format!("ratekeeper_rule_key_budget{flood}")),
        200.0
    );
    let users = r#"{rule="edge > user"}"#;
    assert_eq!(metric(http, &format!("ratekeeper_rule_keys{users}")), 20.0);
    assert_eq!(
        metric(http, &format!("ratekeeper_rule_key_budget{users}")),
        50.0
    );
    assert_eq!(
        metric(http, &format!("ratekeeper_rule_key_refusals_total{users}")),
        0.0
    );
    // The explanation shows the rule's keys against its budget.
    let explained = explain(server.admin_addr(), "user-0");
    assert_eq!(
        explained["descriptors"][0]["limits"][0]["keys"],
        json!({"live": 20, "budget": 50, "refused": 0}),
        "{explained}"
    );
}
