//! `POST /debug/explain`: what each descriptor of a `/json` request would meet, consuming
//! nothing, and the `ratekeeper explain` command that asks for it ([`client`]).
//!
//! The body is exactly `/json`'s (same parsing, same bounds, 400 naming the field). The
//! answer, always 200 when the request is valid:
//!
//! ```json
//! {"domain": "edge", "domain_found": true, "descriptors": [{
//!   "entries": [{"key": "api_key", "value": "k1"}], "hits": 1,
//!   "match": "limited", "reason": "matched edge > api_key", "path": "edge > api_key",
//!   "shadow": false, "would_reject": false, "retry_after_ms": null, "replaced": [],
//!   "shard": 3, "shards": 8, "owner": "10.0.0.2:8091", "local": false,
//!   "limits": [{"name": "per_key", "requests_per_unit": 5, "unit": "minute",
//!               "algorithm": "fixed_window", "burst": 5, "used": 2, "remaining": 3,
//!               "reset_after_ms": 41200, "would_reject": false, "retry_after_ms": null,
//!               "max_wait_ms": null,
//!               "keys": {"live": 1834, "budget": 2000000, "refused": 0}}]}]}
//! ```
//!
//! `keys` is the limit's rule on this node: its live keys, its key budget (`max_keys`, or
//! its share of `--max-keys`) and the requests refused because it held its budget; `null`
//! with a store that keeps no budgets (Redis).
//!
//! `retry_after_ms` (a limit's, and the descriptor's: the longest of its rejecting limits)
//! is, when the hits would be rejected now, how long until they would be admitted if nothing
//! else were counted meanwhile; `null` when they would pass now, and when they never can
//! (more hits than the limit's capacity, or a limit of 0).
//!
//! `match` is one of `unknown_domain`, `no_match`, `allow_listed`, `replaced`, `unlimited`,
//! `limited`, `request_limit`; `replaced` lists `{"limit", "by", "at"}` for the limits
//! another descriptor's `replaces` dropped. `shard`/`shards` are present when this node
//! holds the counters, `owner` in cluster mode. A descriptor that is also an RLQS bucket of
//! this node (its entries, ordered by key) gets `rlqs`: `{"reporters": [{"stream",
//! "demand", "share"}]}`, the Envoy streams reporting it with their demand and share per
//! unit. Errors: 400 for a bad body or request, 503 when the store or the key's owner
//! cannot answer.

pub mod client;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::http::{error, error_response, json};
use crate::limiter::{DescriptorExplanation, Explanation, LimitState, Matched, Query};

/// Answers `POST /debug/explain`: the `/json` request in `body`, explained without consuming.
pub(super) async fn explain(
    limiter: &crate::limiter::Limiter,
    rlqs: Option<&crate::quota::Hub>,
    body: &[u8],
) -> Response {
    let request = match json::parse_request(body) {
        Ok(request) => request,
        Err(problem) => return error(StatusCode::BAD_REQUEST, &problem),
    };
    let query = request.query();
    match limiter.explain(&query).await {
        Ok(explanation) => {
            let mut answer = render(&query, &explanation);
            if let Some(hub) = rlqs {
                add_rlqs(&mut answer, &query, hub);
            }
            (StatusCode::OK, axum::Json(answer)).into_response()
        }
        Err(failed) => error_response(&failed),
    }
}

/// Adds `rlqs` to each descriptor of `answer` that is a bucket `hub` holds.
fn add_rlqs(answer: &mut Value, query: &Query<'_>, hub: &crate::quota::Hub) {
    let Some(descriptors) = answer.get_mut("descriptors").and_then(Value::as_array_mut) else {
        return;
    };
    for (out, descriptor) in descriptors.iter_mut().zip(&query.descriptors) {
        let bucket = crate::quota::bucket_key(descriptor.entries.iter().copied());
        let reporters = hub.reporters(query.domain, &bucket);
        if !reporters.is_empty() {
            out["rlqs"] = json!({ "reporters": reporters });
        }
    }
}

/// The JSON answer for `query`'s explanation.
fn render(query: &Query<'_>, explanation: &Explanation) -> Value {
    let descriptors: Vec<Value> = query
        .descriptors
        .iter()
        .zip(&explanation.descriptors)
        .map(|(descriptor, explained)| {
            let entries: Vec<Value> = descriptor
                .entries
                .iter()
                .map(|(key, value)| json!({"key": key, "value": value}))
                .collect();
            let mut out = json!({
                "entries": entries,
                "hits": explained.cost,
                "match": explained.matched.as_str(),
                "reason": reason(query.domain, explained),
                "path": explained.path.as_deref(),
                "shadow": explained.shadow,
                "would_reject": explained.would_reject(),
                "retry_after_ms": explained.retry_after().map(millis),
                "replaced": explained.replaced.iter().map(|replaced| json!({
                    "limit": &*replaced.limit,
                    "by": replaced.by.as_deref(),
                    "at": &*replaced.at,
                })).collect::<Vec<_>>(),
                "limits": explained.limits.iter().map(limit).collect::<Vec<_>>(),
            });
            if let Some(placement) = &explained.placement {
                if let Some((shard, shards)) = placement.shard {
                    out["shard"] = json!(shard);
                    out["shards"] = json!(shards);
                }
                if let Some(owner) = &placement.owner {
                    out["owner"] = json!(&**owner);
                }
                out["local"] = json!(placement.local);
            }
            out
        })
        .collect();
    json!({
        "domain": query.domain,
        "domain_found": explanation.domain_found,
        "descriptors": descriptors,
    })
}

pub(super) fn limit(state: &LimitState) -> Value {
    let mut out = json!({
        "name": state.name.as_deref(),
        "requests_per_unit": state.rate.requests_per_unit,
        "unit": state.rate.unit.as_str(),
        "algorithm": state.rate.algorithm.as_str(),
        "burst": state.rate.burst,
        "used": state.used,
        "remaining": state.remaining,
        "reset_after_ms": millis(state.reset_after),
        "would_reject": state.rejects,
        "retry_after_ms": state.retry_after.map(millis),
        "max_wait_ms": state.max_wait.map(millis),
        "keys": state.keys.map(|keys| json!({
            "live": keys.live,
            "budget": keys.budget,
            "refused": keys.refused,
        })),
    });
    if state.rate.multiplier != 1 {
        out["unit_multiplier"] = json!(state.rate.multiplier);
    }
    out
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One line saying why the descriptor is limited or not.
fn reason(domain: &str, explained: &DescriptorExplanation) -> String {
    let path = explained.path.as_deref().unwrap_or("?");
    match explained.matched {
        Matched::UnknownDomain => format!("no limits are configured for domain {domain:?}"),
        Matched::NoMatch => "no configured entry matches these entries".to_owned(),
        Matched::AllowListed => format!("matched {path}, which has no limit (allow-listed)"),
        Matched::Unlimited => format!("matched {path}, which is unlimited"),
        Matched::Replaced => {
            let by: Vec<String> = explained
                .replaced
                .iter()
                .map(|replaced| match &replaced.by {
                    Some(name) => format!("{name} at {}", replaced.at),
                    None => format!("the limit at {}", replaced.at),
                })
                .collect();
            format!(
                "matched {path}, but its limits are replaced by {}",
                by.join(", ")
            )
        }
        Matched::Limited if explained.shadow => format!("matched {path} (shadow mode)"),
        Matched::Limited => format!("matched {path}"),
        Matched::RequestLimit => "the request's own limit applies".to_owned(),
    }
}
