//! The reference stats' part of `docs/metrics.md` (written by `metrics::catalog::markdown`):
//! every name the reference sends, whether ratekeeper sends it and how it differs, from
//! the table [`NAMES`].

use std::fmt::Write as _;

/// One stat of the reference.
pub struct Name {
    /// Its StatsD name (`<key>` as in [`super::names`]).
    pub statsd: &'static str,
    /// What the reference's default mapping names it in Prometheus, with its labels.
    pub prometheus: &'static str,
    /// What ratekeeper counts under it, and how that compares with the reference.
    pub counts: &'static str,
}

const fn name(statsd: &'static str, prometheus: &'static str, counts: &'static str) -> Name {
    Name {
        statsd,
        prometheus,
        counts,
    }
}

/// Every stat of the reference's `src/stats`, in its order.
pub const NAMES: &[Name] = &[
    name(
        "ratelimit.service.rate_limit.<key>.total_hits",
        "`ratelimit_service_rate_limit_total_hits{domain,key1[,key2]}`",
        "as the reference: every hit checked against the limit (`hits_addend` counts)",
    ),
    name(
        "ratelimit.service.rate_limit.<key>.over_limit",
        "`ratelimit_service_rate_limit_over_limit{..}`",
        "as the reference: the hits past the limit (a refused request whole when the limit \
         was used up, else its part past the limit); shadow-mode hits too",
    ),
    name(
        "ratelimit.service.rate_limit.<key>.near_limit",
        "`ratelimit_service_rate_limit_near_limit{..}`",
        "as the reference: hits past `floor(limit * NEAR_LIMIT_RATIO)` (`--near-limit-ratio`) \
         and not over the limit",
    ),
    name(
        "ratelimit.service.rate_limit.<key>.within_limit",
        "`ratelimit_service_rate_limit_within_limit{..}`",
        "as the reference: the hits of admitted requests",
    ),
    name(
        "ratelimit.service.rate_limit.<key>.shadow_mode",
        "`ratelimit_service_rate_limit_shadow_mode{..}`",
        "as the reference: hits over a `shadow_mode` limit (admitted anyway)",
    ),
    name(
        "ratelimit.service.rate_limit.<key>.over_limit_with_local_cache",
        "(unmapped)",
        "never sent: ratekeeper's over-limit cache (`--store-blocked-keys`) answers exactly, \
         its refusals count as over_limit",
    ),
    name(
        "ratelimit_server.ShouldRateLimit.total_requests",
        "`ratelimit_service_total_requests{grpc_method}`",
        "as the reference: every `ShouldRateLimit` call",
    ),
    name(
        "ratelimit_server.ShouldRateLimit.response_time",
        "`ratelimit_service_response_time_seconds`",
        "never sent: ratekeeper's latency is `ratekeeper_request_duration_seconds`",
    ),
    name(
        "ratelimit.service.call.should_rate_limit.redis_error",
        "`ratelimit_service_should_rate_limit_error{err_type}`",
        "calls answered UNAVAILABLE: the store failed (Redis, or the peers in cluster mode)",
    ),
    name(
        "ratelimit.service.call.should_rate_limit.service_error",
        "`ratelimit_service_should_rate_limit_error{err_type}`",
        "calls answered INVALID_ARGUMENT (the reference counts its other failures here)",
    ),
    name(
        "ratelimit.service.config_load_success",
        "`ratelimit_service_config_load_success`",
        "as the reference: limits loads that took (the start-up load counts)",
    ),
    name(
        "ratelimit.service.config_load_error",
        "`ratelimit_service_config_load_error`",
        "as the reference: limits loads refused",
    ),
];

const INTRO: &str = "\
With `--statsd` (the reference's `USE_STATSD`) or `--prometheus-addr` (`USE_PROMETHEUS`),
ratekeeper also keeps the reference service's stats, under its names, where Envoy Gateway
looks for them: pushed to StatsD (its earlier Deployments: a statsd_exporter sidecar on
`:9125`), or served on a Prometheus listener of their own with a statsd_exporter mapping
applied (its newer ones: `PROMETHEUS_ADDR=:19001`, `PROMETHEUS_MAPPER_YAML`), ratekeeper's
own metrics beside them on that page. Off without those flags, and then free.

`<key>` is the limit's key: the domain, then each configured entry from the root to the
limit's, `key` or `key_value` (a wildcard's pattern as its value), joined with dots:
`edge.api_key_vip.path`. With `detailed_metric` it holds the request's values
(`edge.user_alice`; an entry matched by a `share_threshold` wildcard as its pattern), with
`value_to_metric` the request's value of the entries that ask for it, and a request's own
`limit` names the request's entries. `EXTRA_TAGS` (`--stats-tag`) end the names of the
`ratelimit.` scope as gostats writes them: `.__key=value`, sorted by key.
";

const REST: &str = "
Only a stat that counted something is sent or shown, as the reference's gostats and
statsd_exporter do.

**Mapping files** (`--prometheus-mapping`, `PROMETHEUS_MAPPER_YAML`; without one, the
reference's default mapping): statsd_exporter's format, the part that concerns counters.
`mappings` with `match`, `name` and `labels` (`$1`, `${1}` stand for the match's captures),
`action: drop`, `match_type: regex` (or `defaults.match_type`), `match_metric_type` (only
`counter` matches), `help`. A glob's `*` matches within one dot-separated part; a regex may
match anywhere in the name (RE2, as Go's). The first matching glob wins, then the first
matching regex. A name nothing matches keeps its name with every character but
`[A-Za-z0-9_:]` turned into `_`. The other keys (`timer_type`, `buckets`, `ttl`, ...) are
read and ignored. Envoy Gateway's mapping file (its `statsd-exporter-config` ConfigMap) is
a test fixture: `src/metrics/reference/testdata/envoy-gateway-statsd.yaml`.

**What differs from the reference:**

- The page is OpenMetrics: a counter's sample ends in `_total`
  (`ratelimit_service_rate_limit_over_limit_total`), where the reference's classic text shows
  `ratelimit_service_rate_limit_over_limit`. A query on the reference's name adds `_total`.
- The page reads the counts at each scrape; the reference's exporter sees them after each
  `STATS_FLUSH_INTERVAL`.
- StatsD lines go over UDP (datagrams of at most 512 bytes); the reference's gostats uses TCP
  unless `STATSD_PROTOCOL=udp`. statsd_exporter listens on both.
- The reference pushes to `localhost:8125` unless `USE_STATSD=false`; ratekeeper pushes only
  when asked (`USE_STATSD=true` or `--statsd`), to the reference's defaults for whatever of
  `STATSD_HOST`, `STATSD_PORT` is unset. A StatsD name that does not resolve yet is retried at
  each push, it never stops the start.
- A mapping file that cannot be read or parsed stops the start, naming it; the reference
  ignores the error and maps nothing.
- At most `--metrics-max-series` keys; past it, new ones count under
  `ratelimit.service.rate_limit.<domain>._other` and a warning is logged once.
- Several limits on one entry (which the reference cannot say) share its key: their counts
  add up.
- statsd_exporter's own `statsd_exporter_*` metrics and the Go runtime's are not served.
";

/// The section of `docs/metrics.md` on the reference's names.
pub fn markdown() -> String {
    let mut out =
        String::from("## The reference service's names (`--statsd`, `--prometheus-addr`)\n\n");
    out.push_str(INTRO);
    out.push_str(
        "\n| StatsD name | Prometheus name (default mapping) | what ratekeeper counts |\n\
         | --- | --- | --- |\n",
    );
    for name in NAMES {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} |",
            name.statsd, name.prometheus, name.counts
        );
    }
    out.push_str(REST);
    out
}
