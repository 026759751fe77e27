//! `GET /debug/rlqs[?domain=NAME]` on the admin listener: the RLQS buckets of this node, each
//! with its limit and its reporters (stream, demand and share per unit), as JSON. At most
//! [`MAX_BUCKETS`] buckets, ordered by domain and id; `total` says how many there are.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use axum::routing::{MethodRouter, get};

use crate::quota::{BucketView, Hub};

/// The most buckets one answer lists.
pub const MAX_BUCKETS: usize = 1000;

#[derive(serde::Serialize)]
struct Answer {
    streams: usize,
    total: usize,
    buckets: Vec<BucketView>,
}

/// The route, over `hub` (none: RLQS is refused on this node, and nothing is listed).
pub fn route(hub: Option<Arc<Hub>>) -> MethodRouter {
    get(list).with_state(hub)
}

async fn list(State(hub): State<Option<Arc<Hub>>>, uri: Uri) -> Json<serde_json::Value> {
    // `domain=NAME` (taken as written: domain names need no escaping).
    let domain = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("domain="));
    let answer = match &hub {
        Some(hub) => {
            let (buckets, total) = hub.snapshot(domain, MAX_BUCKETS);
            Answer {
                streams: hub.stream_count(),
                total,
                buckets,
            }
        }
        None => Answer {
            streams: 0,
            total: 0,
            buckets: Vec::new(),
        },
    };
    Json(serde_json::to_value(answer).unwrap_or_default())
}
