//! Limits from an xDS management server (`--config-source xds`), as the reference service's
//! `CONFIG_TYPE=GRPC_XDS_SOTW` takes them: one state-of-the-world subscription to
//! [`TYPE_URL`] over Envoy's Aggregated Discovery Service
//! (`envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources`).
//!
//! Every `DiscoveryResponse` holds the whole configuration: its resources are converted
//! (`convert`) into the sources the limits compiler takes, compiled and swapped in through
//! [`reload::reload_sources`] (the same path, counters and log lines as a file reload),
//! then ACKed (`version_info` + `response_nonce`). A response that does not compile is
//! NACKed with the config errors in `error_detail` (each naming the resource and the place)
//! and the live limits stay. On reconnect the first request carries the last ACKed version.
//! Over TLS (`tls`) each connection takes the client config live when it opens, so a
//! renewed client certificate or CA is used from the next reconnect on.
//!
//! Invariants:
//! - Only this module knows the discovery protocol and the `RateLimitConfig` proto.
//! - Limits change only by a whole, validated response (all or nothing), never by a part.
//! - Bounded: resources per response and bytes per resource (`convert`), bytes per
//!   response ([`MAX_RESPONSE_BYTES`]), an `error_detail` of at most [`MAX_ERROR_BYTES`],
//!   a request queue of [`REQUEST_QUEUE`], and reconnects spaced by a capped exponential
//!   backoff with jitter that restarts once a stream delivered a response.
//! - One log line per state change: connected, stream lost (then quiet while reconnects
//!   keep failing, but for each new reason, up to `MAX_LOGGED`), each applied or rejected
//!   configuration; a TLS failure says what to check, naming the flag and the file.

mod convert;
mod metrics;
mod tls;

pub use self::convert::{MAX_RESOURCE_BYTES, MAX_RESOURCES, source, sources};
pub use self::tls::{FLAGS as TLS_FLAGS, XdsTls, XdsTlsOptions};

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use envoy_types::pb::google::rpc::Status;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::limits::{Limits, LoadOptions};
use crate::reload::{self, ReloadStats};

/// The reference service's `RateLimitConfig` messages (`proto/ratelimit/...`).
pub mod proto {
    tonic::include_proto!("ratelimit.config.ratelimit.v3");
}

/// The resource type ratekeeper subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The largest `DiscoveryResponse` accepted, in bytes.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// The longest `error_detail` message sent in a NACK, in bytes.
pub const MAX_ERROR_BYTES: usize = 4096;

/// Requests (the first one, ACKs, NACKs) waiting to be sent on a stream.
const REQUEST_QUEUE: usize = 4;

/// How long connecting to the management server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 pings that find a dead server on an idle stream.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// Distinct reasons logged (at warn) while the server stays unreachable; the rest, and
/// each reason again, at debug.
const MAX_LOGGED: usize = 4;

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// Where and how to subscribe.
#[derive(Clone, Debug)]
pub struct XdsOptions {
    /// The management server, `http://host:port` or `https://host:port` (a bare
    /// `host:port` means `http://`, or `https://` with `tls`).
    pub server: String,
    /// TLS to the server (an `https://` server without it: TLS with the defaults, the
    /// system's roots and no client certificate).
    pub tls: Option<XdsTlsOptions>,
    /// `node.id` in every request (the reference's `CONFIG_GRPC_XDS_NODE_ID`).
    pub node_id: String,
    /// `node.metadata`, string fields (`CONFIG_GRPC_XDS_NODE_METADATA`).
    pub node_metadata: Vec<(String, String)>,
    /// gRPC metadata sent with the stream (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// The first reconnect delay; each failed attempt doubles it, up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How the resources become limits (`--merge-domain-config`, the store's capabilities).
    pub load: LoadOptions,
}

impl XdsOptions {
    /// Options for `server` with the reference's node id (`default`) and 1 s..60 s backoff.
    pub fn new(server: impl Into<String>) -> XdsOptions {
        XdsOptions {
            server: server.into(),
            tls: None,
            node_id: "default".to_owned(),
            node_metadata: Vec::new(),
            headers: Vec::new(),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            load: LoadOptions::default(),
        }
    }

    /// The server's URL, with its scheme.
    pub fn url(&self) -> String {
        match (self.server.contains("://"), self.tls.is_some()) {
            (true, _) => self.server.clone(),
            (false, false) => format!("http://{}", self.server),
            (false, true) => format!("https://{}", self.server),
        }
    }

    /// How to reach the server over TLS, when it is to be reached so.
    pub fn tls_options(&self) -> Option<XdsTlsOptions> {
        let https = self
            .server
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
        match &self.tls {
            Some(tls) => Some(tls.clone()),
            None => https.then(XdsTlsOptions::default),
        }
    }
}

/// The client's figures, scraped by metrics; written only by the client task.
#[derive(Debug, Default)]
pub struct XdsStats {
    /// A stream is open (the server accepted it).
    pub connected: AtomicBool,
    /// Streams opened.
    pub connects: AtomicU64,
    /// Connection or stream failures, and streams the server ended.
    pub disconnects: AtomicU64,
    pub acks: AtomicU64,
    pub nacks: AtomicU64,
}

impl XdsStats {
    /// Registers the `xds_*` metrics (read at scrape time) in `registry`.
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        registry.register_collector(Box::new(metrics::XdsCollector {
            stats: Arc::clone(self),
        }));
    }
}

/// The subscription: an actor owning the connection state; [`XdsClient::spawn`] runs it.
#[derive(Debug)]
pub struct XdsClient {
    options: XdsOptions,
    live: Arc<ArcSwap<Limits>>,
    reload: Arc<ReloadStats>,
    stats: Arc<XdsStats>,
    /// The last ACKed `version_info`, sent again when reconnecting.
    acked: String,
    /// TLS to the server (its files loaded by the server at start).
    tls: Option<XdsTls>,
}

/// How a stream ended.
enum Ended {
    /// The server closed it (or it failed) after it had been open.
    Lost(String),
    /// It never opened.
    Unreachable(String),
}

impl XdsClient {
    pub fn new(
        options: XdsOptions,
        live: Arc<ArcSwap<Limits>>,
        reload: Arc<ReloadStats>,
        stats: Arc<XdsStats>,
    ) -> XdsClient {
        XdsClient {
            options,
            live,
            reload,
            stats,
            acked: String::new(),
            tls: None,
        }
    }

    /// Connects over TLS with `tls` (see [`XdsTls::load`]).
    pub fn with_tls(mut self, tls: Option<XdsTls>) -> XdsClient {
        self.tls = tls;
        self
    }

    /// Starts the subscription on the current runtime; it runs until the handle is aborted.
    pub fn spawn(self) -> JoinHandle<()> {
        tokio::spawn(self.run())
    }

    async fn run(mut self) {
        let url = self.options.url();
        let tls = self.tls.as_ref().map(XdsTls::name);
        tracing::info!(server = %url, node = %self.options.node_id, tls_name = ?tls, "subscribing to limits over xds");
        let mut attempt: u32 = 0;
        // The reasons logged while the server stays unreachable (each is logged once).
        let mut logged: Vec<String> = Vec::new();
        loop {
            let (ended, delivered) = self.session(&url).await;
            self.stats.connected.store(false, Ordering::Relaxed);
            self.stats.disconnects.fetch_add(1, Ordering::Relaxed);
            if delivered {
                attempt = 0;
            }
            let delay = backoff(
                attempt,
                self.options.backoff_initial,
                self.options.backoff_max,
                jitter_seed(),
            );
            attempt = attempt.saturating_add(1);
            match ended {
                Ended::Lost(why) => {
                    logged.clear();
                    tracing::warn!(server = %url, reason = %why, retry_in = ?delay, "xds stream lost, reconnecting");
                }
                Ended::Unreachable(why) if !logged.contains(&why) && logged.len() < MAX_LOGGED => {
                    tracing::warn!(server = %url, reason = %why, retry_in = ?delay, "cannot reach the xds server, retrying");
                    logged.push(why);
                }
                Ended::Unreachable(why) => {
                    tracing::debug!(server = %url, reason = %why, retry_in = ?delay, "xds server still unreachable");
                }
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// One stream, from connecting to its end; also whether it delivered a response.
    async fn session(&mut self, url: &str) -> (Ended, bool) {
        let channel = match self.connect(url).await {
            Ok(channel) => channel,
            Err(why) => return (Ended::Unreachable(why), false),
        };
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        let (requests, queue) = mpsc::channel(REQUEST_QUEUE);
        let first = self.request(self.acked.clone(), String::new(), None);
        // The receiver is alive (it is right here), so this cannot fail.
        let _ = requests.try_send(first);
        let outgoing = futures_util::stream::unfold(queue, |mut queue| async move {
            queue.recv().await.map(|request| (request, queue))
        });
        let mut call = tonic::Request::new(outgoing);
        for (name, value) in &self.options.headers {
            // Checked when the flags were parsed; an invalid one is skipped, not fatal.
            if let (Ok(name), Ok(value)) = (
                MetadataKey::from_bytes(name.as_bytes()),
                MetadataValue::try_from(value.as_str()),
            ) {
                call.metadata_mut().insert(name, value);
            }
        }
        let mut responses = match client.stream_aggregated_resources(call).await {
            Ok(responses) => responses.into_inner(),
            Err(status) => return (Ended::Unreachable(self.why_status(&status)), false),
        };
        self.stats.connected.store(true, Ordering::Relaxed);
        self.stats.connects.fetch_add(1, Ordering::Relaxed);
        tracing::info!(server = %url, "xds stream open");
        let mut delivered = false;
        loop {
            let response = match responses.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return (Ended::Lost("the server ended the stream".into()), delivered),
                Err(status) => return (Ended::Lost(self.why_status(&status)), delivered),
            };
            delivered = true;
            if response.type_url != TYPE_URL {
                tracing::debug!(type_url = %response.type_url, "ignoring an xds response of another type");
                continue;
            }
            let reply = self.apply(url, response).await;
            if requests.send(reply).await.is_err() {
                return (Ended::Lost("the request stream closed".into()), delivered);
            }
        }
    }

    /// A connection to the server: plaintext, or TLS with the client config live now.
    async fn connect(&self, url: &str) -> Result<Channel, String> {
        let endpoint = |url: String| {
            Endpoint::from_shared(url)
                .map(|endpoint| {
                    endpoint
                        .connect_timeout(CONNECT_TIMEOUT)
                        .http2_keep_alive_interval(KEEPALIVE)
                        .keep_alive_timeout(KEEPALIVE)
                })
                .map_err(|error| error.to_string())
        };
        let connected = match &self.tls {
            // Never plaintext to a server named https:// (the server always gives the
            // client its TLS; a library user might not).
            None if self.options.tls_options().is_some() => {
                return Err("an https:// server without a tls config (XdsClient::with_tls)".into());
            }
            None => endpoint(url.to_owned())?.connect().await,
            Some(tls) => {
                // The connector does TLS; the endpoint's URI says http so that tonic (whose
                // own TLS the tests' build turns on) never wraps it a second time, and the
                // origin gives requests their https scheme.
                let authority = url.split_once("://").map_or(url, |(_, rest)| rest);
                let origin = format!("https://{authority}")
                    .parse::<Uri>()
                    .map_err(|error| error.to_string())?;
                endpoint(format!("http://{authority}"))?
                    .origin(origin)
                    .connect_with_connector(tls.dial())
                    .await
            }
        };
        connected.map_err(|error| self.why(&error, source_chain(&error)))
    }

    /// `text` (an error's), preceded by what to check when the error comes from TLS.
    fn why(&self, error: &(dyn std::error::Error + 'static), text: String) -> String {
        match self.tls.as_ref().and_then(|tls| tls.explain(error)) {
            Some(explained) => format!("{explained} ({text})"),
            None => text,
        }
    }

    fn why_status(&self, status: &tonic::Status) -> String {
        self.why(status, status_text(status))
    }

    /// Applies one response; the ACK or NACK to send.
    async fn apply(&mut self, url: &str, response: DiscoveryResponse) -> DiscoveryRequest {
        let DiscoveryResponse {
            version_info,
            resources,
            nonce,
            ..
        } = response;
        let outcome = match sources(&resources) {
            Err(problem) => {
                self.reload.checks.fetch_add(1, Ordering::Relaxed);
                self.reload.failures.fetch_add(1, Ordering::Relaxed);
                Err(problem)
            }
            Ok(sources) => {
                let live = Arc::clone(&self.live);
                let stats = Arc::clone(&self.reload);
                let load = self.options.load;
                let origin = format!("xds {url} version {version_info:?}");
                // Compiling is CPU work on up to a few MiB: off the runtime's workers.
                let compiled = tokio::task::spawn_blocking(move || {
                    reload::reload_sources(&origin, &sources, load, &live, &stats)
                        .map_err(|errors| errors.to_string())
                })
                .await;
                compiled.unwrap_or_else(|error| Err(format!("the compile did not finish: {error}")))
            }
        };
        match outcome {
            Ok(_) => {
                self.stats.acks.fetch_add(1, Ordering::Relaxed);
                tracing::info!(version = %version_info, resources = resources.len(), "xds limits acked");
                self.acked = version_info.clone();
                self.request(version_info, nonce, None)
            }
            Err(problem) => {
                self.stats.nacks.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(version = %version_info, "xds limits rejected (nack), keeping the previous ones: {problem}");
                let detail = Status {
                    code: INVALID_ARGUMENT,
                    message: truncate(problem, MAX_ERROR_BYTES),
                    details: Vec::new(),
                };
                self.request(self.acked.clone(), nonce, Some(detail))
            }
        }
    }

    fn request(&self, version: String, nonce: String, error: Option<Status>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version,
            node: Some(self.node()),
            type_url: TYPE_URL.to_owned(),
            response_nonce: nonce,
            error_detail: error,
            ..DiscoveryRequest::default()
        }
    }

    fn node(&self) -> Node {
        let metadata = (!self.options.node_metadata.is_empty()).then(|| Struct {
            fields: self
                .options
                .node_metadata
                .iter()
                .map(|(key, value)| {
                    let value = Value {
                        kind: Some(Kind::StringValue(value.clone())),
                    };
                    (key.clone(), value)
                })
                .collect::<HashMap<_, _>>(),
        });
        Node {
            id: self.options.node_id.clone(),
            metadata,
            user_agent_name: "ratekeeper".to_owned(),
            ..Node::default()
        }
    }
}

/// The delay before reconnect attempt `attempt` (0-based): `initial * 2^attempt`, capped at
/// `max`, then jittered into its upper half by `seed` (so many clients spread out, and the
/// delay never exceeds `max`).
pub fn backoff(attempt: u32, initial: Duration, max: Duration, seed: u64) -> Duration {
    let factor = 1u32 << attempt.min(20);
    let full = initial.saturating_mul(factor).min(max);
    let half = full / 2;
    let span = u64::try_from((full - half).as_nanos()).unwrap_or(u64::MAX);
    let extra = match span {
        0 => 0,
        span => seed % span.saturating_add(1),
    };
    half + Duration::from_nanos(extra)
}

/// A random number for jitter: each `RandomState` is seeded afresh.
fn jitter_seed() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max.saturating_sub(3);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

/// A status's code and message, and what caused it (a transport error's own message says
/// little).
fn status_text(status: &tonic::Status) -> String {
    let message = status.message();
    match std::error::Error::source(status).map(source_chain) {
        // tonic's transport errors repeat their source's text as the message.
        Some(chain) if chain.starts_with(message) => format!("{:?}: {chain}", status.code()),
        Some(chain) => format!("{:?}: {message}: {chain}", status.code()),
        None => format!("{:?}: {message}", status.code()),
    }
}

/// An error and its sources, for transport errors whose own text is only "transport error".
fn source_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        // An IO error shows its inner error's text, then has it as its source.
        let part = source.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = source.source();
    }
    text
}

#[cfg(test)]
mod tests;
