//! The reference service's environment (envoyproxy/ratelimit's `src/settings/settings.go`),
//! read as it is, so a Deployment written for the reference runs ratekeeper unchanged.
//!
//! [`map`] turns the variables that are set into ratekeeper flags, warnings and errors:
//! - a variable ratekeeper honours becomes the flag that means the same (`PORT` ->
//!   `--http-addr`), unless ratekeeper's own flag or `RATEKEEPER_*` variable for it is given
//!   too: ours win, and the variable is reported as overridden;
//! - the reference's defaults never apply: an unset variable changes nothing (an unset
//!   `BACKEND_TYPE` keeps the in-memory store unless `REDIS_URL` names a Redis, `PORT` alone
//!   keeps ratekeeper's loopback host);
//! - a variable asking for what ratekeeper does not do (memcache, a second Redis for
//!   per-second limits, DogStatsD, ...) is an error naming it; one that changes nothing that
//!   matters (pipelining knobs, jitter) is a warning saying it is ignored.
//!
//! Pure: the environment comes in as a map and the ids of ratekeeper's explicitly given
//! arguments as a set; nothing here reads the process environment. Every variable of
//! [`VARIABLES`] is answered one way or another (a test holds it to that, and to docs/migrating.md's
//! migration table naming each of them).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

mod limiter;
mod listen;
mod redis;
mod sources;
mod stats;

/// Every variable of the reference's `settings.go`, in its order.
pub const VARIABLES: &[&str] = &[
    "PROTO",
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_UDS",
    "GRPC_HOST",
    "GRPC_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    // Envoy Gateway's name for the client CA (the reference does not read it).
    "GRPC_SERVER_TLS_CA_CERT",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_POOL_SIZE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_USE_EXPLICIT_PIPELINE",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_USE_EXPLICIT_PIPELINE",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_TIMEOUT",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
];

/// OpenTelemetry's standard endpoint variables: read (with `TRACING_ENABLED=true` only) for
/// where the reference's exporter sends spans.
pub const OTEL_ENDPOINTS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The reference's default runtime root, used only to complete a path whose other parts
/// are set (`RUNTIME_SUBDIRECTORY` alone means a directory under it).
const RUNTIME_ROOT: &str = "/srv/runtime_data/current";

/// One ratekeeper argument set from the reference's variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flag {
    /// The clap id of the argument (`http_addr`).
    pub id: &'static str,
    /// Its long flag (`--http-addr`).
    pub long: &'static str,
    /// Its value; `None` for a switch (`--shadow-mode`).
    pub value: Option<String>,
    /// The value for logs: the same, with a Redis password masked.
    pub shown: Option<String>,
    /// The variables it comes from.
    pub from: Vec<&'static str>,
}

impl Flag {
    /// The command-line argument (`--http-addr=[::]:8080`).
    pub fn arg(&self) -> String {
        match &self.value {
            Some(value) => format!("{}={value}", self.long),
            None => self.long.to_owned(),
        }
    }

    /// [`Flag::arg`] for logs.
    fn shown(&self) -> String {
        match &self.shown {
            Some(value) => format!("{}={value}", self.long),
            None => self.long.to_owned(),
        }
    }
}

/// A warning or an error about one variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub variable: &'static str,
    pub text: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.variable, self.text)
    }
}

/// What the reference's environment asks of ratekeeper.
#[derive(Clone, Debug, Default)]
pub struct Mapping {
    /// Arguments to add to the command line.
    pub flags: Vec<Flag>,
    /// The variables honoured, as flags or because ratekeeper already behaves so.
    pub applied: Vec<&'static str>,
    /// Variables whose meaning ratekeeper's own argument (the flag named) replaced.
    pub overridden: Vec<(&'static str, &'static str)>,
    /// Variables ignored, and why.
    pub warnings: Vec<Note>,
    /// Variables ratekeeper cannot honour: the start must stop.
    pub errors: Vec<Note>,
}

impl Mapping {
    /// Whether any reference variable was set at all.
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty()
            && self.overridden.is_empty()
            && self.warnings.is_empty()
            && self.errors.is_empty()
    }

    /// The arguments to add to the command line.
    pub fn args(&self) -> impl Iterator<Item = String> + '_ {
        self.flags.iter().map(Flag::arg)
    }

    /// The start-up line naming what was applied (no secrets), or `None` when nothing was.
    pub fn summary(&self) -> Option<String> {
        if self.applied.is_empty() && self.overridden.is_empty() {
            return None;
        }
        let mut line = format!(
            "applied the reference service's environment: {}",
            self.applied.join(", ")
        );
        if !self.flags.is_empty() {
            let flags: Vec<String> = self.flags.iter().map(Flag::shown).collect();
            line.push_str(&format!(" (as {})", flags.join(" ")));
        }
        if !self.overridden.is_empty() {
            let overridden: Vec<String> = self
                .overridden
                .iter()
                .map(|(variable, flag)| format!("{variable} ({flag})"))
                .collect();
            line.push_str(&format!(
                "; ratekeeper's own settings won over {}",
                overridden.join(", ")
            ));
        }
        Some(line)
    }

    /// Logs the warnings and the [`Mapping::summary`] line.
    pub fn log(&self) {
        for warning in &self.warnings {
            tracing::warn!("reference service environment: {warning}");
        }
        if let Some(summary) = self.summary() {
            tracing::info!("{summary}");
        }
    }

    /// Every variable this mapping says something about.
    pub fn mentions(&self, variable: &str) -> bool {
        self.applied.contains(&variable)
            || self.overridden.iter().any(|(name, _)| *name == variable)
            || self
                .warnings
                .iter()
                .chain(&self.errors)
                .any(|note| note.variable == variable)
    }
}

/// The reference's variables in `env` as ratekeeper flags, warnings and errors. `given`
/// holds the clap ids of ratekeeper's own arguments given on the command line or by their
/// `RATEKEEPER_*` variable (those win); `env` may hold anything else, which is not read.
/// The name the reference's image runs its binary by (`/bin/ratelimit`; Envoy Gateway's
/// Deployment runs exactly that): ratekeeper answers to it as `ratekeeper serve` with the
/// reference's defaults ([`entry_point_defaults`]).
pub const REFERENCE_ENTRY_POINT: &str = "ratelimit";

/// Run as the reference's entry point, its defaults for the listeners: what the reference
/// listens on when `HOST`/`PORT` and `GRPC_HOST`/`GRPC_PORT` are unset (every interface, 8080
/// and 8081), as if `PORT=8080` and `GRPC_PORT=8081` were set; nothing else (no Redis by
/// default, the admin listener stays on loopback). A listener whose host or port is set is
/// left to them.
pub fn entry_point_defaults(env: &mut BTreeMap<String, String>) {
    let unset = |env: &BTreeMap<String, String>, name: &str| {
        env.get(name).is_none_or(|value| value.is_empty())
    };
    for (host, port, default) in [("HOST", "PORT", "8080"), ("GRPC_HOST", "GRPC_PORT", "8081")] {
        if unset(env, host) && unset(env, port) {
            env.insert(port.to_owned(), default.to_owned());
        }
    }
}

pub fn map(env: &BTreeMap<String, String>, given: &BTreeSet<&str>) -> Mapping {
    let mut reader = Reader {
        env,
        given,
        out: Mapping::default(),
    };
    reader.listeners();
    reader.grpc_tls();
    reader.logs();
    let xds = reader.config_source();
    reader.files(xds);
    reader.xds(xds);
    reader.stats();
    reader.limiter();
    reader.redis();
    reader.memcache();
    reader.tracing();
    reader.out
}

struct Reader<'a> {
    env: &'a BTreeMap<String, String>,
    given: &'a BTreeSet<&'a str>,
    out: Mapping,
}

impl<'a> Reader<'a> {
    /// The variable's value; an empty value counts as unset.
    fn get(&self, variable: &str) -> Option<&'a str> {
        self.env
            .get(variable)
            .map(String::as_str)
            .filter(|value| !value.is_empty())
    }

    fn given(&self, id: &str) -> bool {
        self.given.contains(id)
    }

    fn applied(&mut self, variable: &'static str) {
        if !self.out.applied.contains(&variable) {
            self.out.applied.push(variable);
        }
    }

    fn warn(&mut self, variable: &'static str, text: impl Into<String>) {
        self.out.warnings.push(Note {
            variable,
            text: text.into(),
        });
    }

    fn refuse(&mut self, variable: &'static str, text: impl Into<String>) {
        self.out.errors.push(Note {
            variable,
            text: text.into(),
        });
    }

    /// Warns for each of `variables` that is set: ignored, `why`.
    fn unused(&mut self, variables: &[&'static str], why: &str) {
        for &variable in variables {
            if self.get(variable).is_some() {
                self.warn(variable, format!("ignored: {why}"));
            }
        }
    }

    /// A Go boolean (`strconv.ParseBool`); an error naming the variable otherwise.
    fn bool(&mut self, variable: &'static str) -> Option<bool> {
        let value = self.get(variable)?;
        match value {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
            _ => {
                self.refuse(
                    variable,
                    format!("{value:?} is not a boolean (true or false)"),
                );
                None
            }
        }
    }

    /// Whether a Go boolean is `true`; `false` is honoured (ratekeeper's default already),
    /// an invalid value is an error.
    fn is_true(&mut self, variable: &'static str) -> bool {
        match self.bool(variable) {
            Some(true) => true,
            Some(false) => {
                self.applied(variable);
                false
            }
            None => false,
        }
    }

    /// The variables of [`VARIABLES`] whose names start with one of `prefixes`.
    fn named(prefixes: &[&str]) -> Vec<&'static str> {
        VARIABLES
            .iter()
            .copied()
            .filter(|name| prefixes.iter().any(|prefix| name.starts_with(prefix)))
            .collect()
    }

    /// A Go duration (`time.ParseDuration`); an error naming the variable otherwise.
    fn duration(&mut self, variable: &'static str) -> Option<Duration> {
        let value = self.get(variable)?;
        let parsed = go_duration(value);
        if parsed.is_none() {
            self.refuse(
                variable,
                format!("{value:?} is not a duration like 500ms, 10s or 1m30s"),
            );
        }
        parsed
    }

    /// Sets argument `id` (`long`) to `value` from `from` (the set ones count), unless
    /// ratekeeper's own argument is given: then they are overridden.
    fn set(
        &mut self,
        id: &'static str,
        long: &'static str,
        value: Option<String>,
        from: &[&'static str],
    ) {
        self.set_shown(id, long, value.clone(), value, from);
    }

    fn set_shown(
        &mut self,
        id: &'static str,
        long: &'static str,
        value: Option<String>,
        shown: Option<String>,
        from: &[&'static str],
    ) {
        let from: Vec<&'static str> = from
            .iter()
            .copied()
            .filter(|variable| self.get(variable).is_some())
            .collect();
        if self.given(id) {
            for variable in from {
                self.out.overridden.push((variable, long));
            }
            return;
        }
        for &variable in &from {
            self.applied(variable);
        }
        self.out.flags.push(Flag {
            id,
            long,
            value,
            shown,
            from,
        });
    }

    /// A boolean that turns a ratekeeper switch on; `false` is ratekeeper's default.
    fn switch(&mut self, variable: &'static str, id: &'static str, long: &'static str) {
        match self.bool(variable) {
            Some(true) => self.set(id, long, None, &[variable]),
            Some(false) if self.given(id) => self.out.overridden.push((variable, long)),
            Some(false) => self.applied(variable),
            None => {}
        }
    }

    /// A Go duration copied as the flag's duration text.
    fn copy_duration(&mut self, variable: &'static str, id: &'static str, long: &'static str) {
        if let Some(duration) = self.duration(variable) {
            self.set(id, long, Some(go_text(duration)), &[variable]);
        }
    }

    /// A value copied as it is.
    fn copy(&mut self, variable: &'static str, id: &'static str, long: &'static str) {
        if let Some(value) = self.get(variable) {
            self.set(id, long, Some(value.to_owned()), &[variable]);
        }
    }
}

/// Go's `time.ParseDuration` for non-negative durations: `300ms`, `10s`, `1m30s`, `1.5h`,
/// `0`.
pub fn go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|ch: char| !(ch.is_ascii_digit() || ch == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|ch: char| ch.is_ascii_digit() || ch == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        let mut part = whole.checked_mul(nanos)?;
        if !fraction.is_empty() {
            let digits = fraction.get(..fraction.len().min(18))?;
            let scale = 10u128.checked_pow(u32::try_from(digits.len()).ok()?)?;
            part = part.checked_add(digits.parse::<u128>().ok()?.checked_mul(nanos)? / scale)?;
        }
        total = total.checked_add(part)?;
        rest = after;
    }
    Some(Duration::from_nanos(u64::try_from(total).ok()?))
}

/// A duration as ratekeeper's flags read it (`10s`, `150ms`, `1500us`, `7ns`).
fn go_text(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos.is_multiple_of(1_000_000_000) {
        format!("{}s", nanos / 1_000_000_000)
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}us", nanos / 1_000)
    } else {
        format!("{nanos}ns")
    }
}

#[cfg(test)]
mod tests;
