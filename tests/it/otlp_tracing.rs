//! OpenTelemetry tracing of `ShouldRateLimit` (`--otlp-endpoint`): the real binary exports
//! one span per call to an OTLP collector this test runs, as a child of the W3C trace
//! context the caller sent (`traceparent`, as Envoy forwards it). The spans leave in
//! batches (the SDK's default: every 5 s), so the test waits for them with a bound.

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
