//! The direct HTTP API for services not behind Envoy: `POST /rate/{domain}/{name}` and
//! `POST /rate/{domain}/{name}/{value}` check and consume one configured limit, found by its
//! `name` (`rate_limit.name`), and the `RateLimit-*` / `Retry-After` headers that the HTTP
//! front ends (this API and `/nginx`) derive from the limiter's `Verdict`.
//!
//! A call becomes a query of one descriptor: the entries along the named limit's configured path,
//! with the configured value of each entry and the call's `value` on the last entry when that
//! entry is a default (no `value`) or wildcard one. That descriptor goes through
//! [`Limiter::decide`](crate::limiter::Limiter::decide), so it is validated, matched, counted, metered (and
//! forwarded in cluster mode) exactly like the same descriptor over gRPC: an exact or
//! wildcard entry for the value wins over the default, so a value that is allow-listed is
//! allowed with no limit. The answer reports the limit the status reports (with several
//! limits on one descriptor, the one closest to exhaustion), which is not always `name`.
//!
//! Parameters (query string): `hits` (0 to 4294967295, default 1; 0 consumes nothing and
//! reports the state, always allowed) and `wait` (`0`, `250ms`, `2s`; default the limit's
//! `max_wait`; never longer than it, so a limit without `max_wait` never waits). Answers:
//! 200 allowed or 429 denied, both with the JSON
//! `{"allowed", "limit", "remaining", "reset_after_ms", "retry_after_ms", "name"}` and
//! `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (plus `Retry-After` when
//! denied); 404 for an unknown domain or limit name; 400 for bad parameters or a limit this
//! API cannot address; 503 when overloaded. Errors are `{"error": "..."}`.
//!
//! Invariants:
//! - Only limits whose path has at most one entry without a fixed value, and that one
//!   last, are addressable (the others need several values: use `POST /json`); a name used
//!   on several descriptors of a domain is refused as ambiguous, never guessed.
//! - The name index is built once per limits snapshot (the first call after a reload), so a
//!   call costs two hash lookups, not a walk of the tree.
//! - `Retry-After` and `retry_after_ms` are exactly when the same call would pass (from the
//!   store's decision), absent when it never can.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use serde_json::json;

use super::descriptor::percent_decode;
use super::{PathParams, error};
use crate::algorithm::NANOS_PER_SEC;
use crate::limiter::{Limiter, LimiterOptions, Query, Verdict, bounds};
use crate::limits::{Domain, Limits, Step, Steps, parse_duration};

const NANOS_PER_MILLI: u64 = 1_000_000;

/// The two routes of this API (`/rate/{domain}/{name}` and `.../{value}`), sharing their
/// state.
pub(super) fn routes(limiter: Arc<Limiter>) -> (MethodRouter, MethodRouter) {
    let state = RateState {
        limiter,
        index: Arc::new(ArcSwapOption::empty()),
    };
    (
        post(rate_fixed).with_state(state.clone()),
        post(rate_valued).with_state(state),
    )
}

#[derive(Clone)]
struct RateState {
    limiter: Arc<Limiter>,
    /// The name index of the latest limits snapshot seen.
    index: Arc<ArcSwapOption<NameIndex>>,
}

impl RateState {
    /// The index for `snapshot`, building it on the first call after a reload (racing calls
    /// may both build; the result is the same).
    fn index_for(&self, snapshot: &Arc<Limits>) -> Arc<NameIndex> {
        if let Some(index) = self.index.load_full()
            && index.is_for(snapshot)
        {
            return index;
        }
        let fresh = Arc::new(NameIndex::build(snapshot));
        self.index.store(Some(Arc::clone(&fresh)));
        fresh
    }
}

async fn rate_fixed(
    State(state): State<RateState>,
    PathParams((domain, name)): PathParams<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    check(&state, &domain, &name, None, query.as_deref()).await
}

async fn rate_valued(
    State(state): State<RateState>,
    PathParams((domain, name, value)): PathParams<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    check(&state, &domain, &name, Some(value), query.as_deref()).await
}

async fn check(
    state: &RateState,
    domain: &str,
    name: &str,
    value: Option<String>,
    query: Option<&str>,
) -> Response {
    let params = match Params::parse(query.unwrap_or_default()) {
        Ok(params) => params,
        Err(problem) => return error(StatusCode::BAD_REQUEST, &problem),
    };
    let snapshot = state.limiter.limits().load_full();
    if snapshot.domain(domain).is_none() {
        return error(StatusCode::NOT_FOUND, &format!("unknown domain {domain:?}"));
    }
    let index = state.index_for(&snapshot);
    let Some(target) = index.get(domain, name) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("domain {domain:?} has no limit named {name:?}"),
        );
    };
    let entries = match target.entries(name, value) {
        Ok(entries) => entries,
        Err(problem) => return error(StatusCode::BAD_REQUEST, &problem),
    };
    let mut query = Query::new(domain);
    query.descriptor(
        entries.iter().map(|(key, value)| (&**key, value.as_str())),
        params.hits,
    );
    query.max_wait = params.wait;
    match state.limiter.decide(&query).await {
        Ok(verdict) => answer(&verdict, state.limiter.options()),
        Err(failed) => error(failed.http_status(), &failed.to_string()),
    }
}

/// The 200/429 answer for the call's single descriptor.
fn answer(verdict: &Verdict, options: &LimiterOptions) -> Response {
    let over = verdict.is_over();
    let limited = verdict.statuses.first().and_then(|status| status.limited());
    let retry_after = if over { verdict.retry_after() } else { None };
    let body = json!({
        "allowed": !over,
        "limit": limited.map(|limited| limited.requests_per_unit),
        "remaining": limited.map(|limited| limited.remaining),
        "reset_after_ms": limited.map(|limited| millis(limited.reset_after)),
        "retry_after_ms": retry_after.map(millis),
        "name": limited
            .and_then(|limited| limited.name.as_deref())
            .filter(|name| !name.is_empty()),
    });
    let code = if over {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    (code, rate_limit_headers(verdict, options), axum::Json(body)).into_response()
}

// ---------------------------------------------------------------------------------------
// Parameters

/// The query parameters of one call.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Params {
    /// Hits to count (0: only report).
    pub hits: u64,
    /// The caller's bound on waiting; `None` keeps the limit's `max_wait`.
    pub wait: Option<Duration>,
}

impl Params {
    /// Parses `hits=N&wait=D` (both optional, each at most once, nothing else); the error
    /// names the parameter.
    pub fn parse(query: &str) -> Result<Params, String> {
        let mut hits = None;
        let mut wait = None;
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
            let name = String::from_utf8_lossy(&percent_decode(name.as_bytes())).into_owned();
            let text = String::from_utf8_lossy(&percent_decode(raw.as_bytes())).into_owned();
            let slot = match name.as_str() {
                "hits" => &mut hits,
                "wait" => &mut wait,
                _ => {
                    return Err(format!(
                        "unknown parameter {name:?} (expected hits or wait)"
                    ));
                }
            };
            if slot.is_some() {
                return Err(format!("{name}: given more than once"));
            }
            *slot = Some(text);
        }
        let hits = match hits {
            None => 1,
            Some(text) => text.parse::<u32>().map(u64::from).map_err(|_| {
                format!(
                    "hits: expected a whole number from 0 to {}, got {text:?}",
                    u32::MAX
                )
            })?,
        };
        let wait = match wait {
            None => None,
            Some(text) => Some(parse_wait(&text).ok_or_else(|| {
                format!("wait: expected a duration like 0, 250ms or 2s, got {text:?}")
            })?),
        };
        Ok(Params { hits, wait })
    }
}

/// `0` or a duration in `ns`, `us`, `ms` or `s`, as `max_wait` is written.
fn parse_wait(text: &str) -> Option<Duration> {
    if text == "0" {
        Some(Duration::ZERO)
    } else {
        parse_duration(text)
    }
}

// ---------------------------------------------------------------------------------------
// Limits by name

/// What `/rate/{domain}/{name}` turns into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// Every entry has a configured value: the call takes no value.
    Fixed {
        path: Box<str>,
        entries: Vec<(Box<str>, Box<str>)>,
    },
    /// The last entry (`key`) takes the call's value; the `prefix` entries are configured.
    Valued {
        path: Box<str>,
        prefix: Vec<(Box<str>, Box<str>)>,
        key: Box<str>,
    },
    /// A name this API cannot address, and why.
    Unaddressable(String),
}

impl Target {
    /// Resolves the limit on the node at `path` (its `Node::path`), reached by `steps`.
    pub fn resolve(path: &str, steps: &[(Box<str>, Step)]) -> Target {
        let open = steps
            .iter()
            .filter(|(_, step)| !matches!(step, Step::Exact(_)))
            .count();
        let fixed = |steps: &[(Box<str>, Step)]| -> Vec<(Box<str>, Box<str>)> {
            steps
                .iter()
                .filter_map(|(key, step)| match step {
                    Step::Exact(value) => Some((key.clone(), value.clone())),
                    Step::Wildcard(_) | Step::Default => None,
                })
                .collect()
        };
        match steps.split_last() {
            Some(_) if open == 0 => Target::Fixed {
                path: path.into(),
                entries: fixed(steps),
            },
            Some(((key, Step::Wildcard(_) | Step::Default), prefix)) if open == 1 => {
                Target::Valued {
                    path: path.into(),
                    prefix: fixed(prefix),
                    key: key.clone(),
                }
            }
            _ => Target::Unaddressable(format!(
                "its descriptor ({path}) has {open} entries without a fixed value and /rate \
                 can fill only the last one; use POST /json"
            )),
        }
    }

    /// The request entries for a call with `value`; the error says what to call instead.
    fn entries(
        &self,
        name: &str,
        value: Option<String>,
    ) -> Result<Vec<(Box<str>, String)>, String> {
        let entry = |(key, value): &(Box<str>, Box<str>)| (key.clone(), value.to_string());
        match (self, value) {
            (Target::Fixed { entries, .. }, None) => Ok(entries.iter().map(entry).collect()),
            (Target::Fixed { path, .. }, Some(_)) => Err(format!(
                "limit {name:?} ({path}) has a fixed descriptor: call it without a value"
            )),
            (Target::Valued { path, .. }, None) => Err(format!(
                "limit {name:?} ({path}) needs a value: POST /rate/<domain>/{name}/<value>"
            )),
            (Target::Valued { prefix, key, .. }, Some(value)) => {
                if value.len() > bounds::MAX_VALUE_LEN {
                    return Err(format!(
                        "value: {} bytes, at most {} allowed",
                        value.len(),
                        bounds::MAX_VALUE_LEN
                    ));
                }
                let mut entries: Vec<(Box<str>, String)> = prefix.iter().map(entry).collect();
                entries.push((key.clone(), value));
                Ok(entries)
            }
            (Target::Unaddressable(why), _) => {
                Err(format!("limit {name:?} cannot be used with /rate: {why}"))
            }
        }
    }
}

/// Every named limit of one limits snapshot, by domain and name.
#[derive(Debug)]
pub(super) struct NameIndex {
    /// The snapshot this index describes (weak: an old snapshot's tree is not kept alive).
    limits: Weak<Limits>,
    domains: HashMap<Box<str>, HashMap<Box<str>, Target>>,
}

impl NameIndex {
    pub fn build(limits: &Arc<Limits>) -> NameIndex {
        let domains = limits
            .domains()
            .map(|domain| (Box::from(domain.name()), named_targets(domain)))
            .collect();
        NameIndex {
            limits: Arc::downgrade(limits),
            domains,
        }
    }

    fn is_for(&self, limits: &Arc<Limits>) -> bool {
        std::ptr::eq(self.limits.as_ptr(), Arc::as_ptr(limits))
    }

    pub fn get(&self, domain: &str, name: &str) -> Option<&Target> {
        self.domains.get(domain)?.get(name)
    }
}

/// The target of every limit name in `domain`.
fn named_targets(domain: &Domain) -> HashMap<Box<str>, Target> {
    // name -> the nodes carrying it, with the steps leading to each.
    let mut found: HashMap<&str, Vec<(&str, Steps)>> = HashMap::new();
    for (steps, node) in domain.entries() {
        let mut names: Vec<&str> = node
            .limits
            .iter()
            .filter_map(|limit| limit.name.as_deref())
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            found
                .entry(name)
                .or_default()
                .push((&node.path, steps.clone()));
        }
    }
    found
        .into_iter()
        .map(|(name, mut nodes)| {
            let target = match nodes.as_slice() {
                [(path, steps)] => Target::resolve(path, steps),
                _ => {
                    nodes.sort_unstable_by(|a, b| a.0.cmp(b.0));
                    let paths: Vec<&str> = nodes.iter().map(|(path, _)| *path).collect();
                    Target::Unaddressable(format!(
                        "the name is on {} descriptors ({}); give each limit its own name",
                        paths.len(),
                        paths.join(", ")
                    ))
                }
            };
            (Box::from(name), target)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Headers

/// The rate limit headers in the configured style (`RateLimit-Limit`, `RateLimit-Remaining`,
/// `RateLimit-Reset` of the tightest descriptor, or the IETF draft's `RateLimit-Policy` and
/// `RateLimit`), plus `Retry-After` (seconds, rounded up) when the verdict is over the limit
/// and the request can pass later: the headers of both HTTP front ends.
pub(super) fn rate_limit_headers(verdict: &Verdict, options: &LimiterOptions) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in verdict.headers(options.header_style, &options.header_names) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.insert(name, value);
        }
    }
    if verdict.is_over()
        && let Some(wait) = verdict.retry_after()
    {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds(wait)));
    }
    headers
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Whole seconds, rounded up.
fn seconds(duration: Duration) -> u64 {
    nanos(duration).div_ceil(NANOS_PER_SEC)
}

/// Whole milliseconds, rounded up.
fn millis(duration: Duration) -> u64 {
    nanos(duration).div_ceil(NANOS_PER_MILLI)
}

#[cfg(test)]
mod tests;
