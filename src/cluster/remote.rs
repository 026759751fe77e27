//! One peer as seen from this node: a batcher that groups forwarded checks into one RPC, a
//! deadline on every call, and a circuit breaker so a dead peer costs a fast local fallback
//! instead of a timeout per request.
//!
//! Batching: the batcher takes the first waiting group, then everything else already queued
//! (up to `batch_size`), yields once to let concurrent callers add theirs, and sends as soon
//! as nothing more arrived or `batch_window` passed. An idle peer adds no latency; a busy one
//! gets full batches. (Tokio's timers tick in milliseconds, so the sub-millisecond window is
//! measured with `Instant`, not slept.) Several batches may be in flight at once, up to
//! `max_in_flight`.
//!
//! Liveness: the connection to the peer carries HTTP/2 pings every `keepalive`; one not
//! acknowledged within `keepalive_timeout` closes the connection, failing the calls on it at
//! once. So a silent peer (partitioned, stopped, its host gone) costs at most
//! `keepalive + keepalive_timeout`, a dead one (refused, reset) nothing, while a peer that is
//! merely slow (an overloaded machine) still acknowledges pings and is waited for up to the
//! forward's deadline (`--peer-timeout`): falling back then would decide the owner's keys a
//! second time, on another counter, while the owner counts them too.
//!
//! Invariants: the queue to the batcher is bounded (`try_send`; full = fallback); every
//! submitted group gets exactly one answer, within the deadline; the breaker opens after
//! `breaker_failures` consecutive failed calls and lets calls through again after
//! `breaker_cooldown`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tonic::transport::Channel;

use super::convert::{self, OLDEST};
use super::lease::{Grant, Leases, Refund};
use super::proto::v1 as wire;
use super::proto::v1::peer_client::PeerClient;
use super::{ClusterOptions, PeerStats};
use crate::breaker::Breaker;
use crate::check::{Checks, Decisions, Slot};
use crate::error::{ClusterError, ErrorKind};
use crate::key::KeyId;
use crate::transport::tls::Tls;

/// A forward batch slower than this is counted as slow (`ratekeeper_peer_slow_total`): past
/// Envoy's default rate limit timeout (20 ms), so Envoy applied its failure mode meanwhile.
const SLOW: Duration = Duration::from_millis(20);

/// Why a forward did not get the owner's answer.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PeerError {
    #[error("peer {0} is marked down (circuit open)")]
    CircuitOpen(Arc<str>),
    #[error("the queue to peer {0} is full")]
    QueueFull(Arc<str>),
    #[error("peer {peer} did not answer: {problem}")]
    Unreachable { peer: Arc<str>, problem: String },
    /// The owner answered, with an error of its own (it is overloaded or full).
    #[error("peer {peer}: {message}")]
    Remote {
        peer: Arc<str>,
        kind: ErrorKind,
        message: String,
    },
}

/// Where no fallback may stand in (explanations, resets, an owner's own error): the
/// owner's error as it answered it, and anything else as the owner being unreachable.
impl From<PeerError> for ClusterError {
    fn from(error: PeerError) -> ClusterError {
        match error {
            PeerError::Remote {
                peer,
                kind,
                message,
            } => ClusterError::Owner {
                peer,
                kind,
                message,
            },
            PeerError::CircuitOpen(peer)
            | PeerError::QueueFull(peer)
            | PeerError::Unreachable { peer, .. } => ClusterError::Unreachable { peer },
        }
    }
}

/// The owner's decisions, or why not, with the checks handed back for the fallback.
pub type Answer = Result<Answered, (PeerError, Checks)>;

/// The owner's decisions for one request's checks, and what it counted for them.
#[derive(Debug)]
pub struct Answered {
    /// One per counter, in order.
    pub decisions: Decisions,
    pub counted: Counted,
}

/// What an owner counted for one request's checks: enough to give it back if the request
/// fails elsewhere (read only then, so the request path only moves what it already has).
#[derive(Debug)]
pub struct Counted {
    /// The checks, handed back.
    checks: Checks,
    /// Per counter, the window the owner counted it in (`Decision.counted_window` in the
    /// protocol) when its check was admitted and cost something; `None` otherwise.
    windows: SmallVec<[Option<u64>; 4]>,
}

impl Counted {
    /// `checks` as the owner answered them (`decisions`: one per counter, in order).
    fn new(checks: Checks, decisions: &[wire::Decision]) -> Counted {
        let mut windows = SmallVec::with_capacity(decisions.len());
        let mut offset = 0;
        for check in &checks {
            let len = check.counters.len();
            let answered = decisions.get(offset..offset + len).unwrap_or_default();
            offset += len;
            let admitted = check.takes()
                && answered.len() == len
                && answered.iter().all(|decision| decision.allowed);
            windows.extend(
                answered
                    .iter()
                    .map(|decision| admitted.then_some(decision.counted_window)),
            );
        }
        Counted { checks, windows }
    }

    /// What the owner (`lender`) counted, as refunds: each counter of each check it
    /// admitted, the check's cost, in the window the owner named.
    pub fn refunds(&self, lender: &Arc<str>) -> Vec<Refund> {
        let counters = self
            .checks
            .iter()
            .flat_map(|check| check.counters.iter().map(|counter| (check.cost, counter)));
        counters
            .zip(&self.windows)
            .filter_map(|((units, counter), window)| {
                Some(Refund {
                    lender: Arc::clone(lender),
                    counter: *counter,
                    units,
                    window: (*window)?,
                })
            })
            .collect()
    }
}

struct Pending {
    checks: Checks,
    reply: oneshot::Sender<Answer>,
}

/// A peer node: forwards, handoffs and membership calls.
pub struct Remote {
    address: Arc<str>,
    me: Arc<str>,
    client: PeerClient<Channel>,
    queue: mpsc::Sender<Pending>,
    pub breaker: Breaker,
    pub stats: PeerStats,
    timeout: Duration,
    /// Where the leases this peer grants are kept.
    leases: Arc<Leases>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("address", &self.address)
            .field("open", &self.breaker.is_open())
            .finish()
    }
}

impl Remote {
    /// A client for `address` with its batcher running (over mutual TLS with `tls`).
    /// `recovered` is notified when the breaker closes again (so counters kept meanwhile can
    /// be handed over).
    pub fn spawn(
        address: Arc<str>,
        me: Arc<str>,
        options: &ClusterOptions,
        recovered: Arc<Notify>,
        leases: Arc<Leases>,
        tls: Option<&Tls>,
    ) -> Result<Arc<Remote>, PeerError> {
        let unreachable = |problem: String| PeerError::Unreachable {
            peer: Arc::clone(&address),
            problem,
        };
        let endpoint = super::dial::endpoint(&address)
            .map_err(unreachable)?
            .connect_timeout(options.timeout.max(Duration::from_millis(100)))
            .http2_keep_alive_interval(options.keepalive)
            .keep_alive_timeout(options.keepalive_timeout)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let channel = super::dial::channel(&address, endpoint, tls).map_err(unreachable)?;
        let client = PeerClient::new(channel);
        let (queue, rx) = mpsc::channel(options.queue_capacity.max(1));
        let remote = Arc::new(Remote {
            address,
            me,
            client,
            queue,
            breaker: Breaker::new(options.breaker_failures, options.breaker_cooldown),
            stats: PeerStats::default(),
            timeout: options.timeout,
            leases,
        });
        let batcher = Batcher {
            remote: Arc::downgrade(&remote),
            rx,
            batch_size: options.batch_size.max(1),
            batch_window: options.batch_window,
            in_flight: Arc::new(Semaphore::new(options.max_in_flight.max(1))),
            recovered,
        };
        tokio::spawn(batcher.run());
        Ok(remote)
    }

    pub fn address(&self) -> &Arc<str> {
        &self.address
    }

    /// Queues one request's checks for this peer; the answer arrives on the receiver. When
    /// the peer is marked down or its queue is full, the checks come straight back.
    #[allow(
        clippy::result_large_err,
        reason = "the error hands the checks back, no copy"
    )]
    pub fn submit(&self, checks: Checks) -> Result<oneshot::Receiver<Answer>, (PeerError, Checks)> {
        if self.breaker.refuses() {
            return Err((PeerError::CircuitOpen(Arc::clone(&self.address)), checks));
        }
        let (reply, rx) = oneshot::channel();
        match self.queue.try_send(Pending { checks, reply }) {
            Ok(()) => Ok(rx),
            Err(full_or_closed) => {
                self.breaker.abandon();
                Err((
                    PeerError::QueueFull(Arc::clone(&self.address)),
                    full_or_closed.into_inner().checks,
                ))
            }
        }
    }

    fn unreachable(&self, problem: impl ToString) -> PeerError {
        PeerError::Unreachable {
            peer: Arc::clone(&self.address),
            problem: problem.to_string(),
        }
    }

    /// An answer from this peer that is not what the call expects.
    fn answered(&self, message: String) -> PeerError {
        PeerError::Remote {
            peer: Arc::clone(&self.address),
            kind: ErrorKind::Internal,
            message,
        }
    }

    /// One call other than a forward: `message` sent through `send` with `deadline` (also
    /// the gRPC timeout the peer sees). A peer that answers UNIMPLEMENTED predates the call
    /// (added within version 1): an error saying it cannot `what`; any other failure, or
    /// no answer in time, is unreachable.
    async fn call<T, R, F, Fut>(
        &self,
        what: &str,
        deadline: Duration,
        message: T,
        send: F,
    ) -> Result<R, PeerError>
    where
        F: FnOnce(PeerClient<Channel>, tonic::Request<T>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let mut request = tonic::Request::new(message);
        request.set_timeout(deadline);
        match tokio::time::timeout(deadline, send(self.client.clone(), request)).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                Err(self.answered(format!("this node's version cannot {what} (upgrade it)")))
            }
            Ok(Err(status)) => Err(self.unreachable(status.message())),
            Err(_) => Err(self.unreachable(format!("no answer to {what} within {deadline:?}"))),
        }
    }

    /// The deadline of membership, reset, refund and explain calls: not on the request
    /// path, so longer than a forward's when that is short.
    fn admin_deadline(&self) -> Duration {
        self.timeout.max(Duration::from_secs(1))
    }

    /// Hands counters to this peer (it owns them now). Not on the request path, so it gets
    /// a longer deadline than forwards.
    pub async fn handoff(&self, counters: &[(KeyId, Slot)]) -> Result<u32, PeerError> {
        let batch = wire::HandoffBatch {
            version: OLDEST,
            sender: self.me.to_string(),
            counters: counters
                .iter()
                .map(|(key, slot)| convert::state_to_wire(key, slot))
                .collect(),
        };
        let send =
            |mut client: PeerClient<Channel>, request| async move { client.handoff(request).await };
        let reply = self
            .call("take counters", Duration::from_secs(5), batch, send)
            .await?;
        Ok(reply.accepted)
    }

    /// Gives hits back to this peer (their counters' owner): unspent leased ones, and those
    /// it counted for a request that failed elsewhere. Answers how many it took back.
    pub async fn refund(&self, refunds: &[Refund]) -> Result<u64, PeerError> {
        let batch = wire::RefundBatch {
            version: convert::version_for(refunds.iter().map(|refund| &refund.counter.rate)),
            sender: self.me.to_string(),
            refunds: refunds
                .iter()
                .map(|refund| wire::Refunded {
                    counter: Some(convert::counter_to_wire(&refund.counter)),
                    units: refund.units,
                    window: refund.window,
                })
                .collect(),
        };
        let send =
            |mut client: PeerClient<Channel>, request| async move { client.refund(request).await };
        let reply = self
            .call("take leased hits back", self.admin_deadline(), batch, send)
            .await?;
        Ok(reply.taken_back)
    }

    /// Keeps the leases the owner granted with `decisions` (answering `checks`).
    fn take_leases(&self, checks: &Checks, decisions: &[wire::Decision]) {
        let now = tokio::time::Instant::now();
        let counters = checks.iter().flat_map(|check| check.counters.iter());
        for (counter, decision) in counters.zip(decisions) {
            if let Some(grant) = grant(&self.address, decision) {
                self.leases.take(counter, grant, now);
            }
        }
    }

    /// Asks this peer (the keys' owner) to forget the counters of `keys`; answers how
    /// many it held. A node without the call (an older version) is reported as such.
    pub async fn reset(&self, keys: &[KeyId]) -> Result<u32, PeerError> {
        let message = wire::ResetRequest {
            version: OLDEST,
            sender: self.me.to_string(),
            keys: keys.iter().map(convert::key_to_wire).collect(),
        };
        let send =
            |mut client: PeerClient<Channel>, request| async move { client.reset(request).await };
        let reply = self
            .call("reset counters", self.admin_deadline(), message, send)
            .await?;
        Ok(reply.removed)
    }

    /// Asks this peer (the keys' owner) how its counters stand for `checks`' costs, consuming
    /// nothing (an explanation): one decision per counter, in order. A node without the
    /// call (an older version) is reported as such.
    pub async fn peek(&self, checks: &Checks) -> Result<Decisions, PeerError> {
        let rates = checks
            .iter()
            .flat_map(|check| check.counters.iter().map(|counter| &counter.rate));
        let message = wire::PeekRequest {
            version: convert::version_for(rates),
            sender: self.me.to_string(),
            checks: checks
                .iter()
                .map(|check| wire::Check {
                    max_wait_nanos: 0,
                    max_queue: 0,
                    lease: false,
                    ..convert::check_to_wire(check)
                })
                .collect(),
        };
        let send =
            |mut client: PeerClient<Channel>, request| async move { client.peek(request).await };
        let reply = self
            .call("explain counters", self.admin_deadline(), message, send)
            .await?;
        Ok(reply
            .decisions
            .iter()
            .map(convert::decision_from_wire)
            .collect())
    }

    /// Asks this peer for its counter names of `domain` above `after` (at most `limit`)
    /// within `deadline`; `None` when it keeps none. A node without the call (an older
    /// version) is reported as such.
    pub async fn names(
        &self,
        domain: &str,
        after: Option<u64>,
        limit: usize,
        deadline: Duration,
    ) -> Result<Option<super::names::NamesPage>, PeerError> {
        let message = wire::NamesRequest {
            version: OLDEST,
            sender: self.me.to_string(),
            domain: domain.to_owned(),
            has_after: after.is_some(),
            after: after.unwrap_or(0),
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
        };
        let send =
            |mut client: PeerClient<Channel>, request| async move { client.names(request).await };
        let reply = self.call("list counters", deadline, message, send).await?;
        convert::names_from_wire(domain, limit, reply)
            .map_err(|problem| self.answered(format!("a malformed listing: {problem}")))
    }

    /// Sends this peer (their owner) this node's demand for quota buckets, within
    /// `deadline`: the share of each, in order (`None`: none given); `Ok(None)` when it
    /// divides no quotas. At most [`quota::MAX_BUCKETS`](super::quota::MAX_BUCKETS)
    /// demands (the caller splits larger batches).
    pub async fn quota(
        &self,
        demands: &[super::quota::QuotaDemand],
        deadline: Duration,
    ) -> Result<Option<Vec<Option<u64>>>, PeerError> {
        let message = wire::QuotaReport {
            version: OLDEST,
            sender: self.me.to_string(),
            buckets: demands.iter().map(convert::quota_demand_to_wire).collect(),
        };
        let send =
            |mut client: PeerClient<Channel>, request| async move { client.quota(request).await };
        let reply = self.call("divide quotas", deadline, message, send).await?;
        convert::quota_shares_from_wire(demands, reply)
            .map_err(|problem| self.answered(format!("a malformed quota answer: {problem}")))
    }

    /// Tells this peer we joined; returns the members it knows.
    pub async fn join(&self) -> Result<Vec<String>, PeerError> {
        self.membership(true).await
    }

    /// Tells this peer we are leaving.
    pub async fn leave(&self) -> Result<Vec<String>, PeerError> {
        self.membership(false).await
    }

    async fn membership(&self, join: bool) -> Result<Vec<String>, PeerError> {
        let member = wire::Member {
            version: OLDEST,
            address: self.me.to_string(),
        };
        let send = |mut client: PeerClient<Channel>, request| async move {
            if join {
                client.join(request).await
            } else {
                client.leave(request).await
            }
        };
        let what = if join {
            "take a member"
        } else {
            "drop a member"
        };
        let reply = self.call(what, self.admin_deadline(), member, send).await?;
        // A malformed answer counts as no answer.
        convert::member_addresses(reply.addresses).map_err(|problem| PeerError::Unreachable {
            peer: Arc::clone(&self.address),
            problem: format!("a malformed membership answer: {problem}"),
        })
    }

    /// Sends one batch and answers every group in it.
    async fn send(&self, batch: Vec<Pending>, recovered: &Notify) {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats
            .forwarded
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let rates = batch
            .iter()
            .flat_map(|pending| pending.checks.iter())
            .flat_map(|check| check.counters.iter().map(|counter| &counter.rate));
        let message = wire::CheckBatch {
            version: convert::version_for(rates),
            sender: self.me.to_string(),
            groups: batch
                .iter()
                .map(|pending| wire::Group {
                    checks: pending.checks.iter().map(convert::check_to_wire).collect(),
                })
                .collect(),
        };
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        let sent = Instant::now();
        let reply = match tokio::time::timeout(self.timeout, client.check(request)).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => {
                Err(self.unreachable(format!("{}: {}", status.code(), status.message())))
            }
            Err(_) => Err(self.unreachable(format!("no answer within {:?}", self.timeout))),
        };
        if sent.elapsed() > SLOW {
            self.stats.slow.fetch_add(1, Ordering::Relaxed);
        }
        let reply = reply.and_then(|reply| {
            if reply.groups.len() == batch.len() {
                Ok(reply)
            } else {
                Err(self.unreachable("answered a different number of groups"))
            }
        });
        match reply {
            Ok(reply) => {
                if self.breaker.succeeded() {
                    tracing::info!(peer = %self.address, "peer reachable again");
                    recovered.notify_one();
                }
                for (pending, group) in batch.into_iter().zip(reply.groups) {
                    let answer = self.answer(pending.checks, group);
                    let _ = pending.reply.send(answer);
                }
            }
            Err(error) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                if self.breaker.failed() {
                    tracing::warn!(peer = %self.address, %error, "peer unreachable: its keys fall back to the local policy");
                }
                for pending in batch {
                    let _ = pending.reply.send(Err((error.clone(), pending.checks)));
                }
            }
        }
    }

    /// One group's answer: its decisions (taking the leases they grant), or the owner's own
    /// error, or a malformed answer (another number of decisions) as an internal error.
    // `Answer` is what the batch's channel carries: built once per group and moved into it.
    #[allow(clippy::result_large_err)]
    fn answer(&self, checks: Checks, group: wire::GroupReply) -> Answer {
        let expected: usize = checks.iter().map(|check| check.counters.len()).sum();
        let failed = !group.error.is_empty() || group.code != 0;
        if !failed && group.decisions.len() == expected {
            self.take_leases(&checks, &group.decisions);
            return Ok(Answered {
                decisions: group
                    .decisions
                    .iter()
                    .map(convert::decision_from_wire)
                    .collect(),
                counted: Counted::new(checks, &group.decisions),
            });
        }
        let (kind, message) = if failed {
            (convert::error_from_wire(group.code), group.error)
        } else {
            let problem = "answered a different number of decisions";
            (ErrorKind::Internal, problem.to_owned())
        };
        let error = PeerError::Remote {
            peer: Arc::clone(&self.address),
            kind,
            message,
        };
        Err((error, checks))
    }
}

/// The lease `lender` granted with `decision`, if it lent any hits.
pub(crate) fn grant(lender: &Arc<str>, decision: &wire::Decision) -> Option<Grant> {
    (decision.lease_units > 0).then(|| Grant {
        lender: Arc::clone(lender),
        units: decision.lease_units,
        window: decision.lease_window,
        lease_for: Duration::from_nanos(decision.lease_for_nanos),
        // The decision's remaining counts the lease in; the owner's does not.
        remaining: decision
            .remaining
            .saturating_sub(u32::try_from(decision.lease_units).unwrap_or(u32::MAX)),
        reset_after: Duration::from_nanos(decision.reset_after_nanos),
    })
}

struct Batcher {
    remote: std::sync::Weak<Remote>,
    rx: mpsc::Receiver<Pending>,
    batch_size: usize,
    batch_window: Duration,
    in_flight: Arc<Semaphore>,
    recovered: Arc<Notify>,
}

impl Batcher {
    /// Runs until the `Remote` is dropped.
    async fn run(mut self) {
        while let Some(first) = self.rx.recv().await {
            let mut batch = vec![first];
            let started = Instant::now();
            loop {
                while batch.len() < self.batch_size {
                    match self.rx.try_recv() {
                        Ok(pending) => batch.push(pending),
                        Err(_) => break,
                    }
                }
                if batch.len() >= self.batch_size || started.elapsed() >= self.batch_window {
                    break;
                }
                tokio::task::yield_now().await;
                if self.rx.is_empty() {
                    break;
                }
            }
            let Some(remote) = self.remote.upgrade() else {
                // The peer left the ring: hand every waiting request back for the fallback.
                self.rx.close();
                while let Ok(pending) = self.rx.try_recv() {
                    batch.push(pending);
                }
                for pending in batch {
                    let error = PeerError::Unreachable {
                        peer: Arc::from("a former member"),
                        problem: "left the ring".to_owned(),
                    };
                    let _ = pending.reply.send(Err((error, pending.checks)));
                }
                break;
            };
            let Ok(permit) = Arc::clone(&self.in_flight).acquire_owned().await else {
                break;
            };
            let recovered = Arc::clone(&self.recovered);
            tokio::spawn(async move {
                remote.send(batch, &recovered).await;
                drop(permit);
            });
        }
    }
}
