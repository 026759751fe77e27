//! The real gRPC server, driven by a tonic client: what Envoy sees on the wire.

use std::time::Duration;

use crate::support::spawn_server;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratekeeper::envoy::grpc::SHOULD_RATE_LIMIT;
use ratekeeper::limiter::LimiterOptions;
use ratekeeper::limits::Limits;
use ratekeeper::server::{ServeError, Server, ServerOptions};
use ratekeeper::store::memory::EngineConfig;
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

/// The finding: `hits_addend` 2^64 - 1 against a 5/hour limit with 3 used was answered OK
/// and left the counter at 2 (the sum wrapped). Now, on every algorithm, over gRPC and
/// `/json` alike: a cost no limit can admit is OVER_LIMIT and consumes nothing, and one
/// above 2^32 - 1 is INVALID_ARGUMENT naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_hits_addend_never_passes_nor_refunds_a_limit() {
    let limits = "
domain: huge
descriptors:
  - {key: fixed_window, rate_limit: {unit: day, requests_per_unit: 5}}
  - {key: sliding_window, rate_limit: {unit: day, requests_per_unit: 5, algorithm: sliding_window}}
  - {key: token_bucket, rate_limit: {unit: day, requests_per_unit: 5, algorithm: token_bucket}}
  - {key: gcra, rate_limit: {unit: day, requests_per_unit: 5, algorithm: gcra, burst: 5}}
";
    let running = start_with(limits, LimiterOptions::default()).await;
    let mut client = running.client.clone();
    let mut ask = async |key: &str, hits: u64| {
        let mut request = request_of("huge", &[(key, "v")]);
        request.descriptors[0].hits_addend =
            Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
        client.should_rate_limit(request).await
    };
    for key in ["fixed_window", "sliding_window", "token_bucket", "gcra"] {
        let used = ask(key, 3).await.expect("answered").into_inner();
        assert_eq!(used.statuses[0].limit_remaining, 2, "{key}");
        for hits in [6, u64::from(u32::MAX)] {
            let answer = ask(key, hits).await.expect("answered").into_inner();
            assert_eq!(answer.overall_code, Code::OverLimit as i32, "{key} {hits}");
        }
        for hits in [1 << 32, (1 << 53) + 1, 1 << 63, u64::MAX] {
            let status = ask(key, hits).await.expect_err("refused");
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{key} {hits}");
            assert_eq!(
                status.message(),
                format!("descriptors[0].hits_addend: {hits} given, at most 4294967295 allowed")
            );
        }
        let last = ask(key, 2).await.expect("answered").into_inner();
        assert_eq!(last.overall_code, Code::Ok as i32, "{key}: the 2 left pass");
        let over = ask(key, 1).await.expect("answered").into_inner();
        assert_eq!(
            over.overall_code,
            Code::OverLimit as i32,
            "{key}: and no more"
        );
    }
    // The same over `/json`.
    let json = |hits: u64| {
        format!(
            r#"{{"domain": "huge", "descriptors": [{{"hits_addend": {hits}, "entries": [{{"key": "fixed_window", "value": "json"}}]}}]}}"#
        )
    };
    let http = running.http;
    let post =
        |body: String| crate::support::http_post(http, "/json", &[], &body).expect("answered");
    assert_eq!(post(json(3)).status, 200);
    assert_eq!(post(json(u64::MAX)).status, 400);
    assert!(
        post(json(u64::MAX))
            .body
            .contains("descriptors[0].hits_addend")
    );
    assert_eq!(post(json(u64::from(u32::MAX))).status, 429);
    assert_eq!(post(json(2)).status, 200, "the 2 left pass");
    assert_eq!(post(json(1)).status, 429);
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
    // The passed descriptors' `metadata`, under `metadata` as the reference puts it.
    use envoy_types::pb::google::protobuf::value::Kind;
    let Some(Kind::StructValue(passed)) = metadata
        .fields
        .get("metadata")
        .and_then(|value| value.kind.as_ref())
    else {
        panic!("no metadata struct in {metadata:?}");
    };
    assert_eq!(text_field(passed, "backend"), Some("b"));
    assert_eq!(text_field(metadata, "backend"), None);
    // gpt-a is reported over while the request passes.
    assert_eq!(second.statuses[0].code, over);
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

/// What a raw HTTP/2 call got back: HTTP status, `grpc-status`, `grpc-message` (from the
/// trailers, or from the headers of a trailers-only answer) and the body's bytes.
struct RawAnswer {
    http: u16,
    grpc_status: Option<String>,
    grpc_message: String,
    body: Vec<u8>,
}

/// One call with a hand-made body and headers: what a client tonic would never send.
async fn raw_call(
    grpc: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> RawAnswer {
    let tcp = tokio::net::TcpStream::connect(grpc)
        .await
        .expect("connects");
    let (mut client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut request = http::Request::post(format!("http://{grpc}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let (response, mut send) = client
        .send_request(request.body(()).expect("a request"), false)
        .expect("sends");
    send.send_data(bytes::Bytes::from(body), true)
        .expect("sends the body");
    let response = response.await.expect("an answer");
    let http = response.status().as_u16();
    let header = |map: &http::HeaderMap, name: &str| {
        map.get(name)
            .map(|value| value.to_str().expect("ascii").to_owned())
    };
    let mut grpc_status = header(response.headers(), "grpc-status");
    let mut grpc_message = header(response.headers(), "grpc-message").unwrap_or_default();
    let mut received = response.into_body();
    let mut body = Vec::new();
    while let Some(chunk) = received.data().await {
        body.extend_from_slice(&chunk.expect("a data frame"));
    }
    if let Some(trailers) = received.trailers().await.expect("trailers") {
        grpc_status = header(&trailers, "grpc-status").or(grpc_status);
        grpc_message = header(&trailers, "grpc-message").unwrap_or(grpc_message);
    }
    RawAnswer {
        http,
        grpc_status,
        grpc_message: percent_decoded(&grpc_message),
        body,
    }
}

/// `grpc-message` is percent-encoded on the wire.
fn percent_decoded(text: &str) -> String {
    let mut bytes = Vec::new();
    let mut rest = text.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        match (first, tail) {
            (b'%', [high, low, after @ ..]) => {
                let hex = std::str::from_utf8(&[*high, *low])
                    .expect("ascii")
                    .to_owned();
                bytes.push(u8::from_str_radix(&hex, 16).expect("a percent escape"));
                rest = after;
            }
            _ => {
                bytes.push(first);
                rest = tail;
            }
        }
    }
    String::from_utf8(bytes).expect("utf-8")
}

/// `[flag][u32 big-endian length][message]`.
fn grpc_frame(flag: u8, message: &[u8]) -> Vec<u8> {
    let mut frame = vec![flag];
    frame.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    frame.extend_from_slice(message);
    frame
}

#[tokio::test]
async fn malformed_calls_get_the_grpc_status_tonic_would_give_and_the_server_keeps_serving() {
    use prost::Message;
    let mut running = start(false).await;
    let message = request("grpc", &["raw"]).encode_to_vec();

    // A well-formed call by hand: one message in, one out, grpc-status 0 in the trailers.
    let ok = raw_call(
        running.grpc,
        SHOULD_RATE_LIMIT,
        &[],
        grpc_frame(0, &message),
    )
    .await;
    assert_eq!((ok.http, ok.grpc_status.as_deref()), (200, Some("0")));
    let decoded =
        envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse::decode(&ok.body[5..])
            .expect("a RateLimitResponse");
    assert_eq!(decoded.overall_code, Code::Ok as i32);
    assert_eq!(decoded.statuses[0].limit_remaining, 4);

    // (what, body, extra headers, grpc-status, a part of grpc-message; `None`: the message
    // is prost's or tonic's own wording, not checked)
    type Case<'a> = (
        &'a str,
        Vec<u8>,
        &'a [(&'a str, &'a str)],
        &'a str,
        Option<&'a str>,
    );
    let cases: Vec<Case> = vec![
        (
            "no message",
            Vec::new(),
            &[],
            "13",
            Some("Missing request message."),
        ),
        (
            "a cut-off header",
            vec![0, 0, 0],
            &[],
            "13",
            Some("Unexpected EOF decoding stream."),
        ),
        (
            "a cut-off message",
            grpc_frame(0, &message)[..8].to_vec(),
            &[],
            "13",
            Some("Unexpected EOF decoding stream."),
        ),
        (
            "a compressed message without grpc-encoding",
            grpc_frame(1, &message),
            &[],
            "13",
            Some("compressed-flag but no grpc-encoding"),
        ),
        (
            "an invalid compression flag",
            grpc_frame(7, &message),
            &[],
            "13",
            Some("invalid compression flag: 7"),
        ),
        (
            "a declared length over 1 MiB",
            [0, 0, 0x20, 0, 0].to_vec(),
            &[],
            "11",
            Some("the limit is: 1048576 bytes"),
        ),
        (
            "two messages",
            [grpc_frame(0, &message), grpc_frame(0, &message)].concat(),
            &[],
            "3",
            Some("takes one message"),
        ),
        (
            "bytes that are not protobuf",
            grpc_frame(0, &[0xff; 9]),
            &[],
            "13",
            None,
        ),
        (
            "gzip, which this server does not accept",
            grpc_frame(1, &message),
            &[("grpc-encoding", "gzip")],
            "12",
            None,
        ),
    ];
    for (what, body, headers, code, text) in cases {
        let answer = raw_call(running.grpc, SHOULD_RATE_LIMIT, headers, body).await;
        assert_eq!(answer.http, 200, "{what}");
        assert_eq!(
            answer.grpc_status.as_deref(),
            Some(code),
            "{what}: {}",
            answer.grpc_message
        );
        if let Some(text) = text {
            assert!(
                answer.grpc_message.contains(text),
                "{what}: {:?} should say {text:?}",
                answer.grpc_message
            );
        }
    }

    // Other methods and services are tonic's: unknown ones are UNIMPLEMENTED.
    let unknown = raw_call(
        running.grpc,
        "/envoy.service.ratelimit.v3.RateLimitService/Nope",
        &[],
        grpc_frame(0, &message),
    )
    .await;
    assert_eq!(unknown.grpc_status.as_deref(), Some("12"));

    // Still serving, and none of the refused calls consumed anything: 5 - 2 = 3 left.
    let fine = running
        .client
        .should_rate_limit(request("grpc", &["raw"]))
        .await
        .expect("serves after bad input")
        .into_inner();
    assert_eq!(fine.statuses[0].limit_remaining, 3);
    running.shutdown().await;
}

#[tokio::test]
async fn a_waiting_call_is_cancelled_when_its_grpc_timeout_expires() {
    use prost::Message;
    // One token, then one every 3 s; a second call waits for it (max_wait 5s).
    let limits = "
domain: grpc
descriptors:
  - key: user
    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 20, burst: 1, max_wait: 5s}
";
    let running = start_with(limits, LimiterOptions::default()).await;
    let message = grpc_frame(0, &request("grpc", &["paced"]).encode_to_vec());
    let first = raw_call(running.grpc, SHOULD_RATE_LIMIT, &[], message.clone()).await;
    assert_eq!(first.grpc_status.as_deref(), Some("0"));
    let started = std::time::Instant::now();
    let second = raw_call(
        running.grpc,
        SHOULD_RATE_LIMIT,
        &[("grpc-timeout", "200m")],
        message,
    )
    .await;
    let waited = started.elapsed();
    assert_eq!(second.grpc_status.as_deref(), Some("1"), "CANCELLED");
    assert_eq!(second.grpc_message, "Timeout expired");
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
        "answered after {waited:?}, not at the client's 200 ms deadline"
    );
    running.shutdown().await;
}

const CHARGED_LIMITS: &str = "
domain: charged
descriptors:
  - {key: fixed_window, rate_limit: {unit: day, requests_per_unit: 5}}
  - {key: sliding_window, rate_limit: {unit: day, requests_per_unit: 5, algorithm: sliding_window}}
  - {key: token_bucket, rate_limit: {unit: day, requests_per_unit: 5, algorithm: token_bucket}}
  - {key: gcra, rate_limit: {unit: day, requests_per_unit: 5, algorithm: gcra, burst: 5}}
";

const ALGORITHMS: [&str; 4] = ["fixed_window", "sliding_window", "token_bucket", "gcra"];

/// One descriptor `key = value` of `charged` costing `hits`, given back when `refund`
/// (Envoy 1.38's `is_negative_hits`); answers the overall code and what remains.
async fn charged_call(
    client: &mut RateLimitServiceClient<Channel>,
    key: &str,
    value: &str,
    hits: u64,
    refund: bool,
) -> (Code, u32) {
    let mut request = request_of("charged", &[(key, value)]);
    request.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
    request.descriptors[0].is_negative_hits = refund;
    let answer = client
        .should_rate_limit(request)
        .await
        .unwrap_or_else(|status| panic!("{key} {hits} refund={refund}: {status:?}"))
        .into_inner();
    let status = &answer.statuses[0];
    assert_eq!(
        answer.overall_code, status.code,
        "{key}: one descriptor, its code is the overall one"
    );
    let code = Code::try_from(answer.overall_code).expect("a known code");
    (code, status.limit_remaining)
}

/// Envoy 1.38's refunds (`is_negative_hits`: the descriptor's `hits_addend` is given back
/// instead of taken), over gRPC on every algorithm and every store: one node in memory, a
/// 3-node cluster (each call through the next node, so refunds are forwarded to the
/// owner) and Redis. A refund is answered OK with what remains after it; it never lifts a
/// limit above its capacity, and a refund larger than any limit is refused like such a
/// hit. Before, every refund was INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_gives_hits_back_on_every_algorithm_and_store() {
    use crate::support::{Ratekeeper, RedisServer, TempDir, grpc_clients, start_cluster};
    let dir = TempDir::new("grpc-refunds");
    crate::support::write_config(dir.path(), "charged.yaml", CHARGED_LIMITS);
    let redis_dir = TempDir::new("grpc-charged-redis");
    let redis = RedisServer::start(redis_dir.path(), &[]);
    let url = redis.url();
    let setups: Vec<(&str, Vec<Ratekeeper>)> = vec![
        ("memory", vec![Ratekeeper::start(dir.path(), &[])]),
        (
            "cluster",
            start_cluster(dir.path(), 3, &["--peer-timeout", "2s"]),
        ),
        (
            "redis",
            vec![Ratekeeper::start(dir.path(), &["--store", url.as_str()])],
        ),
    ];
    for (store, nodes) in &setups {
        let mut clients = grpc_clients(nodes).await;
        let mut turn = 0;
        let mut call = async |key: &str, hits: u64, refund: bool| {
            turn += 1;
            let client = &mut clients[turn % nodes.len()];
            charged_call(client, key, store, hits, refund).await
        };
        for key in ALGORITHMS {
            assert_eq!(call(key, 5, false).await, (Code::Ok, 0), "{store} {key}");
            assert_eq!(
                call(key, 1, false).await.0,
                Code::OverLimit,
                "{store} {key}"
            );
            assert_eq!(
                call(key, 3, true).await,
                (Code::Ok, 3),
                "{store} {key}: 3 given back"
            );
            assert_eq!(
                call(key, u64::from(u32::MAX), true).await,
                (Code::Ok, 5),
                "{store} {key}: never above the limit"
            );
            assert_eq!(call(key, 5, false).await, (Code::Ok, 0), "{store} {key}");
            assert_eq!(
                call(key, 1, false).await.0,
                Code::OverLimit,
                "{store} {key}: and no more"
            );
        }
        // A refund beyond what any limit counts is refused like such a hit.
        let mut request = request_of("charged", &[("gcra", "huge")]);
        request.descriptors[0].hits_addend =
            Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 << 32 });
        request.descriptors[0].is_negative_hits = true;
        let status = clients[0]
            .should_rate_limit(request)
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{store}");
        assert_eq!(
            status.message(),
            "descriptors[0].hits_addend: 4294967296 given, at most 4294967295 allowed"
        );
    }
}

/// `--count-rejected-hits` (the reference service's default): a rejected request is
/// counted, taking what was left, on every algorithm and store; by default the hits left
/// still pass after a rejection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_rejected_hits_takes_what_was_left_on_every_algorithm_and_store() {
    use crate::support::{Ratekeeper, RedisServer, TempDir, grpc_clients, start_cluster};
    let dir = TempDir::new("grpc-counted");
    crate::support::write_config(dir.path(), "charged.yaml", CHARGED_LIMITS);
    let redis_dir = TempDir::new("grpc-charged-redis");
    let redis = RedisServer::start(redis_dir.path(), &[]);
    let url = redis.url();
    let counting = ["--count-rejected-hits"];
    let setups: Vec<(&str, bool, Vec<Ratekeeper>)> = vec![
        ("memory", false, vec![Ratekeeper::start(dir.path(), &[])]),
        (
            "memory",
            true,
            vec![Ratekeeper::start(dir.path(), &counting)],
        ),
        (
            "cluster",
            true,
            start_cluster(
                dir.path(),
                3,
                &["--peer-timeout", "2s", "--count-rejected-hits"],
            ),
        ),
        (
            "redis",
            true,
            vec![Ratekeeper::start_with_env(
                dir.path(),
                &["--store", url.as_str()],
                &[("RATEKEEPER_COUNT_REJECTED_HITS", "true")],
            )],
        ),
    ];
    for (store, counted, nodes) in &setups {
        let clients = grpc_clients(nodes).await;
        let value = format!("{store}-{counted}");
        for (turn, key) in ALGORITHMS.into_iter().enumerate() {
            let client = |n: usize| clients[(turn + n) % nodes.len()].clone();
            let used = charged_call(&mut client(0), key, &value, 3, false).await;
            assert_eq!(used, (Code::Ok, 2), "{store} {key}");
            let rejected = charged_call(&mut client(1), key, &value, 4, false).await;
            assert_eq!(rejected.0, Code::OverLimit, "{store} {key}");
            let last = charged_call(&mut client(2), key, &value, 2, false).await;
            let expected = if *counted { Code::OverLimit } else { Code::Ok };
            assert_eq!(
                last.0, expected,
                "{store} {key}: the 2 left, taken by the rejection when counted"
            );
        }
    }
}
