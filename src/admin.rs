//! The HTTP listener: health and operator endpoints.
//!
//! `GET /healthcheck` answers 200 `OK` while the process serves and 503 once shutdown has
//! begun; `GET /rlconfig` dumps the live limits. Handlers only read shared state.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::limits::Limits;

/// Whether the process is serving (false once shutdown began).
#[derive(Debug)]
pub struct Health {
    serving: AtomicBool,
}

impl Health {
    pub fn new() -> Health {
        Health {
            serving: AtomicBool::new(true),
        }
    }

    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
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
    limits: Arc<ArcSwap<Limits>>,
}

pub fn router(health: Arc<Health>, limits: Arc<ArcSwap<Limits>>) -> Router {
    Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/rlconfig", get(rlconfig))
        .with_state(AdminState { health, limits })
}

async fn healthcheck(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if state.health.is_serving() {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
    }
}

async fn rlconfig(State(state): State<AdminState>) -> String {
    state.limits.load().to_string()
}
