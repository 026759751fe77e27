//! `GET /ui`: the operator's dashboard, one self-contained HTML page (inline CSS and JS, no
//! external assets, works offline), and `GET /ui/data`, the JSON it polls:
//!
//! - `limits`: the live limits as a tree (one row per configured entry, `depth` from the
//!   path), each limit with its hits and over-limit hits since start (`/metrics`' figures);
//! - `hot`: the most used counters of this node (from `/counters`' names: needs
//!   `--counter-names N`, and `--admin-counters` on), at most [`HOT_KEYS`];
//! - `cluster`: the ring's members, each with its health as this node sees it (a peer's
//!   circuit breaker open: down), and the peers the failure detector took off the ring
//!   (`off_ring`, down);
//! - `reload`: reload counts, the last success and the last failure's errors;
//! - `history`: per limit, its hits and over-limit totals sampled on the server every 10 s
//!   for the last 10 minutes ([`history`]: `interval_ms`, `keep`, `now_ms`, and `series`,
//!   each `{"key", "domain", "path", "limit", "points": [[unix_ms, hits, over], ...]}`,
//!   `truncated` counting the limits not followed).
//!
//! The page charts the over-limit rate per limit from `history` (so a page opened now
//! shows the minutes before), the current poll's totals extending each chart to now; it
//! explains a descriptor with `POST /debug/explain` and resets one with
//! `DELETE /counters/{domain}`. Nothing here is on the request path: `/ui/data` reads
//! atomics, the limits snapshot, the history's rings (sampled by a background task), and
//! (for `hot`) the same cost-0 checks `/counters` makes, bounded by [`HOT_DOMAINS`] x
//! [`HOT_PAGE`].
//!
//! With `--admin-token-file`, `GET /ui` itself is served without the token (it is the same
//! static page for everyone, holding no data), and everything it fetches needs it: opened
//! as `/ui#token=TOKEN`, the page sends the fragment's token as `Authorization: Bearer` on
//! its requests. A fragment is never sent to a server, so the token stays out of request
//! lines and access logs.

pub mod history;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use serde_json::{Value, json};

use self::history::History;
use crate::cluster::Runtime;
use crate::limiter::Limiter;
use crate::limits::{Domain, Limits, Node};
use crate::reload::ReloadStats;

/// The page: `ui/dashboard.html`, compiled in.
const PAGE: &str = include_str!("ui/dashboard.html");
/// Configured entries listed at most (the rest is counted in `limits_truncated`).
pub(super) const MAX_ROWS: usize = 1000;
/// Hottest counters reported.
pub(super) const HOT_KEYS: usize = 10;
/// Domains and counters per domain looked at for the hottest counters.
const HOT_DOMAINS: usize = 20;
const HOT_PAGE: usize = 100;

#[derive(Clone)]
pub(super) struct UiState {
    pub limiter: Arc<Limiter>,
    pub names: Option<Arc<super::names::CounterNames>>,
    pub cluster: Option<Arc<Runtime>>,
    pub reload: Arc<ReloadStats>,
    /// `--admin-counters`: the page may list and reset counters.
    pub counters: bool,
    /// The per-limit totals of the last minutes, sampled in the background.
    pub history: History,
    /// The node's RLQS state (`None` where RLQS is refused).
    pub rlqs: Option<Arc<crate::quota::Hub>>,
}

/// `GET /ui` (the page) and `GET /ui/data` (its JSON).
pub(super) fn routes(state: UiState) -> (MethodRouter, MethodRouter) {
    (get(page), get(data).with_state(state))
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            // Everything is inline; nothing may be loaded from elsewhere.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
                 connect-src 'self'; img-src data:",
            ),
        ],
        PAGE,
    )
        .into_response()
}

async fn data(State(state): State<UiState>) -> Response {
    let snapshot = state.limiter.limits().load_full();
    let body = json!({
        "now": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs()),
        "limits": limits(&state.limiter, &snapshot),
        "hot": hot(&state, &snapshot).await,
        "cluster": cluster(state.cluster.as_deref()),
        "reload": reload(&state.reload),
        "counters_enabled": state.counters,
        "history": history_json(&state.history),
        "rlqs": rlqs(state.rlqs.as_deref()),
    });
    ([(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response()
}

/// The RLQS buckets shown on the page (at most [`RLQS_BUCKETS`]), with their reporters'
/// demand and shares.
fn rlqs(hub: Option<&crate::quota::Hub>) -> Value {
    match hub {
        None => json!({"served": false, "streams": 0, "total": 0, "buckets": []}),
        Some(hub) => {
            let (buckets, total) = hub.snapshot(None, RLQS_BUCKETS);
            json!({
                "served": true,
                "streams": hub.stream_count(),
                "total": total,
                "buckets": buckets,
            })
        }
    }
}

/// The most RLQS buckets `/ui/data` lists (`/debug/rlqs` lists more).
const RLQS_BUCKETS: usize = 50;

/// The sampled per-limit totals, each point `[unix_ms, hits, over]`.
fn history_json(history: &History) -> Value {
    let sampled = history.series();
    let series: Vec<Value> = sampled
        .series
        .iter()
        .map(|(key, points)| {
            let points: Vec<[u64; 3]> = points
                .iter()
                .map(|point| [point.at_ms, point.hits, point.over])
                .collect();
            json!({
                "key": key.joined(),
                "domain": &*key.domain,
                "path": &*key.path,
                "limit": &*key.limit,
                "points": points,
            })
        })
        .collect();
    json!({
        "interval_ms": u64::try_from(history.interval().as_millis()).unwrap_or(u64::MAX),
        "keep": history.keep(),
        "now_ms": history.now_ms(),
        "series": series,
        "truncated": sampled.truncated,
    })
}

/// Every domain (by name) with its configured entries in config order: the order of the
/// page's rows and of the history's series.
fn in_config_order(snapshot: &Limits) -> Vec<(&Domain, Vec<&Node>)> {
    let mut domains: Vec<_> = snapshot.domains().collect();
    domains.sort_by(|a, b| a.name().cmp(b.name()));
    domains
        .into_iter()
        .map(|domain| {
            let mut nodes = domain.nodes();
            nodes.sort_by_key(|node| node.order());
            (domain, nodes)
        })
        .collect()
}

/// The configured entries of every domain, in config order, with their limits' figures.
fn limits(limiter: &Limiter, snapshot: &Limits) -> Value {
    let mut rows = Vec::new();
    let mut truncated = 0usize;
    let keys = limiter.rule_keys();
    for (domain, nodes) in in_config_order(snapshot) {
        let totals = limiter.limit_totals(domain.name());
        if rows.len() >= MAX_ROWS {
            truncated += nodes.len() + 1;
            continue;
        }
        rows.push(
            json!({"domain": domain.name(), "path": domain.name(), "depth": 0, "limits": []}),
        );
        for node in nodes {
            if rows.len() >= MAX_ROWS {
                truncated += 1;
                continue;
            }
            let limits: Vec<Value> = node
                .limits
                .iter()
                .map(|limit| {
                    let (hits, over) = totals.get(limit.index).copied().unwrap_or_default();
                    let rate = limit.rate.map(|rate| {
                        let mut rate_json = json!({
                            "requests_per_unit": rate.requests_per_unit,
                            "unit": rate.unit.as_str(),
                            "algorithm": rate.algorithm.as_str(),
                        });
                        if rate.multiplier != 1 {
                            rate_json["unit_multiplier"] = json!(rate.multiplier);
                        }
                        rate_json
                    });
                    json!({
                        "name": limit.name.as_deref(),
                        "rate": rate,
                        "hits": hits,
                        "over_limit": over,
                        "keys": keys.get(&limit.rule).map(|keys| keys.live).unwrap_or(0),
                        "key_budget": keys.get(&limit.rule).map(|keys| keys.budget),
                        "key_refusals": keys.get(&limit.rule).map(|keys| keys.refused).unwrap_or(0),
                    })
                })
                .collect();
            rows.push(json!({
                "domain": domain.name(),
                "path": &*node.path,
                "depth": node.path.matches(" > ").count(),
                "shadow": node.shadow_mode,
                "quota": node.soft,
                "limits": limits,
            }));
        }
    }
    json!({"rows": rows, "truncated": truncated})
}

/// The most used counters this node holds, when it keeps their names.
async fn hot(state: &UiState, snapshot: &Limits) -> Value {
    if !state.counters {
        return json!({"enabled": false, "reason": "--admin-counters=false"});
    }
    let Some(names) = &state.names else {
        return json!({"enabled": false, "reason": "start ratekeeper with --counter-names N to see the hottest counters"});
    };
    let mut found: Vec<(f64, Value)> = Vec::new();
    for domain in snapshot.domains().take(HOT_DOMAINS) {
        let page = match names
            .counters(&state.limiter, domain.name(), None, HOT_PAGE)
            .await
        {
            Ok(page) => page,
            Err(error) => {
                return json!({"enabled": true, "error": error.to_string(), "counters": []});
            }
        };
        for listed in page.counters {
            let limits: Vec<Value> = listed
                .explained
                .limits
                .iter()
                .map(|limit| {
                    json!({"name": limit.name.as_deref(), "used": limit.used,
                           "remaining": limit.remaining, "capacity": limit.rate.capacity()})
                })
                .collect();
            let heat = listed
                .explained
                .limits
                .iter()
                .map(|limit| limit.used as f64 / limit.rate.capacity().max(1) as f64)
                .fold(0.0, f64::max);
            found.push((
                heat,
                json!({
                    "domain": domain.name(),
                    "entries": super::counters::entries_json(&listed.name),
                    "path": listed.explained.path.as_deref(),
                    "limits": limits,
                }),
            ));
        }
    }
    found.sort_by(|a, b| b.0.total_cmp(&a.0));
    found.truncate(HOT_KEYS);
    json!({"enabled": true, "counters": found.into_iter().map(|(_, value)| value).collect::<Vec<_>>()})
}

/// The ring's members and their health as this node sees it.
fn cluster(cluster: Option<&Runtime>) -> Value {
    let Some(cluster) = cluster else {
        return json!({"mode": "single", "members": [{"address": "this node", "me": true, "healthy": true}]});
    };
    let me = cluster.me();
    let (_, peers) = cluster.stats();
    let members: Vec<Value> = cluster
        .members()
        .iter()
        .map(|member| {
            if &**member == me {
                return json!({"address": &**member, "me": true, "healthy": true});
            }
            match peers.iter().find(|peer| peer.address() == member) {
                Some(peer) => json!({
                    "address": &**member,
                    "me": false,
                    "healthy": !peer.breaker.is_open(),
                    "forwarded": peer.stats.forwarded.load(Ordering::Relaxed),
                    "errors": peer.stats.errors.load(Ordering::Relaxed),
                }),
                None => json!({"address": &**member, "me": false, "healthy": false}),
            }
        })
        .collect();
    // Peers the failure detector took off the ring are listed too, down.
    let members: Vec<Value> = members
        .into_iter()
        .chain(cluster.peer_health().into_iter().filter(|(_, up)| !up).map(
            |(peer, _)| json!({"address": peer, "me": false, "healthy": false, "off_ring": true}),
        ))
        .collect();
    json!({"mode": "cluster", "me": me, "members": members})
}

fn reload(stats: &ReloadStats) -> Value {
    let last_error = stats
        .last_error()
        .map(|(at, errors)| json!({"at": at, "errors": errors}));
    json!({
        "checks": stats.checks.load(Ordering::Relaxed),
        "successes": stats.successes.load(Ordering::Relaxed),
        "failures": stats.failures.load(Ordering::Relaxed),
        "last_success": stats.last_success_unix_seconds.load(Ordering::Relaxed),
        "version": format!("{:016x}", stats.version.load(Ordering::Relaxed)),
        "last_error": last_error,
    })
}
