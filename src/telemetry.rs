//! Logs, and optional OpenTelemetry tracing of `ShouldRateLimit` (`--otlp-endpoint`, off by
//! default): one span per call, a child of the caller's W3C trace context (Envoy's
//! `traceparent` header, forwarded as gRPC metadata), exported over OTLP/gRPC in batches.
//!
//! Invariants: with tracing off, the request path creates no span (one relaxed atomic load
//! per call); export never blocks a request (a bounded batch queue drops spans when full).

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
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
    /// The collector's OTLP/gRPC endpoint, e.g. `http://otel-collector:4317`.
    pub endpoint: String,
    /// `service.name` of the spans.
    pub service_name: String,
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
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(otlp.endpoint.clone())
        .build()
        .map_err(|error| format!("--otlp-endpoint {}: {error}", otlp.endpoint))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(otlp.service_name.clone())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
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
