//! `/nginx/{domain}`: the rate limit check as nginx's `auth_request` subrequest needs it
//! (nginx has no Envoy RLS client). Any method is accepted, since a subrequest inherits the
//! method of the request it checks.
//!
//! The request: each `X-Ratelimit-Descriptor` header is one descriptor, in header order; its
//! value is a comma-separated list of `key=value` entries, in order. Keys and values are
//! percent-decoded (`%2C` for a comma, `%3D` for `=`, `%25` for `%`; a `%` not followed by
//! two hex digits stays as it is, `+` stays `+`), after spaces and tabs around each entry
//! are trimmed. An entry with an empty value drops its descriptor, like Envoy drops a
//! descriptor whose header is missing, so `api_key=$http_x_api_key` does not limit requests
//! without the header; no descriptor left (or none sent) means nothing to limit: allowed.
//! An optional `X-Ratelimit-Hits: N` (0 to 4294967295) counts every descriptor N times (0
//! checks without consuming). Bounds: 64 descriptor headers, 32 entries each, and the key
//! and value lengths of [`bounds`].
//!
//! The answer, for `auth_request` (which passes 2xx, 401 and 403 and turns anything else
//! into a 500): 204 when allowed, 403 when over the limit, both with `RateLimit-Limit`,
//! `RateLimit-Remaining` and `RateLimit-Reset` of the tightest descriptor when a limit
//! applied, and `Retry-After` on a 403; 400 for a malformed subrequest (a configuration
//! error; nginx logs `auth request unexpected status: 400` and answers 500, or whatever its
//! `error_page 500` says); 503 when overloaded. `examples/nginx/nginx.conf` maps the 403 to
//! a 429 and fails open on the rest.
//!
//! Invariants: the check goes through [`Limiter::decide`] like gRPC (same matching,
//! counters, metrics); a malformed subrequest never reaches the limiter and never
//! panics; header bytes that are not UTF-8 are decoded lossily, never rejected, so client
//! data copied into a value cannot turn into an error.

use std::sync::Arc;

use super::descriptor;
use super::rate::rate_limit_headers;
use crate::limiter::{Limiter, Query, bounds};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any};

/// One descriptor per header line.
pub(super) const DESCRIPTOR_HEADER: &str = "x-ratelimit-descriptor";
/// Hits per descriptor (default 1).
pub(super) const HITS_HEADER: &str = "x-ratelimit-hits";

/// The route, with its own state.
pub(super) fn route(limiter: Arc<Limiter>) -> MethodRouter {
    any(check).with_state(limiter)
}

async fn check(
    State(limiter): State<Arc<Limiter>>,
    domain: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let parsed = domain
        .map_err(|rejection| rejection.body_text())
        .and_then(|Path(domain)| parse_request(domain, &headers));
    let request = match parsed {
        Ok(Some(request)) => request,
        Ok(None) => return StatusCode::NO_CONTENT.into_response(),
        Err(problem) => {
            tracing::debug!(%problem, "malformed nginx subrequest");
            return text(StatusCode::BAD_REQUEST, problem);
        }
    };
    match limiter.decide(&request.query()).await {
        Ok(verdict) => {
            let headers = rate_limit_headers(&verdict, limiter.options());
            if verdict.is_over() {
                (StatusCode::FORBIDDEN, headers, "over limit\n").into_response()
            } else {
                (StatusCode::NO_CONTENT, headers).into_response()
            }
        }
        Err(failed) => text(failed.http_status(), failed.to_string()),
    }
}

fn text(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message + "\n",
    )
        .into_response()
}

/// What one subrequest asks, decoded from its headers.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Subrequest {
    pub domain: String,
    /// Each descriptor's entries, `(key, value)`, in header order.
    pub descriptors: Vec<Vec<(String, String)>>,
    /// `X-Ratelimit-Hits`, if sent: hits per descriptor.
    pub hits: Option<u64>,
}

impl Subrequest {
    /// The limiter query (borrowing the decoded strings).
    pub fn query(&self) -> Query<'_> {
        let mut query = Query::new(&self.domain);
        for entries in &self.descriptors {
            let entries = entries
                .iter()
                .map(|(key, value)| (key.as_str(), value.as_str()));
            query.descriptor(entries, self.hits.unwrap_or(1));
        }
        query
    }
}

/// The request a subrequest asks for: `None` when no descriptor is left to check; the error
/// names the header and entry at fault.
pub(super) fn parse_request(
    domain: String,
    headers: &HeaderMap,
) -> Result<Option<Subrequest>, String> {
    let hits = parse_hits(headers)?;
    let lines = headers.get_all(DESCRIPTOR_HEADER);
    let count = lines.iter().count();
    if count > bounds::MAX_DESCRIPTORS {
        return Err(format!(
            "{DESCRIPTOR_HEADER}: {count} headers, at most {} allowed",
            bounds::MAX_DESCRIPTORS
        ));
    }
    let mut descriptors = Vec::with_capacity(count);
    for (index, line) in lines.iter().enumerate() {
        if let Some(entries) = parse_descriptor(line.as_bytes(), index)? {
            descriptors.push(entries);
        }
    }
    if descriptors.is_empty() {
        return Ok(None);
    }
    Ok(Some(Subrequest {
        domain,
        descriptors,
        hits,
    }))
}

/// `X-Ratelimit-Hits`, if sent (at most once).
fn parse_hits(headers: &HeaderMap) -> Result<Option<u64>, String> {
    let mut values = headers.get_all(HITS_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("{HITS_HEADER}: sent more than once"));
    }
    let text = String::from_utf8_lossy(value.as_bytes());
    text.trim()
        .parse::<u32>()
        .map(|hits| Some(u64::from(hits)))
        .map_err(|_| {
            format!(
                "{HITS_HEADER}: expected a whole number from 0 to {}, got {text:?}",
                u32::MAX
            )
        })
}

/// One descriptor header's entries ([`descriptor::parse`]); `None` when an entry's value
/// is empty (the descriptor is dropped). The whole header is checked either way.
pub(super) fn parse_descriptor(
    raw: &[u8],
    index: usize,
) -> Result<Option<Vec<(String, String)>>, String> {
    let entries = descriptor::parse(raw, &format!("{DESCRIPTOR_HEADER}[{index}]"))?;
    let complete = entries.iter().all(|(_, value)| !value.is_empty());
    Ok(complete.then_some(entries))
}

#[cfg(test)]
mod tests;
