//! `RateLimitConfig` resources -> the limits compiler's input ([`Source`]s).
//!
//! Pure. A resource becomes the limits file it stands for, written as JSON (which is YAML),
//! so the one compiler in `limits` validates it: no second validator, and every config
//! error names the resource (`xds resource NAME`) and the place inside it. Proto3 cannot
//! tell an empty string or a zero from a missing field, so empty strings, `false`, unit
//! `UNKNOWN` and an unlimited limit's zero `requests_per_unit` are left out, as a file
//! would leave them out; what remains is checked exactly like a file.
//!
//! Bounded: at most [`MAX_RESOURCES`] resources and [`MAX_RESOURCE_BYTES`] per resource;
//! prost bounds nesting while decoding, and the compiler bounds depth and count.

use prost::Message;
use serde_json::{Map, Value, json};

use super::TYPE_URL;
use super::proto::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};
use crate::limits::{MAX_FILE_BYTES, Source};
use envoy_types::pb::google::protobuf::Any;

/// The most resources one response may carry.
pub const MAX_RESOURCES: usize = 1024;
/// The largest encoded resource accepted, in bytes (a limits file's cap).
pub const MAX_RESOURCE_BYTES: usize = MAX_FILE_BYTES;

/// Decodes every resource of a response into the source it stands for, in order. An error
/// (too many, wrong type, too large, undecodable) names the resource and rejects them all.
pub fn sources(resources: &[Any]) -> Result<Vec<Source>, String> {
    if resources.len() > MAX_RESOURCES {
        return Err(format!(
            "{} resources in one response, at most {MAX_RESOURCES} are accepted",
            resources.len()
        ));
    }
    resources
        .iter()
        .enumerate()
        .map(|(index, any)| {
            let place = format!("resources[{index}]");
            if any.type_url != TYPE_URL {
                return Err(format!(
                    "{place}: type {:?} is not {TYPE_URL}",
                    any.type_url
                ));
            }
            if any.value.len() > MAX_RESOURCE_BYTES {
                return Err(format!(
                    "{place}: {} bytes, larger than {MAX_RESOURCE_BYTES} bytes (4 MiB)",
                    any.value.len()
                ));
            }
            let config = RateLimitConfig::decode(any.value.as_slice())
                .map_err(|error| format!("{place}: cannot decode a RateLimitConfig: {error}"))?;
            Ok(source(index, &config))
        })
        .collect()
}

/// One resource as the limits file it stands for, named after the resource (or its index,
/// when it has no name).
pub fn source(index: usize, config: &RateLimitConfig) -> Source {
    let name = match config.name.as_str() {
        "" => format!("xds resource #{index}"),
        name => format!("xds resource {}", name.escape_debug()),
    };
    let mut file = Map::new();
    file.insert("domain".to_owned(), json!(config.domain));
    file.insert(
        "descriptors".to_owned(),
        Value::Array(config.descriptors.iter().map(descriptor).collect()),
    );
    Source {
        name,
        text: Value::Object(file).to_string(),
    }
}

fn descriptor(descriptor: &RateLimitDescriptor) -> Value {
    let mut map = Map::new();
    if !descriptor.key.is_empty() {
        map.insert("key".to_owned(), json!(descriptor.key));
    }
    if !descriptor.value.is_empty() {
        map.insert("value".to_owned(), json!(descriptor.value));
    }
    if let Some(policy) = &descriptor.rate_limit {
        map.insert("rate_limit".to_owned(), rate_limit(policy));
    }
    for (field, set) in [
        ("shadow_mode", descriptor.shadow_mode),
        ("detailed_metric", descriptor.detailed_metric),
        ("quota_mode", descriptor.quota_mode),
    ] {
        if set {
            map.insert(field.to_owned(), json!(true));
        }
    }
    if !descriptor.descriptors.is_empty() {
        let children = descriptor
            .descriptors
            .iter()
            .map(self::descriptor)
            .collect();
        map.insert("descriptors".to_owned(), Value::Array(children));
    }
    Value::Object(map)
}

fn rate_limit(policy: &RateLimitPolicy) -> Value {
    let mut map = Map::new();
    match RateLimitUnit::try_from(policy.unit) {
        Ok(RateLimitUnit::Unknown) => {}
        Ok(unit) => {
            map.insert("unit".to_owned(), json!(unit.as_str_name()));
        }
        // An enum number this proto does not know: the compiler reports it as a unit.
        Err(_) => {
            map.insert("unit".to_owned(), json!(policy.unit.to_string()));
        }
    }
    if !(policy.unlimited && policy.requests_per_unit == 0) {
        map.insert(
            "requests_per_unit".to_owned(),
            json!(policy.requests_per_unit),
        );
    }
    if policy.unlimited {
        map.insert("unlimited".to_owned(), json!(true));
    }
    if !policy.name.is_empty() {
        map.insert("name".to_owned(), json!(policy.name));
    }
    if !policy.replaces.is_empty() {
        let replaces = policy
            .replaces
            .iter()
            .map(|replace| match replace.name.as_str() {
                "" => json!({}),
                name => json!({ "name": name }),
            })
            .collect();
        map.insert("replaces".to_owned(), Value::Array(replaces));
    }
    Value::Object(map)
}
