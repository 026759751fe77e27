//! `GET /counters/{domain}?after=CURSOR&limit=N`: the live counters of a domain on this
//! node, in pages, when ratekeeper keeps counter names (`--counter-names N`; without it the
//! answer is 404 saying so).
//!
//! ```json
//! {"domain": "edge",
//!  "counters": [{"entries": [{"key": "api_key", "value": "k1"}], "path": "edge > api_key",
//!                "shard": 1, "limits": [{"name": "per_key", "used": 2, "remaining": 3, ...}]}],
//!  "next": "00f3a9c2e1b47d55",
//!  "names": {"kept": 812, "capacity": 10000, "dropped": 0}}
//! ```
//!
//! A counter is listed while it has something counted (its state is read as
//! `/debug/explain` reads it: cost 0, nothing consumed); `limits` has the same fields as
//! there. Pages follow the counters' route hashes: pass `next` as `after` for the next
//! page (`null`: the last page); a page may hold fewer than `limit` counters when some
//! recovered meanwhile. `limit` is 1 to 1000 (default 100). A page is sorted by use (the
//! largest share of a limit used first). Errors: 400 naming the parameter, 404 for an
//! unknown domain or when names are not kept, 503 when the store cannot answer.
//!
//! `?cluster=1` (cluster mode): the whole cluster's counters. This node asks every other
//! ring member for its names of the domain after the same cursor (peer call `Names`, at
//! most `limit` each, all at once, each within 2 s), merges them with its own (a counter
//! named on several nodes is listed once), reads each counter's state from its owner, and
//! answers the `limit` first routes like a local page, each counter with its `owner`, plus
//! `"cluster": {"members": [..], "missing": [{"member", "problem"}]}`: a member that did
//! not answer (or keeps no names, or whose counters' state could not be read) is reported
//! there, and the page is made of the others. `names` adds up every answering member's
//! figures. Outside cluster mode it is the local listing.
//!
//! `DELETE /counters/{domain}?descriptor=key=value,key=value`: forgets the counters of that
//! descriptor (every limit it matches) wherever they live: this node's engine, the key's
//! owner in cluster mode, or Redis. It needs no `--counter-names`. Keys and values are
//! percent-decoded after splitting on `,` and `=`, so `%2C` and `%3D` stand for a comma or
//! an equals sign inside them. Answer, 200:
//!
//! ```json
//! {"domain": "edge", "entries": [{"key": "api_key", "value": "k1"}],
//!  "path": "edge > api_key", "limits": ["per_key"], "removed": 1}
//! ```
//!
//! `removed` counts the counters that existed (0: nothing was counted yet). Errors: 400
//! naming the parameter, 404 for an unknown domain or a descriptor that matches no limit,
//! 503 when the store or the owner cannot answer.
//!
//! With `--admin-counters=false` both routes answer 404 saying so.

use std::sync::Arc;

use super::names::{self, CounterName, CounterNames, ListedCounter, MAX_PAGE, NamesFigures};
use crate::cluster::Runtime;
use crate::limiter::{Query, ResetOutcome};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use serde_json::{Value, json};

use super::explain::limit;
use crate::http::descriptor::percent_decode;
use crate::http::{PathParams, error};
use crate::limiter::Limiter;

/// Counters per page unless `limit` says otherwise.
const DEFAULT_PAGE: usize = 100;

#[derive(Clone)]
struct CountersState {
    limiter: Arc<Limiter>,
    names: Option<Arc<CounterNames>>,
    cluster: Option<Arc<Runtime>>,
}

/// `GET` and `DELETE /counters/{domain}`; with `enabled` false, both answer 404 saying so.
pub(super) fn route(
    limiter: Arc<Limiter>,
    names: Option<Arc<CounterNames>>,
    cluster: Option<Arc<Runtime>>,
    enabled: bool,
) -> MethodRouter {
    if !enabled {
        return get(off).delete(off);
    }
    get(list).delete(reset).with_state(CountersState {
        limiter,
        names,
        cluster,
    })
}

async fn off() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "the counters endpoints are off: ratekeeper runs with --admin-counters=false",
    )
}

async fn reset(
    State(CountersState { limiter, .. }): State<CountersState>,
    PathParams(domain): PathParams<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let entries = match reset_params(query.as_deref().unwrap_or_default()) {
        Ok(entries) => entries,
        Err(problem) => return error(StatusCode::BAD_REQUEST, &problem),
    };
    let mut query = Query::new(&domain);
    query.descriptor(
        entries
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str())),
        0,
    );
    let unknown = || error(StatusCode::NOT_FOUND, &format!("unknown domain {domain:?}"));
    match limiter.reset(&query).await {
        Ok(ResetOutcome::Reset {
            path,
            limits,
            removed,
        }) => {
            let entries: Vec<Value> = entries
                .iter()
                .map(|(key, value)| json!({"key": key, "value": value}))
                .collect();
            let limits: Vec<Option<&str>> = limits.iter().map(Option::as_deref).collect();
            let body = json!({
                "domain": domain,
                "entries": entries,
                "path": path.as_deref(),
                "limits": limits,
                "removed": removed,
            });
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Ok(ResetOutcome::UnknownDomain) => unknown(),
        Ok(ResetOutcome::NoLimit) => error(
            StatusCode::NOT_FOUND,
            &format!("descriptor: matches no limit with a counter in domain {domain:?}"),
        ),
        Err(failed) => error(failed.http_status(), &failed.to_string()),
    }
}

/// `descriptor=key=value,key=value`, exactly once, nothing else: the entries, decoded.
fn reset_params(query: &str) -> Result<Vec<(String, String)>, String> {
    let mut descriptor: Option<Vec<(String, String)>> = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "descriptor" if descriptor.is_none() => {
                descriptor = Some(crate::http::descriptor::parse(
                    raw.as_bytes(),
                    "descriptor",
                )?);
            }
            "descriptor" => return Err("descriptor: given more than once".to_owned()),
            _ => return Err(format!("unknown parameter {name:?} (expected descriptor)")),
        }
    }
    descriptor
        .ok_or_else(|| "descriptor: missing (expected descriptor=key=value,key=value)".to_owned())
}

const NOT_KEPT: &str =
    "counter names are not kept: start ratekeeper with --counter-names N to list counters";

async fn list(
    State(state): State<CountersState>,
    PathParams(domain): PathParams<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let params = match params(query.as_deref().unwrap_or_default()) {
        Ok(params) => params,
        Err(problem) => return error(StatusCode::BAD_REQUEST, &problem),
    };
    let limiter = &state.limiter;
    if limiter.limits().load().domain(&domain).is_none() {
        return error(StatusCode::NOT_FOUND, &format!("unknown domain {domain:?}"));
    }
    if params.cluster
        && let Some(cluster) = &state.cluster
    {
        return list_cluster(
            &state.limiter,
            state.names.as_deref(),
            cluster,
            &domain,
            &params,
        )
        .await;
    }
    let Some(names) = &state.names else {
        return error(StatusCode::NOT_FOUND, NOT_KEPT);
    };
    match names
        .counters(limiter, &domain, params.after, params.limit)
        .await
    {
        Ok(page) => {
            let body = render(&domain, &page.counters, page.next, page.figures);
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Err(failed) => error(failed.http_status(), &failed.to_string()),
    }
}

/// `?cluster=1`: this node's names and every other member's, merged, each counter's state
/// read from its owner.
async fn list_cluster(
    limiter: &Limiter,
    names: Option<&CounterNames>,
    cluster: &Runtime,
    domain: &str,
    params: &Params,
) -> Response {
    let me = cluster.me();
    let Some(names) = names else {
        return error(StatusCode::NOT_FOUND, NOT_KEPT);
    };
    let (mut named, mut more) = names.page(domain, params.after, params.limit);
    let mut figures = names.figures();
    let mut members = vec![json!(me)];
    let mut missing: Vec<(String, String)> = Vec::new();
    let answers = cluster
        .member_names(domain, params.after, params.limit)
        .await;
    for (member, answer) in answers {
        members.push(json!(&*member));
        match answer {
            Ok(page) => {
                more |= page.more;
                let count = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
                figures.kept = figures.kept.saturating_add(count(page.kept));
                figures.capacity = figures.capacity.saturating_add(count(page.capacity));
                figures.dropped = figures.dropped.saturating_add(page.dropped);
                named.extend(page.names.into_iter().map(|named| {
                    let name = CounterName {
                        domain: Box::from(domain),
                        entries: named.entries.into_boxed_slice(),
                    };
                    (named.route, Arc::new(name))
                }));
            }
            Err(why) => missing.push((member.to_string(), why.to_string())),
        }
    }
    let page = names::cluster_counters(limiter, named, more, params.limit).await;
    for (owner, why) in page.unanswered {
        let member = owner.as_deref().unwrap_or(me).to_owned();
        if !missing.iter().any(|(other, _)| *other == member) {
            missing.push((member, format!("its counters' state: {why}")));
        }
    }
    let mut body = render(domain, &page.counters, page.next, figures);
    body["cluster"] = json!({
        "members": members,
        "missing": missing
            .iter()
            .map(|(member, problem)| json!({"member": member, "problem": problem}))
            .collect::<Vec<_>>(),
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// A listing's query parameters.
#[derive(Debug, PartialEq, Eq)]
struct Params {
    after: Option<u64>,
    limit: usize,
    /// `cluster=1`: every member's counters.
    cluster: bool,
}

/// `after` (a cursor: 16 hex digits), `limit` and `cluster` (`1`/`true`, `0`/`false`),
/// each at most once, nothing else.
fn params(query: &str) -> Result<Params, String> {
    let (mut after, mut page_size, mut cluster) = (None, None, None);
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let text = String::from_utf8_lossy(&percent_decode(raw.as_bytes())).into_owned();
        match name {
            "after" if after.is_none() => {
                let cursor = u64::from_str_radix(&text, 16)
                    .ok()
                    .filter(|_| !text.is_empty() && text.len() <= 16)
                    .ok_or_else(|| {
                        format!("after: expected a cursor from `next` (hex digits), got {text:?}")
                    })?;
                after = Some(cursor);
            }
            "limit" if page_size.is_none() => {
                let size = text
                    .parse::<usize>()
                    .ok()
                    .filter(|size| (1..=MAX_PAGE).contains(size))
                    .ok_or_else(|| {
                        format!("limit: expected a whole number from 1 to {MAX_PAGE}, got {text:?}")
                    })?;
                page_size = Some(size);
            }
            "cluster" if cluster.is_none() => {
                cluster = Some(match text.as_str() {
                    "1" | "true" => true,
                    "0" | "false" => false,
                    _ => return Err(format!("cluster: expected 1 or 0, got {text:?}")),
                });
            }
            "after" | "limit" | "cluster" => {
                return Err(format!("{name}: given more than once"));
            }
            _ => {
                return Err(format!(
                    "unknown parameter {name:?} (expected after, limit or cluster)"
                ));
            }
        }
    }
    Ok(Params {
        after,
        limit: page_size.unwrap_or(DEFAULT_PAGE),
        cluster: cluster.unwrap_or(false),
    })
}

/// A counter's descriptor entries as `[{"key": .., "value": ..}]`.
pub(super) fn entries_json(name: &CounterName) -> Value {
    name.entries
        .iter()
        .map(|(key, value)| json!({"key": &**key, "value": &**value}))
        .collect()
}

fn render(
    domain: &str,
    counters: &[ListedCounter],
    next: Option<u64>,
    figures: NamesFigures,
) -> Value {
    let counters: Vec<Value> = counters
        .iter()
        .map(|listed| {
            let mut out = json!({
                "entries": entries_json(&listed.name),
                "path": listed.explained.path.as_deref(),
                "shadow": listed.explained.shadow,
                "limits": listed.explained.limits.iter().map(limit).collect::<Vec<_>>(),
            });
            if let Some(placement) = &listed.explained.placement {
                if let Some((shard, _)) = placement.shard {
                    out["shard"] = json!(shard);
                }
                if let Some(owner) = &placement.owner {
                    out["owner"] = json!(&**owner);
                }
            }
            out
        })
        .collect();
    json!({
        "domain": domain,
        "counters": counters,
        "next": next.map(|route| format!("{route:016x}")),
        "names": {
            "kept": figures.kept,
            "capacity": figures.capacity,
            "dropped": figures.dropped,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_names_its_bad_parameter() {
        let entries = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect()
        };
        assert_eq!(
            reset_params("descriptor=api_key=k1,path=%2Fv1%2Cx"),
            Ok(entries(&[("api_key", "k1"), ("path", "/v1,x")]))
        );
        assert_eq!(
            reset_params("descriptor=api_key="),
            Ok(entries(&[("api_key", "")]))
        );
        for (query, problem) in [
            ("", "descriptor: missing"),
            ("descriptor=api_key", "descriptor.entries[0]: no `=`"),
            ("descriptor=a=1,,b=2", "descriptor.entries[1]: empty entry"),
            (
                "descriptor==v",
                "descriptor.entries[0].key: must not be empty",
            ),
            (
                "descriptor=a=1&descriptor=a=2",
                "descriptor: given more than once",
            ),
            ("key=a", "unknown parameter \"key\""),
        ] {
            let error = reset_params(query).expect_err(query);
            assert!(error.starts_with(problem), "{query}: {error}");
        }
    }

    #[test]
    fn parameters_are_checked_and_named() {
        let expected = |after, limit, cluster| Params {
            after,
            limit,
            cluster,
        };
        assert_eq!(params(""), Ok(expected(None, DEFAULT_PAGE, false)));
        assert_eq!(
            params("after=00000000000000ff&limit=5"),
            Ok(expected(Some(255), 5, false))
        );
        assert_eq!(params("cluster=1&limit=7"), Ok(expected(None, 7, true)));
        assert_eq!(
            params("cluster=false"),
            Ok(expected(None, DEFAULT_PAGE, false))
        );
        for (query, problem) in [
            ("limit=0", "limit: expected a whole number from 1 to 1000"),
            (
                "limit=1001",
                "limit: expected a whole number from 1 to 1000",
            ),
            ("after=xyz", "after: expected a cursor"),
            ("after=", "after: expected a cursor"),
            ("after=1&after=2", "after: given more than once"),
            ("cluster=yes", "cluster: expected 1 or 0"),
            ("cluster=1&cluster=1", "cluster: given more than once"),
            ("page=2", "unknown parameter \"page\""),
        ] {
            let error = params(query).expect_err(query);
            assert!(error.starts_with(problem), "{query}: {error}");
        }
    }
}
