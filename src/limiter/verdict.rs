//! What the limiter answers: a [`Verdict`], one [`Status`] per descriptor, plus what quota
//! mode and dynamic metadata need. Plain data: each front end renders it its own way.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use serde_json::{Value, json};

use crate::algorithm::Unit;
use crate::limits::Metadata;

use super::Query;

/// The limit a descriptor was decided by, and where its counter stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    /// The limit's `name`, if it has one.
    pub name: Option<Arc<str>>,
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// The window is `multiplier` units (`unit_multiplier`; canonical, see
    /// [`Rate::every`](crate::algorithm::Rate::every)).
    pub multiplier: u32,
    /// Hits still admissible right now; 0 when over the limit (like the reference service,
    /// even if a smaller request would still fit).
    pub remaining: u32,
    /// Until the limit has fully recovered (the window ends, the bucket is full).
    pub reset_after: Duration,
    /// Reported over the limit (`OVER_LIMIT`): one of its limits is exceeded and its rule is
    /// not in shadow mode. Whether the request passes is [`Verdict::is_over`] (quota mode
    /// and the global shadow mode let some over descriptors pass).
    pub over: bool,
    /// The limit is in shadow mode: counted and reported, never enforced.
    pub shadow: bool,
    /// When over: how long until the same request would pass (`None`: never can).
    pub retry_after: Option<Duration>,
}

impl Limited {
    /// The window (or refill period) in seconds.
    pub fn window_seconds(&self) -> u64 {
        self.unit.window_seconds(self.multiplier)
    }

    /// How answers name the window ([`Unit::window_name`]).
    pub fn window_name(&self) -> std::borrow::Cow<'static, str> {
        self.unit.window_name(self.multiplier)
    }
}

/// What was decided for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// No limit applies (unknown domain, no match, allow-list entry, replaced limits).
    NoLimit,
    /// An `unlimited` limit matched.
    Unlimited,
    /// Decided by a limit: with several on the descriptor, the one closest to exhaustion.
    Limited(Limited),
}

impl Status {
    /// Reported `OVER_LIMIT` (see [`Limited::over`]).
    pub fn is_over(&self) -> bool {
        matches!(self, Status::Limited(limited) if limited.over)
    }

    pub fn limited(&self) -> Option<&Limited> {
        match self {
            Status::Limited(limited) => Some(limited),
            _ => None,
        }
    }
}

/// The answer to a query: one status per descriptor, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub statuses: SmallVec<[Status; 4]>,
    /// The request must not pass (see `limiter::respond` for the rules).
    pub denied: bool,
    /// Whether any limit checked for this query was soft (`quota_mode` in the file, or
    /// `--quota-mode`; reported as the reference's `quotaModeEnabled`).
    pub soft_mode: bool,
    /// The descriptors (by index) whose soft limits were exceeded. They pass (their status
    /// is not over) unless every soft descriptor of the query was exceeded.
    pub soft_violations: SmallVec<[usize; 2]>,
    /// Per descriptor, the `metadata` of the configured entry it matched, when it still has
    /// room: not over, and not in a quota group that is over (for front ends that hand it
    /// back, like Envoy's dynamic metadata).
    pub metadata: SmallVec<[Option<Arc<Metadata>>; 4]>,
    /// The `(backend_name, model_name_override)` of the quota groups that still have room,
    /// in request order: where an AI gateway may route the request.
    pub passed_backends: SmallVec<[(String, String); 2]>,
}

impl Verdict {
    /// The request must not pass (overall `OVER_LIMIT`).
    pub fn is_over(&self) -> bool {
        self.denied
    }

    /// How long until the whole request would pass: the longest wait of its descriptors
    /// that are over and can pass at all (`None` when it passes, or none can pass).
    pub fn retry_after(&self) -> Option<Duration> {
        if !self.denied {
            return None;
        }
        self.statuses
            .iter()
            .filter_map(Status::limited)
            .filter(|limited| limited.over)
            .filter_map(|limited| limited.retry_after)
            .max()
    }

    /// `passedBackends` of the dynamic metadata (every front end's): the quota groups with
    /// room, `{backend_name, model_name_override}` each; `None` when there are none.
    pub fn passed_backends_json(&self) -> Option<serde_json::Value> {
        if self.passed_backends.is_empty() {
            return None;
        }
        let backends = self
            .passed_backends
            .iter()
            .map(|(backend, model)| {
                serde_json::json!({"backend_name": backend, "model_name_override": model})
            })
            .collect();
        Some(serde_json::Value::Array(backends))
    }

    /// The `metadata` of the descriptors that still have room, merged in request order as
    /// the reference service merges it: the first value of a name wins, except that two
    /// maps under one name are merged the same way, name by name.
    pub fn passed_metadata(&self) -> Metadata {
        let mut merged = Metadata::new();
        for metadata in self.metadata.iter().flatten() {
            merge_first_wins(&mut merged, metadata);
        }
        merged
    }
}

fn merge_first_wins(into: &mut Metadata, from: &Metadata) {
    for (name, value) in from {
        match (into.get_mut(name), value) {
            (None, _) => {
                into.insert(name.clone(), value.clone());
            }
            (Some(serde_json::Value::Object(ours)), serde_json::Value::Object(theirs)) => {
                merge_first_wins(ours, theirs);
            }
            (Some(_), _) => {}
        }
    }
}

/// The response's dynamic metadata (`--response-dynamic-metadata`) for `query` decided as
/// `verdict`, in the reference service's shape; the one builder both front ends render
/// (gRPC as a protobuf `Struct`, `/json` as it is). Envoy's ratelimit filter stores it under
/// its own name (`envoy.filters.http.ratelimit`):
///
/// - `domain`; `descriptors`: one object per request descriptor with `entries`
///   (`"key=value"` strings), its `limit` (`requestsPerUnit`, `unit`) and `hitsAddend` when
///   the request set them, plus what was decided: `code` (`OK` or `OVER_LIMIT`) and
///   `limitName` (the deciding limit's name, when it has one); the request's `hitsAddend`
///   when it set one;
/// - `metadata`: the configured `metadata` of the descriptors that still have room (not
///   over, and not in a quota group that is over), merged first value wins
///   ([`Verdict::passed_metadata`]); Envoy reads it as
///   `%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:NAME)%`;
/// - with quota mode: `quotaModeEnabled: true`, `quotaModeViolations` (the indices of the
///   descriptors over their quota-mode limits) and, when quota groups are named by
///   `backend_name` / `model_name_override` entries, `passedBackends`: those of the groups
///   that still have room (`{backend_name, model_name_override}`, where to route).
pub fn dynamic_metadata(query: &Query<'_>, verdict: &Verdict) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    let passed = verdict.passed_metadata();
    if !passed.is_empty() {
        out.insert("metadata".to_owned(), Value::Object(passed));
    }
    out.insert("domain".to_owned(), json!(query.domain));
    let descriptors = query
        .descriptors
        .iter()
        .zip(&verdict.statuses)
        .map(|(descriptor, status)| {
            let entries: Vec<String> = descriptor
                .entries
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            let mut fields = json!({
                "entries": entries,
                "code": if status.is_over() { "OVER_LIMIT" } else { "OK" },
            });
            if let Some(limit) = &descriptor.limit {
                fields["limit"] = json!({
                    "requestsPerUnit": limit.requests_per_unit,
                    "unit": limit.unit.as_str().to_ascii_uppercase(),
                });
            }
            if let Some(hits) = descriptor.hits_addend.filter(|hits| *hits != 0) {
                // Above 2^53 a JSON (and protobuf) number loses precision, as in the
                // reference.
                fields["hitsAddend"] = json!(hits);
            }
            if let Some(name) = status.limited().and_then(|limited| limited.name.as_deref()) {
                fields["limitName"] = json!(name);
            }
            fields
        })
        .collect();
    out.insert("descriptors".to_owned(), Value::Array(descriptors));
    if query.hits_addend != 0 {
        out.insert("hitsAddend".to_owned(), json!(query.hits_addend));
    }
    if verdict.soft_mode {
        out.insert("quotaModeEnabled".to_owned(), json!(true));
        out.insert(
            "quotaModeViolations".to_owned(),
            json!(verdict.soft_violations.as_slice()),
        );
        if let Some(backends) = verdict.passed_backends_json() {
            out.insert("passedBackends".to_owned(), backends);
        }
    }
    out
}
