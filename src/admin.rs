//! The HTTP listeners: the public one (health, metrics, the check front ends: `json`,
//! `rate`, `nginx`) and the admin one (the operator endpoints that read counters or
//! change them: [`explain`], `counters`, [`rlqs`], `ui`; with `--admin-token-file`
//! behind the bearer token, see [`auth`]). What each listener serves is its table in
//! [`routes`], from which both routers, the guard, the index pages and the docs derive.
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
use axum::routing::{MethodRouter, any, get, post};

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
pub mod routes;
mod ui;

use self::routes::{Access, Http, IndexOf};

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
    pub rlqs: Option<Arc<crate::quota::Hub>>,
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
    rlqs: Option<Arc<crate::quota::Hub>>,
}

/// The HTTP listener's routes ([`routes::HTTP`]); the operator endpoints' paths answer 403
/// naming the admin listener at `admin_addr` ([`routes::guarded_paths`]).
pub fn router(admin: &Admin, admin_addr: SocketAddr) -> Router {
    let limiter = &admin.limiter;
    let state = AdminState {
        health: Arc::clone(&admin.health),
        limiter: Arc::clone(limiter),
        rlqs: None,
    };
    let index = Html(routes::index_page(admin_addr, IndexOf::Http));
    let (rate_fixed, rate_valued) = rate::routes(Arc::clone(limiter));
    let nginx = nginx::route(Arc::clone(limiter));
    let mut router = Router::new();
    for route in routes::HTTP {
        let served: MethodRouter = match route.endpoint {
            Http::Index => {
                let index = index.clone();
                get(move || async move { index })
            }
            Http::Healthcheck => get(healthcheck).with_state(state.clone()),
            Http::Metrics => get(metrics).with_state(state.clone()),
            Http::Rlconfig => get(rlconfig).with_state(state.clone()),
            Http::Json => post(json_request)
                .layer(DefaultBodyLimit::max(MAX_MESSAGE_BYTES))
                .with_state(state.clone()),
            Http::RateFixed => rate_fixed.clone(),
            Http::RateValued => rate_valued.clone(),
            Http::Nginx => nginx.clone(),
        };
        router = router.route(route.path, served);
    }
    let message = format!(
        "this endpoint is served on the admin listener (--admin-addr, {admin_addr}), not on \
         the HTTP listener"
    );
    for path in routes::guarded_paths() {
        let message = message.clone();
        router = router.route(
            &path,
            any(move || async move { error(StatusCode::FORBIDDEN, &message) }),
        );
    }
    router
}

/// The admin listener's routes ([`routes::ADMIN`]); with a token, the routes of
/// [`Access::Token`] are behind it. With the dashboard on, this starts the task sampling
/// its history (on the current tokio runtime); the task ends once the router is dropped.
pub fn admin_router(
    admin: Admin,
    token: Option<auth::TokenFile>,
    admin_addr: SocketAddr,
) -> Router {
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
    let index = Html(routes::index_page(admin_addr, IndexOf::Admin));
    let ui = options.ui.then(|| {
        ui::routes(ui::UiState {
            history: ui::history::History::spawn(&limiter, crate::clock::Clock::system()),
            limiter: Arc::clone(&limiter),
            names: names.clone(),
            cluster: cluster.clone(),
            reload,
            counters: options.counters,
            rlqs: rlqs.clone(),
        })
    });
    let counters = counters::route(Arc::clone(&limiter), names, cluster, options.counters);
    let (mut protected, mut open) = (Router::new(), Router::new());
    for route in routes::ADMIN {
        let served: Option<MethodRouter> = match route.endpoint {
            routes::Admin::Index => {
                let index = index.clone();
                Some(get(move || async move { index }))
            }
            routes::Admin::Healthcheck => Some(get(healthcheck).with_state(state.clone())),
            routes::Admin::Metrics | routes::Admin::Stats => {
                Some(get(metrics).with_state(state.clone()))
            }
            routes::Admin::Rlconfig => Some(get(rlconfig).with_state(state.clone())),
            routes::Admin::Explain => Some(
                post(explain::explain)
                    .layer(DefaultBodyLimit::max(MAX_MESSAGE_BYTES))
                    .with_state(state.clone()),
            ),
            routes::Admin::Counters => Some(counters.clone()),
            routes::Admin::Rlqs => Some(rlqs::route(rlqs.clone())),
            // Off with --admin-ui=false: not served at all.
            routes::Admin::Ui => ui.as_ref().map(|(page, _)| page.clone()),
            routes::Admin::UiData => ui.as_ref().map(|(_, data)| data.clone()),
        };
        let Some(served) = served else { continue };
        match route.access {
            Access::Token => protected = protected.route(route.path, served),
            Access::Open => open = open.route(route.path, served),
        }
    }
    let protected = match token {
        Some(token) => protected.layer(axum::middleware::from_fn_with_state(
            token,
            auth::require_token,
        )),
        None => protected,
    };
    protected.merge(open)
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
