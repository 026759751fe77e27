//! The operator listener (`--admin-addr`): the endpoints that read counters or change them
//! ([`explain`], `counters`, [`rlqs`], `ui`: the dashboard), with `--admin-token-file`
//! behind the bearer token (see [`auth`]), its index page, and the probes it shares with
//! the public listener ([`crate::http`]). Its routes are [`routes::ADMIN`], in the one module
//! that holds both listeners' tables, so the public listener's 403 guard and the docs derive
//! from the same list.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{Html, Response};
use axum::routing::{MethodRouter, post};

use crate::cluster::Runtime;
use crate::envoy::rls::MAX_MESSAGE_BYTES;
use crate::http::routes::{self, Access, IndexOf};
use crate::http::{Health, Probes, page};
use crate::limiter::Limiter;
use crate::reload::ReloadStats;

pub mod auth;
mod counters;
pub mod explain;
pub mod names;
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
    /// The cluster runtime, in cluster mode (its ring, its members' names).
    pub cluster: Option<Arc<Runtime>>,
    pub reload: Arc<ReloadStats>,
    pub options: AdminOptions,
    /// The node's RLQS state (`None` where RLQS streams are refused).
    pub rlqs: Option<Arc<crate::quota::Hub>>,
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
    let probes = Probes::new(health, Arc::clone(&limiter));
    let explained = ExplainState {
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
            routes::Admin::Index => Some(page(index.clone())),
            routes::Admin::Healthcheck => Some(probes.healthcheck.clone()),
            routes::Admin::Metrics | routes::Admin::Stats => Some(probes.metrics.clone()),
            routes::Admin::Rlconfig => Some(probes.rlconfig.clone()),
            routes::Admin::Explain => Some(
                post(explain_request)
                    .layer(DefaultBodyLimit::max(MAX_MESSAGE_BYTES))
                    .with_state(explained.clone()),
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

/// What `/debug/explain` reads.
#[derive(Clone)]
struct ExplainState {
    limiter: Arc<Limiter>,
    /// The node's RLQS state, to say which quota a descriptor would draw from.
    rlqs: Option<Arc<crate::quota::Hub>>,
}

async fn explain_request(State(state): State<ExplainState>, body: Bytes) -> Response {
    explain::explain(&state.limiter, state.rlqs.as_deref(), &body).await
}
