//! The HTTP listeners: the public one (health, metrics, the check front ends) and the admin
//! one (the operator endpoints that read counters or change them).
//!
//! On the HTTP listener (`--http-addr`, which probes and Envoy's or nginx's checks reach):
//! - `GET /healthcheck`: 200 `OK` while serving, 503 once shutdown has begun;
//! - `GET /metrics`: Prometheus text format;
//! - `GET /rlconfig`: the live limits, one line per limit;
//! - `POST /json`: a JSON `RateLimitRequest`, answered with the JSON response: 200 when OK,
//!   429 when over the limit, 400 for a bad body or request, 503 when overloaded;
//! - `POST /rate/{domain}/{name}[/{value}]`: check and consume one limit by name (see
//!   [`rate`]);
//! - `/nginx/{domain}` (any method): the check for nginx's `auth_request` (see [`nginx`]).
//!
//! On the admin listener (`--admin-addr`, loopback by default; with `--admin-token-file`
//! every request needs the bearer token, see [`auth`]):
//! - `POST /debug/explain`: the `/json` body, answered with what each descriptor would meet,
//!   consuming nothing (see [`explain`]);
//! - `GET /counters/{domain}`: the live counters of a domain on this node, paged, with
//!   `--counter-names` (see [`counters`]);
//! - `DELETE /counters/{domain}?descriptor=k=v,k=v`: resets one descriptor's counters
//!   wherever they live (see [`counters`]); both `/counters` routes answer 404 with
//!   `--admin-counters=false`;
//! - `GET /debug/rlqs`: the RLQS buckets of this node with their reporters' demand and
//!   shares (see [`rlqs`]);
//! - `GET /ui`: the dashboard, one self-contained page polling `GET /ui/data` (see [`ui`]),
//!   unless `--admin-ui=false`;
//! - `GET /rlconfig`, `/stats` (the Prometheus text, as `/metrics`), `/metrics` and
//!   `/healthcheck`: what the reference service's debug port answers (the admin listener is
//!   where `DEBUG_PORT` points), read-only and served without the token like on the HTTP
//!   listener.
//!
//! Invariant: the HTTP listener never serves an operator endpoint; it answers their paths
//! (any method) 403 naming the admin listener, so a caller learns where they went instead of
//! a bare 404. Handlers only read shared state; `/json` goes through the same [`Limiter`] as
//! gRPC.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{any, get, post};

use arc_swap::ArcSwap;

use crate::envoy::rls::MAX_MESSAGE_BYTES;
use crate::error::Error;
use crate::limiter::Limiter;
use crate::limits::Limits;
use crate::reload::ReloadStats;
use crate::store::cluster::Cluster;

pub mod auth;
mod counters;
pub mod descriptor;
pub mod explain;
mod json;
pub mod names;
mod nginx;
mod rate;
pub mod rlqs;
mod ui;

/// Which operator endpoints the admin listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminOptions {
    /// `GET` and `DELETE /counters/{domain}` (`--admin-counters`).
    pub counters: bool,
    /// `GET /ui` and `/ui/data` (`--admin-ui`).
    pub ui: bool,
    /// Keep the descriptor values of up to this many live counters, for
    /// `GET /counters/{domain}` and the dashboard's hottest counters (`--counter-names`;
    /// 0: keep none).
    pub counter_names: usize,
}

impl Default for AdminOptions {
    fn default() -> AdminOptions {
        AdminOptions {
            counters: true,
            ui: true,
            counter_names: 0,
        }
    }
}

/// What the admin listener reads: everything is shared with the rest of the process.
#[derive(Clone, Debug)]
pub struct Admin {
    pub health: Arc<Health>,
    pub limiter: Arc<Limiter>,
    /// The descriptor values of live counters (`--counter-names`), which the limiter feeds
    /// as its observer; `None` when none are kept.
    pub names: Option<Arc<names::CounterNames>>,
    /// The in-memory store across peers, in cluster mode (its ring, its members' names).
    pub cluster: Option<Cluster>,
    pub reload: Arc<ReloadStats>,
    pub options: AdminOptions,
    /// The node's RLQS state (`None` where RLQS streams are refused).
    pub rlqs: Option<Arc<crate::envoy::rlqs::Hub>>,
}

/// Whether the process is ready for traffic: serving (false once shutdown began) and, when
/// that is required, holding limits with at least one domain.
#[derive(Debug)]
pub struct Health {
    serving: AtomicBool,
    /// Ready only once these limits have a domain (`--healthy-only-with-config`).
    requires: Option<Arc<ArcSwap<Limits>>>,
}

impl Health {
    pub fn new() -> Health {
        Health {
            serving: AtomicBool::new(true),
            requires: None,
        }
    }

    /// Ready only while `limits` hold at least one domain (the reference service's
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub fn once_limits_loaded(limits: Arc<ArcSwap<Limits>>) -> Health {
        Health {
            requires: Some(limits),
            ..Health::new()
        }
    }

    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Whether limits are there, if they are required.
    pub fn has_limits(&self) -> bool {
        self.requires
            .as_ref()
            .is_none_or(|limits| limits.load().domains().next().is_some())
    }

    /// Serving, with limits if they are required.
    pub fn is_ready(&self) -> bool {
        self.is_serving() && self.has_limits()
    }

    pub fn stop_serving(&self) {
        self.serving.store(false, Ordering::Release);
    }
}

impl Default for Health {
    fn default() -> Health {
        Health::new()
    }
}

#[derive(Clone)]
struct AdminState {
    health: Arc<Health>,
    limiter: Arc<Limiter>,
    /// The node's RLQS state, for `/debug/explain` (admin listener only).
    rlqs: Option<Arc<crate::envoy::rlqs::Hub>>,
}

/// The operator endpoints' paths: served on the admin listener only.
const ADMIN_PATHS: [&str; 5] = [
    "/counters",
    "/counters/{*rest}",
    "/debug/explain",
    "/ui",
    "/ui/{*rest}",
];

/// The HTTP listener's routes; the operator endpoints' paths answer 403 naming the admin
/// listener at `admin_addr`.
pub fn router(admin: &Admin, admin_addr: SocketAddr) -> Router {
    let limiter = &admin.limiter;
    let index = Html(index_page(admin_addr));
    let mut router = Router::new()
        .route("/", get(move || async move { index }))
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .route("/rlconfig", get(rlconfig))
        .route("/json", post(json_request))
        .layer(DefaultBodyLimit::max(MAX_MESSAGE_BYTES))
        .with_state(AdminState {
            health: Arc::clone(&admin.health),
            limiter: Arc::clone(limiter),
            rlqs: None,
        })
        .merge(rate::router(Arc::clone(limiter)))
        .merge(nginx::router(Arc::clone(limiter)));
    let message = format!(
        "this endpoint is served on the admin listener (--admin-addr, {admin_addr}), not on \
         the HTTP listener"
    );
    for path in ADMIN_PATHS {
        let message = message.clone();
        router = router.route(
            path,
            any(move || async move { error(StatusCode::FORBIDDEN, &message) }),
        );
    }
    router
}

/// The admin listener's routes, behind the bearer token when there is one. With the
/// dashboard on, this starts the task sampling its history (on the current tokio runtime);
/// the task ends once the router is dropped.
pub fn admin_router(admin: Admin, token: Option<auth::TokenFile>) -> Router {
    let Admin {
        health,
        limiter,
        names,
        cluster,
        reload,
        options,
        rlqs,
    } = admin;
    let state = AdminState {
        health,
        limiter: Arc::clone(&limiter),
        rlqs: rlqs.clone(),
    };
    // The reference's debug port (`DEBUG_PORT`) answers these; they are read-only and the
    // HTTP listener serves them to anyone, so they stay open under the token too.
    let debug = Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .route("/stats", get(metrics))
        .route("/rlconfig", get(rlconfig))
        .with_state(state.clone());
    let mut router = Router::new()
        .route("/debug/explain", post(explain::explain))
        .layer(DefaultBodyLimit::max(MAX_MESSAGE_BYTES))
        .with_state(state)
        .merge(counters::router(
            Arc::clone(&limiter),
            names.clone(),
            cluster.clone(),
            options.counters,
        ))
        .merge(rlqs::router(rlqs.clone()));
    if options.ui {
        router = router.merge(ui::router(ui::UiState {
            history: ui::history::History::spawn(&limiter, crate::clock::Clock::system()),
            limiter,
            names,
            cluster,
            reload,
            counters: options.counters,
            rlqs: rlqs.clone(),
        }));
    }
    let router = match token {
        Some(token) => router.layer(axum::middleware::from_fn_with_state(
            token,
            auth::require_token,
        )),
        None => router,
    };
    router.merge(debug)
}

/// `GET /` on the HTTP listener: what a newcomer pointing a browser at the port finds, the
/// endpoints this listener serves and those of the admin listener.
fn index_page(admin_addr: SocketAddr) -> String {
    format!(
        r#"<!doctype html>
<html><head><meta charset="utf-8"><title>ratekeeper</title></head>
<body>
<h1>ratekeeper</h1>
<p>An Envoy rate limit service: gRPC <code>ShouldRateLimit</code> on its gRPC listener.
This HTTP listener serves:</p>
<ul>
<li><a href="/healthcheck">/healthcheck</a>: 200 once limits are loaded and while serving</li>
<li><a href="/metrics">/metrics</a>: Prometheus metrics</li>
<li><a href="/rlconfig">/rlconfig</a>: the limits in force</li>
<li><code>POST /json</code>, <code>POST /rate/{{domain}}/{{name}}[/{{value}}]</code>,
<code>/nginx/{{domain}}</code>: checks over HTTP</li>
</ul>
<p>On the admin listener (<code>--admin-addr</code>, {admin_addr}; the reference
service's <code>DEBUG_PORT</code>): <code>/ui</code> (the dashboard),
<code>/counters/{{domain}}</code>, <code>POST /debug/explain</code>, behind its token when
one is set; and, open, <code>/rlconfig</code>, <code>/stats</code>, <code>/metrics</code>,
<code>/healthcheck</code>.</p>
</body></html>
"#
    )
}

async fn healthcheck(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if !state.health.is_serving() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
    } else if !state.health.has_limits() {
        (StatusCode::SERVICE_UNAVAILABLE, "no limits loaded yet")
    } else {
        (StatusCode::OK, "OK")
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.limiter.metrics().encode(),
    )
        .into_response()
}

async fn rlconfig(State(state): State<AdminState>) -> String {
    state.limiter.limits().load().to_string()
}

async fn json_request(State(state): State<AdminState>, body: Bytes) -> Response {
    let request = match json::parse_request(&body) {
        Ok(request) => request,
        Err(problem) => return error(StatusCode::BAD_REQUEST, &problem),
    };
    let query = request.query();
    match state.limiter.decide(&query).await {
        Ok(verdict) => {
            let status = if verdict.is_over() {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let options = state.limiter.options();
            let headers = if options.response_headers {
                verdict.headers(options.header_style, &options.header_names)
            } else {
                Default::default()
            };
            let mut body = json::response(&verdict, &headers);
            if options.response_dynamic_metadata {
                body["dynamicMetadata"] =
                    serde_json::Value::Object(crate::limiter::dynamic_metadata(&query, &verdict));
            }
            (status, axum::Json(body)).into_response()
        }
        Err(failed) => error_response(&failed),
    }
}

/// A JSON error body with the error's own HTTP status.
fn error_response(failed: &Error) -> Response {
    error(failed.http_status(), &failed.to_string())
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

/// The parameters of a route's path (`Path<T>`), or 400 naming what is wrong with them in
/// the admin's JSON error.
struct PathParams<T>(T);

impl<T, S> axum::extract::FromRequestParts<S> for PathParams<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Response> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(params)) => Ok(PathParams(params)),
            Err(rejection) => Err(error(StatusCode::BAD_REQUEST, &rejection.body_text())),
        }
    }
}
