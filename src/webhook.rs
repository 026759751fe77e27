//! `ratekeeper webhook` ([`WebhookArgs`]): the mutating admission webhook server, answering
//! with the injector crate's [`review`] (it lives here, not there, for the server's TLS
//! and metrics). HTTPS (HTTP/1.1) for the API
//! server (`POST /inject`, `POST /inject/namespace`, see [`Scope`]), with the certificate
//! of `--tls-cert`/`--tls-key` reloaded when it changes ([`crate::transport::tls`]); plain
//! HTTP for probes and Prometheus (`GET /healthcheck`, `GET /metrics`).
//!
//! Invariants:
//! - Bounded: a body over [`MAX_BODY_BYTES`] is refused (413), an answer is sent within
//!   [`ANSWER_WITHIN`] (503 past it), a TLS handshake gets [`HANDSHAKE_TIMEOUT`], request
//!   headers [`HEADER_TIMEOUT`], and at most [`MAX_CONNECTIONS`] connections are served.
//! - Never blocks a pod by failing: every review that is JSON is answered "allowed"
//!   ([`crate::inject::review`]); the manifests also set `failurePolicy: Ignore`.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Args;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::histogram::{AtomicHistogram, SharedHistogram};
use crate::inject::review::{self, Scope};
use crate::inject::settings::SettingsArgs;
use crate::transport::tls::{Flags, Tls, TlsError, TlsOptions};

/// Review bodies larger than this are refused (a pod is at most ~1.5 MiB in etcd).
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// A review is answered within this, body read included (the manifests give the API
/// server's call 5 s).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(2);
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub const MAX_CONNECTIONS: usize = 256;

/// The flags naming the webhook's certificate files, for errors, logs and metrics.
pub const WEBHOOK_TLS: Flags = Flags {
    cert: "--tls-cert",
    key: "--tls-key",
    ca: "--tls-client-ca",
    san: "--tls-client-san",
    what: "webhook",
    client: false,
};

/// What the webhook server needs.
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    pub addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub tls: TlsOptions,
    pub settings: SettingsArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The webhook's metrics (`ratekeeper_webhook_*`).
pub(crate) struct Metrics {
    reviews: Family<ResultLabels, Counter>,
    duration: Arc<AtomicHistogram>,
}

impl Metrics {
    /// The webhook's metrics and its registry, which holds them and `tls`'s figures.
    pub(crate) fn registered(tls: &Arc<crate::transport::tls::TlsStats>) -> (Metrics, Registry) {
        let mut registry = Registry::with_prefix("ratekeeper");
        let metrics = Metrics {
            reviews: Family::default(),
            duration: Arc::new(AtomicHistogram::default()),
        };
        registry.register(
            "webhook_reviews",
            "Admission reviews answered, by result (injected, skipped, refused: the pod cannot take the sidecar, malformed, not_json, too_large, timeout)",
            metrics.reviews.clone(),
        );
        registry.register(
            "webhook_review_duration_seconds",
            "Time to answer an admission review, body read included",
            SharedHistogram(Arc::clone(&metrics.duration)),
        );
        tls.register_metrics_as(WEBHOOK_TLS.what, &mut registry);
        (metrics, registry)
    }

    /// Counts a review answered with `result`.
    #[cfg(test)]
    pub(crate) fn count(&self, result: &'static str) {
        self.reviews.get_or_create(&ResultLabels { result }).inc();
    }
}

struct WebhookState {
    settings: SettingsArgs,
    metrics: Metrics,
    registry: Registry,
}

/// A bound webhook server, not yet serving.
pub struct Webhook {
    https: TcpListener,
    http: TcpListener,
    tls: Tls,
    state: Arc<WebhookState>,
}

impl Webhook {
    /// Loads the certificate and binds both listeners.
    pub async fn bind(options: &WebhookOptions) -> Result<Webhook, WebhookError> {
        let tls = Tls::load_for(options.tls.clone(), &WEBHOOK_TLS)?;
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| WebhookError::Listen { addr, source })
        };
        let https = bind(options.addr).await?;
        let http = bind(options.http_addr).await?;
        let (metrics, registry) = Metrics::registered(tls.stats());
        Ok(Webhook {
            https,
            http,
            tls,
            state: Arc::new(WebhookState {
                settings: options.settings.clone(),
                metrics,
                registry,
            }),
        })
    }

    pub fn https_addr(&self) -> std::io::Result<SocketAddr> {
        self.https.local_addr()
    }

    pub fn http_addr(&self) -> std::io::Result<SocketAddr> {
        self.http.local_addr()
    }

    /// Serves until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), WebhookError> {
        let _watch = self.tls.watch()?;
        let reviews = Router::new()
            .route("/inject", post(inject_annotated))
            .route("/inject/namespace", post(inject_namespace))
            .route("/healthcheck", get(healthcheck))
            .with_state(Arc::clone(&self.state));
        let probes = Router::new()
            .route("/healthcheck", get(healthcheck))
            .route("/metrics", get(metrics))
            .with_state(Arc::clone(&self.state));
        let (stop, stopped) = tokio::sync::watch::channel(());
        let mut stopped_http = stopped.clone();
        let http = tokio::spawn(
            axum::serve(self.http, probes)
                .with_graceful_shutdown(async move {
                    let _ = stopped_http.changed().await;
                })
                .into_future(),
        );
        let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.https.accept() => accepted,
            };
            let Ok((stream, _)) = accepted else {
                // Out of descriptors, say: pause so it is not a busy loop.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                continue;
            };
            let acceptor = acceptor(&self.tls);
            let stats = Arc::clone(self.tls.stats());
            let service = TowerToHyperService::new(reviews.clone());
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let stream =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => stream,
                        _ => {
                            stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    };
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::pin!(connection);
                tokio::select! {
                    _ = connection.as_mut() => {}
                    _ = stopped.changed() => {
                        connection.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(ANSWER_WITHIN, connection).await;
                    }
                }
            });
        }
        let _ = stop.send(());
        let _ = http.await;
        Ok(())
    }
}

/// The live certificate, offering HTTP/1.1 (the API server's client takes it; the shared TLS
/// code offers `h2`, for gRPC).
fn acceptor(tls: &Tls) -> tokio_rustls::TlsAcceptor {
    let mut config = rustls::ServerConfig::clone(tls.acceptor().config());
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

async fn healthcheck() -> &'static str {
    "OK"
}

async fn metrics(State(state): State<Arc<WebhookState>>) -> Response {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &state.registry);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn inject_annotated(State(state): State<Arc<WebhookState>>, request: Request) -> Response {
    answer(&state, Scope::Annotated, request).await
}

async fn inject_namespace(State(state): State<Arc<WebhookState>>, request: Request) -> Response {
    answer(&state, Scope::Namespace, request).await
}

async fn answer(state: &WebhookState, scope: Scope, request: Request) -> Response {
    let started = tokio::time::Instant::now();
    // A declared length over the bound is refused before reading anything.
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    let body: Body = request.into_body();
    let answered = tokio::time::timeout(ANSWER_WITHIN, async {
        if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
            let message = format!("the review is larger than {MAX_BODY_BYTES} bytes");
            return (
                "too_large",
                (StatusCode::PAYLOAD_TOO_LARGE, message).into_response(),
            );
        }
        let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
            Ok(bytes) => bytes,
            Err(error) if too_large(&error) => {
                let message = format!("the review is larger than {MAX_BODY_BYTES} bytes");
                return (
                    "too_large",
                    (StatusCode::PAYLOAD_TOO_LARGE, message).into_response(),
                );
            }
            Err(error) => {
                let message = format!("cannot read the review: {error}");
                return (
                    "malformed",
                    (StatusCode::BAD_REQUEST, message).into_response(),
                );
            }
        };
        match review::answer(&bytes, scope, &state.settings) {
            Ok(answer) => {
                // A pod a controller creates never shows its warnings to a person: the log does.
                let response = &answer.review["response"];
                for warning in response["warnings"].as_array().into_iter().flatten() {
                    let uid = response["uid"].as_str().unwrap_or_default();
                    tracing::warn!(
                        uid,
                        warning = warning.as_str().unwrap_or_default(),
                        "admission review"
                    );
                }
                (
                    answer.decision.label(),
                    axum::Json(answer.review).into_response(),
                )
            }
            Err(review::NotJson(problem)) => (
                "not_json",
                (StatusCode::BAD_REQUEST, problem).into_response(),
            ),
        }
    })
    .await;
    let (result, response) = answered.unwrap_or_else(|_| {
        let message = format!("no answer within {ANSWER_WITHIN:?}");
        (
            "timeout",
            (StatusCode::SERVICE_UNAVAILABLE, message).into_response(),
        )
    });
    state.metrics.duration.observe(started.elapsed());
    state
        .metrics
        .reviews
        .get_or_create(&ResultLabels { result })
        .inc();
    if !matches!(result, "injected" | "skipped" | "refused" | "malformed") {
        tracing::warn!(result, "admission review not answered");
    }
    response
}

/// Whether reading the body failed because it passed the limit.
fn too_large(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if error.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// `ratekeeper webhook`.
#[derive(Args)]
pub struct WebhookArgs {
    /// The HTTPS listener the API server calls.
    #[arg(long, env = "RATEKEEPER_WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub addr: SocketAddr,
    /// Plain HTTP: /healthcheck and /metrics.
    #[arg(
        long,
        env = "RATEKEEPER_WEBHOOK_HTTP_ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub http_addr: SocketAddr,
    /// The server's certificate chain (PEM), reloaded when it changes.
    #[arg(long, env = "RATEKEEPER_WEBHOOK_TLS_CERT")]
    pub tls_cert: PathBuf,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "RATEKEEPER_WEBHOOK_TLS_KEY")]
    pub tls_key: PathBuf,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

impl WebhookArgs {
    /// Serves until `shutdown` resolves; prints `ratekeeper webhook serving https=.. http=..`
    /// once bound.
    pub fn run(
        &self,
        runtime: &tokio::runtime::Runtime,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> ExitCode {
        // The defaults must make valid settings, else every pod would be refused.
        if let Err(error) = self.settings.for_pod(None) {
            return fail(&error);
        }
        let options = WebhookOptions {
            addr: self.addr,
            http_addr: self.http_addr,
            tls: TlsOptions {
                cert: self.tls_cert.clone(),
                key: self.tls_key.clone(),
                client_ca: None,
                client_san: None,
            },
            settings: self.settings.clone(),
        };
        let result = runtime.block_on(async {
            let server = Webhook::bind(&options).await?;
            let (https, http) = (server.https_addr(), server.http_addr());
            if let (Ok(https), Ok(http)) = (https, http) {
                println!("ratekeeper webhook serving https={https} http={http}");
                let _ = std::io::stdout().flush();
                tracing::info!(%https, %http, "webhook serving");
            }
            server.run(shutdown).await
        });
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => fail(&error.to_string()),
        }
    }
}

fn fail(error: &str) -> ExitCode {
    eprintln!("{error}");
    ExitCode::FAILURE
}
