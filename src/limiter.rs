//! The limiter: decides a [`Query`] against the live limits and answers a [`Verdict`],
//! whatever protocol the query came in on.
//!
//! [`Limiter::decide`] validates the query's bounds, matches each descriptor against one
//! [`Limits`] snapshot (exact > wildcard > default, `replaces`, `unlimited`, shadow mode,
//! request-supplied limits), turns the matched limits into [`Check`]s, hands them to the
//! [`Store`], counts every limit's hits in the metrics, and reports one [`Status`] per
//! descriptor. Front ends (`envoy::rls` for Envoy, `http::nginx`, `http::rate`, `http::json`)
//! build the query from their own input and render the verdict in their own format; none
//! of them sees another's types.
//!
//! Invariants:
//! - Input is bounded (see [`bounds`]) and never panics the process: every violation is an
//!   [`Error::Invalid`] naming the field.
//! - A query uses one limits snapshot from start to end, whatever reloads happen meanwhile.
//! - Shadow-mode limits count and report but never make a status over the limit and never
//!   make a request wait; a store that cannot wait is never asked to.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use smallvec::SmallVec;

use crate::algorithm::Rate;
use crate::check::{Charge, Check, Checks, Counter, Decision, RuleKeys, WaitPolicy};
use crate::error::{Error, StoreError};
use crate::key::KeyBuilder;
use crate::limits::{Applies, Domain, Limit, Limits, Metadata, Node, Walk, replaced_names};
use crate::metrics::reference::Hit;
use crate::metrics::{LimitCounters, LimitTable, Metrics, Outcome};
use crate::store::Store;

mod explain;
mod headers;
mod query;
mod reset;
mod verdict;

pub use self::explain::{DescriptorExplanation, Explanation, LimitState, Matched, Replacement};
pub use self::headers::{HeaderNames, HeaderStyle, POLICY_HEADER, RATELIMIT_HEADER};
use self::query::validate;
pub use self::query::{Descriptor, Entries, LimitOverride, Query, bounds};
pub use self::reset::ResetOutcome;
pub use self::verdict::{Limited, Status, Verdict, dynamic_metadata};

/// Switches of the limiter.
#[derive(Clone, Debug, Default)]
pub struct LimiterOptions {
    /// gRPC and `/json` add the rate limit headers to their answers (nginx and `/rate`
    /// always send them).
    pub response_headers: bool,
    /// Which rate limit headers every front end sends: draft-03's three, or the current
    /// IETF draft's `RateLimit-Policy` and `RateLimit`.
    pub header_style: HeaderStyle,
    /// Every limit acts as if it had `shadow_mode: true`: counted and reported, never
    /// enforced (the reference service's global `SHADOW_MODE`).
    pub shadow_mode: bool,
    /// Every limit is soft, as if it had `quota_mode: true` (`--quota-mode`, the reference
    /// service's global `QUOTA_MODE`): a descriptor over its limit lets the request pass
    /// unless every soft descriptor of the request is over.
    pub soft_mode: bool,
    /// The Envoy front end returns what was decided in the response's dynamic metadata
    /// (the reference service's `RESPONSE_DYNAMIC_METADATA`).
    pub response_dynamic_metadata: bool,
    /// The names of the draft-03 `RateLimit-*` headers, on every front end.
    pub header_names: HeaderNames,
    /// A rejected request is counted too, as the reference service counts it by default
    /// (`--count-rejected-hits`; its `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false`): see
    /// [`Charge::Always`](crate::check::Charge::Always). No check then waits (`max_wait`).
    pub count_rejected_hits: bool,
    /// gRPC answers carry each limit's `unit_multiplier` in Envoy's pending
    /// `RateLimit.unit_multiplier` field (`--unit-multiplier-field`).
    pub unit_multiplier_field: bool,
}

/// Decides queries against the live limits.
#[derive(Debug)]
pub struct Limiter {
    limits: Arc<ArcSwap<Limits>>,
    store: Arc<dyn Store>,
    options: LimiterOptions,
    metrics: Arc<Metrics>,
    /// Per-limit counters of the latest limits snapshot seen (rebuilt once per reload).
    table: ArcSwap<LimitTable>,
    /// Store failures since the last warning, and when (Unix seconds) it was logged: at
    /// most one warning a second, so an overload does not also flood the logs.
    failures: AtomicU64,
    warned_at: AtomicU64,
    /// Told of each decided descriptor whose counters were full before it (the admin's
    /// counter names, `--counter-names`); `None`: nobody listens.
    observer: Option<Arc<dyn Observer>>,
}

/// Listens to what the limiter decides, for operator features that live elsewhere (the
/// admin's counter names: `admin::names`), so the limiter itself keeps to planning,
/// deciding, explaining and resetting.
pub trait Observer: Send + Sync + std::fmt::Debug {
    /// A decided descriptor of `domain` with these `entries`, whose counters (of `route`)
    /// were full before it: a new key, or one that had fully recovered. Called once per
    /// such descriptor, on the request's task: keep it short.
    fn fresh(&self, route: u64, domain: &str, entries: &[(&str, &str)]);

    /// An operator reset the counters of `route` ([`Limiter::reset`]).
    fn reset(&self, _route: u64) {}
}

/// How a query's descriptors matched, and what to ask the store: [`Limiter::plan`]'s answer.
struct Planned<'s> {
    /// The configured entry each descriptor's walk ended on (`None`: no match, or a
    /// request-supplied limit).
    nodes: SmallVec<[Option<&'s Node>; 4]>,
    /// The limit names the matched limits' `replaces` drop from this query.
    replaced: SmallVec<[&'s str; 4]>,
    /// One per descriptor, in order.
    plans: SmallVec<[Plan<'s>; 4]>,
    /// One per [`Plan::Checked`], in order.
    checks: Checks,
}

/// What one descriptor turned into.
enum Plan<'a> {
    NoLimit,
    Unlimited,
    /// These limits are checked; their decisions start at `first` in the store's answer.
    Checked {
        limits: SmallVec<[&'a Limit; 2]>,
        /// The configured entry, or `None` for a request-supplied limit.
        node: Option<&'a Node>,
        /// The configured entries matched, one per request entry (`None`: a
        /// request-supplied limit).
        walk: Option<Walk<'a>>,
        /// Shadow mode, the rule's own or global (`--shadow-mode`): never waits, counted as
        /// shadow hits.
        shadow: bool,
        /// The rule itself is in shadow mode: its violations are reported `OK`. Under the
        /// global shadow mode only, they are reported `OVER_LIMIT` and only the overall
        /// answer passes (the reference service's rule).
        rule_shadow: bool,
        /// Quota mode: over the limit, the descriptor is reported `OVER_LIMIT` but the
        /// request still passes unless every quota group is over (see [`respond`]).
        soft: bool,
        first: usize,
        /// The descriptor's route hash (its counters' shard and owner).
        route: u64,
    },
}

impl Plan<'_> {
    /// Whether the descriptor is checked in quota mode.
    #[inline]
    fn is_soft(&self) -> bool {
        matches!(self, Plan::Checked { soft: true, .. })
    }
}

impl Limiter {
    pub fn new(
        limits: Arc<ArcSwap<Limits>>,
        store: Arc<dyn Store>,
        options: LimiterOptions,
        metrics: Arc<Metrics>,
    ) -> Limiter {
        let table = metrics.limit_table(limits.load_full());
        Limiter {
            limits,
            store,
            metrics,
            table: ArcSwap::from_pointee(table),
            failures: AtomicU64::new(0),
            warned_at: AtomicU64::new(0),
            observer: None,
            options,
        }
    }

    /// This limiter, telling `observer` of what it decides (see [`Observer`]).
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Limiter {
        self.observer = Some(observer);
        self
    }

    /// Where the counters of `route` live, as the store knows it.
    pub fn placement(&self, route: u64) -> crate::store::Placement {
        self.store.placement(route)
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn limits(&self) -> &Arc<ArcSwap<Limits>> {
        &self.limits
    }

    /// Per limit of `domain` in the live limits, by [`Limit::index`]: the hits counted and
    /// those over the limit, since start (what `/metrics` reports; read for the dashboard).
    pub fn limit_totals(&self, domain: &str) -> Vec<(u64, u64)> {
        let snapshot = self.limits.load_full();
        self.table_for(&snapshot)
            .domain(domain)
            .iter()
            .map(|counters| (counters.total_hits.get(), counters.over_limit.get()))
            .collect()
    }

    /// Each rule's live keys on this node against its key budget, by rule tag (empty with a
    /// store that keeps no budgets).
    pub fn rule_keys(&self) -> std::collections::HashMap<u32, RuleKeys> {
        self.store.all_rule_keys().into_iter().collect()
    }

    pub fn options(&self) -> &LimiterOptions {
        &self.options
    }

    /// Decides one query and records its outcome and latency.
    pub async fn decide(&self, query: &Query<'_>) -> Result<Verdict, Error> {
        let started = std::time::Instant::now();
        let result = self.decide_unrecorded(query).await;
        let outcome = match &result {
            Ok(verdict) if verdict.is_over() => Outcome::OverLimit,
            Ok(_) => Outcome::Ok,
            Err(Error::Invalid { .. }) => Outcome::InvalidArgument,
            Err(Error::Store(error)) => {
                self.warn_throttled(error);
                Outcome::Unavailable
            }
        };
        self.metrics.record_request(outcome, started.elapsed());
        result
    }

    /// Counts a request a front end refused before it became a query (so the request
    /// metrics see every call), and hands the error back.
    pub fn refuse(&self, error: Error) -> Error {
        self.metrics
            .record_request(Outcome::InvalidArgument, Duration::ZERO);
        error
    }

    /// The per-limit counters for `snapshot`, building them on the first request after a
    /// reload (racing requests may both build; the result is the same).
    fn table_for(&self, snapshot: &Arc<Limits>) -> arc_swap::Guard<Arc<LimitTable>> {
        let table = self.table.load();
        if table.is_for(snapshot) {
            return table;
        }
        let fresh = Arc::new(self.metrics.limit_table(Arc::clone(snapshot)));
        self.table.store(Arc::clone(&fresh));
        arc_swap::Guard::from_inner(fresh)
    }

    async fn decide_unrecorded(&self, query: &Query<'_>) -> Result<Verdict, Error> {
        validate(query)?;
        // A guard, not a clone: no shared reference count to bounce between cores.
        let snapshot = self.limits.load();
        let Some(domain) = snapshot.domain(query.domain) else {
            return Ok(Verdict {
                statuses: query.descriptors.iter().map(|_| Status::NoLimit).collect(),
                metadata: query.descriptors.iter().map(|_| None).collect(),
                ..Verdict::default()
            });
        };
        // Request-supplied limits live as long as this call; `Plan` borrows them.
        let overrides = overrides(query);
        let Planned {
            plans,
            checks,
            nodes,
            ..
        } = self.plan(query, domain, &overrides);
        let decisions = if checks.is_empty() {
            Default::default()
        } else {
            self.store.check(checks).wait().await?
        };
        let table = self.table_for(&snapshot);
        self.count(query, &plans, &decisions, &table);
        if let Some(observer) = &self.observer {
            observe(&**observer, query, &plans, &decisions);
        }
        Ok(respond(
            query,
            &plans,
            &decisions,
            &nodes,
            self.options.shadow_mode,
        ))
    }

    /// Matches every descriptor of `query` in `domain` and builds the checks of the limits
    /// that apply (shared by [`Limiter::decide`] and [`Limiter::explain`], so both see the
    /// same matching). `overrides` holds each descriptor's request-supplied limit.
    fn plan<'s>(
        &self,
        query: &Query<'_>,
        domain: &'s Domain,
        overrides: &'s [Option<Limit>],
    ) -> Planned<'s> {
        let walks = walks(query, domain, overrides);
        let nodes: SmallVec<[Option<&Node>; 4]> = walks
            .iter()
            .map(|walk| walk.as_ref().map(Walk::node))
            .collect();
        let replaced = replaced_names(nodes.iter().flatten().copied());
        let can_wait = self.store.capabilities().wait;
        let mut plans: SmallVec<[Plan<'_>; 4]> = SmallVec::new();
        let mut checks = Checks::new();
        let mut counters_so_far = 0;
        for ((descriptor, overridden), walk) in query.descriptors.iter().zip(overrides).zip(walks) {
            let node = walk.as_ref().map(Walk::node);
            let (applies, rule_shadow, soft) = self.applies(overridden.as_ref(), node, &replaced);
            let shadow = rule_shadow || self.options.shadow_mode;
            let limits = match applies {
                Applies::Nothing => {
                    plans.push(Plan::NoLimit);
                    continue;
                }
                Applies::Unlimited => {
                    plans.push(Plan::Unlimited);
                    continue;
                }
                Applies::Limits(limits) => limits,
            };
            let key = counter_key(query.domain, &descriptor.entries, walk.as_ref());
            // Quota-mode limits let an over request pass (mostly): nothing waits for them,
            // nor for shadow-mode ones (never enforced), nor on a store that cannot wait.
            let may_wait = can_wait && !shadow && !soft;
            let check = self.check(descriptor, &limits, &key, may_wait, query.max_wait);
            let first = counters_so_far;
            counters_so_far += limits.len();
            plans.push(Plan::Checked {
                limits,
                node,
                walk,
                shadow,
                rule_shadow,
                soft,
                first,
                route: key.route(),
            });
            checks.push(check);
        }
        Planned {
            nodes,
            replaced,
            plans,
            checks,
        }
    }

    /// What applies to one descriptor: its request-supplied limit (`overridden`), else
    /// the limits of the entry it matched (`node`) that `replaced` leaves; with whether
    /// its rule is in shadow mode, and whether it is soft (quota mode).
    #[inline]
    fn applies<'s>(
        &self,
        overridden: Option<&'s Limit>,
        node: Option<&'s Node>,
        replaced: &[&str],
    ) -> (Applies<'s>, bool, bool) {
        match (overridden, node) {
            (Some(limit), _) => (Applies::of([limit]), false, self.options.soft_mode),
            (None, Some(node)) => (
                node.applies(replaced),
                node.shadow_mode,
                node.soft || self.options.soft_mode,
            ),
            (None, None) => (Applies::Nothing, false, false),
        }
    }

    /// The store check of one descriptor's `limits`, its counters keyed by `key`. It may
    /// wait (within `max_wait`, the query's bound) only if `may_wait` says its limits can.
    #[inline]
    fn check(
        &self,
        descriptor: &Descriptor<'_>,
        limits: &[&Limit],
        key: &KeyBuilder,
        may_wait: bool,
        max_wait: Option<Duration>,
    ) -> Check {
        let counters = limits
            .iter()
            .filter_map(|limit| {
                limit.rate.map(|rate| Counter {
                    key: key.rule_key(&rate, limit.rule),
                    rate,
                })
            })
            .collect();
        let charge = if descriptor.refund {
            Charge::Refund
        } else if self.options.count_rejected_hits {
            Charge::Always
        } else {
            Charge::Admitted
        };
        // A check that counts when rejected never waits, nor does a refund (never rejected).
        let wait = if !may_wait || charge != Charge::Admitted {
            None
        } else {
            wait_policy(limits, max_wait)
        };
        Check {
            counters,
            cost: descriptor.cost,
            wait,
            charge,
        }
    }

    /// Counts every checked limit's hits in its metrics.
    fn count(
        &self,
        query: &Query<'_>,
        plans: &[Plan<'_>],
        decisions: &[Decision],
        table: &LimitTable,
    ) {
        let ratio = self.metrics.near_limit_ratio();
        // One lookup of the domain per request; each limit is then an index.
        let counters_of = table.domain(query.domain);
        for (plan, descriptor) in plans.iter().zip(&query.descriptors) {
            let Plan::Checked {
                limits,
                walk,
                shadow,
                first,
                ..
            } = plan
            else {
                continue;
            };
            if descriptor.refund {
                // Hits given back, not hits: the hit counters do not count them.
                continue;
            }
            let ours = decisions.get(*first..*first + limits.len()).unwrap_or(&[]);
            let admitted = ours.iter().all(|decision| decision.allowed);
            for (limit, decision) in limits.iter().zip(ours) {
                let Some(rate) = limit.rate else { continue };
                let owned;
                let counters = match walk {
                    Some(walk) if walk.node().detailed_metric => {
                        owned = self.metrics.detailed_counters(
                            query.domain,
                            &descriptor.entries,
                            walk.steps(),
                            limit,
                        );
                        &owned
                    }
                    Some(walk) if walk.values_in_metrics() => {
                        owned = self.metrics.value_counters(
                            query.domain,
                            &descriptor.entries,
                            walk.steps(),
                            limit,
                            table,
                        );
                        &owned
                    }
                    Some(_) => match counters_of.get(limit.index) {
                        Some(counters) => counters,
                        None => continue,
                    },
                    None => {
                        owned = self.metrics.override_counters(
                            query.domain,
                            &descriptor.entries,
                            rate.unit.as_str(),
                        );
                        &owned
                    }
                };
                let cost = descriptor.cost;
                record(counters, &rate, decision, cost, admitted, *shadow, ratio);
            }
        }
    }

    fn warn_throttled(&self, error: &StoreError) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        let last = self.warned_at.load(Ordering::Relaxed);
        if now > last
            && self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.failures.fetch_sub(failures, Ordering::Relaxed);
            tracing::warn!(%error, kind = error.kind().as_str(), failures, "rate limit checks failed (answered unavailable)");
        }
    }
}

/// The answer to `query` from its plans and the store's decisions, by the reference
/// service's rules:
/// - a descriptor over one of its limits is reported `OVER_LIMIT` (with 0 remaining),
///   unless its rule is in shadow mode (reported `OK`);
/// - the request is denied when a descriptor not in quota mode is reported over, or when
///   every quota group is: quota-mode descriptors are grouped by their `backend_name` and
///   `model_name_override` entries when they have either (one model behind an AI gateway:
///   the group is over when any of its descriptors is), each on its own otherwise;
/// - under the global shadow mode (`global_shadow`) the request is never denied, though
///   its descriptors are reported as they are.
fn respond(
    query: &Query<'_>,
    plans: &[Plan<'_>],
    decisions: &[Decision],
    nodes: &[Option<&Node>],
    global_shadow: bool,
) -> Verdict {
    let reported = reported_over(plans, decisions);
    let soft_violations: SmallVec<[usize; 2]> = plans
        .iter()
        .zip(&reported)
        .enumerate()
        .filter(|(_, (plan, reported))| plan.is_soft() && **reported)
        .map(|(index, _)| index)
        .collect();
    let groups = soft_groups(query, plans, &reported);
    let soft_over = !groups.is_empty() && groups.iter().all(|group| group.over);
    let rate_over = plans
        .iter()
        .zip(&reported)
        .any(|(plan, reported)| *reported && !plan.is_soft());
    let denied = (rate_over || soft_over) && !global_shadow;
    let statuses = plans
        .iter()
        .zip(&reported)
        .map(|(plan, reported)| status(plan, decisions, *reported))
        .collect();
    let metadata = available_metadata(nodes, &reported, &groups);
    let passed_backends = groups
        .iter()
        .filter(|group| !group.over)
        .filter_map(QuotaGroup::backend)
        .collect();
    Verdict {
        statuses,
        denied,
        soft_mode: !groups.is_empty(),
        soft_violations,
        metadata,
        passed_backends,
    }
}

/// Per descriptor, whether it is reported over a limit: one of its limits denied it, and
/// its rule is not in shadow mode.
#[inline]
fn reported_over(plans: &[Plan<'_>], decisions: &[Decision]) -> SmallVec<[bool; 4]> {
    plans
        .iter()
        .map(|plan| match plan {
            Plan::Checked {
                limits,
                first,
                rule_shadow,
                ..
            } => {
                !rule_shadow
                    && decisions_of(decisions, *first, limits.len())
                        .iter()
                        .any(|decision| !decision.allowed)
            }
            Plan::NoLimit | Plan::Unlimited => false,
        })
        .collect()
}

/// The status of the descriptor planned as `plan` (`reported`: over a limit): its limit
/// closest to exhaustion and how that stands.
#[inline]
fn status(plan: &Plan<'_>, decisions: &[Decision], reported: bool) -> Status {
    let (limits, first, shadow) = match plan {
        Plan::NoLimit => return Status::NoLimit,
        Plan::Unlimited => return Status::Unlimited,
        Plan::Checked {
            limits,
            first,
            shadow,
            ..
        } => (limits, *first, *shadow),
    };
    let ours = decisions_of(decisions, first, limits.len());
    let Some((limit, decision)) = closest_to_exhaustion(limits, ours) else {
        return Status::NoLimit;
    };
    let Some(rate) = limit.rate else {
        return Status::NoLimit;
    };
    // Every denying limit must have room again: the longest wait, if any can.
    let retry_after = if reported {
        ours.iter()
            .filter(|decision| !decision.allowed)
            .map(|decision| decision.retry_after)
            .reduce(|a, b| a.zip(b).map(|(a, b)| a.max(b)))
            .flatten()
            .map(Duration::from_nanos)
    } else {
        None
    };
    Status::Limited(Limited {
        name: limit.name.clone(),
        requests_per_unit: rate.requests_per_unit,
        unit: rate.unit,
        multiplier: rate.multiplier,
        remaining: if reported { 0 } else { decision.remaining },
        reset_after: Duration::from_nanos(decision.reset_after),
        over: reported,
        shadow,
        retry_after,
    })
}

/// Per descriptor, the metadata of its configured entry (`nodes`) if it still has room:
/// passed, and not in a quota group that is over (it must not be offered as a place to
/// route to).
#[inline]
fn available_metadata(
    nodes: &[Option<&Node>],
    reported: &[bool],
    groups: &[QuotaGroup<'_>],
) -> SmallVec<[Option<Arc<Metadata>>; 4]> {
    let available = |index: usize| {
        !reported[index]
            && groups
                .iter()
                .all(|group| !(group.over && group.members.contains(&index)))
    };
    nodes
        .iter()
        .enumerate()
        .map(|(index, node)| match node {
            Some(node) if available(index) => node.metadata.clone(),
            _ => None,
        })
        .collect()
}

/// The store's decisions for the `count` limits of a plan, from `first`.
#[inline]
fn decisions_of(decisions: &[Decision], first: usize, count: usize) -> &[Decision] {
    decisions.get(first..first + count).unwrap_or(&[])
}

/// Each descriptor's walk through `domain`; `None` for one with a request-supplied limit
/// (in `overrides`), which is not matched.
#[inline]
fn walks<'s>(
    query: &Query<'_>,
    domain: &'s Domain,
    overrides: &[Option<Limit>],
) -> SmallVec<[Option<Walk<'s>>; 4]> {
    query
        .descriptors
        .iter()
        .zip(overrides)
        .map(|(descriptor, overridden)| match overridden {
            Some(_) => None,
            None => domain.walk(descriptor.entries.iter().copied()),
        })
        .collect()
}

/// The entries that name a quota group (one model behind an AI gateway).
const QUOTA_GROUP_KEYS: [&str; 2] = ["backend_name", "model_name_override"];

/// What makes one quota group: one model behind an AI gateway (its `backend_name` and
/// `model_name_override`, either may be empty), or else the descriptor's own entries.
#[derive(PartialEq, Eq)]
enum GroupKey<'q> {
    Model(&'q str, &'q str),
    Entries(&'q [(&'q str, &'q str)]),
}

/// One quota group of a request: its descriptors (by index) and whether any is reported over.
struct QuotaGroup<'q> {
    key: GroupKey<'q>,
    members: SmallVec<[usize; 2]>,
    over: bool,
}

impl QuotaGroup<'_> {
    /// The `(backend_name, model_name_override)` of a group named by them.
    fn backend(&self) -> Option<(String, String)> {
        match self.key {
            GroupKey::Model(backend, model) => Some((backend.to_owned(), model.to_owned())),
            GroupKey::Entries(_) => None,
        }
    }
}

/// The quota groups of `query`'s quota-mode descriptors, in the order they first appear;
/// `reported[i]`: descriptor `i` is reported over.
fn soft_groups<'q>(
    query: &'q Query<'_>,
    plans: &[Plan<'_>],
    reported: &[bool],
) -> SmallVec<[QuotaGroup<'q>; 2]> {
    let mut groups: SmallVec<[QuotaGroup<'q>; 2]> = SmallVec::new();
    for (index, (plan, descriptor)) in plans.iter().zip(&query.descriptors).enumerate() {
        if !matches!(plan, Plan::Checked { soft: true, .. }) {
            continue;
        }
        let value_of = |key: &str| {
            descriptor
                .entries
                .iter()
                .find(|(name, _)| *name == key)
                .map_or("", |(_, value)| *value)
        };
        let (backend, model) = (value_of(QUOTA_GROUP_KEYS[0]), value_of(QUOTA_GROUP_KEYS[1]));
        let key = if backend.is_empty() && model.is_empty() {
            GroupKey::Entries(&descriptor.entries)
        } else {
            GroupKey::Model(backend, model)
        };
        let position = match groups.iter().position(|group| group.key == key) {
            Some(position) => position,
            None => {
                groups.push(QuotaGroup {
                    key,
                    members: SmallVec::new(),
                    over: false,
                });
                groups.len() - 1
            }
        };
        let group = &mut groups[position];
        group.members.push(index);
        group.over |= reported.get(index).copied().unwrap_or(false);
    }
    groups
}

/// The counter key of one descriptor: the domain and the request's entries, where an entry
/// matched by a `share_threshold` wildcard counts as its pattern.
fn counter_key(domain: &str, entries: &[(&str, &str)], walk: Option<&Walk<'_>>) -> KeyBuilder {
    let mut key = KeyBuilder::new(domain);
    let steps = walk.map_or(&[][..], Walk::steps);
    for (index, (name, value)) in entries.iter().enumerate() {
        match steps.get(index).and_then(|node| node.shared.as_deref()) {
            Some(pattern) => key.shared_entry(name, pattern),
            None => key.entry(name, value),
        };
    }
    key
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
    if let Some(stat) = &counters.reference {
        let hit = Hit {
            capacity: rate.capacity(),
            remaining: u64::from(decision.remaining),
            cost,
            admitted,
            refused: !decision.allowed,
            shadow,
        };
        stat.record(&hit, near_limit_ratio);
    }
}

/// Each descriptor's request-supplied limit, as a configured limit would be.
fn overrides(query: &Query<'_>) -> SmallVec<[Option<Limit>; 4]> {
    query
        .descriptors
        .iter()
        .map(|descriptor| descriptor.limit.map(override_limit))
        .collect()
}

/// The limit a request-supplied override stands for.
fn override_limit(limit: LimitOverride) -> Limit {
    Limit {
        index: usize::MAX,
        name: None,
        rate: Some(Rate::fixed(limit.requests_per_unit, limit.unit)),
        max_wait: None,
        max_queue: 0,
        replaces: Box::default(),
        // A request's own limit belongs to no configured rule: its keys share the default
        // budget of tag 0.
        rule: 0,
        max_keys: None,
    }
}

/// Tells `observer` of the decided descriptors whose counters were full before the query
/// (`remaining + cost >= capacity` on every limit: a new key, or one that had fully
/// recovered), so a hot key is reported once per window at most.
fn observe(observer: &dyn Observer, query: &Query<'_>, plans: &[Plan<'_>], decisions: &[Decision]) {
    for (plan, descriptor) in plans.iter().zip(&query.descriptors) {
        let Plan::Checked {
            limits,
            node: Some(_),
            first,
            route,
            ..
        } = plan
        else {
            continue;
        };
        if descriptor.cost == 0 || descriptor.refund {
            continue;
        }
        let ours = decisions.get(*first..*first + limits.len()).unwrap_or(&[]);
        let was_full = ours.iter().zip(limits).all(|(decision, limit)| {
            decision.allowed
                && limit.rate.is_some_and(|rate| {
                    u64::from(decision.remaining).saturating_add(descriptor.cost) >= rate.capacity()
                })
        });
        if was_full {
            observer.fresh(*route, query.domain, &descriptor.entries);
        }
    }
}

/// The strictest wait policy among the limits that opt in, narrowed to `cap` if given.
fn wait_policy(limits: &[&Limit], cap: Option<Duration>) -> Option<WaitPolicy> {
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

impl Limiter {
    /// A limiter over `limits` on one node's in-memory store (over `engine`), with its own
    /// metrics registry and no reloader (embedding, tests, benchmarks).
    pub fn standalone(
        limits: Limits,
        engine: crate::store::memory::Engine,
        options: LimiterOptions,
        metrics: crate::metrics::MetricsOptions,
    ) -> Limiter {
        Limiter::on_engine(limits, engine, options, metrics, None)
    }

    /// [`Limiter::standalone`], with the reload figures of `reload` in the registry.
    fn on_engine(
        limits: Limits,
        engine: crate::store::memory::Engine,
        options: LimiterOptions,
        metrics: crate::metrics::MetricsOptions,
        reload: Option<Arc<crate::reload::ReloadStats>>,
    ) -> Limiter {
        let memory = crate::store::memory::MemoryStore::new(engine);
        let mut registry = Metrics::registry();
        memory.register_metrics(&mut registry);
        if let Some(reload) = reload {
            reload.register_metrics(&mut registry);
        }
        let metrics = Arc::new(Metrics::new(metrics, registry));
        Limiter::new(
            Arc::new(ArcSwap::from_pointee(limits)),
            Arc::new(memory),
            options,
            metrics,
        )
    }
}

#[cfg(test)]
impl Limiter {
    /// A limiter over the limits in `yaml`, with a small two-shard engine whose clock reads
    /// `start` (Unix nanoseconds) and its own metrics registry (with reload figures at
    /// version `abc`).
    pub(crate) fn for_tests(
        yaml: &str,
        start: u64,
        options: LimiterOptions,
        metrics: crate::metrics::MetricsOptions,
    ) -> Limiter {
        let limits = Limits::parse_str("test.yaml", yaml).expect("valid test limits");
        let engine = crate::store::memory::Engine::spawn(
            crate::store::memory::EngineConfig {
                shards: 2,
                max_keys: 1000,
                max_waiters: 10,
                rule_key_share: 1.0,
            },
            crate::clock::Clock::starting_at(start),
        );
        let reload = Arc::new(crate::reload::ReloadStats::with_version(0xabc));
        Limiter::on_engine(limits, engine, options, metrics, Some(reload))
    }

    /// [`Limiter::for_tests`] with default metrics options and the clock at
    /// 2024-01-04T00:00:10Z (a Thursday; 50 s left in the minute): the setup of the
    /// limiter's and its front ends' unit tests.
    pub(crate) fn at_test_start(yaml: &str, options: LimiterOptions) -> Limiter {
        const START: u64 = (1_704_326_400 + 10) * crate::algorithm::NANOS_PER_SEC;
        Limiter::for_tests(
            yaml,
            START,
            options,
            crate::metrics::MetricsOptions::default(),
        )
    }
}

#[cfg(test)]
mod tests;
