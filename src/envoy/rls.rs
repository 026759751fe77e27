//! The Envoy adapter: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
//!
//! The only module that knows Envoy's rate limit protobufs. It checks what only the proto
//! can get wrong (an unknown unit), turns a `RateLimitRequest` into a
//! [`Query`] (borrowing its strings), asks the [`Limiter`], and renders the [`Verdict`] as a
//! `RateLimitResponse` (one `DescriptorStatus` per descriptor, `RateLimit-*` headers and
//! dynamic metadata when enabled); errors become a `Status` through their
//! [`ErrorKind`](crate::error::ErrorKind).

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{
    Duration as ProtoDuration, ListValue, NullValue, Struct, Value,
};

use prost::Message;
use smallvec::SmallVec;

use crate::algorithm::Unit;
use crate::error::Error;
use crate::limiter::{LimitOverride, Limited, Limiter, Query, Status, Verdict};

/// The largest encoded `RateLimitRequest` accepted, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// Decides one `RateLimitRequest`.
pub async fn should_rate_limit(
    limiter: &Limiter,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, Error> {
    decide(limiter, request).await.map(|answer| answer.response)
}

/// A `ShouldRateLimit` answer, with what Envoy's message has no field for yet.
#[derive(Debug)]
pub struct Answer {
    pub response: RateLimitResponse,
    /// With `--unit-multiplier-field`, each status's `unit_multiplier` (1: none), sent as
    /// Envoy's pending `RateLimitResponse.RateLimit.unit_multiplier` (field 4, a
    /// `UInt32Value`; envoyproxy/envoy#47307) by [`Answer::encode`]; empty otherwise.
    pub multipliers: SmallVec<[u32; 4]>,
}

impl Answer {
    /// Appends the response's protobuf encoding to `buf`: the response itself, and each
    /// status with a `unit_multiplier` followed by a second `current_limit` holding only
    /// field 4, which protobuf merges into the first (a parser that does not know field 4,
    /// Envoy 1.40's, skips it).
    pub fn encode(mut self, buf: &mut Vec<u8>) {
        use prost::encoding::{WireType, encode_key, encode_varint};
        if self.multipliers.iter().all(|multiplier| *multiplier == 1) {
            self.response.encode(buf).expect("a Vec grows as needed");
            return;
        }
        let statuses = std::mem::take(&mut self.response.statuses);
        self.response.encode(buf).expect("a Vec grows as needed");
        for (index, status) in statuses.iter().enumerate() {
            let mut extra = Vec::new();
            let multiplier = self.multipliers.get(index).copied().unwrap_or(1);
            if multiplier != 1 {
                // RateLimit { unit_multiplier (4): UInt32Value { value (1): multiplier } }
                let mut value = Vec::new();
                encode_key(1, WireType::Varint, &mut value);
                encode_varint(u64::from(multiplier), &mut value);
                let mut limit = Vec::new();
                encode_key(4, WireType::LengthDelimited, &mut limit);
                encode_varint(value.len() as u64, &mut limit);
                limit.extend_from_slice(&value);
                // DescriptorStatus { current_limit (2): that }
                encode_key(2, WireType::LengthDelimited, &mut extra);
                encode_varint(limit.len() as u64, &mut extra);
                extra.extend_from_slice(&limit);
            }
            // RateLimitResponse { statuses (2): status, then the extra field }
            encode_key(2, WireType::LengthDelimited, buf);
            encode_varint((status.encoded_len() + extra.len()) as u64, buf);
            status.encode(buf).expect("a Vec grows as needed");
            buf.extend_from_slice(&extra);
        }
    }
}

/// Decides one `RateLimitRequest` into an [`Answer`].
async fn decide(limiter: &Limiter, request: &RateLimitRequest) -> Result<Answer, Error> {
    let query = query(request).map_err(|error| limiter.refuse(error))?;
    let verdict = limiter.decide(&query).await?;
    let options = limiter.options();
    let headers = if options.response_headers {
        verdict.headers(options.header_style, &options.header_names)
    } else {
        Default::default()
    };
    let mut response = response(&verdict, &headers);
    if options.response_dynamic_metadata {
        response.dynamic_metadata = Some(dynamic_metadata(&query, &verdict));
    }
    let multipliers = if options.unit_multiplier_field {
        verdict
            .statuses
            .iter()
            .map(|status| status.limited().map_or(1, |limited| limited.multiplier))
            .collect()
    } else {
        SmallVec::new()
    };
    Ok(Answer {
        response,
        multipliers,
    })
}

/// The response's dynamic metadata (`--response-dynamic-metadata`) as a protobuf `Struct`:
/// what [`limiter::dynamic_metadata`](crate::limiter::dynamic_metadata) builds for both
/// front ends.
pub fn dynamic_metadata(query: &Query<'_>, verdict: &Verdict) -> Struct {
    let fields = crate::limiter::dynamic_metadata(query, verdict)
        .iter()
        .map(|(name, item)| (name.clone(), json_value(item)))
        .collect();
    Struct { fields }
}

fn value(kind: Kind) -> Value {
    Value { kind: Some(kind) }
}

fn string(text: &str) -> Value {
    value(Kind::StringValue(text.to_owned()))
}

fn number(number: f64) -> Value {
    value(Kind::NumberValue(number))
}

fn list(values: Vec<Value>) -> Value {
    value(Kind::ListValue(ListValue { values }))
}

fn structure(fields: HashMap<String, Value>) -> Value {
    value(Kind::StructValue(Struct { fields }))
}

/// A configured `metadata` value as a protobuf `Value` (numbers become doubles).
fn json_value(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => value(Kind::NullValue(NullValue::NullValue as i32)),
        serde_json::Value::Bool(flag) => value(Kind::BoolValue(*flag)),
        serde_json::Value::Number(n) => number(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(text) => string(text),
        serde_json::Value::Array(items) => list(items.iter().map(json_value).collect()),
        serde_json::Value::Object(map) => structure(
            map.iter()
                .map(|(name, item)| (name.clone(), json_value(item)))
                .collect(),
        ),
    }
}

/// The query a request asks; the error names the proto field at fault.
pub fn query(request: &RateLimitRequest) -> Result<Query<'_>, Error> {
    let request_cost = u64::from(request.hits_addend.max(1));
    let mut query = Query::new(&request.domain);
    query.hits_addend = request.hits_addend;
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        let field = |name: &str| format!("descriptors[{index}].{name}");
        let limit = match &descriptor.limit {
            None => None,
            Some(limit) => {
                let unit = Unit::from_proto(limit.unit).ok_or_else(|| {
                    Error::invalid(field("limit.unit"), format!("unknown unit {}", limit.unit))
                })?;
                Some(LimitOverride {
                    requests_per_unit: limit.requests_per_unit,
                    unit,
                })
            }
        };
        let cost = descriptor
            .hits_addend
            .as_ref()
            .map_or(request_cost, |hits| hits.value);
        let entries = descriptor
            .entries
            .iter()
            .map(|entry| (entry.key.as_str(), entry.value.as_str()));
        let added = query.descriptor(entries, cost);
        added.limit = limit;
        added.hits_addend = descriptor.hits_addend.as_ref().map(|hits| hits.value);
        // Envoy 1.38's refunds: the hits are given back instead of taken.
        added.refund = descriptor.is_negative_hits;
    }
    Ok(query)
}

/// The response Envoy gets for `verdict`, with `headers` (name, value) to add to the
/// client's response.
pub fn response(verdict: &Verdict, headers: &[(&str, String)]) -> RateLimitResponse {
    let statuses = verdict.statuses.iter().map(descriptor_status).collect();
    let overall = if verdict.is_over() {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let mut response = RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        ..Default::default()
    };
    response.response_headers_to_add = headers
        .iter()
        .map(|(key, value)| HeaderValue {
            key: (*key).to_owned(),
            value: value.clone(),
            ..Default::default()
        })
        .collect();
    response
}

fn descriptor_status(status: &Status) -> DescriptorStatus {
    match status {
        Status::NoLimit => DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        },
        Status::Unlimited => DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..Default::default()
        },
        Status::Limited(limited) => limited_status(limited),
    }
}

fn limited_status(limited: &Limited) -> DescriptorStatus {
    let code = if limited.over {
        Code::OverLimit
    } else {
        Code::Ok
    };
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: limited.name.as_deref().unwrap_or_default().to_owned(),
            requests_per_unit: limited.requests_per_unit,
            unit: limited.unit.to_proto(),
        }),
        limit_remaining: limited.remaining,
        duration_until_reset: Some(ProtoDuration {
            seconds: i64::try_from(limited.reset_after.as_secs()).unwrap_or(i64::MAX),
            // Below one second, so it fits.
            nanos: limited.reset_after.subsec_nanos() as i32,
        }),
        quota: None,
    }
}

/// The gRPC service Envoy calls.
#[derive(Debug)]
pub struct RlsService {
    limiter: Arc<Limiter>,
}

/// The tonic service of `RateLimitService` (the calls `envoy::grpc` leaves to tonic's
/// router), bounded to [`MAX_MESSAGE_BYTES`] per message.
pub fn server(limiter: Arc<Limiter>) -> RateLimitServiceServer<RlsService> {
    RateLimitServiceServer::from_arc(Arc::new(RlsService::new(limiter)))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
}

/// Sets `RateLimitService`'s own name in gRPC health to serving or not.
pub async fn set_health(reporter: &tonic_health::server::HealthReporter, serving: bool) {
    if serving {
        reporter
            .set_serving::<RateLimitServiceServer<RlsService>>()
            .await;
    } else {
        reporter
            .set_not_serving::<RateLimitServiceServer<RlsService>>()
            .await;
    }
}

impl RlsService {
    pub fn new(limiter: Arc<Limiter>) -> RlsService {
        RlsService { limiter }
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        // tonic encodes the message itself: no `unit_multiplier` field on this path (calls
        // with a `grpc-encoding`; see `envoy::grpc`).
        answer(&self.limiter, request.metadata(), request.get_ref())
            .await
            .map(|answer| tonic::Response::new(answer.response))
            .map_err(|error| error.to_grpc())
    }
}

/// Decides one call: [`should_rate_limit`], traced when `--otlp-endpoint` is set (the
/// trace context comes from the call's `metadata`). What both gRPC paths run: the server's
/// own ([`crate::envoy::grpc`]) and [`RlsService`].
pub async fn answer(
    limiter: &Limiter,
    metadata: &tonic::metadata::MetadataMap,
    request: &RateLimitRequest,
) -> Result<Answer, Error> {
    if crate::telemetry::tracing_enabled() {
        traced(limiter, metadata, request).await
    } else {
        decide(limiter, request).await
    }
}

/// [`should_rate_limit`] inside its `ShouldRateLimit` span (`--otlp-endpoint`), the span
/// recording the overall code.
async fn traced(
    limiter: &Limiter,
    metadata: &tonic::metadata::MetadataMap,
    request: &RateLimitRequest,
) -> Result<Answer, Error> {
    use tracing::Instrument;
    let span = crate::telemetry::request_span(metadata, &request.domain);
    let answer = decide(limiter, request).instrument(span.clone()).await;
    let code = match &answer {
        Ok(answer) => Code::try_from(answer.response.overall_code)
            .map_or("UNKNOWN", |code| code.as_str_name()),
        Err(error) => error.kind().as_str(),
    };
    span.record("ratelimit.code", code);
    answer
}

#[cfg(test)]
mod tests;
