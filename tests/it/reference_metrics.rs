//! Metrics where Envoy Gateway looks: the reference service's stats through the real
//! binary, asked for with the reference's variables. `USE_PROMETHEUS` with Envoy Gateway's
//! mapping file serves them, mapped, on a listener of their own, beside ratekeeper's
//! metrics; `USE_STATSD` pushes them as StatsD lines to a UDP socket the test holds. The
//! counts are the calls' outcomes: over_limit is the number of denied calls.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::UdpSocket;
use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::support::{
    Ratekeeper, TempDir, away_from_a_window_end, edge_decide, eventually_some, grpc_client,
    http_get, run_ratekeeper, write_config,
};

const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: tenant
    value: acme
    descriptors:
      - key: path
        rate_limit: {unit: day, requests_per_unit: 100}
";

/// Envoy Gateway's mapping file (its ConfigMap's `conf.yaml`).
fn envoy_gateway_mapping() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/metrics/reference/testdata/envoy-gateway-statsd.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// Five calls on `api_key` (limit 2: two admitted, three denied) and one on
/// `tenant=acme, path=/x`.
async fn send_calls(node: &Ratekeeper) {
    let mut client = grpc_client(node).await;
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(edge_decide(&mut client, "k").await);
    }
    let denied = codes
        .iter()
        .filter(|code| **code == Code::OverLimit)
        .count();
    assert_eq!(denied, 3, "{codes:?}");
    let entry = |key: &str, value: &str| Entry {
        key: key.to_owned(),
        value: value.to_owned(),
    };
    let request = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![entry("tenant", "acme"), entry("path", "/x")],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let answer = client.should_rate_limit(request).await.expect("answered");
    assert_eq!(answer.into_inner().overall_code, Code::Ok as i32);
}

/// Envoy Gateway's newer Deployment: `USE_STATSD=false`, `USE_PROMETHEUS=true`, its mapping
/// file; the scrape shows its names with the calls' counts, and ratekeeper's own metrics.
#[tokio::test(flavor = "multi_thread")]
async fn use_prometheus_serves_the_references_names_through_envoy_gateways_mapping() {
    let dir = TempDir::new("reference-metrics-prometheus");
    write_config(dir.path(), "limits.yaml", LIMITS);
    let mapping = write_config(dir.path(), "conf.yaml", &envoy_gateway_mapping());
    let mapping = mapping.to_string_lossy().into_owned();
    away_from_a_window_end(Duration::from_secs(86_400), Duration::from_secs(30)).await;
    let node = Ratekeeper::start_with_env(
        &dir.path().join("limits.yaml"),
        &[],
        &[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "127.0.0.1:0"),
            ("PROMETHEUS_MAPPER_YAML", &mapping),
        ],
    );
    send_calls(&node).await;
    let scrape = http_get(node.prometheus_addr(), "/metrics", &[]).expect("scraped");
    assert_eq!(scrape.status, 200);
    let text = scrape.body;
    let api_key = r#"{domain="edge",key1="api_key"}"#;
    let nested = r#"{domain="edge",key1="tenant_acme",key2="path"}"#;
    for line in [
        format!("ratelimit_service_rate_limit_total_hits_total{api_key} 5"),
        format!("ratelimit_service_rate_limit_over_limit_total{api_key} 3"),
        format!("ratelimit_service_rate_limit_within_limit_total{api_key} 2"),
        format!("ratelimit_service_rate_limit_near_limit_total{api_key} 1"),
        format!("ratelimit_service_rate_limit_total_hits_total{nested} 1"),
        format!("ratelimit_service_rate_limit_within_limit_total{nested} 1"),
        r#"ratelimit_service_total_requests_total{grpc_method="ShouldRateLimit"} 6"#.to_owned(),
        "ratelimit_service_config_load_success_total 1".to_owned(),
        r#"ratekeeper_limit_over_limit_total{domain="edge",limit="api_key",unit="day"} 3"#
            .to_owned(),
    ] {
        assert!(text.lines().any(|got| got == line), "{line} in:\n{text}");
    }
    // Envoy Gateway's closing rule drops whatever it does not map.
    assert!(
        !text.contains("ratelimit_service_rate_limit_edge"),
        "unmapped names are dropped:\n{text}"
    );
    let stderr = node.stderr_with("applied the reference service's environment");
    assert!(
        stderr.contains("USE_PROMETHEUS") && !stderr.contains("USE_PROMETHEUS: ignored"),
        "{stderr}"
    );
}

/// The StatsD lines received on `socket`, summed by name, once they add up to `expected`
/// (within a bound); what was received otherwise.
fn statsd_sums(socket: &UdpSocket, expected: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    let mut buffer = [0u8; 2048];
    let done = eventually_some(Duration::from_secs(20), || {
        while let Ok(size) = socket.recv(&mut buffer) {
            for line in String::from_utf8_lossy(&buffer[..size]).lines() {
                let (name, rest) = line.rsplit_once(':').expect("name:value|c");
                let value = rest.strip_suffix("|c").expect("a counter line");
                *sums.entry(name.to_owned()).or_insert(0) += value.parse::<u64>().expect("a count");
            }
        }
        expected
            .iter()
            .all(|(name, value)| sums.get(name) == Some(value))
            .then_some(())
    });
    assert!(done.is_some(), "expected {expected:#?}, received {sums:#?}");
    sums
}

/// Envoy Gateway's earlier Deployment pushes to a statsd_exporter sidecar: `USE_STATSD`,
/// `STATSD_PORT` (on `localhost`, the sidecar's IPv4 socket); the lines carry the reference's names (with `EXTRA_TAGS`
/// the way gostats writes them) and add up to the calls' counts.
#[tokio::test(flavor = "multi_thread")]
async fn use_statsd_pushes_the_references_names_to_statsd() {
    let dir = TempDir::new("reference-metrics-statsd");
    let limits = write_config(dir.path(), "limits.yaml", LIMITS);
    let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("a read timeout");
    let port = socket.local_addr().expect("bound").port().to_string();
    away_from_a_window_end(Duration::from_secs(86_400), Duration::from_secs(30)).await;
    let node = Ratekeeper::start_with_env(
        &limits,
        &[],
        &[
            // No STATSD_HOST, as Envoy Gateway: the reference's default, localhost.
            ("USE_STATSD", "true"),
            ("STATSD_PORT", &port),
            ("STATS_FLUSH_INTERVAL", "100ms"),
            ("EXTRA_TAGS", "env:test"),
        ],
    );
    send_calls(&node).await;
    let stat =
        |key: &str, kind: &str| format!("ratelimit.service.rate_limit.{key}.{kind}.__env=test");
    let expected: BTreeMap<String, u64> = [
        (stat("edge.api_key", "total_hits"), 5),
        (stat("edge.api_key", "over_limit"), 3),
        (stat("edge.api_key", "within_limit"), 2),
        (stat("edge.tenant_acme.path", "total_hits"), 1),
        (
            "ratelimit.service.config_load_success.__env=test".to_owned(),
            1,
        ),
        (
            "ratelimit_server.ShouldRateLimit.total_requests".to_owned(),
            6,
        ),
    ]
    .into_iter()
    .collect();
    let sums = statsd_sums(&socket, &expected);
    assert!(
        !sums
            .keys()
            .any(|name| name.ends_with(".shadow_mode.__env=test")),
        "a stat that counted nothing is not pushed: {sums:#?}"
    );
}

/// A mapping file that cannot be read or used stops the start, naming it.
#[test]
fn a_bad_mapping_file_stops_the_start_naming_it() {
    let dir = TempDir::new("reference-metrics-bad-mapping");
    let limits = write_config(dir.path(), "limits.yaml", LIMITS);
    let bad = write_config(
        dir.path(),
        "bad.yaml",
        "mappings: [{match: 'a.*', name: x, labels: {'1x': '$1'}}]",
    );
    for mapping in [bad, dir.path().join("missing.yaml")] {
        let (status, _, stderr) = run_ratekeeper(&[
            OsStr::new("serve"),
            OsStr::new("--config"),
            limits.as_os_str(),
            OsStr::new("--grpc-addr=127.0.0.1:0"),
            OsStr::new("--http-addr=127.0.0.1:0"),
            OsStr::new("--admin-addr=127.0.0.1:0"),
            OsStr::new("--prometheus-addr=127.0.0.1:0"),
            OsStr::new("--prometheus-mapping"),
            mapping.as_os_str(),
        ]);
        assert!(!status.success(), "{stderr}");
        let named = format!("--prometheus-mapping {}", mapping.display());
        assert!(stderr.contains(&named), "{stderr}");
    }
}
