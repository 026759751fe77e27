//! Explanations: what [`Limiter::decide`] would do with a query, and why, without
//! consuming anything.
//!
//! [`Limiter::explain`] matches the query with the same planning as `decide`
//! ([`Limiter::plan`]), then asks the store how the counters stand for the descriptor's hits
//! ([`Store::peek`](crate::store::Store::peek), which consumes nothing): whether they would
//! be admitted, and if not, when they would be. In cluster mode those go to each key's owner
//! over the peer protocol, so the state is the owner's, and an owner that cannot answer is
//! an error rather than a fallback's guess. Nothing is counted in the metrics: an
//! explanation is not a request.
//!
//! Invariants: an explanation never changes a counter, never waits for capacity, and
//! reports exactly the matching `decide` would apply (the planning is shared, not copied).

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Rate;
use crate::check::{Check, Checks, Decision, Decisions, RuleKeys};
use crate::error::Error;
use crate::limits::{Limit, Node};
use crate::store::Placement;

use super::{Limiter, Plan, Planned, Query, decisions_of, overrides, validate};

/// Why a descriptor is limited or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matched {
    /// The query's domain has no limits.
    UnknownDomain,
    /// The descriptor's entries match no configured entry (or only part of one).
    NoMatch,
    /// The walk ended on an entry without limits: an allow-list entry (or an intermediate
    /// one).
    AllowListed,
    /// Every limit of the matched entry was dropped by another descriptor's `replaces`.
    Replaced,
    /// An `unlimited` limit matched.
    Unlimited,
    /// The matched entry's limits apply.
    Limited,
    /// The request's own limit (Envoy's descriptor `limit`) applies instead of the config.
    RequestLimit,
}

impl Matched {
    pub fn as_str(self) -> &'static str {
        match self {
            Matched::UnknownDomain => "unknown_domain",
            Matched::NoMatch => "no_match",
            Matched::AllowListed => "allow_listed",
            Matched::Replaced => "replaced",
            Matched::Unlimited => "unlimited",
            Matched::Limited => "limited",
            Matched::RequestLimit => "request_limit",
        }
    }

    /// Whether a limit is counted for the descriptor.
    pub fn is_limited(self) -> bool {
        matches!(self, Matched::Limited | Matched::RequestLimit)
    }
}

/// A limit dropped by a `replaces` of another matched limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    /// The dropped limit's name.
    pub limit: Arc<str>,
    /// The replacing limit's name (if it has one) and its entry's place in the config.
    pub by: Option<Arc<str>>,
    pub at: Box<str>,
}

/// One limit of a descriptor and where its counter stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitState {
    pub name: Option<Arc<str>>,
    pub rate: Rate,
    /// Hits counted against the limit right now (its capacity minus what remains).
    pub used: u64,
    /// Hits still admissible right now.
    pub remaining: u32,
    /// Until the limit has fully recovered (the window ends, the bucket is full).
    pub reset_after: Duration,
    /// Whether this limit alone would reject the descriptor's hits now.
    pub rejects: bool,
    /// When it rejects: how long until the hits would be admitted (nothing else counted
    /// meanwhile); `None` when they never can (more hits than the limit's capacity), and
    /// when it does not reject.
    pub retry_after: Option<Duration>,
    pub max_wait: Option<Duration>,
    /// The rule's live keys on this node against its key budget (stores that keep
    /// budgets: memory, cluster).
    pub keys: Option<RuleKeys>,
}

/// What one descriptor would meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorExplanation {
    pub matched: Matched,
    /// The configured entry the walk ended on (`edge > api_key=vip > path`).
    pub path: Option<Box<str>>,
    /// Hits the descriptor would count.
    pub cost: u64,
    /// Its limits are in shadow mode (counted, never enforced).
    pub shadow: bool,
    /// Limits of the matched entry that `replaces` dropped.
    pub replaced: Vec<Replacement>,
    /// Where its counters live (when a limit is counted).
    pub placement: Option<Placement>,
    /// The limits counted, in config order.
    pub limits: Vec<LimitState>,
}

impl DescriptorExplanation {
    /// Whether `cost` hits would be rejected right now (a shadow limit never rejects).
    pub fn would_reject(&self) -> bool {
        !self.shadow && self.limits.iter().any(|limit| limit.rejects)
    }

    /// When the descriptor's hits would be admitted again, if they would be rejected now:
    /// the longest wait of the limits that reject them; `None` when none rejects, or when
    /// one never admits them.
    pub fn retry_after(&self) -> Option<Duration> {
        if !self.would_reject() {
            return None;
        }
        self.limits
            .iter()
            .filter(|limit| limit.rejects)
            .map(|limit| limit.retry_after)
            .try_fold(Duration::ZERO, |longest, wait| Some(longest.max(wait?)))
    }
}

/// What a query would meet, descriptor by descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    pub domain_found: bool,
    pub descriptors: Vec<DescriptorExplanation>,
}

impl Limiter {
    /// Explains `query`: per descriptor, the match (or why none), the limits and their
    /// counters' state, and where they live. Consumes nothing and records no metrics.
    pub async fn explain(&self, query: &Query<'_>) -> Result<Explanation, Error> {
        validate(query)?;
        let snapshot = self.limits.load();
        let Some(domain) = snapshot.domain(query.domain) else {
            let unknown = |descriptor: &super::Descriptor<'_>| {
                DescriptorExplanation::new(Matched::UnknownDomain, descriptor.cost)
            };
            return Ok(Explanation {
                domain_found: false,
                descriptors: query.descriptors.iter().map(unknown).collect(),
            });
        };
        let overrides = overrides(query);
        let Planned {
            nodes,
            replaced,
            plans,
            checks,
        } = self.plan(query, domain, &overrides);
        let (placements, decisions) = self.peek(checks).await?;
        let mut placements = placements.into_iter();
        let mut descriptors = Vec::with_capacity(plans.len());
        for ((plan, node), descriptor) in plans.iter().zip(&nodes).zip(&query.descriptors) {
            let mut explained = DescriptorExplanation {
                path: node.map(|node| node.path.clone()),
                replaced: node
                    .map(|node| replacements(node, &replaced, &nodes))
                    .unwrap_or_default(),
                ..DescriptorExplanation::new(matched(plan, *node), descriptor.cost)
            };
            if let Plan::Checked {
                limits,
                shadow,
                first,
                ..
            } = plan
            {
                let ours = decisions_of(&decisions, *first, limits.len());
                explained.shadow = *shadow;
                explained.placement = placements.next();
                explained.limits = self.limit_states(limits, ours);
            }
            descriptors.push(explained);
        }
        Ok(Explanation {
            domain_found: true,
            descriptors,
        })
    }

    /// The state of each of `limits` that has a rate, from its decision in `ours`.
    fn limit_states(&self, limits: &[&Limit], ours: &[Decision]) -> Vec<LimitState> {
        limits
            .iter()
            .zip(ours)
            .filter_map(|(limit, decision)| {
                let keys = self.store.rule_keys(limit.rule);
                limit_state(limit, decision, keys)
            })
            .collect()
    }

    /// How the counters of `checks` stand, never waiting and consuming nothing (the cost
    /// is only weighed), with where each check's counters live.
    async fn peek(&self, mut checks: Checks) -> Result<(Vec<Placement>, Decisions), Error> {
        for check in &mut checks {
            check.wait = None;
        }
        let placements: Vec<Placement> = checks
            .iter()
            .map(|check| self.store.placement(Check::route(check)))
            .collect();
        let decisions = if checks.is_empty() {
            Default::default()
        } else {
            self.store.peek(checks).wait().await?
        };
        Ok((placements, decisions))
    }
}

impl DescriptorExplanation {
    /// A descriptor of `cost` hits, `matched` so, before anything else is known: no path,
    /// nothing replaced, no counters.
    fn new(matched: Matched, cost: u64) -> DescriptorExplanation {
        DescriptorExplanation {
            matched,
            path: None,
            cost,
            shadow: false,
            replaced: Vec::new(),
            placement: None,
            limits: Vec::new(),
        }
    }
}

/// Why the descriptor planned as `plan` (whose walk ended on `node`) is limited or not.
fn matched(plan: &Plan<'_>, node: Option<&Node>) -> Matched {
    match (plan, node) {
        (Plan::Unlimited, _) => Matched::Unlimited,
        (Plan::NoLimit, None) => Matched::NoMatch,
        (Plan::NoLimit, Some(node)) if node.limits.is_empty() => Matched::AllowListed,
        (Plan::NoLimit, Some(_)) => Matched::Replaced,
        (Plan::Checked { node: Some(_), .. }, _) => Matched::Limited,
        (Plan::Checked { node: None, .. }, _) => Matched::RequestLimit,
    }
}

fn limit_state(limit: &Limit, decision: &Decision, keys: Option<RuleKeys>) -> Option<LimitState> {
    let rate = limit.rate?;
    Some(LimitState {
        name: limit.name.clone(),
        rate,
        used: rate
            .capacity()
            .saturating_sub(u64::from(decision.remaining)),
        remaining: decision.remaining,
        reset_after: Duration::from_nanos(decision.reset_after),
        rejects: !decision.allowed,
        retry_after: (!decision.allowed)
            .then_some(decision.retry_after)
            .flatten()
            .map(Duration::from_nanos),
        max_wait: limit.max_wait,
        keys,
    })
}

/// The limits of `node` that `replaced` drops, each with the matched limit that drops it.
fn replacements(node: &Node, replaced: &[&str], nodes: &[Option<&Node>]) -> Vec<Replacement> {
    node.limits
        .iter()
        .filter(|limit| limit.is_replaced(replaced))
        .filter_map(|limit| {
            let name = limit.name.clone()?;
            let (by, at) = nodes
                .iter()
                .flatten()
                .flat_map(|other| other.limits.iter().map(move |limit| (limit, &other.path)))
                .find(|(other, _)| other.replaces.contains(&name))?;
            Some(Replacement {
                limit: name,
                by: by.name.clone(),
                at: at.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
