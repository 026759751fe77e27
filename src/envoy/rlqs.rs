//! The Rate Limit Quota Service adapter:
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`.
//!
//! The only module that knows RLQS protobufs. Each Envoy holds one stream per domain and
//! reports every bucket's usage on it (at once for a new bucket, then every 5 s); this
//! module checks a report (the first names the domain; sizes are bounded), reads each
//! bucket as a descriptor of the limits ([`resolve`]), hands the usage to the node's [`Hub`]
//! and answers with a quota assignment per reported bucket: allow all, deny all, or a token
//! bucket holding the stream's share of the limit ([`divide`](crate::quota::divide)). The
//! hub pushes changed shares to the other streams of a bucket, and a [`Sweeper`] abandons
//! idle buckets.
//!
//! Invariants:
//! - A refused report ends its stream with a status naming the field (`INVALID_ARGUMENT`)
//!   or the bound (`RESOURCE_EXHAUSTED`), and changes nothing. A bucket whose id cannot be
//!   read as a descriptor (empty, too many pairs, a pair too long) is denied all on its own
//!   and the stream goes on ([`usages`]): ids come from request headers, and one client's
//!   must not end every bucket's assignment.
//! - Streams end when the server stops (so the gRPC drain is not held up by them), and a
//!   closed stream's shares go back to the others at once.
//! - With `--store redis` every stream is refused (`UNIMPLEMENTED`, the reason in the
//!   message): each node would divide the limit alone. In cluster mode each node divides
//!   its share of the limit, from the bucket's owner ([`crate::quota::cluster`]).
//!
//! What is not about the protocol (the hub, the division, the rules, the exchange across
//! the cluster) is [`crate::quota`]'s.

use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as Proto};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket as ProtoTokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as ActionKind, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tonic::{Status, Streaming};

use crate::limiter::Limiter;

use crate::quota::{
    Action, BucketKey, ENVOY_REPORT_INTERVAL, Hub, HubError, HubOptions, RlqsStats, Sink, Strategy,
    StreamId, UNKNOWN_DOMAIN, Usage, bucket_key, resolve,
};

/// The assignment TTLs `--rlqs-assignment-ttl` may be: longer than one of Envoy's report
/// intervals (every report renews the assignment), at most an hour.
pub const ASSIGNMENT_TTLS: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(6)..=Duration::from_secs(3600);

/// Most pairs in one bucket id.
pub const MAX_BUCKET_ENTRIES: usize = 32;

/// Most bytes of one bucket id key or value.
pub const MAX_ENTRY_BYTES: usize = 1024;

/// Answers queued for one stream; a push that finds the queue full is skipped (the stream
/// gets its assignment at its next report).
const STREAM_QUEUE: usize = 64;

/// The RLQS settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RlqsOptions {
    pub hub: HubOptions,
    /// How long Envoy keeps an assignment without hearing again (whole seconds, within
    /// [`ASSIGNMENT_TTLS`]).
    pub assignment_ttl: Duration,
    /// How often idle buckets and silent reporters are looked for.
    pub sweep_every: Duration,
    /// Cluster mode: how often a node sends its demand to the buckets' owners (within
    /// [`crate::quota::cluster::EXCHANGE_INTERVALS`]); an owner forgets a node after two of them.
    pub exchange_every: Duration,
    /// The largest report, in encoded bytes.
    pub max_message_bytes: usize,
}

impl Default for RlqsOptions {
    fn default() -> RlqsOptions {
        RlqsOptions {
            hub: HubOptions {
                max_streams: 1024,
                max_buckets_per_stream: 10_000,
                max_buckets: 100_000,
                // Three missed reports.
                stale_after: 3 * ENVOY_REPORT_INTERVAL,
                abandon_after: Duration::from_secs(60),
            },
            // Three report intervals: one lost report does not drop Envoy to its fallback.
            assignment_ttl: 3 * ENVOY_REPORT_INTERVAL,
            sweep_every: ENVOY_REPORT_INTERVAL,
            exchange_every: crate::quota::cluster::EXCHANGE_EVERY,
            max_message_bytes: 1 << 20,
        }
    }
}

/// The gRPC service.
pub struct RlqsService {
    shared: Arc<Shared>,
}

struct Shared {
    hub: Arc<Hub>,
    limiter: Arc<Limiter>,
    options: RlqsOptions,
    /// Why every stream is refused (`--store redis`).
    refused: Option<String>,
    stop: watch::Receiver<bool>,
    /// When an invalid bucket id was last logged.
    invalid_logged: std::sync::Mutex<Option<Instant>>,
}

/// Invalid bucket ids are logged at most this often (the metric counts every one).
const INVALID_LOG_EVERY: Duration = Duration::from_secs(60);

impl RlqsService {
    /// A service over `limiter`'s limits. `refused`: the reason every stream is refused;
    /// `stop` turning true (or its sender dropping) ends every stream.
    pub fn new(
        limiter: Arc<Limiter>,
        options: RlqsOptions,
        stats: RlqsStats,
        refused: Option<String>,
        stop: watch::Receiver<bool>,
    ) -> RlqsService {
        RlqsService {
            shared: Arc::new(Shared {
                hub: Arc::new(Hub::new(options.hub, stats)),
                limiter,
                options,
                refused,
                stop,
                invalid_logged: std::sync::Mutex::new(None),
            }),
        }
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.shared.hub
    }

    /// The tonic server (messages up to four times `max_message_bytes` are read, so the
    /// bound is answered with `RESOURCE_EXHAUSTED` by this module, not tonic).
    pub fn into_server(self) -> RateLimitQuotaServiceServer<RlqsService> {
        let max = self.shared.options.max_message_bytes.saturating_mul(4);
        RateLimitQuotaServiceServer::new(self).max_decoding_message_size(max)
    }

    /// The sweeper of this service's hub (not started).
    pub fn sweeper(&self) -> Sweeper {
        Sweeper {
            hub: Arc::downgrade(&self.shared.hub),
            every: self.shared.options.sweep_every,
        }
    }
}

/// Abandons idle buckets and drops silent reporters every `sweep_every`; ends once the hub
/// is gone.
pub struct Sweeper {
    hub: Weak<Hub>,
    every: Duration,
}

impl Sweeper {
    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run())
    }

    pub async fn run(self) {
        let mut ticks = tokio::time::interval(self.every.max(Duration::from_millis(10)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(hub) = self.hub.upgrade() else {
                return;
            };
            hub.sweep(Instant::now());
        }
    }
}

/// The answers of one stream, as tonic reads them.
pub struct Outbound(mpsc::Receiver<Result<RateLimitQuotaResponse, Status>>);

impl futures_core::Stream for Outbound {
    type Item = Result<RateLimitQuotaResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Outbound;

    async fn stream_rate_limit_quotas(
        &self,
        request: tonic::Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<Outbound>, Status> {
        if let Some(reason) = &self.shared.refused {
            self.shared.hub.stats().refuse("unsupported_store");
            return Err(Status::unimplemented(reason.clone()));
        }
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        tokio::spawn(run_stream(
            Arc::clone(&self.shared),
            request.into_inner(),
            tx,
        ));
        Ok(tonic::Response::new(Outbound(rx)))
    }
}

type Tx = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// One stream, until Envoy ends it, a report is refused or the server stops.
async fn run_stream(
    shared: Arc<Shared>,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    tx: Tx,
) {
    let mut stop = shared.stop.clone();
    let mut open: Option<(StreamId, String)> = None;
    let ended = loop {
        let message = tokio::select! {
            message = inbound.message() => message,
            _ = stop.wait_for(|stop| *stop) => break Ok(()),
        };
        let report = match message {
            Ok(Some(report)) => report,
            Ok(None) => break Ok(()),
            // What tonic could not read (a message over its bound: OUT_OF_RANGE) is answered
            // with tonic's status; a client that went away never sees it.
            Err(status) => {
                tracing::debug!(%status, "rlqs stream ended reading a report");
                break Err(status);
            }
        };
        match shared.take(&mut open, report, &tx) {
            // A report naming no bucket needs no answer.
            Ok(response) if response.bucket_action.is_empty() => {}
            Ok(response) => {
                if tx.send(Ok(response)).await.is_err() {
                    break Ok(());
                }
            }
            Err((reason, status)) => {
                shared.hub.stats().refuse(reason);
                tracing::debug!(%status, "rlqs stream refused");
                break Err(status);
            }
        }
    };
    if let Some((id, _)) = open {
        shared.hub.close(id);
    }
    if let Err(status) = ended {
        let _ = tx.send(Err(status)).await;
    }
}

impl Shared {
    /// Checks and applies one report; the answer for its buckets, or why the stream ends
    /// (a metric reason and the status).
    fn take(
        &self,
        open: &mut Option<(StreamId, String)>,
        report: RateLimitQuotaUsageReports,
        tx: &Tx,
    ) -> Result<RateLimitQuotaResponse, (&'static str, Status)> {
        let size = report.encoded_len();
        if size > self.options.max_message_bytes {
            return Err((
                "message_too_large",
                Status::resource_exhausted(format!(
                    "the report is {size} bytes, more than the {} allowed (--rlqs-max-message-bytes)",
                    self.options.max_message_bytes
                )),
            ));
        }
        let Usages { valid, invalid } = usages(&report);
        let (id, domain) = match open {
            Some((id, domain)) => {
                if !report.domain.is_empty() && report.domain != *domain {
                    return Err((
                        "invalid_argument",
                        Status::invalid_argument(format!(
                            "domain: a stream reports one domain; it opened with {domain:?} and now names {:?}",
                            report.domain
                        )),
                    ));
                }
                (*id, domain.clone())
            }
            None => {
                let id = self.open(&report.domain, tx)?;
                *open = Some((id, report.domain.clone()));
                (id, report.domain.clone())
            }
        };
        let limits = self.limiter.limits().load();
        let shadow = self.limiter.options().shadow_mode;
        let domain_limits = limits.domain(&domain);
        let mut actions = self
            .hub
            .report(
                id,
                valid,
                |bucket| resolve(domain_limits, bucket, shadow),
                Instant::now(),
            )
            .map_err(|error| ("too_many_buckets", hub_status(&error)))?
            .actions;
        if !invalid.is_empty() {
            actions.extend(self.deny_invalid(&domain, invalid));
        }
        Ok(response(actions, self.options.assignment_ttl))
    }

    /// Opens a stream on its first report, which names `domain`: a domain no limits file
    /// defines is counted as `_unknown`, and its buckets are allowed all.
    fn open(&self, domain: &str, tx: &Tx) -> Result<StreamId, (&'static str, Status)> {
        if domain.is_empty() {
            return Err((
                "invalid_argument",
                Status::invalid_argument(
                    "domain: the first report of a stream must name the domain (the limits domain of its buckets)",
                ),
            ));
        }
        let known = self.limiter.limits().load().domain(domain).is_some();
        let label = if known {
            domain
        } else {
            tracing::info!(domain = %domain, "rlqs stream for a domain no limits file defines: its buckets are allowed all");
            UNKNOWN_DOMAIN
        };
        let sink_tx = tx.clone();
        let ttl = self.options.assignment_ttl;
        let sink: Sink =
            Box::new(move |actions| sink_tx.try_send(Ok(response(actions, ttl))).is_ok());
        self.hub
            .open(domain, label, sink)
            .map_err(|error| ("too_many_streams", hub_status(&error)))
    }

    /// Answers buckets whose id cannot be read as a descriptor: deny all, each counted by
    /// its reason, the first logged at most once a minute.
    fn deny_invalid(&self, domain: &str, mut invalid: Vec<InvalidBucket>) -> Vec<Action> {
        invalid.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        invalid.dedup_by(|a, b| a.bucket == b.bucket);
        for bucket in &invalid {
            self.hub.stats().invalid_bucket(bucket.reason);
        }
        let mut logged = self
            .invalid_logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if logged.is_none_or(|at| at.elapsed() >= INVALID_LOG_EVERY) {
            *logged = Some(Instant::now());
            tracing::warn!(
                domain,
                buckets = invalid.len(),
                problem = %invalid[0].problem,
                "rlqs buckets whose id cannot be read as a descriptor are denied all (logged at most once a minute; ratekeeper_rlqs_invalid_buckets_total counts them)"
            );
        }
        invalid
            .into_iter()
            .map(|bucket| Action::Assign {
                bucket: bucket.bucket,
                strategy: Strategy::DenyAll,
            })
            .collect()
    }
}

fn hub_status(error: &HubError) -> Status {
    match error {
        HubError::TooManyStreams(_)
        | HubError::TooManyBuckets { .. }
        | HubError::TooManyNodeBuckets { .. } => Status::resource_exhausted(error.to_string()),
        HubError::Closed => Status::unavailable(error.to_string()),
    }
}

/// A report's buckets: those read as descriptors, and those whose id cannot be (answered
/// DENY_ALL on their own while the stream goes on: see [`usages`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Usages {
    pub valid: Vec<Usage>,
    pub invalid: Vec<InvalidBucket>,
}

/// A bucket whose id cannot be read as a descriptor.
#[derive(Debug, PartialEq, Eq)]
pub struct InvalidBucket {
    /// The id as reported, to echo (Envoy matches an answer to its bucket by the id).
    pub bucket: BucketKey,
    /// The metric's reason: `empty`, `too_many_pairs` or `pair_too_long`.
    pub reason: &'static str,
    /// What is wrong, naming the field.
    pub problem: String,
}

/// The report's usages as plain values. A bucket id without pairs, with more than
/// [`MAX_BUCKET_ENTRIES`] pairs or a pair over [`MAX_ENTRY_BYTES`] is set apart rather than
/// ending the stream: bucket ids come from request headers, and one client's empty or
/// oversized `x-api-key` must not cost every bucket of its Envoy its assignments (Envoy
/// would fall back to its `expired_assignment_behavior`, often allow all). Such a bucket is
/// denied all: nothing a client sends buys it more than a valid id would.
pub fn usages(report: &RateLimitQuotaUsageReports) -> Usages {
    let mut read = Usages::default();
    for (index, usage) in report.bucket_quota_usages.iter().enumerate() {
        let pairs = usage.bucket_id.as_ref().map(|id| &id.bucket);
        let bucket = || {
            bucket_key(
                pairs
                    .into_iter()
                    .flatten()
                    .map(|(key, value)| (key.as_str(), value.as_str())),
            )
        };
        let field = || format!("bucket_quota_usages[{index}].bucket_id");
        let count = pairs.map_or(0, |pairs| pairs.len());
        let too_long = pairs
            .into_iter()
            .flatten()
            .find(|(key, value)| key.len() > MAX_ENTRY_BYTES || value.len() > MAX_ENTRY_BYTES);
        let invalid = if count == 0 {
            Some((
                "empty",
                format!(
                    "{}: missing or empty; a bucket id needs at least one pair",
                    field()
                ),
            ))
        } else if count > MAX_BUCKET_ENTRIES {
            Some((
                "too_many_pairs",
                format!(
                    "{}: {count} pairs, more than the {MAX_BUCKET_ENTRIES} allowed",
                    field()
                ),
            ))
        } else {
            too_long.map(|(key, _)| {
                let shown: String = key.chars().take(32).collect();
                (
                    "pair_too_long",
                    format!(
                        "{}: the pair {shown:?} is longer than {MAX_ENTRY_BYTES} bytes",
                        field()
                    ),
                )
            })
        };
        if let Some((reason, problem)) = invalid {
            read.invalid.push(InvalidBucket {
                bucket: bucket(),
                reason,
                problem,
            });
            continue;
        }
        let seconds = usage
            .time_elapsed
            .as_ref()
            .map_or(0, |elapsed| elapsed.seconds.clamp(0, 86_400 * 366));
        read.valid.push(Usage {
            bucket: bucket(),
            allowed: usage.num_requests_allowed,
            denied: usage.num_requests_denied,
            elapsed: Duration::from_secs(seconds.unsigned_abs()),
        });
    }
    read
}

/// The message carrying `actions`, each assignment living `ttl` (whole seconds).
pub fn response(actions: Vec<Action>, ttl: Duration) -> RateLimitQuotaResponse {
    let ttl = ProtoDuration {
        seconds: i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX),
        nanos: 0,
    };
    let bucket_action = actions
        .into_iter()
        .map(|action| match action {
            Action::Assign { bucket, strategy } => BucketAction {
                bucket_id: Some(bucket_id(&bucket)),
                bucket_action: Some(ActionKind::QuotaAssignmentAction(QuotaAssignmentAction {
                    assignment_time_to_live: Some(ttl),
                    rate_limit_strategy: Some(strategy_proto(strategy)),
                })),
            },
            Action::Abandon { bucket } => BucketAction {
                bucket_id: Some(bucket_id(&bucket)),
                bucket_action: Some(ActionKind::AbandonAction(AbandonAction {})),
            },
        })
        .collect();
    RateLimitQuotaResponse { bucket_action }
}

fn bucket_id(bucket: &BucketKey) -> BucketId {
    BucketId {
        bucket: bucket
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect(),
    }
}

fn strategy_proto(strategy: Strategy) -> RateLimitStrategy {
    let strategy = match strategy {
        Strategy::AllowAll => Proto::BlanketRule(BlanketRule::AllowAll as i32),
        Strategy::DenyAll => Proto::BlanketRule(BlanketRule::DenyAll as i32),
        Strategy::TokenBucket(bucket) => Proto::TokenBucket(ProtoTokenBucket {
            max_tokens: bucket.max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: bucket.tokens_per_fill,
            }),
            fill_interval: Some(ProtoDuration {
                seconds: i64::try_from(bucket.fill_interval_secs).unwrap_or(i64::MAX),
                nanos: 0,
            }),
        }),
    };
    RateLimitStrategy {
        strategy: Some(strategy),
    }
}

#[cfg(test)]
mod tests;
