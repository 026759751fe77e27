//! What a check is answered when its store or owner cannot decide it (Redis down, the owner
//! of a key unreachable): one policy for every store and for the cluster's fallback, and one
//! function that makes the stand-in decisions, so every store answers the same situation the
//! same way.
//!
//! - [`FailurePolicy::Allow`] (fail open, like Envoy's default `failure_mode_deny: false`):
//!   admitted, with the limit's whole capacity remaining (nothing is known to be used, so
//!   nothing counts as near the limit) and no reset to wait for.
//! - [`FailurePolicy::Deny`]: over the limit, 0 remaining, retry after `cooldown` (when the
//!   store will try again: its breaker's cooldown), so clients back off instead of
//!   hammering, and `Retry-After` is sent.
//!
//! A refund ([`Charge::Refund`]) is answered as `allow` answers under either policy: it
//! gates no traffic (the hits it would have given back stay counted).

use std::time::Duration;

use crate::check::{Charge, Checks, Decision, Decisions};

/// `--store-failure` (Redis) and the `allow` / `deny` values of `--peer-fallback` (cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    Allow,
    Deny,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
        }
    }

    /// The stand-in decisions for every counter of `checks`, in order; `cooldown`: how long
    /// until the store tries again.
    pub fn decide(self, checks: &Checks, cooldown: Duration) -> Decisions {
        let cooldown = u64::try_from(cooldown.as_nanos()).unwrap_or(u64::MAX);
        checks
            .iter()
            .flat_map(|check| {
                let policy = match check.charge {
                    Charge::Refund => FailurePolicy::Allow,
                    Charge::Admitted | Charge::Always => self,
                };
                check.counters.iter().map(move |counter| (policy, counter))
            })
            .map(|(policy, counter)| match policy {
                FailurePolicy::Allow => Decision {
                    allowed: true,
                    remaining: u32::try_from(counter.rate.capacity()).unwrap_or(u32::MAX),
                    reset_after: 0,
                    retry_after: Some(0),
                },
                FailurePolicy::Deny => Decision {
                    allowed: false,
                    remaining: 0,
                    reset_after: cooldown,
                    retry_after: Some(cooldown),
                },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use smallvec::smallvec;

    use super::*;
    use crate::algorithm::{Algorithm, Rate, Unit};
    use crate::check::{Check, Counter};
    use crate::key::KeyBuilder;

    fn checks() -> Checks {
        let counter = |rate: Rate| Counter {
            key: KeyBuilder::new("edge").entry("user", "u").key(&rate),
            rate,
        };
        smallvec![Check {
            counters: smallvec![
                counter(Rate::fixed(5, Unit::Minute)),
                counter(Rate::new(Algorithm::TokenBucket, 1, Unit::Second, Some(20))),
            ],
            cost: 1,
            wait: None,
            charge: crate::check::Charge::Admitted,
        }]
    }

    #[test]
    fn allow_admits_with_the_whole_capacity_and_deny_says_when_to_retry() {
        let cooldown = Duration::from_secs(2);
        let allowed = FailurePolicy::Allow.decide(&checks(), cooldown);
        assert!(allowed.iter().all(|decision| decision.allowed));
        assert_eq!(
            allowed.iter().map(|d| d.remaining).collect::<Vec<_>>(),
            [5, 20],
            "nothing known used: not near any limit"
        );
        let denied = FailurePolicy::Deny.decide(&checks(), cooldown);
        assert_eq!(denied.len(), 2, "one decision per counter");
        for decision in &denied {
            assert!(!decision.allowed);
            assert_eq!(decision.remaining, 0);
            assert_eq!(
                decision.retry_after,
                Some(2_000_000_000),
                "Retry-After is sent"
            );
        }
    }

    #[test]
    fn a_refund_is_answered_as_allow_answers_under_either_policy() {
        let mut refund = checks();
        refund[0].charge = crate::check::Charge::Refund;
        let cooldown = Duration::from_secs(2);
        for policy in [FailurePolicy::Allow, FailurePolicy::Deny] {
            assert_eq!(
                policy.decide(&refund, cooldown),
                FailurePolicy::Allow.decide(&checks(), cooldown),
                "{policy:?}"
            );
        }
    }
}
