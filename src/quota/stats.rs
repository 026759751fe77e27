//! The RLQS figures, per limits domain: streams and buckets open, reports, assignments and
//! abandons sent, shadow-mode violations, streams refused, and buckets denied for an
//! invalid id. Registered by the server
//! under `ratekeeper_rlqs_*`.
//!
//! Invariant: the `domain` label is a configured domain's name or `_unknown`, never a name
//! from the wire that no limits file defines (so a client cannot grow the series).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The label of a stream whose domain no limits file defines.
pub const UNKNOWN_DOMAIN: &str = "_unknown";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DomainLabel {
    pub domain: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabel {
    pub reason: String,
}

/// The families; cloning shares them.
#[derive(Clone, Debug, Default)]
pub struct RlqsStats {
    pub streams: Family<DomainLabel, Gauge>,
    pub buckets: Family<DomainLabel, Gauge>,
    pub reported_allowed: Family<DomainLabel, Counter>,
    pub reported_denied: Family<DomainLabel, Counter>,
    pub assignments: Family<DomainLabel, Counter>,
    pub abandons: Family<DomainLabel, Counter>,
    pub shadow_violations: Family<DomainLabel, Counter>,
    pub unknown_domain_reports: Counter,
    pub refused: Family<RefusedLabel, Counter>,
    pub invalid_buckets: Family<RefusedLabel, Counter>,
}

impl RlqsStats {
    /// Registers every family in `registry` under `rlqs_` (the registry adds `ratekeeper_`).
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("rlqs");
        sub.register(
            "streams",
            "RLQS streams open (StreamRateLimitQuotas)",
            self.streams.clone(),
        );
        sub.register(
            "buckets",
            "Quota buckets reported by at least one open stream",
            self.buckets.clone(),
        );
        sub.register(
            "reported_allowed",
            "Requests Envoy reported as allowed",
            self.reported_allowed.clone(),
        );
        sub.register(
            "reported_denied",
            "Requests Envoy reported as denied",
            self.reported_denied.clone(),
        );
        sub.register(
            "assignments",
            "Quota assignments sent",
            self.assignments.clone(),
        );
        sub.register(
            "abandons",
            "Abandon actions sent (buckets idle for --rlqs-abandon-after)",
            self.abandons.clone(),
        );
        sub.register(
            "shadow_violations",
            "Requests of shadow-mode buckets allowed beyond the reporter's share",
            self.shadow_violations.clone(),
        );
        sub.register(
            "unknown_domain_reports",
            "Bucket reports for a domain no limits file defines (answered allow all)",
            self.unknown_domain_reports.clone(),
        );
        sub.register(
            "refused",
            "RLQS streams ended with an error, by reason",
            self.refused.clone(),
        );
        sub.register(
            "invalid_buckets",
            "Reported buckets whose id cannot be read as a descriptor (empty, too many pairs, a pair too long), answered deny all, by reason",
            self.invalid_buckets.clone(),
        );
    }

    pub fn label(domain: &str) -> DomainLabel {
        DomainLabel {
            domain: domain.to_owned(),
        }
    }

    pub fn invalid_bucket(&self, reason: &str) {
        self.invalid_buckets
            .get_or_create(&RefusedLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn refuse(&self, reason: &str) {
        self.refused
            .get_or_create(&RefusedLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }
}
