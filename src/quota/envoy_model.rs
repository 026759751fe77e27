//! A model of one Envoy's `rate_limit_quota` bucket for the division tests (the hub's and
//! the cluster's): its token bucket as Envoy 1.40 keeps it, and the usage it reports.

use std::time::Duration;

use super::TokenBucket;
use super::hub::{Action, Strategy, Usage};
use super::rule::BucketKey;

/// Envoy's token bucket as Envoy 1.40 keeps it: a new assignment (any field changed)
/// starts a new bucket, full; the same assignment again keeps the bucket.
pub struct EnvoyModel {
    assignment: Option<TokenBucket>,
    tokens: f64,
    since_report: (u64, u64),
    /// Requests admitted and offered so far.
    pub admitted: u64,
    pub offered: u64,
    /// Assignments that started a new bucket.
    pub changes: u64,
}

impl EnvoyModel {
    pub fn new() -> EnvoyModel {
        EnvoyModel {
            assignment: None,
            tokens: 0.0,
            since_report: (0, 0),
            admitted: 0,
            offered: 0,
            changes: 0,
        }
    }

    pub fn assign(&mut self, actions: &[Action]) {
        for action in actions {
            if let Action::Assign {
                strategy: Strategy::TokenBucket(bucket),
                ..
            } = action
                && self.assignment != Some(*bucket)
            {
                self.assignment = Some(*bucket);
                self.tokens = f64::from(bucket.max_tokens);
                self.changes += 1;
            }
        }
    }

    /// `requests` spread evenly over one second.
    pub fn second(&mut self, requests: u64) {
        for _ in 0..requests {
            self.offered += 1;
            let allowed = match self.assignment {
                // Before its first assignment Envoy allows (no_assignment_behavior unset).
                None => true,
                Some(bucket) => {
                    let rate = f64::from(bucket.tokens_per_fill) / bucket.fill_interval_secs as f64;
                    self.tokens =
                        (self.tokens + rate / requests as f64).min(f64::from(bucket.max_tokens));
                    if self.tokens >= 1.0 {
                        self.tokens -= 1.0;
                        true
                    } else {
                        false
                    }
                }
            };
            if allowed {
                self.admitted += 1;
                self.since_report.0 += 1;
            } else {
                self.since_report.1 += 1;
            }
        }
    }

    /// The report of `bucket` covering `elapsed` seconds: what was allowed and denied since
    /// the last one.
    pub fn usage(&mut self, bucket: BucketKey, elapsed: u64) -> Usage {
        let (allowed, denied) = std::mem::take(&mut self.since_report);
        Usage {
            bucket,
            allowed,
            denied,
            elapsed: Duration::from_secs(elapsed),
        }
    }
}
