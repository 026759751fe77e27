//! The JSON form of `RateLimitRequest` and `RateLimitResponse` for `POST /json`, as the
//! reference service's endpoint speaks it (protobuf's JSON mapping: camelCase names, enum
//! names as strings, durations as `"12.5s"`; snake_case input names are accepted too).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::algorithm::Unit;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
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

/// Parses a request body; the error says what is wrong and where.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let parsed: JsonRequest =
        serde_json::from_slice(body).map_err(|error| format!("invalid request body: {error}"))?;
    let mut descriptors = Vec::with_capacity(parsed.descriptors.len());
    for (index, descriptor) in parsed.descriptors.into_iter().enumerate() {
        let limit = match descriptor.limit {
            None => None,
            Some(limit) => {
                let unit = Unit::parse(&limit.unit).ok_or_else(|| {
                    format!(
                        "descriptors[{index}].limit.unit: unknown unit {:?}",
                        limit.unit
                    )
                })?;
                Some(RateLimitOverride {
                    requests_per_unit: limit.requests_per_unit,
                    unit: unit.to_proto(),
                })
            }
        };
        descriptors.push(RateLimitDescriptor {
            entries: descriptor
                .entries
                .into_iter()
                .map(|entry| Entry {
                    key: entry.key,
                    value: entry.value,
                })
                .collect(),
            limit,
            hits_addend: descriptor.hits_addend.map(|value| UInt64Value { value }),
            ..Default::default()
        });
    }
    Ok(RateLimitRequest {
        domain: parsed.domain,
        descriptors,
        hits_addend: parsed.hits_addend,
    })
}

pub fn is_over_limit(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::OverLimit as i32
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |code| code.as_str_name())
}

fn unit_name(unit: i32) -> String {
    Unit::from_proto(unit).map_or_else(|| "UNKNOWN".to_owned(), |unit| unit.as_str().to_uppercase())
}

fn status(status: &DescriptorStatus) -> Value {
    let mut out = json!({
        "code": code_name(status.code),
        "limitRemaining": status.limit_remaining,
    });
    if let Some(limit) = &status.current_limit {
        let mut current = json!({
            "requestsPerUnit": limit.requests_per_unit,
            "unit": unit_name(limit.unit),
        });
        if !limit.name.is_empty() {
            current["name"] = json!(limit.name);
        }
        out["currentLimit"] = current;
    }
    if let Some(reset) = &status.duration_until_reset {
        let seconds = reset.seconds as f64 + f64::from(reset.nanos) / 1e9;
        out["durationUntilReset"] = json!(format!("{seconds}s"));
    }
    out
}

/// The JSON body answering a request.
pub fn response(response: &RateLimitResponse) -> Value {
    let mut out = json!({
        "overallCode": code_name(response.overall_code),
        "statuses": response.statuses.iter().map(status).collect::<Vec<_>>(),
    });
    if !response.response_headers_to_add.is_empty() {
        out["responseHeadersToAdd"] = response
            .response_headers_to_add
            .iter()
            .map(|header| json!({"key": header.key, "value": header.value}))
            .collect();
    }
    out
}
