//! The public HTTP listener (`--http-addr`): the probes (`/healthcheck`, `/metrics`,
//! `/rlconfig`), the check front ends for callers other than Envoy's gRPC filter (`json`
//! for the reference's `/json`, `rate` for a plain URL, `nginx` for `auth_request`),
//! and its index page. What each listener serves is its table in [`routes`] (this one's and
//! the admin listener's), from which both routers, the guard, the index pages and the docs
//! derive. The operator listener is [`crate::admin`], which serves the probes too.
//!
//! Invariant: this listener never serves an operator endpoint; it answers their paths (any
//! method) 403 naming the admin listener, so a caller learns where they went instead of a
//! bare 404. Handlers only read shared state; every front end goes through the same
//! [`Limiter`] as gRPC.

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

pub(crate) mod descriptor;
pub(crate) mod json;
mod nginx;
mod rate;
pub mod routes;

use self::routes::{Http, IndexOf};

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

/// The HTTP listener's routes ([`routes::HTTP`]); the operator endpoints' paths answer 403
/// naming the admin listener at `admin_addr` ([`routes::guarded_paths`]).
pub fn router(health: Arc<Health>, limiter: Arc<Limiter>, admin_addr: SocketAddr) -> Router {
    let probes = Probes::new(health, Arc::clone(&limiter));
    let index = Html(routes::index_page(admin_addr, IndexOf::Http));
    let (rate_fixed, rate_valued) = rate::routes(Arc::clone(&limiter));
    let nginx = nginx::route(Arc::clone(&limiter));
    let mut router = Router::new();
    for route in routes::HTTP {
        let served: MethodRouter = match route.endpoint {
            Http::Index => page(index.clone()),
            Http::Healthcheck => probes.healthcheck.clone(),
            Http::Metrics => probes.metrics.clone(),
            Http::Rlconfig => probes.rlconfig.clone(),
            Http::Json => post(json_request)
                .layer(DefaultBodyLimit::max(MAX_MESSAGE_BYTES))
                .with_state(Arc::clone(&limiter)),
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

/// A static page, served on `GET`.
pub(crate) fn page(html: Html<String>) -> MethodRouter {
    get(move || async move { html })
}

/// The probes both listeners serve: `/healthcheck`, `/metrics` and `/rlconfig`.
pub(crate) struct Probes {
    pub healthcheck: MethodRouter,
    pub metrics: MethodRouter,
    pub rlconfig: MethodRouter,
}

impl Probes {
    pub(crate) fn new(health: Arc<Health>, limiter: Arc<Limiter>) -> Probes {
        Probes {
            healthcheck: get(healthcheck).with_state(health),
            metrics: get(metrics).with_state(Arc::clone(&limiter)),
            rlconfig: get(rlconfig).with_state(limiter),
        }
    }
}

async fn healthcheck(State(health): State<Arc<Health>>) -> (StatusCode, &'static str) {
    if !health.is_serving() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
    } else if !health.has_limits() {
        (StatusCode::SERVICE_UNAVAILABLE, "no limits loaded yet")
    } else {
        (StatusCode::OK, "OK")
    }
}

async fn metrics(State(limiter): State<Arc<Limiter>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        limiter.metrics().encode(),
    )
        .into_response()
}

async fn rlconfig(State(limiter): State<Arc<Limiter>>) -> String {
    limiter.limits().load().to_string()
}

async fn json_request(State(limiter): State<Arc<Limiter>>, body: Bytes) -> Response {
    let request = match json::parse_request(&body) {
        Ok(request) => request,
        Err(problem) => return error(StatusCode::BAD_REQUEST, &problem),
    };
    let query = request.query();
    match limiter.decide(&query).await {
        Ok(verdict) => {
            let status = if verdict.is_over() {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let options = limiter.options();
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
pub(crate) fn error_response(failed: &Error) -> Response {
    error(failed.http_status(), &failed.to_string())
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

/// The parameters of a route's path (`Path<T>`), or 400 naming what is wrong with them in
/// the JSON error.
pub(crate) struct PathParams<T>(pub T);

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
