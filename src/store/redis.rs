//! The Redis store (`--store redis://...`): counters in Redis, shared by every ratekeeper
//! process that points at it, surviving restarts of all of them.
//!
//! How a request is decided:
//! 1. Checks whose descriptor is known to be over its limit (the blocked cache, below) are
//!    answered here, with no Redis call.
//! 2. The others go to Redis in one script call per request (one per check on a Redis
//!    Cluster, where a check's keys share one hash slot: `rk:{ROUTE}:ID`). The script
//!    (`redis.lua`) reads the counters, decides each check all-or-nothing, writes the
//!    consumed state with a TTL (so Redis holds only live keys) and answers the state it
//!    read.
//! 3. From that state this module derives every decision with the same Rust code as the
//!    in-memory store ([`Check::decide`]), so the answers (remaining, reset, retry after)
//!    are the in-memory store's to the nanosecond. The script and Rust must agree on
//!    "admitted"; a disagreement is counted and logged (and would be a bug).
//!
//! The blocked cache: after a check whose counter has no room left for even one hit, the
//! counters' states are kept here until that counter could admit again. Until then the
//! check is decided on those states locally: nothing can be consumed on a counter with no
//! room (by this process or another), so the local answer is exact. A flood against a
//! blocked key costs no Redis call. Bounded (`blocked_keys`); expired entries go first.
//!
//! Failure: every call has a deadline; consecutive failures open a circuit breaker
//! ([`crate::breaker`]); while Redis cannot answer, checks are decided by the failure
//! policy (`allow` by default, like Envoy's fail-open; or `deny`), counted in metrics, with
//! one log line per breaker change. Never a hang, never a panic.
//!
//! Refunds and counted rejections ([`Charge`](crate::check::Charge)) are decided by the
//! script like any check (it writes the charged state; Rust derives the answer from the
//! state read). A refund always goes to Redis and drops this process's blocked entries for
//! its keys; another process's blocked entry does not see it until that entry expires
//! (when its counter would have had room anyway), an under-admission bounded by that.
//!
//! Not offered: `max_wait` (Redis cannot hold a request in a queue); limits the script
//! cannot count exactly in doubles (see [`CAPABILITIES`]). Both are refused at load.

mod batch;
mod blocked;
mod connection;
mod metrics;
mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use smallvec::SmallVec;

use self::blocked::BlockedCache;
use self::connection::Backend;
pub use self::connection::{Target, redact};
use self::metrics::RedisStats;
pub use self::tls::{RedisTlsOptions, TlsFileError};
use crate::algorithm::{self, NANOS_PER_SEC, Rate, State};
use crate::breaker::Breaker;
use crate::check::{self, Check, Checks, Decisions, States};
use crate::clock::Clock;
use crate::error::StoreError;
pub use crate::failure::FailurePolicy;
use crate::key::KeyId;
use crate::store::{Capabilities, Checked, Placement, ResetFuture, Store};

/// What the Redis store can count exactly: no `max_wait`; sliding windows up to 2^53 / 10^9
/// per unit and buckets that refill within 2^53 ns (104 days), so the script's double
/// arithmetic stays exact.
pub const CAPABILITIES: Capabilities = Capabilities {
    name: "--store redis",
    wait: false,
    max_sliding_per_unit: Some(9_007_199),
    max_refill: Some(Duration::from_nanos(1 << 53)),
};

const SCRIPT: &str = include_str!("redis.lua");

/// Where [`SCRIPT`] takes each algorithm's branch ([`algorithm::lua_branches`]).
const ALGORITHMS_MARKER: &str = "    -- ALGORITHMS:";

/// The script Redis runs: [`SCRIPT`] with every algorithm's Lua in place of its marker
/// (the marker's two comment lines).
pub fn script() -> String {
    let (head, rest) = SCRIPT
        .split_once(ALGORITHMS_MARKER)
        .expect("redis.lua has the algorithms' marker");
    // The marker is two comment lines: the rest starts after the second one.
    let tail = rest.splitn(3, '\n').nth(2).unwrap_or_default();
    format!("{head}{}{tail}", algorithm::lua_branches())
}

/// Consecutive failed calls that open the breaker.
const BREAKER_FAILURES: u32 = 3;

/// The Redis store's settings.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    pub target: Target,
    /// Deadline of one call (connecting included).
    pub timeout: Duration,
    /// Connections to one server (Sentinel too); requests are pipelined on them.
    pub pool: usize,
    pub failure: FailurePolicy,
    /// How long the breaker stays open before one call probes Redis again.
    pub cooldown: Duration,
    /// Most descriptors kept in the blocked cache.
    pub blocked_keys: usize,
    /// How long a key outlives the moment its state stops mattering (the window's end, a
    /// bucket's refill): the TTL's margin, within [`TTL_MARGINS`]. Longer: fewer keys
    /// expire and are made again (Redis's expiry deletes in bursts that stall every call),
    /// at the cost of more keys held.
    pub ttl_margin: Duration,
    /// TLS files for a `rediss://` server (`--store-tls-*`).
    pub tls: RedisTlsOptions,
}

/// The TTL margins a store accepts.
pub const TTL_MARGINS: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(3600);

impl RedisOptions {
    pub fn new(target: Target) -> RedisOptions {
        RedisOptions {
            target,
            timeout: Duration::from_millis(100),
            pool: 4,
            failure: FailurePolicy::Allow,
            cooldown: Duration::from_secs(1),
            blocked_keys: 100_000,
            ttl_margin: Duration::from_secs(1),
            tls: RedisTlsOptions::default(),
        }
    }
}

/// Why a Redis store could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    #[error(transparent)]
    Tls(#[from] TlsFileError),
    #[error(
        "{0} needs a TLS store: rediss:// or rediss-cluster:// (sentinels are reached without tls)"
    )]
    NotTls(&'static str),
}

/// The Redis store; cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    caller: Arc<Caller>,
    /// Requests to one server go through the batcher; `None` on a Redis Cluster.
    batches: Option<tokio::sync::mpsc::Sender<batch::Pending>>,
    clock: Clock,
    options: RedisOptions,
    breaker: Breaker,
    blocked: BlockedCache,
    stats: RedisStats,
    /// When (seconds since `started`) a disagreement was last logged.
    warned_at: AtomicU64,
    started: Instant,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.inner.options.target.describe())
            .field("breaker_open", &self.inner.breaker.is_open())
            .finish()
    }
}

impl RedisStore {
    /// A store for `options.target` reading time from `clock`. Connects on first use, so
    /// it starts even while Redis is down; the TLS files are read now.
    pub fn new(options: RedisOptions, clock: Clock) -> Result<RedisStore, SetupError> {
        let tls = match (&options.tls, options.target.is_tls()) {
            (tls, _) if tls.is_default() => None,
            (tls, true) => Some(Arc::new(tls::TlsFiles::load(tls.clone())?)),
            (tls, false) => {
                return Err(SetupError::NotTls(tls.first_flag().unwrap_or_default()));
            }
        };
        let caller = Arc::new(Caller {
            backend: Backend::new(&options.target, options.pool, options.timeout, tls)?,
            script: redis::Script::new(&script()),
            // Within an hour, so it fits.
            ttl_margin_ms: u64::try_from(
                options
                    .ttl_margin
                    .clamp(*TTL_MARGINS.start(), *TTL_MARGINS.end())
                    .as_millis(),
            )
            .unwrap_or(u64::MAX),
        });
        let batches = (!options.target.is_cluster())
            .then(|| batch::spawn(Arc::clone(&caller), options.pool.max(1) * 2));
        Ok(RedisStore {
            inner: Arc::new(Inner {
                caller,
                batches,
                clock,
                breaker: Breaker::new(BREAKER_FAILURES, options.cooldown),
                blocked: BlockedCache::new(options.blocked_keys),
                stats: RedisStats::default(),
                warned_at: AtomicU64::new(0),
                started: Instant::now(),
                options,
            }),
        })
    }

    /// Adds the store's figures (calls, errors, breaker, blocked cache) to `registry`.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        metrics::register(Arc::clone(&self.inner), registry);
    }

    pub fn describe(&self) -> String {
        self.inner.options.target.describe()
    }
}

impl Store for RedisStore {
    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn check(&self, checks: Checks) -> Checked<'_> {
        let inner = &*self.inner;
        let now = inner.clock.now();
        let answers: SmallVec<[Option<Decisions>; 4]> = checks
            .iter()
            .map(|check| inner.blocked.answer(check, now))
            .collect();
        let cached = answers.iter().filter(|answer| answer.is_some()).count();
        inner
            .stats
            .blocked_hits
            .fetch_add(cached as u64, Ordering::Relaxed);
        if cached == checks.len() {
            return Checked::Ready(Ok(answers.into_iter().flatten().flatten().collect()));
        }
        let remote: Checks = checks
            .into_iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(check, _)| check)
            .collect();
        Checked::Pending(Box::pin(async move {
            let mut decided = inner.decide(&remote, now).await.into_iter();
            let mut out = Decisions::new();
            let mut remote = remote.iter();
            for answer in answers {
                match answer {
                    Some(local) => out.extend(local),
                    None => {
                        let count = remote.next().map_or(0, |check| check.counters.len());
                        out.extend(decided.by_ref().take(count));
                    }
                }
            }
            Ok(out)
        }))
    }

    /// Where the counters live: in Redis, shared by every process using it, and reached
    /// by this one directly (so `/counters` can list the ones it counted).
    fn placement(&self, _route: u64) -> Placement {
        Placement {
            owner: Some(Arc::from(self.inner.options.target.describe())),
            local: true,
            ..Placement::default()
        }
    }

    /// `checks` as Redis holds them, or an error: never the failure policy's stand-in. The
    /// script reads the counters with every cost set to 0 (it consumes nothing); each
    /// check's own cost is then weighed against the states it read.
    fn peek(&self, checks: Checks) -> Checked<'_> {
        let inner = &*self.inner;
        let now = inner.clock.now();
        let costs: SmallVec<[u64; 4]> = checks.iter().map(|check| check.cost).collect();
        let checks: Checks = checks
            .into_iter()
            .map(|check| Check {
                cost: 0,
                wait: None,
                charge: check::Charge::Admitted,
                ..check
            })
            .collect();
        Checked::Pending(Box::pin(async move {
            let unavailable = |problem: String| StoreError::Remote {
                store: inner.options.target.describe(),
                problem,
            };
            if inner.breaker.is_open() {
                return Err(unavailable("its circuit breaker is open".to_owned()));
            }
            let answer = tokio::time::timeout(inner.options.timeout, inner.call(&checks, now))
                .await
                .map_err(|_| unavailable(format!("no answer within {:?}", inner.options.timeout)))?
                .map_err(|error| unavailable(error.to_string()))?;
            let (now, reply) = answer;
            let mut out = Decisions::new();
            let mut at = 0;
            for (check, cost) in checks.iter().zip(costs) {
                let (_, at_time, states) = read_states(check, now, &reply, &mut at)
                    .ok_or_else(|| unavailable("a reply of the wrong shape".to_owned()))?;
                for (counter, state) in check.counters.iter().zip(states) {
                    out.push(check::peek(&counter.rate, state, at_time, cost));
                }
            }
            Ok(out)
        }))
    }

    /// Deletes the descriptor's keys in Redis (one `DEL`: they share a hash slot) and
    /// forgets them in this process's blocked cache. Other processes' blocked caches keep
    /// answering "over" for the descriptor until it would have had room anyway.
    fn reset(&self, keys: Vec<KeyId>) -> ResetFuture<'_> {
        let inner = &*self.inner;
        Box::pin(async move {
            let unavailable = |problem: String| StoreError::Remote {
                store: inner.options.target.describe(),
                problem,
            };
            inner.blocked.forget_keys(&keys);
            let names: Vec<String> = keys.iter().map(redis_key).collect();
            let delete = async {
                let mut connection = inner.caller.backend.connection().await?;
                connection.delete(&names).await
            };
            let deleted = tokio::time::timeout(inner.options.timeout, delete)
                .await
                .map_err(|_| unavailable(format!("no answer within {:?}", inner.options.timeout)))?
                .map_err(|error| unavailable(error.to_string()))?;
            // A check racing the reset may have put the keys back in the cache meanwhile.
            inner.blocked.forget_keys(&keys);
            Ok(deleted)
        })
    }
}

impl Inner {
    /// Decides `checks` in Redis, or by the failure policy when Redis cannot answer.
    async fn decide(&self, checks: &Checks, now: u64) -> Decisions {
        if self.breaker.refuses() {
            return self.by_policy(checks);
        }
        let mut probe = Probe {
            breaker: &self.breaker,
            reported: false,
        };
        let started = Instant::now();
        let result = tokio::time::timeout(self.options.timeout, self.call(checks, now)).await;
        self.stats.latency.observe(started.elapsed());
        let timed_out = result.is_err();
        let failure = match result {
            Ok(Ok((at, reply))) => match self.read(checks, at, &reply) {
                Some(decisions) => {
                    probe.reported = true;
                    self.stats.calls.fetch_add(1, Ordering::Relaxed);
                    if self.breaker.succeeded() {
                        tracing::info!(store = %self.options.target.describe(), "redis answers again: circuit closed");
                    }
                    return decisions;
                }
                None => "a reply of the wrong shape".to_owned(),
            },
            Ok(Err(CallError::Busy)) => {
                // This node is overloaded, not Redis: the breaker is not told.
                self.stats.busy.fetch_add(1, Ordering::Relaxed);
                return self.by_policy(checks);
            }
            Ok(Err(CallError::Failed(error))) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                error
            }
            Err(_) => {
                self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                format!("no answer within {:?}", self.options.timeout)
            }
        };
        probe.reported = true;
        self.caller.backend.failed().await;
        if self.breaker.failed() {
            self.stats.breaker_opened.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                store = %self.options.target.describe(),
                error = %failure,
                policy = self.options.failure.as_str(),
                cooldown = ?self.options.cooldown,
                "redis is failing: circuit open, checks are decided by --store-failure until a probe succeeds"
            );
            if timed_out {
                self.explain_timeouts();
            }
        }
        self.by_policy(checks)
    }

    /// Logs why calls time out (once per opening of the breaker, off the request path):
    /// the pool's reconnection retries outlast a call's deadline and hide the reason.
    fn explain_timeouts(&self) {
        let caller = Arc::clone(&self.caller);
        let store = self.options.target.describe();
        tokio::spawn(async move {
            if let Some(error) = caller.backend.diagnose().await {
                tracing::warn!(%store, %error, "redis calls time out: a direct connection says why");
            }
        });
    }

    /// The script's answer for `checks` and the time it decided them at: batched with
    /// other requests' checks on one server, or one call per check on a Redis Cluster (a
    /// check's keys share a hash slot; different checks may not), sent together.
    async fn call(&self, checks: &Checks, now: u64) -> Result<(u64, Bytes), CallError> {
        if let Some(batches) = &self.batches {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let pending = batch::Pending {
                checks: checks.clone(),
                now,
                reply,
            };
            batches.try_send(pending).map_err(|_| CallError::Busy)?;
            return answer
                .await
                .map_err(|_| CallError::Failed("the redis batcher stopped".to_owned()))?
                .map_err(CallError::Failed);
        }
        let caller = &self.caller;
        let connection = caller
            .backend
            .connection()
            .await
            .map_err(|error| CallError::Failed(error.to_string()))?;
        let calls = checks.iter().map(|check| {
            let mut connection = connection.clone();
            let command = caller.command(std::iter::once(check), now);
            async move { connection.invoke(&caller.script, &command).await }
        });
        let replies = futures_util::future::try_join_all(calls)
            .await
            .map_err(|error| CallError::Failed(error.to_string()))?;
        Ok((now, Bytes::from(replies.concat())))
    }

    /// Derives the decisions from the states the script read; `None` if the reply does not
    /// have the expected shape.
    fn read(&self, checks: &Checks, now: u64, reply: &[u8]) -> Option<Decisions> {
        read_reply(checks, now, reply, |check, states, at_time, agreed| {
            if let Err(admitted) = agreed {
                self.disagreed(admitted);
            }
            self.blocked.remember(check, states, at_time, &self.stats);
        })
    }

    fn disagreed(&self, admitted: bool) {
        self.stats.disagreements.fetch_add(1, Ordering::Relaxed);
        let now = self.started.elapsed().as_secs() + 1;
        if self.warned_at.swap(now, Ordering::Relaxed) != now {
            tracing::error!(
                admitted,
                "the redis script and ratekeeper disagree on a check (a bug: please report it)"
            );
        }
    }

    /// Decisions by `--store-failure` for every counter of `checks`.
    fn by_policy(&self, checks: &Checks) -> Decisions {
        self.stats
            .policy_decisions
            .fetch_add(checks.len() as u64, Ordering::Relaxed);
        self.options.failure.decide(checks, self.options.cooldown)
    }
}

/// Why a script call got no answer.
#[derive(Debug)]
enum CallError {
    /// Redis, or the way to it, failed.
    Failed(String),
    /// The queue to the batcher is full: this node is overloaded, Redis is not at fault.
    Busy,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Failed(problem) => f.write_str(problem),
            CallError::Busy => write!(f, "{} requests already wait for redis", batch::QUEUE),
        }
    }
}

/// What sends script calls: the connections and the script, shared by the store and its
/// batcher.
struct Caller {
    backend: Backend,
    script: redis::Script,
    ttl_margin_ms: u64,
}

impl Caller {
    /// The script call deciding `checks` at `now`: `EVALSHA` with one key per counter and
    /// the checks packed in one argument (see `redis.lua`).
    fn command<'c>(&self, checks: impl Iterator<Item = &'c Check> + Clone, now: u64) -> redis::Cmd {
        let (count, keys) = checks.clone().fold((0, 0), |(count, keys), check| {
            (count + 1, keys + check.counters.len())
        });
        // Doubles: cost, charge and counters per check, five per counter.
        let mut packed = Vec::with_capacity(8 * (3 * count + 5 * keys));
        // EVALSHA, the hash, the key count, the keys, three numbers and `packed`.
        let mut command = redis::Cmd::with_capacity(7 + keys, 128 + keys * KEY_LEN);
        command.arg("EVALSHA").arg(self.script.get_hash()).arg(keys);
        let mut push = |number: u64| packed.extend_from_slice(&(number as f64).to_le_bytes());
        for check in checks {
            for counter in &check.counters {
                command.arg(&redis_key_bytes(&counter.key)[..]);
            }
            push(check::bounded_cost(check.cost));
            push(charge_code(check.charge));
            push(check.counters.len() as u64);
            for counter in &check.counters {
                let rate = &counter.rate;
                push(u64::from(rate.algorithm.code()));
                push(u64::from(rate.requests_per_unit));
                push(rate.window_seconds());
                push(u64::from(rate.burst));
                push(rate.emission_interval());
            }
        }
        command
            .arg(now / NANOS_PER_SEC)
            .arg(now % NANOS_PER_SEC)
            .arg(self.ttl_margin_ms)
            .arg(packed);
        command
    }
}

/// Gives a breaker probe back if its call never reported (the caller went away).
struct Probe<'a> {
    breaker: &'a Breaker,
    reported: bool,
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if !self.reported {
            self.breaker.abandon();
        }
    }
}

/// The decisions the script's `reply` gives `checks` (asked at `now`); `None` if the reply
/// does not have the expected shape. `each` sees every check with its counters' states
/// after the decision, the time it was decided at, and `Err(admitted)` when the script
/// said `admitted` and Rust did not agree.
pub(crate) fn read_reply(
    checks: &Checks,
    now: u64,
    reply: &[u8],
    mut each: impl FnMut(&Check, &States, u64, Result<(), bool>),
) -> Option<Decisions> {
    let mut out = Decisions::new();
    let mut at = 0;
    for check in checks {
        let (admitted, at_time, mut states) = read_states(check, now, reply, &mut at)?;
        let denied = check.decide(&mut states, at_time, &mut out);
        let agreed = if denied.is_none() == admitted {
            Ok(())
        } else {
            Err(admitted)
        };
        each(check, &states, at_time, agreed);
    }
    Some(out)
}

/// One check's part of the script's reply, from `reply[*at]` on (`at` moves past it):
/// whether the script admitted it, the time it decided at (the latest of `now` and the
/// keys' times), and its counters' states. `None` if the reply does not have that shape.
fn read_states(
    check: &Check,
    now: u64,
    reply: &[u8],
    at: &mut usize,
) -> Option<(bool, u64, States)> {
    let (admitted, values) = split_check(check, reply, at)?;
    let admitted = match admitted {
        0 => false,
        1 => true,
        _ => return None,
    };
    let stored = values
        .into_iter()
        .map(Stored::read)
        .collect::<Option<SmallVec<[Option<Stored>; 4]>>>()?;
    let at_time = stored
        .iter()
        .flatten()
        .map(|stored| stored.time)
        .fold(now, u64::max);
    let states = check
        .counters
        .iter()
        .zip(&stored)
        .map(|(counter, stored)| match stored {
            Some(stored) => stored.state(&counter.rate),
            None => algorithm::init(&counter.rate, at_time),
        })
        .collect();
    Some((admitted, at_time, states))
}

/// One check's part of the script's reply, from `reply[*at]` on (`at` moves past it): its
/// "admitted" byte and, per counter, the key's value as read (see `redis.lua`). `None` if
/// `reply` is too short for it.
fn split_check<'r>(
    check: &Check,
    reply: &'r [u8],
    at: &mut usize,
) -> Option<(u8, SmallVec<[&'r [u8]; 4]>)> {
    let admitted = *reply.get(*at)?;
    *at += 1;
    let mut values = SmallVec::new();
    for _ in &check.counters {
        let len = usize::from(*reply.get(*at)?);
        values.push(reply.get(*at + 1..*at + 1 + len)?);
        *at += 1 + len;
    }
    Some((admitted, values))
}

/// The length of the part of `reply` from `at` on that answers `checks`, or `None` if
/// `reply` is too short for it.
pub(crate) fn part_len(checks: &Checks, reply: &[u8], at: usize) -> Option<usize> {
    let mut end = at;
    for check in checks {
        split_check(check, reply, &mut end)?;
    }
    Some(end - at)
}

/// `rk:{ROUTE}:ID`: the route in braces is the Redis Cluster hash tag, so all counters of
/// one descriptor share a slot. [`KEY_LEN`] bytes.
fn redis_key(key: &KeyId) -> String {
    String::from_utf8_lossy(&redis_key_bytes(key)).into_owned()
}

const KEY_LEN: usize = 54;

/// [`redis_key`] without an allocation.
fn redis_key_bytes(key: &KeyId) -> [u8; KEY_LEN] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; KEY_LEN];
    out[..4].copy_from_slice(b"rk:{");
    out[20..22].copy_from_slice(b"}:");
    for (at, number) in [(4, key.route), (22, key.id[0]), (38, key.id[1])] {
        for (digit, byte) in out[at..at + 16].iter_mut().enumerate() {
            *byte = HEX[((number >> (60 - 4 * digit)) & 0xf) as usize];
        }
    }
    out
}

/// A check's charge as the script names it (see `redis.lua`).
fn charge_code(charge: check::Charge) -> u64 {
    match charge {
        check::Charge::Admitted => 0,
        check::Charge::Always => 1,
        check::Charge::Refund => 2,
    }
}

/// A key's content as the script read it: its time and the algorithm's numbers.
#[derive(Clone, Copy, Debug)]
struct Stored {
    /// Unix nanoseconds it was last written at.
    time: u64,
    numbers: [u64; 3],
}

impl Stored {
    /// A key's value as the script read it: little-endian doubles (seconds,
    /// nanoseconds, up to three numbers), or empty when the key did not exist. `None` for
    /// anything else (not a value this script wrote).
    fn read(bytes: &[u8]) -> Option<Option<Stored>> {
        if bytes.is_empty() {
            return Some(None);
        }
        if !bytes.len().is_multiple_of(8) || !(16..=40).contains(&bytes.len()) {
            return None;
        }
        let mut numbers = [0u64; 5];
        for (number, chunk) in numbers.iter_mut().zip(bytes.chunks_exact(8)) {
            let value = f64::from_le_bytes(chunk.try_into().ok()?);
            // Whole, non-negative and exact: the script writes nothing else.
            if !(0.0..=9_007_199_254_740_992.0).contains(&value) || value.fract() != 0.0 {
                return None;
            }
            *number = value as u64;
        }
        let [seconds, nanoseconds, x, y, z] = numbers;
        Some(Some(Stored {
            time: nanos(seconds, nanoseconds),
            numbers: [x, y, z],
        }))
    }

    /// The in-memory [`State`] for the same counter (the layout is the algorithm's:
    /// [`State::from_numbers`]).
    fn state(&self, rate: &Rate) -> State {
        State::from_numbers(rate, self.time, self.numbers)
    }
}

fn nanos(seconds: u64, nanos: u64) -> u64 {
    seconds.saturating_mul(NANOS_PER_SEC).saturating_add(nanos)
}

#[cfg(test)]
mod tests;
