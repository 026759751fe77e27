//! The Rate Limit Quota Service adapter:
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`.
//!
//! The only module that knows RLQS protobufs. Each Envoy holds one stream per domain and
//! reports every bucket's usage on it (at once for a new bucket, then every 5 s); this
//! module checks a report (the first names the domain; sizes are bounded), reads each
//! bucket as a descriptor of the limits ([`resolve`]), hands the usage to the node's [`Hub`]
//! and answers with a quota assignment per reported bucket: allow all, deny all, or a token
//! bucket holding the stream's share of the limit ([`divide`]). The hub pushes changed
//! shares to the other streams of a bucket, and a [`Sweeper`] abandons idle buckets.
//!
//! Invariants:
//! - A refused report ends its stream with a status naming the field (`INVALID_ARGUMENT`)
//!   or the bound (`RESOURCE_EXHAUSTED`), and changes nothing.
//! - Streams end when the server stops (so the gRPC drain is not held up by them), and a
//!   closed stream's shares go back to the others at once.
//! - With `--store redis` every stream is refused (`UNIMPLEMENTED`, the reason in the
//!   message): each node would divide the limit alone. In cluster mode each node divides
//!   its share of the limit, from the bucket's owner ([`cluster`]).

pub mod cluster;
mod division;
mod hub;
mod rule;
mod stats;

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

pub use self::division::{FLOOR_DIVISOR, TokenBucket, divide, keeps};
pub use self::hub::{
    Action, BucketView, Hub, HubError, HubOptions, Members, NodeDemand, ReporterView, Strategy,
    StreamId, Usage, node_limit,
};
pub use self::rule::{BucketKey, Rule, bucket_key, resolve};
pub use self::stats::{RlqsStats, UNKNOWN_DOMAIN};

/// Envoy 1.40 reports every bucket this often (fixed; `reporting_interval` is not read).
pub const ENVOY_REPORT_INTERVAL: Duration = Duration::from_secs(5);

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
    /// How long Envoy keeps an assignment without hearing again (whole seconds).
    pub assignment_ttl: Duration,
    /// How often idle buckets and silent reporters are looked for.
    pub sweep_every: Duration,
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
}

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
        let usages = usages(&report).map_err(|status| ("invalid_argument", status))?;
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
                if report.domain.is_empty() {
                    return Err((
                        "invalid_argument",
                        Status::invalid_argument(
                            "domain: the first report of a stream must name the domain (the limits domain of its buckets)",
                        ),
                    ));
                }
                let known = self
                    .limiter
                    .limits()
                    .load()
                    .domain(&report.domain)
                    .is_some();
                let label = if known {
                    report.domain.as_str()
                } else {
                    tracing::info!(domain = %report.domain, "rlqs stream for a domain no limits file defines: its buckets are allowed all");
                    UNKNOWN_DOMAIN
                };
                let sink_tx = tx.clone();
                let ttl = self.options.assignment_ttl;
                let sink: hub::Sink =
                    Box::new(move |actions| sink_tx.try_send(Ok(response(actions, ttl))).is_ok());
                let id = self
                    .hub
                    .open(&report.domain, label, sink)
                    .map_err(|error| ("too_many_streams", hub_status(&error)))?;
                *open = Some((id, report.domain.clone()));
                (id, report.domain.clone())
            }
        };
        let limits = self.limiter.limits().load();
        let shadow = self.limiter.options().shadow_mode;
        let domain_limits = limits.domain(&domain);
        let reported = self
            .hub
            .report(
                id,
                usages,
                |bucket| rule::resolve(domain_limits, bucket, shadow),
                Instant::now(),
            )
            .map_err(|error| ("too_many_buckets", hub_status(&error)))?;
        Ok(response(reported.actions, self.options.assignment_ttl))
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

/// The report's usages as plain values; the error names the field at fault.
pub fn usages(report: &RateLimitQuotaUsageReports) -> Result<Vec<Usage>, Status> {
    report
        .bucket_quota_usages
        .iter()
        .enumerate()
        .map(|(index, usage)| {
            let field = format!("bucket_quota_usages[{index}].bucket_id");
            let pairs = usage
                .bucket_id
                .as_ref()
                .map(|id| &id.bucket)
                .filter(|pairs| !pairs.is_empty())
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "{field}: missing or empty; a bucket id needs at least one pair"
                    ))
                })?;
            if pairs.len() > MAX_BUCKET_ENTRIES {
                return Err(Status::invalid_argument(format!(
                    "{field}: {} pairs, more than the {MAX_BUCKET_ENTRIES} allowed",
                    pairs.len()
                )));
            }
            if let Some((key, _)) = pairs
                .iter()
                .find(|(key, value)| key.len() > MAX_ENTRY_BYTES || value.len() > MAX_ENTRY_BYTES)
            {
                let shown: String = key.chars().take(32).collect();
                return Err(Status::invalid_argument(format!(
                    "{field}: the pair {shown:?} is longer than {MAX_ENTRY_BYTES} bytes"
                )));
            }
            let seconds = usage
                .time_elapsed
                .as_ref()
                .map_or(0, |elapsed| elapsed.seconds.clamp(0, 86_400 * 366));
            Ok(Usage {
                bucket: bucket_key(
                    pairs
                        .iter()
                        .map(|(key, value)| (key.as_str(), value.as_str())),
                ),
                allowed: usage.num_requests_allowed,
                denied: usage.num_requests_denied,
                elapsed: Duration::from_secs(seconds.unsigned_abs()),
            })
        })
        .collect()
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
