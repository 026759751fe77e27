//! Every metric ratekeeper exports, declared once: name, type, labels, help and when it is
//! there. `docs/metrics.md` is written from this table, and a test builds every collector
//! (each store, xDS, TLS, RLQS, the webhook) and holds the table and the scrape to each
//! other both ways: a family scraped but not declared, declared but not scraped, or with
//! another type, help or label set fails it. A registry only shows label names it has a
//! sample for, which is why the labels are declared here rather than read from it.

use std::fmt::Write as _;

/// Where the reference lives, from the repository root.
pub const DOCS_FILE: &str = "docs/metrics.md";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// When a family is exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// By every `ratekeeper serve`.
    Always,
    /// With the in-memory store: `--store memory` (the default), alone or in cluster mode.
    Memory,
    /// In cluster mode (`--peer-addr`).
    Cluster,
    /// With `--peer-tls-cert`.
    PeerTls,
    /// With `--store redis://...`.
    Redis,
    /// With `--config-source xds`.
    Xds,
    /// With `--grpc-tls-cert`.
    GrpcTls,
    /// By `ratekeeper webhook` (on its own HTTP listener), not by `serve`.
    Webhook,
}

impl When {
    const ALL: [When; 8] = [
        When::Always,
        When::Memory,
        When::Cluster,
        When::PeerTls,
        When::Redis,
        When::Xds,
        When::GrpcTls,
        When::Webhook,
    ];

    fn heading(self) -> &'static str {
        match self {
            When::Always => "Requests, limits, reloads and RLQS (always)",
            When::Memory => "The in-memory store (`--store memory`, alone or in cluster mode)",
            When::Cluster => "Cluster mode (`--peer-addr`)",
            When::PeerTls => "Mutual TLS between peers (`--peer-tls-cert`)",
            When::Redis => "The Redis store (`--store redis://...`)",
            When::Xds => "Limits from xDS (`--config-source xds`)",
            When::GrpcTls => "TLS on the gRPC listener (`--grpc-tls-cert`)",
            When::Webhook => "The injection webhook (`ratekeeper webhook`)",
        }
    }
}

/// One family.
#[derive(Clone, Copy, Debug)]
pub struct Declared {
    /// The family's name after `ratekeeper_` (a counter's samples add `_total`, a
    /// histogram's `_bucket`, `_sum` and `_count`).
    pub name: &'static str,
    pub kind: Kind,
    /// Its label names (a histogram's `le` aside), in the order the samples carry them.
    pub labels: &'static [&'static str],
    /// Its `# HELP` text.
    pub help: &'static str,
    pub when: When,
}

impl Declared {
    /// The family's full name, as `# TYPE` shows it.
    pub fn family_name(&self) -> String {
        format!("ratekeeper_{}", self.name)
    }

    /// The name a query uses: a counter's samples end in `_total`.
    pub fn sample_name(&self) -> String {
        match self.kind {
            Kind::Counter => format!("ratekeeper_{}_total", self.name),
            Kind::Gauge | Kind::Histogram => self.family_name(),
        }
    }
}

const fn family(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    when: When,
    help: &'static str,
) -> Declared {
    Declared {
        name,
        kind,
        labels,
        help,
        when,
    }
}

use Kind::{Counter, Gauge, Histogram};

const LIMIT: &[&str] = &["domain", "limit", "unit"];
const SHARD: &[&str] = &["shard"];
const RULE: &[&str] = &["rule"];
const PEER: &[&str] = &["peer"];
const DOMAIN: &[&str] = &["domain"];
const REASON: &[&str] = &["reason"];
const RESULT: &[&str] = &["result"];

/// Every family, in the order of the docs.
pub const CATALOG: &[Declared] = &[
    family(
        "requests",
        Counter,
        &["result", "code"],
        When::Always,
        "ShouldRateLimit calls by result (ok, over_limit, error) and gRPC code",
    ),
    family(
        "request_duration_seconds",
        Histogram,
        RESULT,
        When::Always,
        "ShouldRateLimit latency inside ratekeeper, by result",
    ),
    family(
        "limit_total_hits",
        Counter,
        LIMIT,
        When::Always,
        "Hits checked against a limit (hits_addend counts)",
    ),
    family(
        "limit_over_limit",
        Counter,
        LIMIT,
        When::Always,
        "Hits rejected by a limit",
    ),
    family(
        "limit_near_limit",
        Counter,
        LIMIT,
        When::Always,
        "Admitted hits that left the limit at least near_limit_ratio used",
    ),
    family(
        "limit_within_limit",
        Counter,
        LIMIT,
        When::Always,
        "Hits admitted by a limit",
    ),
    family(
        "limit_shadow_mode",
        Counter,
        LIMIT,
        When::Always,
        "Hits over a shadow-mode limit (admitted anyway)",
    ),
    family(
        "limit_series_dropped",
        Counter,
        &[],
        When::Always,
        "Hits counted under limit=\"_other\" because the per-limit series cap was reached",
    ),
    family(
        "shard_live_keys",
        Gauge,
        SHARD,
        When::Memory,
        "Keys with live state, per shard",
    ),
    family(
        "shard_key_slots",
        Gauge,
        SHARD,
        When::Memory,
        "Keys the shard's table holds before it grows (its memory), per shard",
    ),
    family(
        "shard_waiters",
        Gauge,
        SHARD,
        When::Memory,
        "Checks waiting in FIFO queues (max_wait), per shard",
    ),
    family(
        "shard_expired_keys",
        Counter,
        SHARD,
        When::Memory,
        "Keys forgotten once their state could no longer change an answer, per shard",
    ),
    family(
        "shard_swept_keys",
        Counter,
        SHARD,
        When::Memory,
        "Keys the sweep of idle keys looked at, per shard (the sweep's work)",
    ),
    family(
        "shard_contended",
        Counter,
        SHARD,
        When::Memory,
        "Checks that found their shard busy with another request's step and waited for it",
    ),
    family(
        "shard_key_capacity_hits",
        Counter,
        SHARD,
        When::Memory,
        "Requests answered UNAVAILABLE because the shard held max_keys keys",
    ),
    family(
        "shard_waits_admitted",
        Counter,
        SHARD,
        When::Memory,
        "Waiting checks admitted within max_wait",
    ),
    family(
        "shard_waits_rejected",
        Counter,
        SHARD,
        When::Memory,
        "Checks that could not wait (queue full, or no capacity within max_wait)",
    ),
    family(
        "rule_keys",
        Gauge,
        RULE,
        When::Memory,
        "Live keys of each rule on this node",
    ),
    family(
        "rule_key_budget",
        Gauge,
        RULE,
        When::Memory,
        "The most live keys each rule may hold on this node (max_keys, or its share of --max-keys)",
    ),
    family(
        "rule_key_refusals",
        Counter,
        RULE,
        When::Memory,
        "Requests answered UNAVAILABLE because they needed a new key of a rule that held its key budget",
    ),
    family(
        "shard_lock_wait_seconds",
        Histogram,
        SHARD,
        When::Memory,
        "How long checks that found their shard busy waited for it",
    ),
    family(
        "cluster_members",
        Gauge,
        &[],
        When::Cluster,
        "Nodes on this node's hash ring, itself included",
    ),
    family(
        "cluster_fallbacks",
        Counter,
        &[],
        When::Cluster,
        "Request groups decided by the fallback policy because their owner did not answer",
    ),
    family(
        "cluster_rerouted",
        Counter,
        &[],
        When::Cluster,
        "Request groups whose owner did not answer but left the ring meanwhile, sent to the new owner",
    ),
    family(
        "cluster_handoff_sent",
        Counter,
        &[],
        When::Cluster,
        "Counters handed to their new owners",
    ),
    family(
        "cluster_handoff_failed",
        Counter,
        &[],
        When::Cluster,
        "Counters an owner did not take (kept here)",
    ),
    family(
        "cluster_handoff_received",
        Counter,
        &[],
        When::Cluster,
        "Counters taken over from other nodes",
    ),
    family(
        "cluster_ring_changes",
        Counter,
        &[],
        When::Cluster,
        "Times the hash ring changed",
    ),
    family(
        "cluster_peer_refused",
        Counter,
        &[],
        When::Cluster,
        "Peer messages refused because the client certificate does not speak for the node they concern (mutual TLS)",
    ),
    family(
        "cluster_quota_sent",
        Counter,
        &[],
        When::Cluster,
        "RLQS: bucket demands sent to their owners (one per bucket per report interval)",
    ),
    family(
        "cluster_quota_unanswered",
        Counter,
        &[],
        When::Cluster,
        "RLQS: bucket demands that got no share back (owner unreachable or full): the bucket used an equal part of its limit per member",
    ),
    family(
        "cluster_quota_failed_calls",
        Counter,
        &[],
        When::Cluster,
        "RLQS: Quota calls to an owner that failed or timed out",
    ),
    family(
        "cluster_quota_received",
        Counter,
        &[],
        When::Cluster,
        "RLQS: bucket demands this node divided as their owner for other nodes",
    ),
    family(
        "cluster_lease_units_lent",
        Counter,
        &[],
        When::Cluster,
        "Hits this node, as their owner, lent to other nodes with leases",
    ),
    family(
        "cluster_lease_hits",
        Counter,
        &[],
        When::Cluster,
        "Requests' checks admitted from a lease, without a forward",
    ),
    family(
        "cluster_lease_units_returned",
        Counter,
        &[],
        When::Cluster,
        "Leased hits that ended unspent: given back to the node that lent them, or dropped when it no longer owns the key",
    ),
    family(
        "cluster_leases",
        Gauge,
        &[],
        When::Cluster,
        "Keys this node holds a lease for",
    ),
    family(
        "peer_forwarded",
        Counter,
        PEER,
        When::Cluster,
        "Request groups forwarded to the peer (their key's owner)",
    ),
    family(
        "peer_batches",
        Counter,
        PEER,
        When::Cluster,
        "Forward batches sent to the peer (forwarded / batches = mean batch size)",
    ),
    family(
        "peer_errors",
        Counter,
        PEER,
        When::Cluster,
        "Forward batches that failed (unreachable, timed out)",
    ),
    family(
        "peer_slow",
        Counter,
        PEER,
        When::Cluster,
        "Forward batches that took over 20 ms (Envoy's default rate limit timeout): the owner is alive but slow",
    ),
    family(
        "peer_circuit_open",
        Gauge,
        PEER,
        When::Cluster,
        "1 while the peer's circuit breaker is open (its keys use the fallback)",
    ),
    family(
        "peer_up",
        Gauge,
        PEER,
        When::Cluster,
        "1 while the failure detector finds the peer reachable (on this node's ring), 0 while it is down",
    ),
    family(
        "store_calls",
        Counter,
        &[],
        When::Redis,
        "Redis script calls answered",
    ),
    family(
        "store_errors",
        Counter,
        &[],
        When::Redis,
        "Redis calls that failed with an error",
    ),
    family(
        "store_timeouts",
        Counter,
        &[],
        When::Redis,
        "Redis calls that missed their deadline (--store-timeout)",
    ),
    family(
        "store_breaker_opened",
        Counter,
        &[],
        When::Redis,
        "Times the Redis circuit breaker opened",
    ),
    family(
        "store_busy",
        Counter,
        &[],
        When::Redis,
        "Requests decided by --store-failure because the queue to Redis was full (this node is overloaded; the breaker is not told)",
    ),
    family(
        "store_policy_decisions",
        Counter,
        &[],
        When::Redis,
        "Descriptor checks decided by --store-failure because Redis could not answer",
    ),
    family(
        "store_blocked_cache_hits",
        Counter,
        &[],
        When::Redis,
        "Descriptor checks answered from the over-limit cache, with no Redis call",
    ),
    family(
        "store_blocked_cache_full",
        Counter,
        &[],
        When::Redis,
        "Over-limit descriptors not cached because the cache was full",
    ),
    family(
        "store_disagreements",
        Counter,
        &[],
        When::Redis,
        "Checks where the Redis script and ratekeeper disagreed (a bug if not 0)",
    ),
    family(
        "store_circuit_open",
        Gauge,
        &[],
        When::Redis,
        "1 while the Redis circuit breaker is open (checks use --store-failure)",
    ),
    family(
        "store_blocked_cache_entries",
        Gauge,
        &[],
        When::Redis,
        "Key slots held by the over-limit cache (a descriptor with several limits takes one per limit)",
    ),
    family(
        "store_call_seconds",
        Histogram,
        &[],
        When::Redis,
        "Time of one Redis script call, failures included",
    ),
    family(
        "config_loads",
        Counter,
        RESULT,
        When::Always,
        "Limits loads by result (the start-up load counts as a success)",
    ),
    family(
        "config_last_success_timestamp_seconds",
        Gauge,
        &[],
        When::Always,
        "Unix time of the last successful limits load",
    ),
    family(
        "config_info",
        Gauge,
        &["version"],
        When::Always,
        "The live limits' version (content hash); always 1",
    ),
    family(
        "xds_connected",
        Gauge,
        &[],
        When::Xds,
        "1 while a stream to the xDS management server is open",
    ),
    family(
        "xds_streams",
        Counter,
        &[],
        When::Xds,
        "Streams opened to the xDS management server",
    ),
    family(
        "xds_disconnects",
        Counter,
        &[],
        When::Xds,
        "Streams to the xDS management server that ended or failed to open",
    ),
    family(
        "xds_responses",
        Counter,
        RESULT,
        When::Xds,
        "RateLimitConfig responses from the xDS management server by answer (ack: applied, nack: rejected)",
    ),
    family(
        "xds_tls_loads",
        Counter,
        RESULT,
        When::Xds,
        "Loads of the xDS client's TLS files (CA, client certificate) by result (the start-up load counts)",
    ),
    family(
        "xds_tls_handshake_failures",
        Counter,
        &[],
        When::Xds,
        "Connections to the xDS management server whose TLS handshake failed",
    ),
    family(
        "grpc_tls_loads",
        Counter,
        RESULT,
        When::GrpcTls,
        "Loads of the gRPC TLS certificate files by result (the start-up load counts)",
    ),
    family(
        "grpc_tls_handshake_failures",
        Counter,
        &[],
        When::GrpcTls,
        "gRPC connections whose TLS handshake failed or timed out",
    ),
    family(
        "peer_tls_loads",
        Counter,
        RESULT,
        When::PeerTls,
        "Loads of the peer TLS certificate files by result (the start-up load counts)",
    ),
    family(
        "peer_tls_handshake_failures",
        Counter,
        &[],
        When::PeerTls,
        "Peer connections whose TLS handshake failed or timed out",
    ),
    family(
        "rlqs_streams",
        Gauge,
        DOMAIN,
        When::Always,
        "RLQS streams open (StreamRateLimitQuotas)",
    ),
    family(
        "rlqs_buckets",
        Gauge,
        DOMAIN,
        When::Always,
        "Quota buckets reported by at least one open stream",
    ),
    family(
        "rlqs_reported_allowed",
        Counter,
        DOMAIN,
        When::Always,
        "Requests Envoy reported as allowed",
    ),
    family(
        "rlqs_reported_denied",
        Counter,
        DOMAIN,
        When::Always,
        "Requests Envoy reported as denied",
    ),
    family(
        "rlqs_assignments",
        Counter,
        DOMAIN,
        When::Always,
        "Quota assignments sent",
    ),
    family(
        "rlqs_abandons",
        Counter,
        DOMAIN,
        When::Always,
        "Abandon actions sent (buckets idle for --rlqs-abandon-after)",
    ),
    family(
        "rlqs_shadow_violations",
        Counter,
        DOMAIN,
        When::Always,
        "Requests of shadow-mode buckets allowed beyond the reporter's share",
    ),
    family(
        "rlqs_unknown_domain_reports",
        Counter,
        &[],
        When::Always,
        "Bucket reports for a domain no limits file defines (answered allow all)",
    ),
    family(
        "rlqs_refused",
        Counter,
        REASON,
        When::Always,
        "RLQS streams ended with an error, by reason",
    ),
    family(
        "rlqs_invalid_buckets",
        Counter,
        REASON,
        When::Always,
        "Reported buckets whose id cannot be read as a descriptor (empty, too many pairs, a pair too long), answered deny all, by reason",
    ),
    family(
        "webhook_reviews",
        Counter,
        RESULT,
        When::Webhook,
        "Admission reviews answered, by result (injected, skipped, refused: the pod cannot take the sidecar, malformed, not_json, too_large, timeout)",
    ),
    family(
        "webhook_review_duration_seconds",
        Histogram,
        &[],
        When::Webhook,
        "Time to answer an admission review, body read included",
    ),
    family(
        "webhook_tls_loads",
        Counter,
        RESULT,
        When::Webhook,
        "Loads of the webhook's TLS certificate files by result (the start-up load counts)",
    ),
    family(
        "webhook_tls_handshake_failures",
        Counter,
        &[],
        When::Webhook,
        "Admission webhook connections whose TLS handshake failed or timed out",
    ),
];

/// The reference, as Markdown: one table per [`When`].
pub fn markdown() -> String {
    let mut out = String::from(
        "# Metrics reference\n\n<!-- Generated from src/metrics/catalog.rs: do not edit. \
         Regenerate with `RATEKEEPER_REGENERATE=1 cargo test --lib catalog`. -->\n\n\
         Every family ratekeeper exports on `/metrics` (the HTTP and the admin listener), in \
         OpenMetrics text. A counter's samples add `_total` to its name, a histogram's \
         `_bucket`, `_sum` and `_count`. What the labels hold, and how to use the figures: \
         [Operating](operating.md#metrics).\n\n",
    );
    for when in When::ALL {
        let _ = writeln!(out, "## {}\n", when.heading());
        out.push_str("| metric | type | labels | help |\n| --- | --- | --- | --- |\n");
        for declared in CATALOG.iter().filter(|declared| declared.when == when) {
            let labels: Vec<String> = declared.labels.iter().map(|l| format!("`{l}`")).collect();
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                declared.sample_name(),
                declared.kind.as_str(),
                labels.join(", "),
                declared.help.replace('|', "\\|")
            );
        }
        out.push('\n');
    }
    out.push_str(&super::reference::docs::markdown());
    out
}

#[cfg(test)]
mod tests;
