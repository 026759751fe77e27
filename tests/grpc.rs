//! The real gRPC server, driven by a tonic client: what Envoy sees on the wire.

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratekeeper::engine::EngineConfig;
use ratekeeper::limiter::LimiterOptions;
use ratekeeper::limits::Limits;
use ratekeeper::server::{ServeError, Server, ServerOptions};
use support::spawn_server;
use tonic::transport::Channel;

const LIMITS: &str = "
domain: grpc
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5}
";

struct Running {
    client: RateLimitServiceClient<Channel>,
    grpc: std::net::SocketAddr,
    http: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), ServeError>>,
}

async fn start(response_headers: bool) -> Running {
    let options = LimiterOptions {
        response_headers,
        ..LimiterOptions::default()
    };
    start_with(LIMITS, options).await
}

async fn start_with(limits: &str, limiter: LimiterOptions) -> Running {
    let options = ServerOptions {
        engine: EngineConfig {
            shards: 2,
            ..EngineConfig::default()
        },
        limiter,
        ..ServerOptions::new(
            "127.0.0.1:0".parse().expect("addr"),
            "127.0.0.1:0".parse().expect("addr"),
        )
    };
    let limits = Limits::parse_str("grpc.yaml", limits).expect("valid");
    let server = Server::bind(&options, limits, 0).await.expect("binds");
    let grpc = server.grpc_addr().expect("grpc on tcp");
    let http = server.http_addr();
    let (stop, done) = spawn_server(server);
    let client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connects");
    Running {
        client,
        grpc,
        http,
        stop: Some(stop),
        done,
    }
}

fn request(domain: &str, users: &[&str]) -> RateLimitRequest {
    let descriptors: Vec<(&str, &str)> = users.iter().map(|user| ("user", *user)).collect();
    request_of(domain, &descriptors)
}

/// A request with one single-entry descriptor per `(key, value)`.
fn request_of(domain: &str, descriptors: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|(key, value)| RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*key).to_owned(),
                    value: (*value).to_owned(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

#[tokio::test]
async fn the_fifth_request_of_the_day_passes_and_the_sixth_is_over() {
    let mut running = start(false).await;
    // A unique user per run: a fixed day window cannot roll over between these calls in any
    // way that matters, since all six land in the same second or the next.
    let user = format!("u{}", std::process::id());
    let mut codes = Vec::new();
    for _ in 0..6 {
        let response = running
            .client
            .should_rate_limit(request("grpc", &[&user]))
            .await
            .expect("ok status")
            .into_inner();
        codes.push(response.overall_code);
        assert_eq!(response.statuses.len(), 1);
    }
    let ok = Code::Ok as i32;
    assert_eq!(codes, [ok, ok, ok, ok, ok, Code::OverLimit as i32]);
    running.shutdown().await;
}

#[tokio::test]
async fn invalid_requests_get_invalid_argument_naming_the_field() {
    let mut running = start(false).await;
    let status = running
        .client
        .should_rate_limit(request("", &["a"]))
        .await
        .expect_err("rejected");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), "domain: must not be empty");
    let status = running
        .client
        .should_rate_limit(request("grpc", &[]))
        .await
        .expect_err("rejected");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), "descriptors: must not be empty");
    // An oversized message is refused by the transport, and the server keeps serving.
    let huge = "v".repeat(2 << 20);
    let status = running
        .client
        .should_rate_limit(request("grpc", &[&huge]))
        .await
        .expect_err("rejected");
    assert_ne!(status.code(), tonic::Code::Ok);
    let fine = running
        .client
        .should_rate_limit(request("grpc", &["still-serving"]))
        .await
        .expect("serves after bad input");
    assert_eq!(fine.into_inner().overall_code, Code::Ok as i32);
    running.shutdown().await;
}

#[tokio::test]
async fn response_headers_reach_the_client_when_enabled() {
    let mut running = start(true).await;
    let response = running
        .client
        .should_rate_limit(request("grpc", &["headers"]))
        .await
        .expect("ok")
        .into_inner();
    let keys: Vec<&str> = response
        .response_headers_to_add
        .iter()
        .map(|header| header.key.as_str())
        .collect();
    assert_eq!(
        keys,
        ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]
    );
    assert_eq!(response.response_headers_to_add[0].value, "5");
    assert_eq!(response.response_headers_to_add[1].value, "4");
    running.shutdown().await;
}

#[tokio::test]
async fn the_grpc_health_service_reports_serving() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let running = start(false).await;
    let channel = Channel::from_shared(format!("http://{}", running.grpc))
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    let mut health = HealthClient::new(channel);
    // "ratelimit" is the name the reference service answers to (probes written for it).
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ratelimit",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("answers")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    running.shutdown().await;
}

#[tokio::test]
async fn healthcheck_answers_ok_while_serving() {
    let running = start(false).await;
    let (status, body) = http_get(running.http, "/healthcheck").await;
    assert_eq!((status, body.as_str()), (200, "OK"));
    running.shutdown().await;
}

/// The reference service's newer keys, over the wire: a shared wildcard counter, quota mode
/// and the dynamic metadata that reports it.
const NEWER_KEYS: &str = "
domain: grpc
descriptors:
  - key: file
    value: files/*
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: model
    value: gpt-a
    quota_mode: true
    metadata: {backend: a}
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: model
    value: gpt-b
    quota_mode: true
    metadata: {backend: b}
    rate_limit: {unit: day, requests_per_unit: 5}
";

/// A string field of a protobuf `Struct`, if it is one.
fn text_field<'a>(
    fields: &'a envoy_types::pb::google::protobuf::Struct,
    name: &str,
) -> Option<&'a str> {
    use envoy_types::pb::google::protobuf::value::Kind;
    match fields.fields.get(name)?.kind.as_ref()? {
        Kind::StringValue(text) => Some(text),
        _ => None,
    }
}

/// The numbers in a list field of a protobuf `Struct`.
fn numbers_field(fields: &envoy_types::pb::google::protobuf::Struct, name: &str) -> Vec<f64> {
    use envoy_types::pb::google::protobuf::value::Kind;
    let Some(Kind::ListValue(list)) = fields.fields.get(name).and_then(|v| v.kind.as_ref()) else {
        panic!("{name} is not a list in {fields:?}");
    };
    list.values
        .iter()
        .filter_map(|value| match value.kind {
            Some(Kind::NumberValue(number)) => Some(number),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn shared_wildcards_and_quota_mode_over_grpc_with_dynamic_metadata() {
    let options = LimiterOptions {
        response_dynamic_metadata: true,
        ..LimiterOptions::default()
    };
    let mut running = start_with(NEWER_KEYS, options).await;
    let mut codes = Vec::new();
    for file in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        let response = running
            .client
            .should_rate_limit(request_of("grpc", &[("file", file)]))
            .await
            .expect("ok status")
            .into_inner();
        codes.push(response.overall_code);
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, [ok, ok, over], "three files, one counter of 2");

    let models = request_of("grpc", &[("model", "gpt-a"), ("model", "gpt-b")]);
    let mut responses = Vec::new();
    for _ in 0..2 {
        let response = running
            .client
            .should_rate_limit(models.clone())
            .await
            .expect("ok status")
            .into_inner();
        responses.push(response);
    }
    // The second call exceeds gpt-a's quota; gpt-b has some left, so it passes.
    let second = &responses[1];
    assert_eq!(second.overall_code, ok);
    let metadata = second.dynamic_metadata.as_ref().expect("dynamic metadata");
    assert_eq!(text_field(metadata, "domain"), Some("grpc"));
    assert_eq!(text_field(metadata, "backend"), Some("b"));
    assert_eq!(numbers_field(metadata, "quotaModeViolations"), [0.0]);
    running.shutdown().await;
}

/// A one-shot HTTP/1.1 GET over a plain TCP stream.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("writes");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("reads");
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("status line");
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

impl Running {
    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        drop(self.client);
        tokio::time::timeout(Duration::from_secs(10), self.done)
            .await
            .expect("drains within 10 s")
            .expect("server task")
            .expect("serves");
    }
}
