//! The reference service's stats (envoyproxy/ratelimit's `src/stats`): the hits of every
//! limit, counted as the reference counts them ([`Hit::counts`]: its near-limit threshold,
//! the parts of a multi-hit request over and near the limit, shadow-mode hits also over
//! it), under the names it gives them
//! (`ratelimit.service.rate_limit.<domain>.<key path>.over_limit`, built by [`names`]),
//! for a StatsD push ([`statsd`], `--statsd`) and a Prometheus listener with
//! statsd_exporter's mapping applied ([`prometheus`], [`mapper`], `--prometheus-addr`):
//! where Envoy Gateway looks for them.
//!
//! Invariants:
//! - Off unless a sink is configured: then [`crate::metrics::Metrics`] holds no
//!   [`ReferenceStats`] and nothing on the request path looks at them.
//! - The request path builds no name for a configured limit: its [`Stat`] is resolved once
//!   per limits snapshot into the limit's `LimitCounters`, and a hit is a few atomic adds.
//!   Only `detailed_metric`, `value_to_metric` and a request's own limit build a key per
//!   request (their names carry request values), as ratekeeper's own metrics do there.
//! - At most `max_names` keys (`--metrics-max-series`); past it a new key is counted under
//!   its domain's `_other` key (`ratelimit.service.rate_limit.<domain>._other.*`, one per
//!   configured domain) and a warning is logged once. A key keeps its counts across reloads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

pub mod docs;
pub mod mapper;
pub mod names;
pub mod prometheus;
pub mod sinks;
pub mod statsd;

/// Where the per-limit stats live, before the key.
pub const RATE_LIMIT_SCOPE: &str = "ratelimit.service.rate_limit.";

/// The key past the cap, after the domain.
pub const OTHER: &str = "_other";

/// One counter of a limit's stat, in the reference's order of names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    TotalHits,
    OverLimit,
    NearLimit,
    WithinLimit,
    ShadowMode,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::TotalHits,
        Kind::OverLimit,
        Kind::NearLimit,
        Kind::WithinLimit,
        Kind::ShadowMode,
    ];

    /// The last part of the stat's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::TotalHits => "total_hits",
            Kind::OverLimit => "over_limit",
            Kind::NearLimit => "near_limit",
            Kind::WithinLimit => "within_limit",
            Kind::ShadowMode => "shadow_mode",
        }
    }
}

/// The limits loads so far, successes and failures (`config_load_success`,
/// `config_load_error`): the reloader's figures (`reload` implements it).
pub trait Loads: Send + Sync + std::fmt::Debug {
    fn loads(&self) -> (u64, u64);
}

/// The counters of one stat key.
#[derive(Debug, Default)]
pub struct Stat {
    counts: [AtomicU64; 5],
}

impl Stat {
    /// Counts `hits` more under `kind`.
    #[inline]
    pub fn add(&self, kind: Kind, hits: u64) {
        self.counts[kind as usize].fetch_add(hits, Ordering::Relaxed);
    }

    pub fn get(&self, kind: Kind) -> u64 {
        self.counts[kind as usize].load(Ordering::Relaxed)
    }

    /// Counts one limit's share of one descriptor check, as the reference counts it.
    #[inline]
    pub fn record(&self, hit: &Hit, near_limit_ratio: f64) {
        for (kind, count) in Kind::ALL.into_iter().zip(hit.counts(near_limit_ratio)) {
            if count > 0 {
                self.add(kind, count);
            }
        }
    }
}

/// One limit's share of one descriptor check.
#[derive(Clone, Copy, Debug)]
pub struct Hit {
    /// The limit's capacity (`requests_per_unit`).
    pub capacity: u64,
    /// What is left of it after the check (a denied check consumed nothing).
    pub remaining: u64,
    /// The hits of the request (`hits_addend`).
    pub cost: u64,
    /// Every limit of the descriptor admitted the hits.
    pub admitted: bool,
    /// This limit refused them.
    pub refused: bool,
    /// The limit is in shadow mode.
    pub shadow: bool,
}

impl Hit {
    /// The counts, by [`Kind`], of the reference's `base_limiter.go`: the near-limit
    /// threshold is `floor(capacity * ratio)` (in `float32`); of admitted hits, those past it
    /// are near the limit; of refused ones, those past the capacity are over it (and in
    /// shadow mode, shadow_mode too) and those between the threshold and the capacity near
    /// it. A refused request counts whole when the limit was already used up.
    pub fn counts(&self, near_limit_ratio: f64) -> [u64; 5] {
        let Hit {
            capacity,
            remaining,
            cost,
            ..
        } = *self;
        // As Go's uint32(math.Floor(float64(float32(limit) * nearLimitRatio))).
        let near = ((capacity as f32) * (near_limit_ratio as f32)).floor() as u64;
        let used = capacity.saturating_sub(remaining);
        let (mut over, mut near_limit, mut within) = (0, 0, 0);
        if self.admitted {
            within = cost;
            let before = used.saturating_sub(cost);
            if used > near {
                near_limit = if before >= near { cost } else { used - near };
            }
        } else if self.refused {
            let after = used.saturating_add(cost);
            if used >= capacity {
                over = cost;
            } else {
                over = after.saturating_sub(capacity);
                near_limit = capacity - near.max(used);
            }
        }
        let shadow = if self.shadow { over } else { 0 };
        [cost, over, near_limit, within, shadow]
    }
}

/// The stats in the reference's names, shared by the limiter (which counts) and the sinks
/// (which read).
#[derive(Debug)]
pub struct ReferenceStats {
    keys: RwLock<HashMap<Box<str>, Arc<Stat>>>,
    max_names: usize,
    warned: AtomicBool,
    /// `.__key=value` for each of `EXTRA_TAGS`, as gostats appends them to the names of
    /// the `ratelimit` scope.
    tags: Box<str>,
    requests: AtomicU64,
    service_errors: AtomicU64,
    store_errors: AtomicU64,
}

impl ReferenceStats {
    /// Stats for at most `max_names` keys, their names tagged with `tags`.
    pub fn new(max_names: usize, tags: &[(String, String)]) -> ReferenceStats {
        ReferenceStats {
            keys: RwLock::default(),
            max_names,
            warned: AtomicBool::new(false),
            tags: serialize_tags(tags).into(),
            requests: AtomicU64::new(0),
            service_errors: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
        }
    }

    /// The stat of `key` (which starts with `domain`), made on first use; its domain's
    /// `_other` past the cap.
    pub fn stat(&self, domain: &str, key: &str) -> Arc<Stat> {
        if let Some(stat) = self.read().get(key) {
            return Arc::clone(stat);
        }
        let mut keys = self
            .keys
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(stat) = keys.get(key) {
            return Arc::clone(stat);
        }
        let key = if keys.len() < self.max_names {
            key.to_owned()
        } else {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    max = self.max_names,
                    "the reference service's stat names reached --metrics-max-series; new \
                     ones are counted under <domain>.{OTHER}"
                );
            }
            format!("{domain}.{OTHER}")
        };
        Arc::clone(keys.entry(key.into()).or_default())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Box<str>, Arc<Stat>>> {
        self.keys
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// One `ShouldRateLimit` call (`ratelimit_server.ShouldRateLimit.total_requests`); a
    /// refused one also as `service_error` (bad input) or `redis_error` (the store).
    pub fn request(&self, outcome: crate::metrics::Outcome) {
        use crate::metrics::Outcome;
        self.requests.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Ok | Outcome::OverLimit => {}
            Outcome::InvalidArgument => {
                self.service_errors.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Unavailable => {
                self.store_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Every stat that counted something, by its full StatsD name, sorted; `reloads` gives
    /// `config_load_success` and `config_load_error`.
    pub fn snapshot(&self, reloads: Option<&dyn Loads>) -> Vec<(String, u64)> {
        let tags = &self.tags;
        let mut out = Vec::new();
        for (key, stat) in self.read().iter() {
            for kind in Kind::ALL {
                let value = stat.get(kind);
                if value > 0 {
                    let name = format!("{RATE_LIMIT_SCOPE}{key}.{}{tags}", kind.as_str());
                    out.push((name, value));
                }
            }
        }
        let mut service = vec![
            (
                "call.should_rate_limit.service_error",
                self.service_errors.load(Ordering::Relaxed),
            ),
            (
                "call.should_rate_limit.redis_error",
                self.store_errors.load(Ordering::Relaxed),
            ),
        ];
        if let Some((successes, failures)) = reloads.map(Loads::loads) {
            service.push(("config_load_success", successes));
            service.push(("config_load_error", failures));
        }
        for (name, value) in service {
            if value > 0 {
                out.push((format!("ratelimit.service.{name}{tags}"), value));
            }
        }
        let requests = self.requests.load(Ordering::Relaxed);
        if requests > 0 {
            let name = "ratelimit_server.ShouldRateLimit.total_requests";
            out.push((name.to_owned(), requests));
        }
        out.sort_unstable();
        out
    }
}

/// gostats' serialization of a scope's tags: `.__key=value` each, sorted by key, pairs with
/// an empty key or value left out, `.`, `:` and `|` in values replaced by `_`.
pub fn serialize_tags(tags: &[(String, String)]) -> String {
    let mut pairs: Vec<&(String, String)> = tags
        .iter()
        .filter(|(key, value)| !key.is_empty() && !value.is_empty())
        .collect();
    pairs.sort();
    let mut out = String::new();
    for (key, value) in pairs {
        out.push_str(".__");
        out.push_str(key);
        out.push('=');
        out.extend(value.chars().map(|ch| match ch {
            '.' | ':' | '|' => '_',
            other => other,
        }));
    }
    out
}

#[cfg(test)]
mod tests;
