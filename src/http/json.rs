//! `POST /json`: the reference service's JSON form of `RateLimitRequest` and
//! `RateLimitResponse` (protobuf's JSON mapping: camelCase names, enum names as strings,
//! durations as `"12.5s"`; snake_case input names are accepted too). The body becomes a
//! limiter [`Query`] directly and the [`Verdict`] is rendered in the same shape Envoy's
//! response has.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::algorithm::Unit;
use crate::limiter::{LimitOverride, Limited, Query, Status, Verdict};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct JsonRequest {
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: Option<u64>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    /// Envoy 1.38's refunds: `hits_addend` is given back instead of taken.
    #[serde(default, alias = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(alias = "requestsPerUnit")]
    requests_per_unit: u32,
    unit: String,
}

/// A parsed body whose units are checked: [`ParsedRequest::query`] cannot fail.
pub(crate) struct ParsedRequest {
    request: JsonRequest,
    limits: Vec<Option<LimitOverride>>,
}

impl ParsedRequest {
    /// The limiter query (borrowing the body's strings).
    pub fn query(&self) -> Query<'_> {
        let request = &self.request;
        let request_cost = u64::from(request.hits_addend.max(1));
        let mut query = Query::new(&request.domain);
        query.hits_addend = request.hits_addend;
        for (descriptor, limit) in request.descriptors.iter().zip(&self.limits) {
            let entries = descriptor
                .entries
                .iter()
                .map(|entry| (entry.key.as_str(), entry.value.as_str()));
            let cost = descriptor.hits_addend.unwrap_or(request_cost);
            let added = query.descriptor(entries, cost);
            added.limit = *limit;
            added.hits_addend = descriptor.hits_addend;
            added.refund = descriptor.is_negative_hits;
        }
        query
    }
}

/// Parses a request body; the error says what is wrong and where (the field's path, like
/// `descriptors[0].entries[1].key`, when the problem is inside the body's structure).
pub(crate) fn parse_request(body: &[u8]) -> Result<ParsedRequest, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let request: JsonRequest =
        serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
            match error.path().to_string().as_str() {
                "." => format!("invalid request body: {}", error.inner()),
                path => format!("invalid request body: {path}: {}", error.inner()),
            }
        })?;
    deserializer
        .end()
        .map_err(|error| format!("invalid request body: {error}"))?;
    let mut limits = Vec::with_capacity(request.descriptors.len());
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        let limit = match &descriptor.limit {
            None => None,
            Some(limit) => {
                let unit = Unit::parse(&limit.unit).ok_or_else(|| {
                    format!(
                        "descriptors[{index}].limit.unit: unknown unit {:?}",
                        limit.unit
                    )
                })?;
                Some(LimitOverride {
                    requests_per_unit: limit.requests_per_unit,
                    unit,
                })
            }
        };
        limits.push(limit);
    }
    Ok(ParsedRequest { request, limits })
}

fn status(status: &Status) -> Value {
    match status {
        Status::NoLimit => json!({"code": "OK", "limitRemaining": 0}),
        Status::Unlimited => json!({"code": "OK", "limitRemaining": u32::MAX}),
        Status::Limited(limited) => limited_status(limited),
    }
}

fn limited_status(limited: &Limited) -> Value {
    let mut current = json!({
        "requestsPerUnit": limited.requests_per_unit,
        "unit": limited.unit.as_str().to_uppercase(),
    });
    if limited.multiplier != 1 {
        // The field Envoy's pending `RateLimit.unit_multiplier` gives it in proto JSON.
        current["unitMultiplier"] = json!(limited.multiplier);
    }
    if let Some(name) = limited.name.as_deref().filter(|name| !name.is_empty()) {
        current["name"] = json!(name);
    }
    let reset = limited.reset_after;
    let seconds = reset.as_secs() as f64 + f64::from(reset.subsec_nanos()) / 1e9;
    json!({
        "code": if limited.over { "OVER_LIMIT" } else { "OK" },
        "limitRemaining": limited.remaining,
        "currentLimit": current,
        "durationUntilReset": format!("{seconds}s"),
    })
}

/// The JSON body answering a request; `headers` (when any) become `responseHeadersToAdd`,
/// like the gRPC response carries them.
pub(super) fn response(verdict: &Verdict, headers: &[(&str, String)]) -> Value {
    let mut out = json!({
        "overallCode": if verdict.is_over() { "OVER_LIMIT" } else { "OK" },
        "statuses": verdict.statuses.iter().map(status).collect::<Vec<_>>(),
    });
    if !headers.is_empty() {
        out["responseHeadersToAdd"] = headers
            .iter()
            .map(|(key, value)| json!({"key": key, "value": value}))
            .collect();
    }
    out
}
