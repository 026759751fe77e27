//! Logs, and optional OpenTelemetry tracing of `ShouldRateLimit` (`--otlp-endpoint`, off by
//! default): one span per call, a child of the caller's W3C trace context (Envoy's
//! `traceparent` header, forwarded as gRPC metadata), exported in batches over OTLP/gRPC
//! or OTLP/HTTP (protobuf); calls without a caller's context are sampled at
//! `--otlp-sampling-rate`, the others as their caller decided (parent-based).
//!
//! Invariants: with tracing off, the request path creates no span (one relaxed atomic load
//! per call); export never blocks a request (a bounded batch queue drops spans when full).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

static TRACING: AtomicBool = AtomicBool::new(false);

/// Whether `ShouldRateLimit` calls are traced.
pub fn tracing_enabled() -> bool {
    TRACING.load(Ordering::Relaxed)
}

/// Where spans go.
#[derive(Clone, Debug)]
pub struct OtlpOptions {
    /// The collector's URL for spans: OTLP/gRPC's endpoint (`http://otel-collector:4317`),
    /// or OTLP/HTTP's full URL (`http://otel-collector:4318/v1/traces`).
    pub endpoint: String,
    /// OTLP/HTTP with protobuf instead of OTLP/gRPC.
    pub http: bool,
    /// The share of calls without a caller's trace context that are traced (0 to 1).
    pub sampling_rate: f64,
    /// `service.name` of the spans.
    pub service_name: String,
    /// `service.namespace`, when given.
    pub service_namespace: Option<String>,
    /// `service.instance.id` (a random UUID when `None`).
    pub service_instance_id: Option<String>,
}

/// OTLP/HTTP's URL for spans under `base` (`OTEL_EXPORTER_OTLP_ENDPOINT`'s meaning):
/// `v1/traces` added to its path.
pub fn http_traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// Flushes the spans still queued when dropped (at exit).
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the logger (`filter` in `RUST_LOG` syntax, text or JSON lines on stderr) and,
/// with `otlp`, the span exporter. Must run inside a tokio runtime when `otlp` is given.
pub fn init(filter: &str, json: bool, otlp: Option<&OtlpOptions>) -> Result<Telemetry, String> {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR");
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour(std::io::stderr().is_terminal(), no_color.as_deref()));
    let logs = if json {
        logs.json().with_filter(EnvFilter::new(filter)).boxed()
    } else {
        logs.with_filter(EnvFilter::new(filter)).boxed()
    };
    let Some(otlp) = otlp else {
        tracing_subscriber::registry().with(logs).init();
        return Ok(Telemetry { provider: None });
    };
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter(otlp)?)
        .with_resource(resource(otlp))
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            otlp.sampling_rate,
        ))))
        .build();
    let tracer = provider.tracer("ratekeeper");
    // Only the request spans go to the collector, whatever the log filter says.
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::filter_fn(|metadata| {
            metadata.is_span() && metadata.name() == SPAN
        }));
    tracing_subscriber::registry().with(logs).with(spans).init();
    TRACING.store(true, Ordering::Relaxed);
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// The span exporter `otlp` asks for: OTLP/gRPC (tonic) or OTLP/HTTP with protobuf (hyper).
fn exporter(otlp: &OtlpOptions) -> Result<opentelemetry_otlp::SpanExporter, String> {
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let built = if otlp.http {
        use opentelemetry_otlp::WithHttpConfig;
        let client = OnRuntime::new().map_err(|error| format!("--otlp-protocol http: {error}"))?;
        builder
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(otlp.endpoint.clone())
            .build()
    } else {
        builder
            .with_tonic()
            .with_endpoint(otlp.endpoint.clone())
            .build()
    };
    built.map_err(|error| format!("--otlp-endpoint {}: {error}", otlp.endpoint))
}

/// How long one OTLP/HTTP export may take (OpenTelemetry's default).
const HTTP_EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// OTLP/HTTP's client: hyper, its requests run on the server's tokio runtime. The SDK's
/// batch processor exports from a thread of its own, outside any runtime, where hyper's
/// connections and timers could not run; it only awaits the spawned task's answer.
#[derive(Debug)]
struct OnRuntime {
    client: Arc<opentelemetry_http::hyper::HyperClient>,
    runtime: tokio::runtime::Handle,
}

impl OnRuntime {
    fn new() -> Result<OnRuntime, tokio::runtime::TryCurrentError> {
        Ok(OnRuntime {
            client: Arc::new(
                opentelemetry_http::hyper::HyperClient::with_default_connector(
                    HTTP_EXPORT_TIMEOUT,
                    None,
                ),
            ),
            runtime: tokio::runtime::Handle::try_current()?,
        })
    }
}

/// What [`opentelemetry_http::HttpClient::send_bytes`] answers.
type Sent = Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError>;

impl opentelemetry_http::HttpClient for OnRuntime {
    // The trait is declared with `async_trait`; this is its expansion, written out.
    fn send_bytes<'a, 'b>(
        &'a self,
        request: http::Request<bytes::Bytes>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Sent> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        let client = Arc::clone(&self.client);
        let task = self
            .runtime
            .spawn(async move { client.send_bytes(request).await });
        Box::pin(async move {
            match task.await {
                Ok(sent) => sent,
                Err(error) => Err(Box::new(error) as opentelemetry_http::HttpError),
            }
        })
    }
}

/// The spans' resource: `service.name`, `service.namespace` (when given) and
/// `service.instance.id` (a random UUID unless given, as the reference service does).
fn resource(otlp: &OtlpOptions) -> opentelemetry_sdk::Resource {
    use opentelemetry::KeyValue;
    let instance = otlp.service_instance_id.clone().unwrap_or_else(random_uuid);
    let mut attributes = vec![KeyValue::new("service.instance.id", instance)];
    if let Some(namespace) = &otlp.service_namespace {
        attributes.push(KeyValue::new("service.namespace", namespace.clone()));
    }
    opentelemetry_sdk::Resource::builder()
        .with_service_name(otlp.service_name.clone())
        .with_attributes(attributes)
        .build()
}

/// A random (version 4) UUID, from the SDK's random trace id generator.
fn random_uuid() -> String {
    use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
    let random = u128::from_be_bytes(RandomIdGenerator::default().new_trace_id().to_bytes());
    // Version 4, variant RFC 9562.
    let uuid = (random & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    let hex = format!("{uuid:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The name of the span of one `ShouldRateLimit` call.
pub const SPAN: &str = "ShouldRateLimit";

/// The span for one call whose gRPC metadata is `metadata`, a child of the trace context it
/// carries (`traceparent`, `tracestate`), if any.
pub fn request_span(metadata: &tonic::metadata::MetadataMap, domain: &str) -> tracing::Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let span = tracing::info_span!(
        "ShouldRateLimit",
        otel.kind = "server",
        rpc.system = "grpc",
        ratelimit.domain = domain,
        ratelimit.code = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&Metadata(metadata));
    let _ = span.set_parent(parent);
    span
}

/// gRPC metadata as a propagation carrier.
struct Metadata<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Whether text logs carry ANSI colour codes: only on a terminal, and not when `NO_COLOR`
/// is set to anything but the empty string (<https://no-color.org>). A file, a pipe or a
/// container runtime's log collector gets plain text.
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::colour;

    #[test]
    fn otlp_http_adds_v1_traces_to_the_base_path() {
        use super::http_traces_url;
        assert_eq!(
            http_traces_url("http://otel:4318"),
            "http://otel:4318/v1/traces"
        );
        assert_eq!(
            http_traces_url("http://otel:4318/"),
            "http://otel:4318/v1/traces"
        );
        assert_eq!(
            http_traces_url("http://gw/otlp"),
            "http://gw/otlp/v1/traces"
        );
    }

    #[test]
    fn a_random_instance_id_is_a_version_4_uuid() {
        let (a, b) = (super::random_uuid(), super::random_uuid());
        assert_ne!(a, b);
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{a}");
        assert_eq!(&a[14..15], "4", "{a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(
            colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR does not count"
        );
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None), "a file or a pipe");
    }
}
