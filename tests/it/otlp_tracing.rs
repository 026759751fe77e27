//! OpenTelemetry tracing of `ShouldRateLimit` (`--otlp-endpoint`): the real binary exports
//! one span per call to an OTLP collector this test runs (OTLP/gRPC, and OTLP/HTTP with
//! protobuf), as a child of the W3C trace context the caller sent (`traceparent`, as Envoy
//! forwards it), with the resource attributes asked for; sampling at rate 0 sends only the
//! calls whose caller sampled its trace; the reference's variables, as Envoy Gateway sets
//! them, trace over OTLP/HTTP unchanged. The spans leave in batches (the SDK's default:
//! every 5 s), so the tests wait for them with a bound.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Ratekeeper, TempDir, eventually_async, write_config};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue;
use opentelemetry_proto::tonic::trace::v1::Span;

const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      unit: day
      requests_per_unit: 1
";

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// An OTLP collector keeping every span it receives, with its service name.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().expect("spans");
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|attribute| attribute.key == "service.name")
                .and_then(|attribute| attribute.value.as_ref())
                .map(|value| format!("{:?}", value.value))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                spans.extend(scope.spans.into_iter().map(|span| (service.clone(), span)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn start_collector() -> (Collector, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the collector");
    let addr = listener.local_addr().expect("an address");
    let collector = Collector::default();
    let service = TraceServiceServer::new(collector.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .expect("the collector serves");
    });
    (collector, addr)
}

fn request() -> tonic::Request<RateLimitRequest> {
    let mut request = tonic::Request::new(RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".to_owned(),
                value: "k".to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    });
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().expect("ascii"));
    request
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_is_a_span_in_the_callers_trace_at_the_collector() {
    let dir = TempDir::new("tracing");
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let (collector, addr) = start_collector().await;
    let endpoint = format!("http://{addr}");
    let node = Ratekeeper::start(
        &config,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-service-name",
            "rk-test",
        ],
    );
    let mut client = RateLimitServiceClient::connect(format!("http://{}", node.grpc_addr()))
        .await
        .expect("connects");
    for _ in 0..2 {
        client.should_rate_limit(request()).await.expect("answers");
    }
    let arrived = eventually_async(Duration::from_secs(20), || {
        let spans = Arc::clone(&collector.spans);
        async move { spans.lock().expect("spans").len() >= 2 }
    })
    .await;
    assert!(arrived, "spans reached the collector: {}", node.stderr());
    let spans = collector.spans.lock().expect("spans").clone();
    let codes: Vec<String> = spans
        .iter()
        .map(|(service, span)| {
            assert_eq!(span.name, "ShouldRateLimit");
            assert!(service.contains("rk-test"), "service.name: {service}");
            assert_eq!(hex(&span.trace_id), TRACE_ID, "the caller's trace");
            assert_eq!(
                hex(&span.parent_span_id),
                PARENT_ID,
                "the caller's span is the parent"
            );
            let attribute = |key: &str| {
                span.attributes
                    .iter()
                    .find(|attribute| attribute.key == key)
                    .and_then(|attribute| attribute.value.as_ref())
                    .map(|value| format!("{:?}", value.value))
                    .unwrap_or_default()
            };
            assert!(attribute("ratelimit.domain").contains("edge"));
            attribute("ratelimit.code")
        })
        .collect();
    assert!(
        codes.iter().any(|code| code.contains("OVER_LIMIT")),
        "{codes:?}"
    );
    assert!(
        codes.iter().any(|code| code.contains("\"OK\"")),
        "{codes:?}"
    );
}

/// An OTLP/HTTP collector (`POST /v1/traces`, protobuf): every request it received, with
/// its path.
#[derive(Clone, Default)]
struct HttpCollector {
    requests: Arc<Mutex<Vec<(String, ExportTraceServiceRequest)>>>,
}

impl HttpCollector {
    /// Every span received: the resource's string attributes (`key=value`) and the span.
    fn spans(&self) -> Vec<(Vec<String>, Span)> {
        let requests = self.requests.lock().expect("requests");
        let mut spans = Vec::new();
        for (_, request) in requests.iter() {
            for resource in &request.resource_spans {
                let attributes: Vec<String> = resource
                    .resource
                    .iter()
                    .flat_map(|resource| &resource.attributes)
                    .filter_map(|attribute| match &attribute.value.as_ref()?.value {
                        Some(StringValue(value)) => Some(format!("{}={value}", attribute.key)),
                        _ => None,
                    })
                    .collect();
                for scope in &resource.scope_spans {
                    spans.extend(
                        scope
                            .spans
                            .iter()
                            .map(|span| (attributes.clone(), span.clone())),
                    );
                }
            }
        }
        spans
    }

    fn paths(&self) -> Vec<String> {
        let requests = self.requests.lock().expect("requests");
        requests.iter().map(|(path, _)| path.clone()).collect()
    }
}

async fn start_http_collector() -> (HttpCollector, SocketAddr) {
    use axum::extract::State;
    use prost::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the collector");
    let addr = listener.local_addr().expect("an address");
    let collector = HttpCollector::default();
    let export = |State(collector): State<HttpCollector>,
                  uri: axum::http::Uri,
                  headers: axum::http::HeaderMap,
                  body: axum::body::Bytes| async move {
        let protobuf = headers
            .get("content-type")
            .is_some_and(|value| value == "application/x-protobuf");
        match ExportTraceServiceRequest::decode(body) {
            Ok(request) if protobuf => {
                let mut requests = collector.requests.lock().expect("requests");
                requests.push((uri.path().to_owned(), request));
                let answer = ExportTraceServiceResponse::default().encode_to_vec();
                (axum::http::StatusCode::OK, answer)
            }
            _ => (axum::http::StatusCode::BAD_REQUEST, Vec::new()),
        }
    };
    let app = axum::Router::new()
        .fallback(axum::routing::post(export))
        .with_state(collector.clone());
    tokio::spawn(async move {
        axum::serve(listener, app)
            .await
            .expect("the collector serves");
    });
    (collector, addr)
}

/// `request()` without a trace context: the sampling rate decides.
fn request_without_context() -> tonic::Request<RateLimitRequest> {
    let mut request = request();
    request.metadata_mut().remove("traceparent");
    request
}

async fn client(node: &Ratekeeper) -> RateLimitServiceClient<tonic::transport::Channel> {
    RateLimitServiceClient::connect(format!("http://{}", node.grpc_addr()))
        .await
        .expect("connects")
}

/// Waits (bounded) until `collector` holds at least `count` spans.
async fn spans_arrive(collector: &HttpCollector, count: usize) -> bool {
    eventually_async(Duration::from_secs(20), || {
        let collector = collector.clone();
        async move { collector.spans().len() >= count }
    })
    .await
}

/// Spans leave every 200 ms instead of the SDK's 5 s, so the tests wait less.
const QUICK_BATCHES: (&str, &str) = ("OTEL_BSP_SCHEDULE_DELAY", "200");

/// An OTLP/HTTP collector and a ratekeeper started with `args` and `env` (quick batches
/// added), where `ENDPOINT` stands for the collector's base URL. Keep the dir as long as
/// the node.
async fn traced_by_http(
    label: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (TempDir, HttpCollector, Ratekeeper) {
    let dir = TempDir::new(label);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let (collector, addr) = start_http_collector().await;
    let endpoint = format!("http://{addr}");
    let at = |text: &str| text.replace("ENDPOINT", &endpoint);
    let args: Vec<String> = args.iter().map(|arg| at(arg)).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, String)> = env.iter().map(|(name, value)| (*name, at(value))).collect();
    let mut env: Vec<(&str, &str)> = env
        .iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect();
    env.push(QUICK_BATCHES);
    let node = Ratekeeper::start_with_env(&config, &args, &env);
    (dir, collector, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_http_collector_with_the_resource_attributes() {
    let (_dir, collector, node) = traced_by_http(
        "tracing-http",
        &[
            "--otlp-protocol",
            "http",
            "--otlp-endpoint",
            "ENDPOINT",
            "--otlp-service-name",
            "rk-http",
            "--otlp-service-namespace",
            "edge-ns",
            "--otlp-service-instance-id",
            "rk-0",
        ],
        &[],
    )
    .await;
    let mut client = client(&node).await;
    for _ in 0..2 {
        client.should_rate_limit(request()).await.expect("answers");
    }
    assert!(
        spans_arrive(&collector, 2).await,
        "spans reached the collector: {}",
        node.stderr()
    );
    assert!(
        collector.paths().iter().all(|path| path == "/v1/traces"),
        "OTLP/HTTP's path added to the base endpoint: {:?}",
        collector.paths()
    );
    for (resource, span) in collector.spans() {
        assert_eq!(span.name, "ShouldRateLimit");
        assert_eq!(hex(&span.trace_id), TRACE_ID, "the caller's trace");
        for expected in [
            "service.name=rk-http",
            "service.namespace=edge-ns",
            "service.instance.id=rk-0",
        ] {
            assert!(
                resource.iter().any(|attribute| attribute == expected),
                "{expected}: {resource:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_rate_zero_traces_only_the_calls_their_caller_sampled() {
    let (_dir, collector, node) = traced_by_http(
        "tracing-sampling",
        &[
            "--otlp-protocol",
            "http",
            "--otlp-endpoint",
            "ENDPOINT",
            "--otlp-sampling-rate",
            "0",
        ],
        &[],
    )
    .await;
    let mut client = client(&node).await;
    for _ in 0..20 {
        client
            .should_rate_limit(request_without_context())
            .await
            .expect("answered while not traced");
    }
    // Then one call whose caller sampled its trace: parent-based, it is traced. Once it
    // arrived, the earlier calls' spans would have too (batches leave in order).
    client.should_rate_limit(request()).await.expect("answers");
    assert!(spans_arrive(&collector, 1).await, "{}", node.stderr());
    let spans = collector.spans();
    assert_eq!(spans.len(), 1, "only the sampled caller's call");
    assert_eq!(hex(&spans[0].1.trace_id), TRACE_ID);
}

/// Envoy Gateway's tracing variables: the reference's default protocol (OTLP/HTTP) to
/// OTEL_EXPORTER_OTLP_ENDPOINT, its service name, namespace and sampling rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_references_tracing_environment_exports_over_otlp_http_unchanged() {
    let (_dir, collector, node) = traced_by_http(
        "tracing-reference",
        &[],
        &[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "ENDPOINT"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SAMPLING_RATE", "1"),
        ],
    )
    .await;
    let mut client = client(&node).await;
    client
        .should_rate_limit(request_without_context())
        .await
        .expect("answers");
    assert!(spans_arrive(&collector, 1).await, "{}", node.stderr());
    assert_eq!(collector.paths()[0], "/v1/traces");
    let (resource, _) = &collector.spans()[0];
    let has = |expected: &str| resource.iter().any(|attribute| attribute == expected);
    let instance = resource
        .iter()
        .find_map(|attribute| attribute.strip_prefix("service.instance.id="))
        .unwrap_or_default();
    assert!(
        has("service.name=envoy-ratelimit")
            && has("service.namespace=envoy-gateway-system")
            && instance.len() == 36,
        "the reference's resource, a random instance id: {resource:?}"
    );
}
