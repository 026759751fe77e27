//! The response's dynamic metadata (`--response-dynamic-metadata`): the reference service's
//! shape, quota-mode violations and the entries' `metadata`.

use envoy_types::pb::google::protobuf::UInt64Value;

use super::*;

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: model
    value: gpt-a
    quota_mode: true
    metadata: {backend: a, domain: spoofed}
    rate_limit: {unit: hour, requests_per_unit: 1, name: model_a}
  - key: model
    value: gpt-b
    quota_mode: true
    metadata: {backend: b, weight: 2, tags: [x], extra: {on: true}}
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1, name: per_user}
"#;

fn metadata_limiter(response_dynamic_metadata: bool) -> Limiter {
    Limiter::at_test_start(
        LIMITS,
        LimiterOptions {
            response_dynamic_metadata,
            ..LimiterOptions::default()
        },
    )
}

/// The response's dynamic metadata as JSON, for readable assertions.
fn json(response: &RateLimitResponse) -> serde_json::Value {
    let metadata = response
        .dynamic_metadata
        .as_ref()
        .expect("dynamic metadata");
    to_json(&Value {
        kind: Some(Kind::StructValue(metadata.clone())),
    })
}

fn to_json(value: &Value) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(flag)) => serde_json::Value::Bool(*flag),
        Some(Kind::NumberValue(number)) => serde_json::json!(number),
        Some(Kind::StringValue(text)) => serde_json::Value::String(text.clone()),
        Some(Kind::ListValue(list)) => list.values.iter().map(to_json).collect(),
        Some(Kind::StructValue(fields)) => fields
            .fields
            .iter()
            .map(|(name, value)| (name.clone(), to_json(value)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
    }
}

#[tokio::test(start_paused = true)]
async fn no_dynamic_metadata_unless_enabled() {
    let limiter = metadata_limiter(false);
    let response = ask(&limiter, &request(vec![descriptor(&[("model", "gpt-a")])])).await;
    assert_eq!(response.dynamic_metadata, None);
}

#[tokio::test(start_paused = true)]
async fn the_reference_shape_with_what_was_decided() {
    let limiter = metadata_limiter(true);
    let mut with_hits = descriptor(&[("user", "u1")]);
    with_hits.hits_addend = Some(UInt64Value { value: 1 });
    let mut overridden = descriptor(&[("user", "u2"), ("tier", "gold")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 7,
        unit: Unit::Minute.to_proto(),
    });
    let mut request = request(vec![with_hits, overridden]);
    request.hits_addend = 1;
    let first = ask(&limiter, &request).await;
    assert_eq!(
        json(&first),
        serde_json::json!({
            "domain": "edge",
            "hitsAddend": 1.0,
            "descriptors": [
                {"entries": ["user=u1"], "hitsAddend": 1.0, "code": "OK", "limitName": "per_user"},
                {
                    "entries": ["user=u2", "tier=gold"],
                    "limit": {"requestsPerUnit": 7.0, "unit": "MINUTE"},
                    "code": "OK"
                }
            ]
        })
    );
    let second = ask(&limiter, &request).await;
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    let codes = &json(&second)["descriptors"];
    assert_eq!(codes[0]["code"], "OVER_LIMIT");
    assert_eq!(codes[1]["code"], "OK");
}

#[tokio::test(start_paused = true)]
async fn quota_violations_and_the_metadata_of_entries_with_quota_left() {
    let limiter = metadata_limiter(true);
    let models = request(vec![
        descriptor(&[("model", "gpt-a")]),
        descriptor(&[("model", "gpt-b")]),
    ]);
    let first = ask(&limiter, &models).await;
    let first = json(&first);
    assert_eq!(first["quotaModeEnabled"], true);
    assert_eq!(first["quotaModeViolations"], serde_json::json!([]));
    // Both entries had quota: both maps merged under `metadata`, the first one winning a
    // clash (the reference's TestOverlappingMetadataReturnsTheFirstValue); nothing of
    // them at the top level, where the reference's own fields are.
    assert_eq!(
        first["metadata"],
        serde_json::json!({
            "backend": "a", "domain": "spoofed", "weight": 2.0, "tags": ["x"],
            "extra": {"on": true}
        })
    );
    assert_eq!(first["domain"], "edge");
    assert_eq!(first["backend"], serde_json::Value::Null);

    // gpt-a is out of quota: the request passes, gpt-a is reported OVER_LIMIT, and the
    // metadata is gpt-b's only (TestMetadataReturnedForPassedDescriptors).
    let second = ask(&limiter, &models).await;
    assert_eq!(second.overall_code, Code::Ok as i32);
    assert_eq!(codes(&second), [Code::OverLimit, Code::Ok]);
    assert_eq!(second.statuses[0].limit_remaining, 0);
    let second = json(&second);
    assert_eq!(second["quotaModeViolations"], serde_json::json!([0.0]));
    assert_eq!(second["metadata"]["backend"], "b");
    assert_eq!(second["descriptors"][0]["code"], "OVER_LIMIT");
    assert_eq!(second["descriptors"][0]["limitName"], "model_a");

    // Only gpt-a asked for: its only quota descriptor is over, so the request is.
    let alone = ask(&limiter, &request(vec![descriptor(&[("model", "gpt-a")])])).await;
    assert_eq!(alone.overall_code, Code::OverLimit as i32);
    let alone = json(&alone);
    assert_eq!(alone["quotaModeViolations"], serde_json::json!([0.0]));
    assert_eq!(
        alone["metadata"],
        serde_json::Value::Null,
        "no quota left anywhere"
    );
    assert_eq!(alone["descriptors"][0]["code"], "OVER_LIMIT");
}

const GATEWAY: &str = r#"
domain: edge
descriptors:
  - key: backend_name
    descriptors:
      - key: model_name_override
        descriptors:
          - key: tenant
            quota_mode: true
            rate_limit: {unit: hour, requests_per_unit: 1}
          - key: bucket
            value: default
            quota_mode: true
            rate_limit: {unit: hour, requests_per_unit: 3}
"#;

fn model(backend: &str, model: &str, last: (&'static str, &'static str)) -> RateLimitDescriptor {
    let mut descriptor = descriptor(&[("backend_name", "x"), ("model_name_override", "y"), last]);
    descriptor.entries[0].value = backend.to_owned();
    descriptor.entries[1].value = model.to_owned();
    descriptor
}

/// The reference's quota groups (TestServiceQuotaModeSameGroup*, *MultiModel*): one model
/// (`backend_name` + `model_name_override`) is over when any of its buckets is; the request
/// is over only when every model is; `passedBackends` lists the models with room.
#[tokio::test(start_paused = true)]
async fn quota_groups_are_models_and_the_request_fails_over_between_them() {
    let limiter = Limiter::at_test_start(
        GATEWAY,
        LimiterOptions {
            response_dynamic_metadata: true,
            ..LimiterOptions::default()
        },
    );
    let both_models = request(vec![
        model("ns/be", "gpt-4o-mini", ("tenant", "t1")),
        model("ns/be", "gpt-4o-mini", ("bucket", "default")),
        model("ns/be", "gpt-5-mini", ("bucket", "default")),
    ]);
    let first = ask(&limiter, &both_models).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(
        json(&first)["passedBackends"],
        serde_json::json!([
            {"backend_name": "ns/be", "model_name_override": "gpt-4o-mini"},
            {"backend_name": "ns/be", "model_name_override": "gpt-5-mini"}
        ])
    );
    // The tenant's bucket of gpt-4o-mini is used up: that model is over although its
    // default bucket has room, and gpt-5-mini still takes the request.
    let second = ask(&limiter, &both_models).await;
    assert_eq!(second.overall_code, Code::Ok as i32);
    assert_eq!(codes(&second), [Code::OverLimit, Code::Ok, Code::Ok]);
    assert_eq!(
        json(&second)["passedBackends"],
        serde_json::json!([{"backend_name": "ns/be", "model_name_override": "gpt-5-mini"}])
    );
    // gpt-4o-mini alone: its group is over, so the request is, though one bucket has room.
    let one_model = request(vec![
        model("ns/be", "gpt-4o-mini", ("tenant", "t1")),
        model("ns/be", "gpt-4o-mini", ("bucket", "default")),
    ]);
    let alone = ask(&limiter, &one_model).await;
    assert_eq!(alone.overall_code, Code::OverLimit as i32);
    assert_eq!(codes(&alone), [Code::OverLimit, Code::Ok]);
    assert_eq!(json(&alone)["passedBackends"], serde_json::Value::Null);
}
