//! The rate limit service: Envoy's `ShouldRateLimit`, transport-independent.
//!
//! [`Limiter::should_rate_limit`] validates a request, matches each descriptor against the
//! live [`Limits`] snapshot, turns the matched limits into [`Check`]s, asks the [`Engine`],
//! and builds one status per descriptor. [`RlsService`] is the thin tonic glue; other front
//! ends (HTTP) call the [`Limiter`] directly.
//!
//! Invariants:
//! - Input is bounded (see [`bounds`]) and never panics the process: every violation is an
//!   [`RequestError::Invalid`] naming the field.
//! - A request uses one limits snapshot from start to end, whatever reloads happen meanwhile.
//! - Shadow-mode limits count and report but never turn a status into OVER_LIMIT and never
//!   make a request wait.

use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;

use crate::algorithm::{Decision, NANOS_PER_SEC, Rate, Unit};
use crate::cluster::Cluster;
use crate::engine::{Engine, EngineError};
use crate::key::KeyBuilder;
use crate::limits::{Limit, Limits, Node};
use crate::metrics::{LimitCounters, LimitTable, Metrics, Outcome};
use crate::shard::{Check, Counter, WaitPolicy};

/// Bounds on one request; larger input is rejected with `INVALID_ARGUMENT`.
pub mod bounds {
    /// Bytes in the encoded gRPC message.
    pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
    pub const MAX_DOMAIN_LEN: usize = 256;
    pub const MAX_DESCRIPTORS: usize = 64;
    pub const MAX_ENTRIES: usize = 32;
    pub const MAX_KEY_LEN: usize = 256;
    pub const MAX_VALUE_LEN: usize = 4096;
}

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl RequestError {
    fn invalid(field: impl Into<String>, problem: impl Into<String>) -> RequestError {
        RequestError::Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// The one place request errors become gRPC statuses: bad input is `INVALID_ARGUMENT`;
/// overload and internal trouble are `UNAVAILABLE`, so Envoy's `failure_mode_deny` decides.
pub fn to_status(error: &RequestError) -> tonic::Status {
    match error {
        RequestError::Invalid { .. } => tonic::Status::invalid_argument(error.to_string()),
        RequestError::Engine(_) => tonic::Status::unavailable(error.to_string()),
    }
}

/// Per-call choices a front end may make (the gRPC service uses the defaults).
#[derive(Clone, Copy, Debug, Default)]
pub struct CallOptions {
    /// Wait at most this long for capacity, and never longer than a limit's `max_wait`
    /// allows; `None` keeps the configured bound, `Some(ZERO)` never waits.
    pub max_wait: Option<std::time::Duration>,
}

/// A decided request, plus what Envoy's statuses cannot carry.
#[derive(Clone, Debug)]
pub struct Verdict {
    pub response: RateLimitResponse,
    /// Per descriptor: when it is over the limit, how long until the same request would
    /// pass (`None` when it is not over, or never can pass).
    pub retry_after: Vec<Option<std::time::Duration>>,
}

impl Verdict {
    /// How long until the whole request would pass: the longest wait of its descriptors.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_after.iter().flatten().max().copied()
    }
}

/// Switches of the service.
#[derive(Clone, Copy, Debug, Default)]
pub struct LimiterOptions {
    /// Add `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` to responses.
    pub response_headers: bool,
}

/// Decides requests against the live limits.
#[derive(Debug)]
pub struct Limiter {
    limits: Arc<ArcSwap<Limits>>,
    cluster: Cluster,
    options: LimiterOptions,
    metrics: Arc<Metrics>,
    /// Per-limit counters of the latest limits snapshot seen (rebuilt once per reload).
    table: ArcSwap<LimitTable>,
}

/// What one request descriptor turned into.
enum Plan<'a> {
    /// No limit applies (unknown domain, no match, allow-list entry, replaced limits).
    NoLimit,
    /// An `unlimited` limit matched.
    Unlimited,
    /// These limits are checked; their decisions start at `first` in the engine's reply.
    Checked {
        limits: Vec<&'a Limit>,
        /// The configured entry, or `None` for the descriptor's own `limit`.
        node: Option<&'a Node>,
        descriptor: &'a RateLimitDescriptor,
        shadow: bool,
        first: usize,
        cost: u64,
    },
}

impl Limiter {
    pub fn new(
        limits: Arc<ArcSwap<Limits>>,
        cluster: Cluster,
        options: LimiterOptions,
        metrics: Arc<Metrics>,
    ) -> Limiter {
        let table = metrics.limit_table(limits.load_full());
        Limiter {
            limits,
            cluster,
            options,
            metrics,
            table: ArcSwap::from_pointee(table),
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn engine(&self) -> &Engine {
        self.cluster.engine()
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn limits(&self) -> &Arc<ArcSwap<Limits>> {
        &self.limits
    }

    /// Decides one request and records its outcome and latency.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RequestError> {
        self.should_rate_limit_with(request, CallOptions::default())
            .await
    }

    /// [`Limiter::should_rate_limit`] with per-call choices.
    pub async fn should_rate_limit_with(
        &self,
        request: &RateLimitRequest,
        options: CallOptions,
    ) -> Result<RateLimitResponse, RequestError> {
        self.verdict(request, options)
            .await
            .map(|verdict| verdict.response)
    }

    /// [`Limiter::should_rate_limit_with`], with the exact retry times (for front ends that
    /// answer `Retry-After`).
    pub async fn verdict(
        &self,
        request: &RateLimitRequest,
        options: CallOptions,
    ) -> Result<Verdict, RequestError> {
        let started = std::time::Instant::now();
        let result = self.decide(request, options).await;
        let outcome = match &result {
            Ok(verdict) if verdict.response.overall_code == Code::OverLimit as i32 => {
                Outcome::OverLimit
            }
            Ok(_) => Outcome::Ok,
            Err(RequestError::Invalid { .. }) => Outcome::InvalidArgument,
            Err(RequestError::Engine(_)) => Outcome::Unavailable,
        };
        self.metrics.record_request(outcome, started.elapsed());
        result
    }

    /// The per-limit counters for `snapshot`, building them on the first request after a
    /// reload (racing requests may both build; the result is the same).
    fn table_for(&self, snapshot: &Arc<Limits>) -> Arc<LimitTable> {
        let table = self.table.load_full();
        if table.is_for(snapshot) {
            return table;
        }
        let fresh = Arc::new(self.metrics.limit_table(Arc::clone(snapshot)));
        self.table.store(Arc::clone(&fresh));
        fresh
    }

    async fn decide(
        &self,
        request: &RateLimitRequest,
        options: CallOptions,
    ) -> Result<Verdict, RequestError> {
        validate(request)?;
        let snapshot = self.limits.load_full();
        let Some(domain) = snapshot.domain(&request.domain) else {
            return Ok(Verdict {
                response: response_without_limits(request.descriptors.len()),
                retry_after: vec![None; request.descriptors.len()],
            });
        };
        // Request-level overrides live as long as this call; `Plan` borrows them.
        let overrides: Vec<Option<Limit>> =
            request.descriptors.iter().map(override_limit).collect();
        let nodes: Vec<Option<&Node>> = request
            .descriptors
            .iter()
            .zip(&overrides)
            .map(|(descriptor, overridden)| match overridden {
                Some(_) => None,
                None => domain.lookup(
                    descriptor
                        .entries
                        .iter()
                        .map(|entry| (entry.key.as_str(), entry.value.as_str())),
                ),
            })
            .collect();
        let replaced = replaced_names(&nodes);
        let request_cost = u64::from(request.hits_addend.max(1));
        let mut plans = Vec::with_capacity(request.descriptors.len());
        let mut checks = Vec::with_capacity(request.descriptors.len());
        let mut counters_so_far = 0;
        for ((descriptor, overridden), node) in
            request.descriptors.iter().zip(&overrides).zip(&nodes)
        {
            let (limits, shadow): (Vec<&Limit>, bool) = match (overridden, node) {
                (Some(limit), _) => (vec![limit], false),
                (None, Some(node)) => (
                    node.limits
                        .iter()
                        .filter(|limit| !is_replaced(limit, &replaced))
                        .collect(),
                    node.shadow_mode,
                ),
                (None, None) => (Vec::new(), false),
            };
            if limits.is_empty() {
                plans.push(Plan::NoLimit);
                continue;
            }
            if limits.iter().any(|limit| limit.rate.is_none()) {
                plans.push(Plan::Unlimited);
                continue;
            }
            let mut key = KeyBuilder::new(&request.domain);
            for entry in &descriptor.entries {
                key.entry(&entry.key, &entry.value);
            }
            let counters: Vec<Counter> = limits
                .iter()
                .filter_map(|limit| limit.rate)
                .map(|rate| Counter {
                    key: key.key(&rate),
                    rate,
                })
                .collect();
            let cost = descriptor
                .hits_addend
                .as_ref()
                .map_or(request_cost, |hits| hits.value);
            let wait = if shadow {
                None
            } else {
                wait_policy(&limits, options.max_wait)
            };
            plans.push(Plan::Checked {
                limits,
                node: *node,
                descriptor,
                shadow,
                first: counters_so_far,
                cost,
            });
            counters_so_far += counters.len();
            checks.push(Check {
                counters,
                cost,
                wait,
            });
        }
        let decisions = self.cluster.check(checks).await?;
        self.count(
            &request.domain,
            &plans,
            &decisions,
            &self.table_for(&snapshot),
        );
        Ok(self.respond(&plans, &decisions))
    }

    /// Counts every checked limit's hits in its metrics.
    fn count(&self, domain: &str, plans: &[Plan<'_>], decisions: &[Decision], table: &LimitTable) {
        let ratio = self.metrics.near_limit_ratio();
        for plan in plans {
            let Plan::Checked {
                limits,
                node,
                descriptor,
                shadow,
                first,
                cost,
            } = plan
            else {
                continue;
            };
            let ours = decisions.get(*first..*first + limits.len()).unwrap_or(&[]);
            let admitted = ours.iter().all(|decision| decision.allowed);
            for (limit, decision) in limits.iter().zip(ours) {
                let Some(rate) = limit.rate else { continue };
                let owned;
                let counters = match node {
                    Some(node) if node.detailed_metric => {
                        let entries: Vec<(&str, &str)> = descriptor
                            .entries
                            .iter()
                            .map(|entry| (entry.key.as_str(), entry.value.as_str()))
                            .collect();
                        owned = self.metrics.detailed_counters(domain, &entries, limit);
                        &owned
                    }
                    Some(_) => match table.get(domain, limit) {
                        Some(counters) => counters,
                        None => continue,
                    },
                    None => {
                        owned = self.metrics.override_counters(domain, rate.unit.as_str());
                        &owned
                    }
                };
                record(counters, &rate, decision, *cost, admitted, *shadow, ratio);
            }
        }
    }

    fn respond(&self, plans: &[Plan<'_>], decisions: &[Decision]) -> Verdict {
        let mut statuses = Vec::with_capacity(plans.len());
        let mut retry_after = Vec::with_capacity(plans.len());
        let mut tightest: Option<(u32, u32, u64)> = None;
        for plan in plans {
            let wait = match plan {
                Plan::Checked {
                    limits,
                    shadow: false,
                    first,
                    ..
                } => {
                    let ours = decisions.get(*first..*first + limits.len()).unwrap_or(&[]);
                    let denied = ours.iter().filter(|decision| !decision.allowed);
                    // Every denying limit must have room again: the longest wait, if any can.
                    denied
                        .map(|decision| decision.retry_after)
                        .reduce(|a, b| a.zip(b).map(|(a, b)| a.max(b)))
                        .flatten()
                        .map(std::time::Duration::from_nanos)
                }
                _ => None,
            };
            retry_after.push(wait);
            let status = match plan {
                Plan::NoLimit => ok_status(),
                Plan::Unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                Plan::Checked {
                    limits,
                    shadow,
                    first,
                    ..
                } => {
                    let ours = decisions.get(*first..*first + limits.len()).unwrap_or(&[]);
                    let Some((limit, decision)) = closest_to_exhaustion(limits, ours) else {
                        statuses.push(ok_status());
                        continue;
                    };
                    let Some(rate) = limit.rate else {
                        statuses.push(ok_status());
                        continue;
                    };
                    let over = !decision.allowed && !shadow;
                    let header = (
                        rate.requests_per_unit,
                        decision.remaining,
                        decision.reset_after,
                    );
                    if tightest.is_none_or(|(_, remaining, _)| decision.remaining < remaining) {
                        tightest = Some(header);
                    }
                    DescriptorStatus {
                        code: if over { Code::OverLimit } else { Code::Ok } as i32,
                        current_limit: Some(current_limit(limit, &rate)),
                        limit_remaining: decision.remaining,
                        duration_until_reset: Some(proto_duration(decision.reset_after)),
                        quota: None,
                    }
                }
            };
            statuses.push(status);
        }
        let over = statuses
            .iter()
            .any(|status| status.code == Code::OverLimit as i32);
        let mut response = RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..Default::default()
        };
        if self.options.response_headers
            && let Some((limit, remaining, reset_after)) = tightest
        {
            response.response_headers_to_add = vec![
                header("RateLimit-Limit", limit.to_string()),
                header("RateLimit-Remaining", remaining.to_string()),
                header(
                    "RateLimit-Reset",
                    reset_after.div_ceil(NANOS_PER_SEC).to_string(),
                ),
            ];
        }
        Verdict {
            response,
            retry_after,
        }
    }
}

#[cfg(test)]
impl Limiter {
    /// A limiter over the limits in `yaml`, with a small two-shard engine whose clock reads
    /// `start` (Unix nanoseconds) and its own metrics registry.
    pub(crate) fn for_tests(
        yaml: &str,
        start: u64,
        options: LimiterOptions,
        metrics: crate::metrics::MetricsOptions,
    ) -> Limiter {
        let limits = Limits::parse_str("test.yaml", yaml).expect("valid test limits");
        let engine = Engine::spawn(
            crate::engine::EngineConfig {
                shards: 2,
                queue_capacity: 64,
                max_keys: 1000,
                max_waiters: 10,
            },
            crate::clock::Clock::starting_at(start),
        );
        let reload = Arc::new(crate::reload::ReloadStats::with_version(0xabc));
        let cluster = Cluster::single(engine);
        let metrics = Arc::new(Metrics::new(metrics, &cluster, reload));
        Limiter::new(
            Arc::new(ArcSwap::from_pointee(limits)),
            cluster,
            options,
            metrics,
        )
    }
}

/// Counts one limit's share of one descriptor check.
fn record(
    counters: &LimitCounters,
    rate: &Rate,
    decision: &Decision,
    cost: u64,
    admitted: bool,
    shadow: bool,
    near_limit_ratio: f64,
) {
    counters.total_hits.inc_by(cost);
    if admitted {
        counters.within_limit.inc_by(cost);
        // Written as used >= ratio * capacity: exact for round ratios like 0.8 * 5.
        let capacity = rate.capacity() as f64;
        if capacity - f64::from(decision.remaining) >= near_limit_ratio * capacity {
            counters.near_limit.inc_by(cost);
        }
    } else if !decision.allowed {
        if shadow {
            counters.shadow_mode.inc_by(cost);
        } else {
            counters.over_limit.inc_by(cost);
        }
    }
}

/// Checks the request against [`bounds`] and the protocol's rules.
fn validate(request: &RateLimitRequest) -> Result<(), RequestError> {
    use bounds::*;
    if request.domain.is_empty() {
        return Err(RequestError::invalid("domain", "must not be empty"));
    }
    if request.domain.len() > MAX_DOMAIN_LEN {
        return Err(RequestError::invalid(
            "domain",
            format!(
                "{} bytes, at most {MAX_DOMAIN_LEN} allowed",
                request.domain.len()
            ),
        ));
    }
    if request.descriptors.is_empty() {
        return Err(RequestError::invalid("descriptors", "must not be empty"));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(RequestError::invalid(
            "descriptors",
            format!(
                "{} given, at most {MAX_DESCRIPTORS} allowed",
                request.descriptors.len()
            ),
        ));
    }
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        let field = |name: &str| format!("descriptors[{index}].{name}");
        if descriptor.entries.is_empty() {
            return Err(RequestError::invalid(field("entries"), "must not be empty"));
        }
        if descriptor.entries.len() > MAX_ENTRIES {
            return Err(RequestError::invalid(
                field("entries"),
                format!(
                    "{} given, at most {MAX_ENTRIES} allowed",
                    descriptor.entries.len()
                ),
            ));
        }
        for (position, entry) in descriptor.entries.iter().enumerate() {
            let entry_field = |name: &str| field(&format!("entries[{position}].{name}"));
            if entry.key.is_empty() {
                return Err(RequestError::invalid(
                    entry_field("key"),
                    "must not be empty",
                ));
            }
            if entry.key.len() > MAX_KEY_LEN {
                return Err(RequestError::invalid(
                    entry_field("key"),
                    format!("{} bytes, at most {MAX_KEY_LEN} allowed", entry.key.len()),
                ));
            }
            if entry.value.len() > MAX_VALUE_LEN {
                return Err(RequestError::invalid(
                    entry_field("value"),
                    format!(
                        "{} bytes, at most {MAX_VALUE_LEN} allowed",
                        entry.value.len()
                    ),
                ));
            }
        }
        if let Some(limit) = &descriptor.limit
            && Unit::from_proto(limit.unit).is_none()
        {
            return Err(RequestError::invalid(
                field("limit.unit"),
                format!("unknown unit {}", limit.unit),
            ));
        }
        if descriptor.is_negative_hits {
            return Err(RequestError::invalid(
                field("is_negative_hits"),
                "negative hits are not supported",
            ));
        }
    }
    Ok(())
}

/// The limit a descriptor's own `limit` field asks for, if any.
/// Its unit was checked by [`validate`].
fn override_limit(descriptor: &RateLimitDescriptor) -> Option<Limit> {
    let limit = descriptor.limit.as_ref()?;
    let unit = Unit::from_proto(limit.unit)?;
    Some(Limit {
        index: usize::MAX,
        name: None,
        rate: Some(Rate::fixed(limit.requests_per_unit, unit)),
        max_wait: None,
        max_queue: 0,
        replaces: Box::default(),
    })
}

/// The names that matched limits ask to replace.
fn replaced_names<'a>(nodes: &[Option<&'a Node>]) -> Vec<&'a str> {
    nodes
        .iter()
        .flatten()
        .flat_map(|node| node.limits.iter())
        .flat_map(|limit| limit.replaces.iter())
        .map(|name| &**name)
        .collect()
}

fn is_replaced(limit: &Limit, replaced: &[&str]) -> bool {
    limit
        .name
        .as_deref()
        .is_some_and(|name| replaced.contains(&name))
}

/// The strictest wait policy among the limits that opt in, narrowed to `cap` if given.
fn wait_policy(limits: &[&Limit], cap: Option<std::time::Duration>) -> Option<WaitPolicy> {
    let policy = limits
        .iter()
        .filter_map(|limit| {
            limit.max_wait.map(|max_wait| WaitPolicy {
                max_wait,
                max_queue: limit.max_queue,
            })
        })
        .reduce(|a, b| WaitPolicy {
            max_wait: a.max_wait.min(b.max_wait),
            max_queue: a.max_queue.min(b.max_queue),
        });
    match (policy, cap) {
        (Some(_), Some(cap)) if cap.is_zero() => None,
        (Some(policy), Some(cap)) => Some(WaitPolicy {
            max_wait: policy.max_wait.min(cap),
            ..policy
        }),
        (policy, _) => policy,
    }
}

/// The limit to report for a descriptor: a denying one (the longest to wait) if any, else
/// the one with the fewest hits left (ties: the one that resets last).
fn closest_to_exhaustion<'a>(
    limits: &[&'a Limit],
    decisions: &'a [Decision],
) -> Option<(&'a Limit, &'a Decision)> {
    limits
        .iter()
        .copied()
        .zip(decisions)
        .min_by_key(|(_, decision)| {
            (
                decision.allowed,
                decision.remaining,
                std::cmp::Reverse(decision.retry_after.unwrap_or(u64::MAX)),
                std::cmp::Reverse(decision.reset_after),
            )
        })
}

fn current_limit(limit: &Limit, rate: &Rate) -> RateLimit {
    RateLimit {
        name: limit.name.as_deref().unwrap_or_default().to_owned(),
        requests_per_unit: rate.requests_per_unit,
        unit: rate.unit.to_proto(),
    }
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    }
}

fn response_without_limits(descriptors: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![ok_status(); descriptors],
        ..Default::default()
    }
}

fn proto_duration(nanos: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(nanos / NANOS_PER_SEC).unwrap_or(i64::MAX),
        // Below one second, so it fits.
        nanos: (nanos % NANOS_PER_SEC) as i32,
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    }
}

/// The gRPC service Envoy calls.
#[derive(Debug)]
pub struct RlsService {
    limiter: Arc<Limiter>,
    /// Engine failures since the last warning, and when (Unix seconds) it was logged: at
    /// most one warning a second, so an overload does not also flood the logs.
    failures: std::sync::atomic::AtomicU64,
    warned_at: std::sync::atomic::AtomicU64,
}

impl RlsService {
    pub fn new(limiter: Arc<Limiter>) -> RlsService {
        RlsService {
            limiter,
            failures: std::sync::atomic::AtomicU64::new(0),
            warned_at: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn warn_throttled(&self, error: &EngineError) {
        use std::sync::atomic::Ordering::Relaxed;
        let failures = self.failures.fetch_add(1, Relaxed) + 1;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        let last = self.warned_at.load(Relaxed);
        if now > last
            && self
                .warned_at
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            self.failures.fetch_sub(failures, Relaxed);
            tracing::warn!(%error, failures, "rate limit checks failed (answered UNAVAILABLE)");
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        match self.limiter.should_rate_limit(request.get_ref()).await {
            Ok(response) => Ok(tonic::Response::new(response)),
            Err(error) => {
                if let RequestError::Engine(engine) = &error {
                    self.warn_throttled(engine);
                }
                Err(to_status(&error))
            }
        }
    }
}

#[cfg(test)]
mod tests;
