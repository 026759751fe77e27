//! `Limiter::reset`: an operator forgets one descriptor's counters (all of its limits), so
//! it starts afresh, wherever the store keeps them (this node, its owner in the cluster,
//! Redis). Matching is [`Limiter::plan`]'s, so the counters reset are exactly the ones a
//! request with that descriptor counts on.

use std::sync::Arc;

use super::{Limiter, Plan, Planned, Query, overrides, validate};
use crate::error::Error;
use crate::key::KeyId;

/// What a reset found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResetOutcome {
    /// No limits are configured for the domain.
    UnknownDomain,
    /// The descriptor matches no limit with a counter (no match, allow-listed, unlimited).
    NoLimit,
    Reset {
        /// The configured entry matched (`edge > api_key`).
        path: Option<Arc<str>>,
        /// The names of the limits whose counters were reset (unnamed ones as `None`).
        limits: Vec<Option<Arc<str>>>,
        /// How many counters existed (0: nothing was counted yet).
        removed: usize,
    },
}

impl Limiter {
    /// Forgets the counters of `query`'s only descriptor (cost and request-supplied
    /// limits are ignored). Errors: an invalid query, more or less than one descriptor,
    /// or a store (or owner) that cannot answer.
    pub async fn reset(&self, query: &Query<'_>) -> Result<ResetOutcome, Error> {
        validate(query)?;
        if query.descriptors.len() != 1 {
            return Err(Error::invalid(
                "descriptors",
                format!(
                    "{} given, a reset takes exactly one",
                    query.descriptors.len()
                ),
            ));
        }
        let snapshot = self.limits.load();
        let Some(domain) = snapshot.domain(query.domain) else {
            return Ok(ResetOutcome::UnknownDomain);
        };
        let mut plain = Query::new(query.domain);
        for descriptor in &query.descriptors {
            plain.descriptor(descriptor.entries.iter().copied(), 0);
        }
        let overrides = overrides(&plain);
        let Planned {
            plans, mut checks, ..
        } = self.plan(&plain, domain, &overrides);
        let (
            Some(Plan::Checked {
                limits,
                node,
                route,
                ..
            }),
            Some(check),
        ) = (plans.first(), checks.pop())
        else {
            return Ok(ResetOutcome::NoLimit);
        };
        let keys: Vec<KeyId> = check.counters.iter().map(|counter| counter.key).collect();
        let removed = self.store.reset(keys).await?;
        if let Some(observer) = &self.observer {
            observer.reset(*route);
        }
        tracing::info!(
            domain = query.domain,
            path = node.map(|node| &*node.path),
            removed,
            "counters reset"
        );
        Ok(ResetOutcome::Reset {
            path: node.map(|node| Arc::from(&*node.path)),
            limits: limits.iter().map(|limit| limit.name.clone()).collect(),
            removed,
        })
    }
}
