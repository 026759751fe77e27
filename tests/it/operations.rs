//! What an SRE relies on, through the real binary: hot reload seen through the gRPC API,
//! reloads under load, metrics that move, `POST /json`, a graceful SIGTERM, and SIGHUP
//! reloading the limits.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::{
    Ratekeeper, TempDir, eventually, eventually_async, http_get, metric, serve_limits, write_config,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(15);

fn limits(domain: &str, requests_per_unit: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: api_key\n    rate_limit: {{unit: day, requests_per_unit: {requests_per_unit}}}\n"
    )
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connects")
}

fn request(domain: &str, key: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".to_owned(),
                value: key.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    key: &str,
) -> RateLimitResponse {
    client
        .should_rate_limit(request(domain, key))
        .await
        .expect("answers")
        .into_inner()
}

/// The configured `requests_per_unit` the service reports for `domain`/`key` (0: no limit),
/// checked without consuming anything.
async fn configured(client: &mut RateLimitServiceClient<Channel>, domain: &str, key: &str) -> u32 {
    let mut peek = request(domain, key);
    peek.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    let response = client
        .should_rate_limit(peek)
        .await
        .expect("answers")
        .into_inner();
    response.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |limit| limit.requests_per_unit)
}

async fn until_configured(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    expected: u32,
) {
    let reached = eventually_async(WAIT, || {
        let mut client = client.clone();
        let domain = domain.to_owned();
        async move { configured(&mut client, &domain, "probe").await == expected }
    })
    .await;
    assert!(
        reached,
        "domain {domain} never reported requests_per_unit {expected}"
    );
}

/// Writes `text` to `dir/name` atomically (write a temp file, rename it over).
fn replace(dir: &Path, name: &str, text: &str) {
    let temp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temp, text).expect("writes");
    std::fs::rename(&temp, dir.join(name)).expect("renames");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_renames_additions_and_deletions_take_effect_and_bad_files_are_survived() {
    let dir = TempDir::new("reload");
    write_config(dir.path(), "edge.yaml", &limits("edge", 5));
    let server = Ratekeeper::start(dir.path(), &[]);
    let mut client = client(server.grpc_addr()).await;
    assert_eq!(configured(&mut client, "edge", "probe").await, 5);

    // Counters survive, and a lowered limit applies to the existing count at once.
    for _ in 0..3 {
        assert_eq!(
            ask(&mut client, "edge", "alice").await.overall_code,
            Code::Ok as i32
        );
    }
    std::fs::write(dir.path().join("edge.yaml"), limits("edge", 3)).expect("edits in place");
    until_configured(&mut client, "edge", 3).await;
    assert_eq!(
        ask(&mut client, "edge", "alice").await.overall_code,
        Code::OverLimit as i32,
        "3 were used before the reload"
    );

    replace(dir.path(), "edge.yaml", &limits("edge", 7));
    until_configured(&mut client, "edge", 7).await;

    write_config(dir.path(), "api.yaml", &limits("api", 9));
    until_configured(&mut client, "api", 9).await;
    std::fs::remove_file(dir.path().join("api.yaml")).expect("deletes");
    until_configured(&mut client, "api", 0).await;

    // An invalid file keeps the old limits; fixing it recovers.
    replace(
        dir.path(),
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: api_key\n    ratelimit: {}\n",
    );
    let failed = eventually(WAIT, || {
        metric(
            server.http_addr(),
            "ratekeeper_config_loads_total{result=\"failure\"}",
        ) >= 1.0
    });
    assert!(failed, "the bad file was noticed: {}", server.stderr());
    assert_eq!(
        configured(&mut client, "edge", "probe").await,
        7,
        "old limits still serve"
    );
    assert!(
        server.stderr().contains("ratelimit"),
        "the error names the bad field"
    );
    replace(dir.path(), "edge.yaml", &limits("edge", 2));
    until_configured(&mut client, "edge", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_symlink_swap_reloads() {
    // The layout the kubelet makes: files are symlinks through `..data`, which is swapped.
    let mount = TempDir::new("configmap");
    let publish = |generation: u32, requests_per_unit: u32| {
        let version = format!("..2026_11_21_00_00_0{generation}.000000001");
        std::fs::create_dir(mount.path().join(&version)).expect("version dir");
        std::fs::write(
            mount.path().join(&version).join("edge.yaml"),
            limits("edge", requests_per_unit),
        )
        .expect("writes");
        let temp = mount.path().join("..data_tmp");
        std::os::unix::fs::symlink(&version, &temp).expect("symlink");
        std::fs::rename(&temp, mount.path().join("..data")).expect("swaps ..data");
    };
    publish(1, 4);
    std::os::unix::fs::symlink("..data/edge.yaml", mount.path().join("edge.yaml"))
        .expect("symlink");
    let server = Ratekeeper::start(mount.path(), &[]);
    let mut client = client(server.grpc_addr()).await;
    assert_eq!(configured(&mut client, "edge", "probe").await, 4);
    publish(2, 8);
    until_configured(&mut client, "edge", 8).await;
    publish(3, 6);
    until_configured(&mut client, "edge", 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_fails_while_the_limits_reload_repeatedly() {
    let dir = TempDir::new("reload-load");
    write_config(dir.path(), "edge.yaml", &limits("edge", 1_000_000));
    let server = Ratekeeper::start(dir.path(), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for worker in 0..4 {
        let mut client = client(server.grpc_addr()).await;
        let (stop, answered) = (Arc::clone(&stop), Arc::clone(&answered));
        clients.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                match client
                    .should_rate_limit(request("edge", &format!("w{worker}-{n}")))
                    .await
                {
                    Ok(response) if response.get_ref().overall_code == Code::Ok as i32 => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    other => failures.push(format!("{other:?}")),
                }
            }
            failures
        }));
    }
    for round in 0..20 {
        replace(dir.path(), "edge.yaml", &limits("edge", 1_000_001 + round));
        let seen = eventually(WAIT, || {
            metric(
                server.http_addr(),
                "ratekeeper_config_loads_total{result=\"success\"}",
            ) >= f64::from(round + 2)
        });
        assert!(seen, "reload {round} happened");
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let failures = client.await.expect("client task");
        assert!(
            failures.is_empty(),
            "requests failed during reloads: {failures:?}"
        );
    }
    assert!(
        answered.load(Ordering::Relaxed) > 100,
        "the clients really ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_as_requests_are_made() {
    let (_dir, server) = serve_limits("metrics", &limits("edge", 2), &[]);
    let mut client = client(server.grpc_addr()).await;
    let http = server.http_addr();
    let labels = r#"{domain="edge",limit="api_key",unit="day"}"#;
    assert_eq!(
        metric(http, &format!("ratekeeper_limit_total_hits_total{labels}")),
        0.0
    );
    for _ in 0..3 {
        ask(&mut client, "edge", "m1").await;
    }
    assert_eq!(
        metric(http, &format!("ratekeeper_limit_total_hits_total{labels}")),
        3.0
    );
    assert_eq!(
        metric(
            http,
            &format!("ratekeeper_limit_within_limit_total{labels}")
        ),
        2.0
    );
    assert_eq!(
        metric(http, &format!("ratekeeper_limit_over_limit_total{labels}")),
        1.0
    );
    assert_eq!(
        metric(http, r#"ratekeeper_requests_total{result="ok",code="OK"}"#),
        2.0
    );
    assert_eq!(
        metric(
            http,
            r#"ratekeeper_requests_total{result="over_limit",code="OK"}"#
        ),
        1.0
    );
    client
        .should_rate_limit(request("", "x"))
        .await
        .expect_err("invalid");
    assert_eq!(
        metric(
            http,
            r#"ratekeeper_requests_total{result="error",code="INVALID_ARGUMENT"}"#
        ),
        1.0
    );
    let live: f64 = (0..4)
        .map(|shard| {
            metric(
                http,
                &format!(r#"ratekeeper_shard_live_keys{{shard="{shard}"}}"#),
            )
        })
        .sum();
    assert_eq!(live, 1.0, "one key is live");
    assert_eq!(
        metric(http, r#"ratekeeper_config_loads_total{result="success"}"#),
        1.0
    );
    assert!(metric(http, "ratekeeper_config_last_success_timestamp_seconds") > 1.7e9);
}

/// `POST path` with a body; returns the status and body.
fn http_post(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connects");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("writes");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("reads");
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("status");
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn json_endpoint_answers_200_429_and_400() {
    let (_dir, server) = serve_limits("json", &limits("edge", 1), &[]);
    let body =
        r#"{"domain": "edge", "descriptors": [{"entries": [{"key": "api_key", "value": "j1"}]}]}"#;
    let (status, first) = http_post(server.http_addr(), "/json", body);
    assert_eq!(status, 200, "{first}");
    let first: serde_json::Value = serde_json::from_str(&first).expect("json");
    assert_eq!(first["overallCode"], "OK");
    assert_eq!(first["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    assert_eq!(first["statuses"][0]["currentLimit"]["unit"], "DAY");
    let (status, second) = http_post(server.http_addr(), "/json", body);
    assert_eq!(status, 429, "{second}");
    let second: serde_json::Value = serde_json::from_str(&second).expect("json");
    assert_eq!(second["statuses"][0]["code"], "OVER_LIMIT");
    let (status, bad) = http_post(
        server.http_addr(),
        "/json",
        r#"{"domain": "edge", "descriptors": 3}"#,
    );
    assert_eq!(status, 400);
    assert!(bad.contains("invalid request body"), "{bad}");
    let (status, empty) = http_post(server.http_addr(), "/json", r#"{"domain": ""}"#);
    assert_eq!(status, 400);
    assert!(empty.contains("domain: must not be empty"), "{empty}");
}

/// The reference's `/json` with `RESPONSE_DYNAMIC_METADATA` and `QUOTA_MODE`: the quota
/// violations and the matched entries' metadata are in the answer, as over gRPC.
#[test]
fn json_endpoint_reports_quota_violations_in_dynamic_metadata() {
    let limits = "\
domain: edge
descriptors:
  - key: quota
    rate_limit: {unit: day, requests_per_unit: 1}
    metadata: {backend: primary}
";
    let (_dir, server) = serve_limits(
        "json-quota",
        limits,
        &["--response-dynamic-metadata", "--quota-mode"],
    );
    let body = r#"{"domain": "edge", "descriptors": [
        {"entries": [{"key": "quota", "value": "q1"}]},
        {"entries": [{"key": "quota", "value": "q2"}]}]}"#;
    let (status, first) = http_post(server.http_addr(), "/json", body);
    assert_eq!(status, 200, "{first}");
    let first: serde_json::Value = serde_json::from_str(&first).expect("json");
    let metadata = &first["dynamicMetadata"];
    assert_eq!(metadata["domain"], "edge", "{first}");
    assert_eq!(
        metadata["descriptors"][1]["entries"][0], "quota=q2",
        "{first}"
    );
    assert_eq!(metadata["quotaModeEnabled"], true, "{first}");
    assert_eq!(
        metadata["quotaModeViolations"],
        serde_json::json!([]),
        "{first}"
    );
    assert_eq!(metadata["metadata"]["backend"], "primary", "{first}");
    assert_eq!(metadata["backend"], serde_json::Value::Null, "{first}");
    // q1 again, with a fresh q3: q1 is over its quota, q3 is not, so the request passes.
    let body = r#"{"domain": "edge", "descriptors": [
        {"entries": [{"key": "quota", "value": "q1"}]},
        {"entries": [{"key": "quota", "value": "q3"}]}]}"#;
    let (status, second) = http_post(server.http_addr(), "/json", body);
    assert_eq!(status, 200, "{second}");
    let second: serde_json::Value = serde_json::from_str(&second).expect("json");
    assert_eq!(
        second["dynamicMetadata"]["quotaModeViolations"],
        serde_json::json!([0]),
        "{second}"
    );
    // As the reference reports it: q1 OVER_LIMIT, the request OK.
    assert_eq!(second["overallCode"], "OK", "{second}");
    assert_eq!(second["statuses"][0]["code"], "OVER_LIMIT", "{second}");
    assert_eq!(
        second["dynamicMetadata"]["descriptors"][0]["code"], "OVER_LIMIT",
        "{second}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_requests_in_flight_then_exits_cleanly() {
    // One token per 3 s, and a request may wait up to 8 s for it: the second request is in
    // flight (waiting) for about 3 s, long enough to send SIGTERM and look around.
    let (_dir, mut server) = serve_limits(
        "shutdown",
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 20, algorithm: token_bucket, burst: 1, max_wait: 8s}\n",
        &[],
    );
    let http = server.http_addr();
    let mut client = client(server.grpc_addr()).await;
    assert_eq!(
        ask(&mut client, "edge", "s1").await.overall_code,
        Code::Ok as i32
    );
    let mut waiting = client.clone();
    let in_flight = tokio::spawn(async move { ask(&mut waiting, "edge", "s1").await });
    let queued = eventually(WAIT, || {
        (0..4).any(|shard| {
            metric(
                http,
                &format!(r#"ratekeeper_shard_waiters{{shard="{shard}"}}"#),
            ) >= 1.0
        })
    });
    assert!(queued, "the second request is waiting");
    server.process().signal("-TERM");
    let not_ready = eventually(WAIT, || {
        http_get(http, "/healthcheck", &[]).is_ok_and(|response| response.status == 503)
    });
    assert!(not_ready, "healthcheck turns 503 while draining");
    assert!(!in_flight.is_finished(), "still waiting for its token");
    let answer = tokio::time::timeout(WAIT, in_flight)
        .await
        .expect("answered before the timeout")
        .expect("task");
    assert_eq!(
        answer.overall_code,
        Code::Ok as i32,
        "admitted when its token came"
    );
    let exited = crate::support::eventually_some(WAIT, || server.process().exited());
    let exit = exited.expect("exits after draining");
    assert!(exit.success(), "exit status {exit:?}: {}", server.stderr());
}

/// `--shutdown-delay`: on SIGTERM, not ready at once (`/healthcheck` 503, gRPC health
/// NOT_SERVING) but still answering every call, on connections old and new, until the
/// delay is over; then it drains and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_serving_while_not_ready_for_the_shutdown_delay() {
    let (_dir, mut server) = serve_limits("delay", &limits("edge", 1000), &["--shutdown-delay=3s"]);
    let http = server.http_addr();
    let grpc = server.grpc_addr();
    let mut before = client(grpc).await;
    assert_eq!(
        ask(&mut before, "edge", "d1").await.overall_code,
        Code::Ok as i32
    );
    let signalled = std::time::Instant::now();
    server.process().signal("-TERM");
    let not_ready = eventually(WAIT, || {
        http_get(http, "/healthcheck", &[]).is_ok_and(|response| response.status == 503)
    });
    assert!(not_ready, "healthcheck turns 503 at once");
    assert_eq!(
        grpc_health(grpc, "envoy.service.ratelimit.v3.RateLimitService").await,
        2,
        "gRPC health NOT_SERVING"
    );
    // Still answered, on the connection it had and on a new one, while the delay lasts.
    let mut after = client(grpc).await;
    for (client, remaining) in [(&mut before, 998), (&mut after, 997)] {
        let answer = ask(client, "edge", "d1").await;
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(answer.statuses[0].limit_remaining, remaining, "counted");
    }
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "the calls above were made within the delay"
    );
    assert!(
        server.process().exited().is_none(),
        "serving until the delay is over"
    );
    let exited = crate::support::eventually_some(WAIT, || server.process().exited());
    assert!(
        signalled.elapsed() >= Duration::from_secs(3),
        "not before the delay ended"
    );
    let exit = exited.expect("exits after the delay");
    assert!(exit.success(), "exit status {exit:?}: {}", server.stderr());
}

/// The gRPC health status of `service`, as a `ServingStatus` number.
async fn grpc_health(addr: SocketAddr, service: &str) -> i32 {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .expect("answers")
        .into_inner()
        .status
}

/// The reference's FORCE_START_WITHOUT_INITIAL_CONFIG and
/// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: a pod whose ConfigMap is not valid yet starts,
/// stays out of the load balancer, and joins once valid limits appear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_without_valid_limits_and_is_healthy_only_once_they_load() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let dir = TempDir::new("no-config");
    write_config(
        dir.path(),
        "edge.yaml",
        "domain: edge\ndescriptors: [{key: a\n",
    );
    let server = Ratekeeper::start_unready(
        dir.path(),
        &["--start-without-config", "--healthy-only-with-config"],
    );
    let health = http_get(server.http_addr(), "/healthcheck", &[]).expect("answers");
    assert_eq!(
        (health.status, health.body.trim()),
        (503, "no limits loaded yet")
    );
    for service in [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        assert_eq!(
            grpc_health(server.grpc_addr(), service).await,
            ServingStatus::NotServing as i32,
            "{service:?}"
        );
    }
    let mut client = client(server.grpc_addr()).await;
    assert_eq!(
        configured(&mut client, "edge", "probe").await,
        0,
        "answers meanwhile, with no limits"
    );

    replace(dir.path(), "edge.yaml", &limits("edge", 4));
    until_configured(&mut client, "edge", 4).await;
    let healthy = eventually(WAIT, || {
        http_get(server.http_addr(), "/healthcheck", &[]).is_ok_and(|r| r.status == 200)
    });
    assert!(healthy, "healthy once limits loaded");
    let grpc = server.grpc_addr();
    let serving = eventually_async(WAIT, || async move {
        grpc_health(grpc, "ratelimit").await == ServingStatus::Serving as i32
    })
    .await;
    assert!(serving, "gRPC health follows");
}

#[test]
fn without_the_flag_invalid_limits_still_refuse_to_start() {
    let dir = TempDir::new("no-config-strict");
    write_config(
        dir.path(),
        "edge.yaml",
        "domain: edge\ndescriptors: [{key: a\n",
    );
    let output = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(dir.path())
        .output()
        .expect("runs");
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "never announced serving");
}

/// Writes `text` into the file `link` names, in place (same inode, no rename).
fn write_in_place(link: &Path, text: &str) {
    std::fs::write(link, text).expect("writes through the link");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_limits_keeps_serving_and_keeps_the_old_limits_on_a_bad_file() {
    let dir = TempDir::new("sighup");
    let config = dir.path().join("limits");
    std::fs::create_dir(&config).expect("mkdir");
    write_config(&config, "edge.yaml", &limits("edge", 5));
    // A hard link outside the watched directory: a write through it changes the limits file
    // without any event in that directory (as on a filesystem that sends none), so only the
    // SIGHUP brings the change in.
    let link = dir.path().join("edge-link.yaml");
    std::fs::hard_link(config.join("edge.yaml"), &link).expect("links");
    let mut server = Ratekeeper::start(&config, &[]);
    let mut client = client(server.grpc_addr()).await;
    assert_eq!(configured(&mut client, "edge", "probe").await, 5);
    let http = server.http_addr();
    let loads = |result: &str| {
        metric(
            http,
            &format!("ratekeeper_config_loads_total{{result=\"{result}\"}}"),
        )
    };
    let successes = loads("success");

    write_in_place(&link, &limits("edge", 3));
    server.process().signal("-HUP");
    until_configured(&mut client, "edge", 3).await;
    assert!(
        server.process().exited().is_none(),
        "SIGHUP did not stop it"
    );
    assert!(
        server.stderr().contains("SIGHUP: reloading limits"),
        "{}",
        server.stderr()
    );
    assert_eq!(loads("success"), successes + 1.0, "counted as a reload");

    // A bad file on SIGHUP: counted and logged, the old limits stay.
    let failures = loads("failure");
    write_in_place(
        &link,
        "domain: edge\ndescriptors:\n  - key: api_key\n    ratelimit: {}\n",
    );
    server.process().signal("-HUP");
    let failed = eventually(WAIT, || loads("failure") > failures);
    assert!(failed, "the bad file was noticed: {}", server.stderr());
    assert_eq!(
        configured(&mut client, "edge", "probe").await,
        3,
        "the old limits still serve"
    );
    assert!(server.process().exited().is_none(), "still running");
}

#[test]
fn sighup_with_limits_from_xds_does_not_stop_the_process() {
    let dir = TempDir::new("sighup-xds");
    // Nobody answers there: the client keeps retrying, which is all this test needs.
    let xds = format!("http://127.0.0.1:{}", crate::support::free_port());
    let mut server = Ratekeeper::start(
        dir.path(),
        &["--config-source", "xds", "--xds-server", &xds],
    );
    server.process().signal("-HUP");
    let logged = eventually(WAIT, || {
        server
            .stderr()
            .contains("SIGHUP: the limits come from xDS, no files to reload")
    });
    assert!(logged, "{}", server.stderr());
    assert!(
        server.process().exited().is_none(),
        "SIGHUP did not stop it"
    );
    let health = http_get(server.http_addr(), "/healthcheck", &[]).expect("answers");
    assert_eq!(health.status, 200);
}
