//! The RLQS state of one node: the open streams, and per bucket the streams reporting it
//! with their demand and share. Plain Rust types only (the adapter, `rlqs`, turns them
//! into Envoy's protobufs); the clock is passed in.
//!
//! Invariants:
//! - One short lock, never held across an await; a push to another stream is a `try_send`
//!   (a full queue skips it: that stream gets its assignment at its own next report).
//! - Bounded: at most `max_streams` streams, each reporting at most
//!   `max_buckets_per_stream` buckets; a bucket lives only while a stream reports it.
//! - A report that is refused changes nothing (its bucket count is checked before any
//!   state is touched).
//! - Per bucket, the shares of its reporters come from [`division::divide`] over their
//!   latest demand: they add up to at most the node's limit (see there). Alone, the node's
//!   limit is the bucket's limit; in cluster mode it is the node's share from the bucket's
//!   owner ([`Hub::set_node_shares`]), an equal part per member until the owner answered
//!   (or while it cannot be reached).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::division::{self, TokenBucket};
use super::rule::{BucketKey, Rule};
use super::stats::{DomainLabel, RlqsStats};

pub type StreamId = u64;

/// What Envoy is told to enforce for a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    AllowAll,
    DenyAll,
    TokenBucket(TokenBucket),
}

/// One bucket's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Assign {
        bucket: BucketKey,
        strategy: Strategy,
    },
    Abandon {
        bucket: BucketKey,
    },
}

/// Delivers actions to a stream without waiting; false when it could not.
pub type Sink = Box<dyn Fn(Vec<Action>) -> bool + Send + Sync>;

/// One bucket's usage in a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    pub bucket: BucketKey,
    pub allowed: u64,
    pub denied: u64,
    /// What Envoy says the usage covers (whole seconds; 0 for a new bucket).
    pub elapsed: Duration,
}

/// The bounds and timings of the hub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubOptions {
    pub max_streams: usize,
    pub max_buckets_per_stream: usize,
    /// Most buckets on the node, all streams together.
    pub max_buckets: usize,
    /// A reporter not heard for this long is dropped (its share goes back).
    pub stale_after: Duration,
    /// A bucket a stream reported no traffic for this long gets `abandon_action`.
    pub abandon_after: Duration,
}

/// Why the hub refused something (the adapter names the gRPC status).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HubError {
    #[error(
        "too many rlqs streams on this node: {0} are open (the most allowed); connect to another node or raise --rlqs-max-streams"
    )]
    TooManyStreams(usize),
    #[error(
        "bucket_quota_usages: this stream would report {would} buckets, more than the {max} allowed per stream (--rlqs-max-buckets-per-stream)"
    )]
    TooManyBuckets { would: usize, max: usize },
    #[error(
        "bucket_quota_usages: this node would hold {would} rlqs buckets, more than the {max} allowed (--rlqs-max-buckets)"
    )]
    TooManyNodeBuckets { would: usize, max: usize },
    #[error("the stream is closed")]
    Closed,
}

/// What one report changed, for the caller's metrics and answer.
#[derive(Debug, Default)]
pub struct Reported {
    /// The actions for the reporting stream: one per reported bucket.
    pub actions: Vec<Action>,
}

struct Stream {
    domain: Arc<str>,
    /// The metrics label: the domain, or `_unknown`.
    label: Arc<str>,
    sink: Sink,
    buckets: HashSet<BucketKey>,
}

#[derive(Debug)]
struct Reporter {
    /// Requests per unit wanted over the last report (`None`: not known yet).
    demand: Option<u64>,
    last_report: Instant,
    last_busy: Instant,
    share: Option<u64>,
    sent: Option<Strategy>,
}

#[derive(Debug)]
struct Bucket {
    /// The metrics label of its streams' domain.
    label: Arc<str>,
    rule: Rule,
    reporters: BTreeMap<StreamId, Reporter>,
    /// Cluster mode: this node's share of the limit, as the bucket's owner last answered
    /// (`None`: no answer yet, or the owner could not be reached).
    granted: Option<u64>,
}

/// One bucket's demand on this node (cluster mode): what its streams want together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDemand {
    pub domain: Arc<str>,
    pub bucket: BucketKey,
    /// The limit's requests per unit.
    pub limit: u64,
    /// The streams' demands summed, a stream whose demand is not known yet counting as the
    /// whole limit; at most `limit`.
    pub demand: u64,
}

#[derive(Default)]
struct State {
    next_id: StreamId,
    streams: HashMap<StreamId, Stream>,
    buckets: HashMap<(Arc<str>, BucketKey), Bucket>,
}

/// Cluster mode: how many members the ring has now.
pub type Members = Arc<dyn Fn() -> u64 + Send + Sync>;

/// A bucket's view for `GET /debug/rlqs`: its limit and its reporters.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BucketView {
    pub domain: String,
    /// The bucket id's pairs, ordered by key.
    pub bucket: Vec<(String, String)>,
    /// What the limits say: `allow_all`, `deny_all`, `unknown_domain`, or the divided
    /// limit (`20/second burst 10`, `shadow` appended in shadow mode).
    pub rule: String,
    /// Cluster mode: what this node divides among its streams of a divided limit (its
    /// share from the bucket's owner, or `limit / members` until the owner answered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_share: Option<u64>,
    pub reporters: Vec<ReporterView>,
}

/// A reporter's view, for `/debug/rlqs` and tests.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ReporterView {
    pub stream: StreamId,
    pub demand: Option<u64>,
    pub share: Option<u64>,
}

pub struct Hub {
    options: HubOptions,
    stats: RlqsStats,
    state: Mutex<State>,
    /// Cluster mode: the ring's member count (unset: a single node).
    members: OnceLock<Members>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("options", &self.options)
            .finish()
    }
}

impl Hub {
    pub fn new(options: HubOptions, stats: RlqsStats) -> Hub {
        Hub {
            options,
            stats,
            state: Mutex::new(State::default()),
            members: OnceLock::new(),
        }
    }

    pub fn options(&self) -> &HubOptions {
        &self.options
    }

    pub fn stats(&self) -> &RlqsStats {
        &self.stats
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the maps half-updated in a way that matters more
        // than refusing every stream would.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a stream for `domain`, labelled `label` in the metrics.
    pub fn open(&self, domain: &str, label: &str, sink: Sink) -> Result<StreamId, HubError> {
        let mut state = self.lock();
        if state.streams.len() >= self.options.max_streams {
            return Err(HubError::TooManyStreams(state.streams.len()));
        }
        state.next_id += 1;
        let id = state.next_id;
        state.streams.insert(
            id,
            Stream {
                domain: Arc::from(domain),
                label: Arc::from(label),
                sink,
                buckets: HashSet::new(),
            },
        );
        self.stats
            .streams
            .get_or_create(&RlqsStats::label(label))
            .inc();
        Ok(id)
    }

    /// Takes one report of stream `id`: `rule` says each bucket's limit. Returns the
    /// stream's assignments for every reported bucket, and pushes changed shares to the
    /// other reporters of those buckets.
    pub fn report(
        &self,
        id: StreamId,
        usages: Vec<Usage>,
        rule: impl Fn(&BucketKey) -> Rule,
        now: Instant,
    ) -> Result<Reported, HubError> {
        let merged = merge_usages(usages);
        let members = self.members();
        let mut state = self.lock();
        let State {
            streams, buckets, ..
        } = &mut *state;
        let stream = streams.get(&id).ok_or(HubError::Closed)?;
        self.check_room(stream, buckets, &merged)?;
        let domain = Arc::clone(&stream.domain);
        let stream_label = Arc::clone(&stream.label);
        let label = RlqsStats::label(&stream.label);
        let mut reported = Reported::default();
        let mut pushes: Vec<(StreamId, Action)> = Vec::new();
        for usage in merged {
            let rule = rule(&usage.bucket);
            self.count_usage(&label, &usage, rule);
            let key = (Arc::clone(&domain), usage.bucket.clone());
            let bucket = match buckets.entry(key) {
                Entry::Occupied(entry) => entry.into_mut(),
                Entry::Vacant(entry) => {
                    self.stats.buckets.get_or_create(&label).inc();
                    entry.insert(Bucket {
                        label: Arc::clone(&stream_label),
                        rule,
                        reporters: BTreeMap::new(),
                        granted: None,
                    })
                }
            };
            if bucket.rule != rule {
                // A reload changed the limit: nothing of the old division is kept.
                bucket.rule = rule;
                for reporter in bucket.reporters.values_mut() {
                    reporter.share = None;
                }
            }
            self.note_reporter(bucket, id, &usage, &label, now);
            for (reporter, strategy, changed) in redivide(bucket, members) {
                let action = Action::Assign {
                    bucket: usage.bucket.clone(),
                    strategy,
                };
                if reporter == id {
                    reported.actions.push(action);
                } else if changed {
                    pushes.push((reporter, action));
                }
            }
        }
        if let Some(stream) = streams.get_mut(&id) {
            for action in &reported.actions {
                if let Action::Assign { bucket, .. } = action
                    && !stream.buckets.contains(bucket)
                {
                    stream.buckets.insert(bucket.clone());
                }
            }
        }
        self.stats
            .assignments
            .get_or_create(&label)
            .inc_by(reported.actions.len() as u64);
        self.deliver(streams, pushes);
        Ok(reported)
    }

    /// Refuses a report that would take `stream` past its bucket bound, or this node past
    /// its own, before anything of it is taken.
    fn check_room(
        &self,
        stream: &Stream,
        buckets: &HashMap<(Arc<str>, BucketKey), Bucket>,
        merged: &[Usage],
    ) -> Result<(), HubError> {
        let new = merged
            .iter()
            .filter(|usage| !stream.buckets.contains(&usage.bucket))
            .count();
        let would = stream.buckets.len() + new;
        if would > self.options.max_buckets_per_stream {
            return Err(HubError::TooManyBuckets {
                would,
                max: self.options.max_buckets_per_stream,
            });
        }
        let fresh = merged
            .iter()
            .filter(|usage| {
                !buckets.contains_key(&(Arc::clone(&stream.domain), usage.bucket.clone()))
            })
            .count();
        let node_would = buckets.len() + fresh;
        if fresh > 0 && node_would > self.options.max_buckets {
            return Err(HubError::TooManyNodeBuckets {
                would: node_would,
                max: self.options.max_buckets,
            });
        }
        Ok(())
    }

    /// Counts what one bucket's report says Envoy allowed and denied.
    fn count_usage(&self, label: &DomainLabel, usage: &Usage, rule: Rule) {
        self.stats
            .reported_allowed
            .get_or_create(label)
            .inc_by(usage.allowed);
        self.stats
            .reported_denied
            .get_or_create(label)
            .inc_by(usage.denied);
        if rule == Rule::UnknownDomain {
            self.stats.unknown_domain_reports.inc();
        }
    }

    /// Records stream `id`'s report on `bucket`: its demand (from the time since its last
    /// report, or for a newcomer Envoy's own interval when that covers a second), and, for
    /// a shadow-mode limit, what it let through beyond its share.
    fn note_reporter(
        &self,
        bucket: &mut Bucket,
        id: StreamId,
        usage: &Usage,
        label: &DomainLabel,
        now: Instant,
    ) {
        let rule = bucket.rule;
        let count = usage.allowed.saturating_add(usage.denied);
        let unit_secs = match rule {
            Rule::Limited { rate, .. } => rate.window_seconds(),
            _ => 1,
        };
        let Some(reporter) = bucket.reporters.get_mut(&id) else {
            // A newcomer: its demand is read from Envoy's own interval when that covers at
            // least a second (a stream reconnecting after a restart), else unknown (it
            // wants a fair share at once).
            let demand = (usage.elapsed >= Duration::from_secs(1)).then(|| {
                division::demand(division::rate_per_unit(
                    count,
                    usage.elapsed.as_nanos(),
                    unit_secs,
                ))
            });
            bucket.reporters.insert(
                id,
                Reporter {
                    demand,
                    last_report: now,
                    last_busy: now,
                    share: None,
                    sent: None,
                },
            );
            return;
        };
        let elapsed = now.saturating_duration_since(reporter.last_report);
        reporter.demand = Some(division::demand(division::rate_per_unit(
            count,
            elapsed.as_nanos(),
            unit_secs,
        )));
        if let (Rule::Limited { shadow: true, .. }, Some(share)) = (rule, reporter.share) {
            // What the share would have let through over the elapsed time.
            let earned = scale(share, elapsed, unit_secs);
            let over = usage.allowed.saturating_sub(earned);
            if over > 0 {
                self.stats
                    .shadow_violations
                    .get_or_create(label)
                    .inc_by(over);
            }
        }
        reporter.last_report = now;
        if count > 0 {
            reporter.last_busy = now;
        }
    }

    /// Ends stream `id`: its shares go back to the other reporters of its buckets at once.
    pub fn close(&self, id: StreamId) {
        let members = self.members();
        let mut state = self.lock();
        let State {
            streams, buckets, ..
        } = &mut *state;
        let Some(stream) = streams.remove(&id) else {
            return;
        };
        let label = RlqsStats::label(&stream.label);
        self.stats.streams.get_or_create(&label).dec();
        let mut pushes = Vec::new();
        for bucket_key in stream.buckets {
            let key = (Arc::clone(&stream.domain), bucket_key);
            let Some(bucket) = buckets.get_mut(&key) else {
                continue;
            };
            bucket.reporters.remove(&id);
            if bucket.reporters.is_empty() {
                buckets.remove(&key);
                self.stats.buckets.get_or_create(&label).dec();
                continue;
            }
            collect_changes(bucket, &key.1, members, &mut pushes);
        }
        self.deliver(streams, pushes);
    }

    /// Drops reporters not heard for `stale_after`, abandons buckets without traffic for
    /// `abandon_after`, and pushes the shares that freed up.
    pub fn sweep(&self, now: Instant) {
        let members = self.members();
        let mut state = self.lock();
        let State {
            streams, buckets, ..
        } = &mut *state;
        let mut pushes = Vec::new();
        let mut empty = Vec::new();
        for (key, bucket) in buckets.iter_mut() {
            let before = bucket.reporters.len();
            bucket.reporters.retain(|&stream_id, reporter| {
                let stale =
                    now.saturating_duration_since(reporter.last_report) >= self.options.stale_after;
                let idle =
                    now.saturating_duration_since(reporter.last_busy) >= self.options.abandon_after;
                if !stale && !idle {
                    return true;
                }
                if let Some(stream) = streams.get_mut(&stream_id) {
                    stream.buckets.remove(&key.1);
                    self.stats
                        .abandons
                        .get_or_create(&RlqsStats::label(&stream.label))
                        .inc();
                    pushes.push((
                        stream_id,
                        Action::Abandon {
                            bucket: key.1.clone(),
                        },
                    ));
                }
                false
            });
            if bucket.reporters.is_empty() {
                empty.push(key.clone());
            } else if bucket.reporters.len() != before {
                collect_changes(bucket, &key.1, members, &mut pushes);
            }
        }
        for key in empty {
            if let Some(bucket) = buckets.remove(&key) {
                self.stats
                    .buckets
                    .get_or_create(&RlqsStats::label(&bucket.label))
                    .dec();
            }
        }
        self.deliver(streams, pushes);
    }

    /// The reporters of `bucket` in `domain`, with their demand and share.
    pub fn reporters(&self, domain: &str, bucket: &BucketKey) -> Vec<ReporterView> {
        let state = self.lock();
        let key = (Arc::from(domain), bucket.clone());
        state.buckets.get(&key).map_or_else(Vec::new, |bucket| {
            bucket
                .reporters
                .iter()
                .map(|(&stream, reporter)| ReporterView {
                    stream,
                    demand: reporter.demand,
                    share: reporter.share,
                })
                .collect()
        })
    }

    /// Up to `max` buckets (of `domain` when given), ordered by domain and id, and how many
    /// buckets there are in all.
    pub fn snapshot(&self, domain: Option<&str>, max: usize) -> (Vec<BucketView>, usize) {
        let cluster = self.members.get().is_some();
        let members = self.members();
        let state = self.lock();
        let mut keys: Vec<&(Arc<str>, BucketKey)> = state
            .buckets
            .keys()
            .filter(|(bucket_domain, _)| domain.is_none_or(|domain| **bucket_domain == *domain))
            .collect();
        let total = keys.len();
        keys.sort();
        let views = keys
            .into_iter()
            .take(max)
            .filter_map(|key| {
                let bucket = state.buckets.get(key)?;
                Some(BucketView {
                    domain: key.0.to_string(),
                    bucket: key
                        .1
                        .iter()
                        .map(|(name, value)| (name.to_string(), value.to_string()))
                        .collect(),
                    rule: match bucket.rule {
                        Rule::UnknownDomain => "unknown_domain".to_owned(),
                        Rule::AllowAll => "allow_all".to_owned(),
                        Rule::DenyAll => "deny_all".to_owned(),
                        Rule::Limited { rate, shadow } => format!(
                            "{}/{} burst {}{}",
                            rate.requests_per_unit,
                            rate.window_name(),
                            rate.burst,
                            if shadow { " shadow" } else { "" }
                        ),
                    },
                    node_share: match bucket.rule {
                        Rule::Limited { rate, .. } if cluster => Some(node_limit(
                            u64::from(rate.requests_per_unit),
                            bucket.granted,
                            members,
                        )),
                        _ => None,
                    },
                    reporters: bucket
                        .reporters
                        .iter()
                        .map(|(&stream, reporter)| ReporterView {
                            stream,
                            demand: reporter.demand,
                            share: reporter.share,
                        })
                        .collect(),
                })
            })
            .collect();
        (views, total)
    }

    /// Cluster mode: every divided bucket's demand on this node (shadow-mode ones too),
    /// for the buckets' owners.
    pub fn node_demands(&self) -> Vec<NodeDemand> {
        let state = self.lock();
        state
            .buckets
            .iter()
            .filter_map(|((domain, bucket), held)| {
                let Rule::Limited { rate, .. } = held.rule else {
                    return None;
                };
                let limit = u64::from(rate.requests_per_unit);
                let demand = held
                    .reporters
                    .values()
                    .map(|reporter| reporter.demand.unwrap_or(limit))
                    .fold(0u64, u64::saturating_add)
                    .min(limit);
                Some(NodeDemand {
                    domain: Arc::clone(domain),
                    bucket: bucket.clone(),
                    limit,
                    demand,
                })
            })
            .collect()
    }

    /// Cluster mode: counts the ring's members with `members` from now on (alone, the
    /// hub divides each bucket's whole limit). Set once; later calls change nothing.
    pub fn follow_members(&self, members: Members) {
        let _ = self.members.set(members);
    }

    /// The members on the ring (1 outside cluster mode).
    fn members(&self) -> u64 {
        self.members.get().map_or(1, |members| members().max(1))
    }

    /// Cluster mode: this node's share of each bucket as its owner answered (`None`: no
    /// answer; an equal part per member is used). Buckets not named keep what they had
    /// (they appeared since the demands were read). Every bucket is divided again (the
    /// members may have changed) and the streams whose assignment changed are pushed it.
    pub fn set_node_shares(
        &self,
        shares: impl IntoIterator<Item = ((Arc<str>, BucketKey), Option<u64>)>,
    ) {
        let shares: HashMap<(Arc<str>, BucketKey), Option<u64>> = shares.into_iter().collect();
        let members = self.members();
        let mut state = self.lock();
        let State {
            streams, buckets, ..
        } = &mut *state;
        let mut pushes = Vec::new();
        for (key, bucket) in buckets.iter_mut() {
            if let Some(&granted) = shares.get(key) {
                bucket.granted = granted;
            }
            collect_changes(bucket, &key.1, members, &mut pushes);
        }
        self.deliver(streams, pushes);
    }

    /// Cluster mode: this node's share of `bucket` from its owner, when it answered.
    pub fn node_share(&self, domain: &str, bucket: &BucketKey) -> Option<u64> {
        let state = self.lock();
        let key = (Arc::from(domain), bucket.clone());
        state.buckets.get(&key).and_then(|bucket| bucket.granted)
    }

    /// How many streams are open.
    pub fn stream_count(&self) -> usize {
        self.lock().streams.len()
    }

    fn deliver(&self, streams: &HashMap<StreamId, Stream>, pushes: Vec<(StreamId, Action)>) {
        let mut by_stream: BTreeMap<StreamId, Vec<Action>> = BTreeMap::new();
        for (stream, action) in pushes {
            by_stream.entry(stream).or_default().push(action);
        }
        for (id, actions) in by_stream {
            if let Some(stream) = streams.get(&id) {
                let assignments = actions
                    .iter()
                    .filter(|action| matches!(action, Action::Assign { .. }))
                    .count();
                if (stream.sink)(actions) {
                    self.stats
                        .assignments
                        .get_or_create(&RlqsStats::label(&stream.label))
                        .inc_by(assignments as u64);
                }
            }
        }
    }
}

/// `share * elapsed / unit`, saturating.
fn scale(share: u64, elapsed: Duration, unit_secs: u64) -> u64 {
    let scaled = u128::from(share).saturating_mul(elapsed.as_nanos())
        / (u128::from(unit_secs.max(1)) * 1_000_000_000);
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// Redivides `bucket` and queues the assignments that changed.
fn collect_changes(
    bucket: &mut Bucket,
    key: &BucketKey,
    members: u64,
    pushes: &mut Vec<(StreamId, Action)>,
) {
    for (reporter, strategy, changed) in redivide(bucket, members) {
        if changed {
            pushes.push((
                reporter,
                Action::Assign {
                    bucket: key.clone(),
                    strategy,
                },
            ));
        }
    }
}

/// What this node divides among its streams of a bucket whose limit is `limit`: the whole
/// limit alone; in cluster mode (`members` above 1) its share from the bucket's owner, or
/// an equal part per member (at least 1) until the owner answered.
pub fn node_limit(limit: u64, granted: Option<u64>, members: u64) -> u64 {
    match granted {
        Some(granted) => granted.min(limit),
        None if members > 1 => (limit / members).max(1),
        None => limit,
    }
}

/// Divides the node's limit of the bucket among its reporters from their demand; returns
/// each reporter's strategy and whether it differs from what it was last sent.
fn redivide(bucket: &mut Bucket, members: u64) -> Vec<(StreamId, Strategy, bool)> {
    let shares = match bucket.rule {
        Rule::Limited { rate, .. } => {
            let demands: Vec<Option<u64>> = bucket
                .reporters
                .values()
                .map(|reporter| reporter.demand)
                .collect();
            let limit = node_limit(u64::from(rate.requests_per_unit), bucket.granted, members);
            division::divide(limit, &demands)
        }
        _ => Vec::new(),
    };
    let mut out = Vec::with_capacity(bucket.reporters.len());
    for (index, (&id, reporter)) in bucket.reporters.iter_mut().enumerate() {
        let strategy = match bucket.rule {
            Rule::UnknownDomain | Rule::AllowAll => {
                reporter.share = None;
                Strategy::AllowAll
            }
            Rule::DenyAll => {
                reporter.share = None;
                Strategy::DenyAll
            }
            Rule::Limited { rate, shadow } => {
                let new = shares.get(index).copied().unwrap_or(1);
                let share = match reporter.share {
                    Some(old) if division::keeps(old, new) => old,
                    _ => new,
                };
                reporter.share = Some(share);
                if shadow {
                    Strategy::AllowAll
                } else {
                    Strategy::TokenBucket(division::token_bucket(
                        share,
                        u64::from(rate.requests_per_unit),
                        u64::from(rate.burst),
                        rate.window_seconds(),
                    ))
                }
            }
        };
        let changed = reporter.sent != Some(strategy);
        if changed {
            tracing::debug!(stream = id, demand = ?reporter.demand, share = ?reporter.share, ?strategy, "rlqs assignment changed");
        }
        reporter.sent = Some(strategy);
        out.push((id, strategy, changed));
    }
    out
}

/// One entry per bucket, even if a report names a bucket twice: their counts summed.
fn merge_usages(usages: Vec<Usage>) -> Vec<Usage> {
    let mut merged: Vec<Usage> = Vec::with_capacity(usages.len());
    let mut seen: HashMap<BucketKey, usize> = HashMap::with_capacity(usages.len());
    for usage in usages {
        match seen.entry(usage.bucket.clone()) {
            Entry::Occupied(at) => {
                let into = &mut merged[*at.get()];
                into.allowed = into.allowed.saturating_add(usage.allowed);
                into.denied = into.denied.saturating_add(usage.denied);
                into.elapsed = into.elapsed.max(usage.elapsed);
            }
            Entry::Vacant(at) => {
                at.insert(merged.len());
                merged.push(usage);
            }
        }
    }
    merged
}

#[cfg(test)]
mod tests;
