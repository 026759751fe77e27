//! The command line: flags, their environment variables and defaults, and how they map
//! onto the library's options. `main.rs` parses and dispatches; everything here is testable.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::admin::AdminOptions;
use crate::admin::explain::client::ExplainRequest;
use crate::envoy::rlqs::{HubOptions, RlqsOptions};
use crate::envoy::xds::XdsOptions;
use crate::limiter::{HeaderNames, HeaderStyle, LimiterOptions};
use crate::limits::{ConfigErrors, Limits, LoadOptions, parse_duration};
use crate::metrics::MetricsOptions;
use crate::reload::{self as reloader, ReloadOptions};
use crate::server::ServerOptions;
use crate::store::Capabilities;
use crate::store::cluster::{ClusterOptions, Fallback};
use crate::store::memory::EngineConfig;
use crate::store::redis::{self, FailurePolicy, RedisOptions, Target};
use crate::transport::tls::TlsOptions;

pub mod reference_env;

/// `--http-addr` unless given (or set by the reference's `HOST`/`PORT`).
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";
/// `--grpc-addr` unless given (or set by the reference's `GRPC_HOST`/`GRPC_PORT`).
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:8081";

/// Envoy rate limit service sidecar.
#[derive(Parser)]
#[command(name = "ratekeeper", version)]
pub struct Cli {
    /// Log filter, `RUST_LOG` syntax (e.g. `info`, `ratekeeper=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "info", global = true)]
    pub log: String,
    /// Log format.
    #[arg(long, env = "RATEKEEPER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Trace every `ShouldRateLimit` call to this OTLP/gRPC collector (e.g.
    /// `http://otel-collector:4317`), as a child of the caller's W3C trace context. Off
    /// when not given.
    #[arg(long, env = "RATEKEEPER_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the traced spans.
    #[arg(
        long,
        env = "RATEKEEPER_OTLP_SERVICE_NAME",
        default_value = "ratekeeper",
        global = true
    )]
    pub otlp_service_name: String,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The process's command line; for `serve`, with the reference service's environment
    /// applied (see [`reference_env`]): the mapping is returned so it can be logged once
    /// logging is set up. Exits as clap does on a bad command line; an error names the
    /// reference variables ratekeeper cannot honour.
    pub fn parse_with_reference_env() -> Result<(Cli, Option<reference_env::Mapping>), String> {
        let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let matches = Cli::command().get_matches_from(&args);
        let Some(("serve", serve)) = matches.subcommand() else {
            return Ok((
                Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()),
                None,
            ));
        };
        let given = explicitly_given(&matches, serve);
        let mut env = std::collections::BTreeMap::new();
        let names = reference_env::VARIABLES
            .iter()
            .chain(&reference_env::OTEL_ENDPOINTS);
        for &name in names {
            if let Some(value) = std::env::var_os(name) {
                let value = value
                    .into_string()
                    .map_err(|_| format!("{name}: not valid UTF-8"))?;
                env.insert(name.to_owned(), value);
            }
        }
        let mapping = reference_env::map(&env, &given);
        if !mapping.errors.is_empty() {
            let errors: Vec<String> = mapping.errors.iter().map(|e| format!("  {e}")).collect();
            return Err(format!(
                "the reference service's environment asks for what ratekeeper does not do, \
                 not starting:\n{}",
                errors.join("\n")
            ));
        }
        args.extend(mapping.args().map(Into::into));
        let cli = Cli::try_parse_from(args).map_err(|error| {
            // clap's own text would show the value, which may hold a Redis password.
            let source = std::error::Error::source(&error)
                .map_or_else(|| error.kind().to_string(), ToString::to_string);
            let vars: Vec<&str> = mapping
                .flags
                .iter()
                .flat_map(|flag| flag.from.clone())
                .collect();
            format!(
                "the reference service's environment ({}) gave an invalid value: {source}",
                vars.join(", ")
            )
        })?;
        Ok((cli, Some(mapping)))
    }

    /// Where spans go, if tracing is on.
    pub fn otlp(&self) -> Option<crate::telemetry::OtlpOptions> {
        self.otlp_endpoint
            .as_ref()
            .map(|endpoint| crate::telemetry::OtlpOptions {
                endpoint: endpoint.clone(),
                service_name: self.otlp_service_name.clone(),
            })
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve Envoy's RateLimitService over gRPC, plus the HTTP endpoints.
    Serve(Box<ServeArgs>),
    /// Load and check a limits file or directory exactly as `serve` would.
    Validate(ValidateArgs),
    /// Ask a running ratekeeper what a request would meet (the matched limits, the
    /// counters' state, where they live), without consuming anything.
    Explain(ExplainArgs),
    /// Add the ratekeeper sidecar to the pod templates of Kubernetes YAML (a file or stdin),
    /// written to stdout; `--uninject` removes it.
    Inject(Box<crate::inject::InjectArgs>),
    /// Serve the mutating admission webhook that injects the sidecar into new pods.
    Webhook(Box<crate::inject::WebhookArgs>),
}

#[derive(Args)]
pub struct ExplainArgs {
    /// The request's domain.
    #[arg(long)]
    pub domain: String,
    /// One descriptor: comma-separated key=value entries, percent-decoded (`%2C` for a
    /// comma). Repeat for several descriptors.
    #[arg(long = "descriptor", required = true)]
    pub descriptors: Vec<String>,
    /// Hits per descriptor (the request's hits_addend) [default: 1].
    #[arg(long)]
    pub hits: Option<u32>,
    /// The admin listener (`serve --admin-addr`) of the ratekeeper to ask.
    #[arg(
        long,
        env = "RATEKEEPER_EXPLAIN_ADDR",
        default_value = "http://127.0.0.1:6070"
    )]
    pub addr: String,
    /// A file holding the admin listener's bearer token (the same file as `serve
    /// --admin-token-file`), sent as `Authorization: Bearer`.
    #[arg(long, env = "RATEKEEPER_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
}

impl ExplainArgs {
    pub fn request(&self) -> ExplainRequest {
        ExplainRequest {
            addr: self.addr.clone(),
            domain: self.domain.clone(),
            descriptors: self.descriptors.clone(),
            hits: self.hits,
            token_file: self.admin_token_file.clone(),
        }
    }
}

#[derive(Args)]
pub struct ValidateArgs {
    pub path: PathBuf,
    /// Merge files that name the same domain, as `serve --merge-domain-config` does.
    #[arg(long, env = "RATEKEEPER_MERGE_DOMAIN_CONFIG")]
    pub merge_domain_config: bool,
    /// Check the limits against what this store can count (`--store` of `serve`).
    #[arg(long, env = "RATEKEEPER_STORE", value_parser = store, default_value = "memory")]
    pub store: StoreArg,
}

impl ValidateArgs {
    /// Loads the limits as `serve` would; prints `read FILE` per file and a summary, or
    /// every error (to stderr). Success when they load.
    pub fn run(&self) -> ExitCode {
        let options = LoadOptions {
            merge_domains: self.merge_domain_config,
            store: self.store.capabilities(),
        };
        match Limits::load_with_sources(&self.path, options) {
            Ok((limits, sources)) => {
                for source in &sources {
                    println!("read {}", source.name);
                }
                let domains: Vec<&str> = limits.domains().map(|domain| domain.name()).collect();
                println!(
                    "{}: ok, {} domains ({}), {} limits",
                    self.path.display(),
                    domains.len(),
                    domains.join(", "),
                    limits.limit_count()
                );
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::FAILURE
            }
        }
    }
}

/// `--store`: where counters live.
#[derive(Clone, Debug)]
pub enum StoreArg {
    /// In this process's memory (with `--peers`: spread over the cluster).
    Memory,
    Redis(Box<Target>),
}

impl StoreArg {
    /// What limits the store can count.
    pub fn capabilities(&self) -> Capabilities {
        match self {
            StoreArg::Memory => Capabilities::MEMORY,
            StoreArg::Redis(_) => redis::CAPABILITIES,
        }
    }
}

/// `--store-failure` values.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FailureArg {
    /// Admit requests while Redis cannot answer (fail open).
    Allow,
    /// Refuse them (over limit, retry after the cooldown).
    Deny,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Limits: a YAML file, or a directory of *.yaml / *.yml files (with --config-source
    /// file).
    #[arg(long, env = "RATEKEEPER_CONFIG", default_value = "config/")]
    pub config: PathBuf,
    /// Where the limits come from: `file` (--config, watched and reloaded) or `xds` (an
    /// xDS management server, --xds-server; no limits until its first valid response).
    #[arg(long, env = "RATEKEEPER_CONFIG_SOURCE", value_enum, default_value_t = ConfigSource::File)]
    pub config_source: ConfigSource,
    /// The xDS management server (`http://host:port`, or `host:port`), with
    /// --config-source xds.
    #[arg(
        long,
        env = "RATEKEEPER_XDS_SERVER",
        required_if_eq("config_source", "xds")
    )]
    pub xds_server: Option<String>,
    /// The node id in xDS requests (the management server keys its snapshots by it).
    #[arg(long, env = "RATEKEEPER_XDS_NODE_ID", default_value = "default")]
    pub xds_node_id: String,
    /// Node metadata in xDS requests: `key=value` (or `key:value`) pairs, comma-separated
    /// or repeated.
    #[arg(long, env = "RATEKEEPER_XDS_NODE_METADATA", value_delimiter = ',', value_parser = pair)]
    pub xds_node_metadata: Vec<(String, String)>,
    /// Extra gRPC metadata on the xDS stream (an auth token, say): `name=value` (or
    /// `name:value`) pairs, comma-separated or repeated.
    #[arg(long, env = "RATEKEEPER_XDS_HEADERS", value_delimiter = ',', value_parser = grpc_header)]
    pub xds_header: Vec<(String, String)>,
    /// The first delay before reconnecting to the xDS server; it doubles per failed
    /// attempt (with jitter) up to --xds-backoff-max.
    #[arg(long, env = "RATEKEEPER_XDS_BACKOFF_INITIAL", value_parser = duration, default_value = "1s")]
    pub xds_backoff_initial: Duration,
    #[arg(long, env = "RATEKEEPER_XDS_BACKOFF_MAX", value_parser = duration, default_value = "60s")]
    pub xds_backoff_max: Duration,
    /// Merge files that name the same domain into one domain (else a duplicate domain is
    /// an error); a top-level descriptor defined in two of them is an error.
    #[arg(long, env = "RATEKEEPER_MERGE_DOMAIN_CONFIG")]
    pub merge_domain_config: bool,
    #[arg(long, env = "RATEKEEPER_GRPC_ADDR", default_value = DEFAULT_GRPC_ADDR)]
    pub grpc_addr: SocketAddr,
    /// Serve gRPC on this Unix domain socket instead of --grpc-addr (a stale socket file
    /// from an earlier run is replaced; the file is removed at exit).
    #[arg(long, env = "RATEKEEPER_GRPC_UDS")]
    pub grpc_uds: Option<PathBuf>,
    /// TLS on the gRPC listener: the server's certificate chain (PEM), reloaded when it changes.
    #[arg(long, env = "RATEKEEPER_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --grpc-tls-cert.
    #[arg(long, env = "RATEKEEPER_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// mTLS: require client certificates signed by a CA in this PEM file.
    #[arg(
        long,
        env = "RATEKEEPER_GRPC_TLS_CLIENT_CA",
        requires = "grpc_tls_cert"
    )]
    pub grpc_tls_client_ca: Option<PathBuf>,
    /// mTLS: the client certificate must also be valid for this DNS name.
    #[arg(
        long,
        env = "RATEKEEPER_GRPC_TLS_CLIENT_SAN",
        requires = "grpc_tls_client_ca"
    )]
    pub grpc_tls_client_san: Option<String>,
    /// Health, metrics and the check front ends (/json, /rate, /nginx); the operator
    /// endpoints answer 403 here, naming --admin-addr.
    #[arg(long, env = "RATEKEEPER_HTTP_ADDR", default_value = DEFAULT_HTTP_ADDR)]
    pub http_addr: SocketAddr,
    /// The admin listener: /counters, /debug/explain and the dashboard (/ui). A non-loopback
    /// address needs --admin-token-file.
    #[arg(long, env = "RATEKEEPER_ADMIN_ADDR", default_value = crate::server::DEFAULT_ADMIN_ADDR)]
    pub admin_addr: SocketAddr,
    /// Every request to the admin listener must send `Authorization: Bearer <token>`, the
    /// token being this file's content (surrounding whitespace ignored); re-read every
    /// second, so a rotated Secret takes effect without a restart.
    #[arg(long, env = "RATEKEEPER_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Shards that own the counters [default: the number of cores].
    #[arg(long, env = "RATEKEEPER_SHARDS", value_parser = clap::value_parser!(u16).range(1..))]
    pub shards: Option<u16>,
    /// Live keys kept at most, across all shards.
    #[arg(long, env = "RATEKEEPER_MAX_KEYS", default_value_t = EngineConfig::default().max_keys)]
    pub max_keys: usize,
    /// The share of --max-keys one rule (one limit of the limits files) may hold when it
    /// sets no `max_keys` of its own: from 0.001 to 1. A flood of new values on one rule
    /// then leaves the rest of the table to the others.
    #[arg(long, env = "RATEKEEPER_RULE_KEY_SHARE", default_value_t = EngineConfig::default().rule_key_share, value_parser = share)]
    pub rule_key_share: f64,
    /// Add rate limit headers to gRPC and /json responses: alone (or `true`), draft-03's
    /// RateLimit-Limit, -Remaining and -Reset; `ietf`, the current IETF draft's
    /// RateLimit-Policy and RateLimit on every front end instead; `false`, none.
    #[arg(
        long,
        env = "RATEKEEPER_RESPONSE_HEADERS",
        value_name = "STYLE",
        num_args = 0..=1,
        default_missing_value = "true",
        default_value = "false",
        value_parser = response_headers
    )]
    pub response_headers: ResponseHeaders,
    /// Name of the header carrying the limit (with --response-headers, and on HTTP answers).
    #[arg(long, env = "RATEKEEPER_HEADER_LIMIT", value_parser = header_name, default_value = "RateLimit-Limit")]
    pub header_limit: String,
    /// Name of the header carrying the hits remaining.
    #[arg(long, env = "RATEKEEPER_HEADER_REMAINING", value_parser = header_name, default_value = "RateLimit-Remaining")]
    pub header_remaining: String,
    /// Name of the header carrying the seconds until the limit resets.
    #[arg(long, env = "RATEKEEPER_HEADER_RESET", value_parser = header_name, default_value = "RateLimit-Reset")]
    pub header_reset: String,
    /// Start even when the limits do not load (invalid, or no file yet), with no limits,
    /// and pick up the first valid files when they appear.
    #[arg(long, env = "RATEKEEPER_START_WITHOUT_CONFIG")]
    pub start_without_config: bool,
    /// Report unhealthy (/healthcheck 503, gRPC health NOT_SERVING) until limits with at
    /// least one domain are loaded.
    #[arg(long, env = "RATEKEEPER_HEALTHY_ONLY_WITH_CONFIG")]
    pub healthy_only_with_config: bool,
    /// Treat every limit as shadow mode: count and report, never reject.
    #[arg(long, env = "RATEKEEPER_SHADOW_MODE")]
    pub shadow_mode: bool,
    /// Treat every limit as quota mode: a descriptor over its limit lets the request pass
    /// (reported in the dynamic metadata) unless every quota-mode descriptor is over.
    #[arg(long, env = "RATEKEEPER_QUOTA_MODE")]
    pub quota_mode: bool,
    /// Count rejected hits too, as the reference service does by default (its
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false): a rejected request takes what is left
    /// of each of its limits, up to its cost, so they end exhausted. By default a rejected
    /// request consumes nothing. No request waits for room (max_wait) with this on.
    #[arg(long, env = "RATEKEEPER_COUNT_REJECTED_HITS")]
    pub count_rejected_hits: bool,
    /// Return what was decided in the gRPC response's dynamic metadata (domain, descriptors,
    /// quota-mode violations, the matched entries' `metadata`).
    #[arg(long, env = "RATEKEEPER_RESPONSE_DYNAMIC_METADATA")]
    pub response_dynamic_metadata: bool,
    /// Also re-read the limits this often (e.g. `30s`), for filesystems without change events.
    #[arg(long, env = "RATEKEEPER_RELOAD_INTERVAL", value_parser = duration)]
    pub reload_interval: Option<Duration>,
    /// How long shutdown waits for in-flight requests.
    #[arg(long, env = "RATEKEEPER_SHUTDOWN_GRACE", value_parser = duration, default_value = "15s")]
    pub shutdown_grace: Duration,
    /// A hit is counted as near the limit when at least this share of it is used.
    #[arg(long, env = "RATEKEEPER_NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    pub near_limit_ratio: f64,
    /// Cluster mode: this node's peer address as the other nodes reach it (POD_IP:8091).
    /// Defaults to the bound --peer-addr when that is a specific address.
    #[arg(long, env = "RATEKEEPER_ADVERTISE")]
    pub advertise: Option<String>,
    /// Cluster mode: peer addresses to join (comma-separated).
    #[arg(long, env = "RATEKEEPER_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Cluster mode: a name:port resolving to the peers (a Kubernetes headless Service),
    /// re-resolved every few seconds.
    #[arg(long, env = "RATEKEEPER_PEER_DNS")]
    pub peer_dns: Option<String>,
    /// Cluster mode: where peers reach this node [default: 0.0.0.0:8091].
    #[arg(long, env = "RATEKEEPER_PEER_ADDR")]
    pub peer_addr: Option<SocketAddr>,
    /// Deadline of a forward to a key's owner that is alive but slow (a silent or dead one
    /// is given up sooner); only after it does the --peer-fallback policy decide.
    #[arg(long, env = "RATEKEEPER_PEER_TIMEOUT", value_parser = duration, default_value = "1s")]
    pub peer_timeout: Duration,
    /// Forwarded request groups per batch at most.
    #[arg(long, env = "RATEKEEPER_PEER_BATCH_SIZE", default_value_t = 128)]
    pub peer_batch_size: usize,
    /// How long a forward batch may wait to fill up at most.
    #[arg(long, env = "RATEKEEPER_PEER_BATCH_WINDOW", value_parser = duration, default_value = "200us")]
    pub peer_batch_window: Duration,
    /// The failure detector: how often every peer is pinged (and each ping's deadline).
    #[arg(long, env = "RATEKEEPER_PEER_PING_INTERVAL", value_parser = duration, default_value = "500ms")]
    pub peer_ping_interval: Duration,
    /// Missed pings in a row before a peer is taken off this node's ring.
    #[arg(long, env = "RATEKEEPER_PEER_DOWN_AFTER", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub peer_down_after: u32,
    /// Answered pings in a row before a peer that was down is back on the ring.
    #[arg(long, env = "RATEKEEPER_PEER_UP_AFTER", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub peer_up_after: u32,
    /// What to do when a key's owner cannot answer.
    #[arg(long, env = "RATEKEEPER_PEER_FALLBACK", value_enum, default_value_t = FallbackArg::Local)]
    pub peer_fallback: FallbackArg,
    /// Mutual TLS between peers: this node's certificate chain (PEM), presented on the peer
    /// listener and when dialling peers; valid for its --advertise host (IP or DNS SAN).
    /// Reloaded when it changes.
    #[arg(
        long,
        env = "RATEKEEPER_PEER_TLS_CERT",
        requires_all = ["peer_tls_key", "peer_tls_ca"]
    )]
    pub peer_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --peer-tls-cert.
    #[arg(long, env = "RATEKEEPER_PEER_TLS_KEY", requires = "peer_tls_cert")]
    pub peer_tls_key: Option<PathBuf>,
    /// The CA (PEM) that signed every peer's certificate: both sides of a peer connection
    /// must present one it signed.
    #[arg(long, env = "RATEKEEPER_PEER_TLS_CA", requires = "peer_tls_cert")]
    pub peer_tls_ca: Option<PathBuf>,
    /// One certificate shared by all nodes: check every peer's certificate for this DNS name
    /// instead of its --advertise host (any holder then speaks for every node).
    #[arg(long, env = "RATEKEEPER_PEER_TLS_NAME", requires = "peer_tls_cert")]
    pub peer_tls_name: Option<String>,
    /// Serve the peer listener without mutual TLS on a non-loopback address: anything that
    /// reaches it can change the membership, hand over and reset counters.
    #[arg(
        long,
        env = "RATEKEEPER_PEER_INSECURE",
        conflicts_with = "peer_tls_cert"
    )]
    pub peer_insecure: bool,
    /// Keep the descriptor values of up to this many live counters, so
    /// GET /counters/{domain} can list them (0: keep none, the endpoint answers 404).
    #[arg(long, env = "RATEKEEPER_COUNTER_NAMES", default_value_t = 0)]
    pub counter_names: usize,
    /// Serve GET and DELETE /counters/{domain} (listing and resetting counters) on the
    /// admin listener; `--admin-counters=false` answers 404 there.
    #[arg(long, env = "RATEKEEPER_ADMIN_COUNTERS", default_value_t = true, action = clap::ArgAction::Set)]
    pub admin_counters: bool,
    /// Serve the dashboard (GET /ui and /ui/data) on the admin listener.
    #[arg(long, env = "RATEKEEPER_ADMIN_UI", default_value_t = true, action = clap::ArgAction::Set)]
    pub admin_ui: bool,
    /// Most per-limit metric series (label sets).
    #[arg(long, env = "RATEKEEPER_METRICS_MAX_SERIES", default_value_t = 10_000)]
    pub metrics_max_series: usize,
    /// RLQS: a bucket a stream reported no traffic for this long is abandoned (Envoy drops
    /// it until its next request).
    #[arg(long, env = "RATEKEEPER_RLQS_ABANDON_AFTER", value_parser = duration, default_value = "60s")]
    pub rlqs_abandon_after: Duration,
    /// RLQS: most streams open on this node.
    #[arg(long, env = "RATEKEEPER_RLQS_MAX_STREAMS", default_value_t = 1024)]
    pub rlqs_max_streams: usize,
    /// RLQS: most buckets one stream may report.
    #[arg(
        long,
        env = "RATEKEEPER_RLQS_MAX_BUCKETS_PER_STREAM",
        default_value_t = 10_000
    )]
    pub rlqs_max_buckets_per_stream: usize,
    /// RLQS: most buckets on this node, all streams together.
    #[arg(long, env = "RATEKEEPER_RLQS_MAX_BUCKETS", default_value_t = 100_000)]
    pub rlqs_max_buckets: usize,
    /// RLQS: how long Envoy keeps enforcing an assignment without hearing from ratekeeper
    /// (whole seconds, 6s to 1h) before its `expired_assignment_behavior`. Each report (every
    /// 5 s) renews it; the default outlasts two lost reports.
    #[arg(long, env = "RATEKEEPER_RLQS_ASSIGNMENT_TTL", value_parser = rlqs_assignment_ttl, default_value = "15s")]
    pub rlqs_assignment_ttl: Duration,
    /// RLQS in cluster mode: how often each node sends its buckets' demand to their owners
    /// (1s to 15s); an owner forgets a node not heard from for two intervals. Shorter:
    /// shares follow demand and a dead node's share returns sooner, for more peer calls.
    #[arg(long, env = "RATEKEEPER_RLQS_EXCHANGE_EVERY", value_parser = rlqs_exchange_every, default_value = "5s")]
    pub rlqs_exchange_every: Duration,
    /// RLQS: the largest report, in bytes.
    #[arg(long, env = "RATEKEEPER_RLQS_MAX_MESSAGE_BYTES", default_value_t = 1 << 20)]
    pub rlqs_max_message_bytes: usize,
    /// Where counters live: `memory` (this process; with --peers, the cluster), or Redis:
    /// `redis://[USER:PASSWORD@]HOST:PORT[/DB]`, `rediss://...` (TLS),
    /// `redis-sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT]/MASTER[/DB]`,
    /// `redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT]`.
    #[arg(long, env = "RATEKEEPER_STORE", value_parser = store, default_value = "memory")]
    pub store: StoreArg,
    /// Deadline of one Redis call, connecting included.
    #[arg(long, env = "RATEKEEPER_STORE_TIMEOUT", value_parser = duration, default_value = "100ms")]
    pub store_timeout: Duration,
    /// What to answer while Redis cannot: allow (fail open) or deny.
    #[arg(long, env = "RATEKEEPER_STORE_FAILURE", value_enum, default_value_t = FailureArg::Allow)]
    pub store_failure: FailureArg,
    /// How long the Redis circuit breaker stays open before one call probes again.
    #[arg(long, env = "RATEKEEPER_STORE_COOLDOWN", value_parser = duration, default_value = "1s")]
    pub store_cooldown: Duration,
    /// Connections to one Redis server; concurrent requests are pipelined on them.
    #[arg(long, env = "RATEKEEPER_STORE_POOL", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub store_pool: u16,
    /// Over-limit descriptors remembered to spare Redis calls (0: off).
    #[arg(long, env = "RATEKEEPER_STORE_BLOCKED_KEYS", default_value_t = 100_000)]
    pub store_blocked_keys: usize,
    /// How long a Redis key outlives its window (1s to 1h). Longer: fewer keys expire and
    /// are made again, which spares Redis's expiry stalls, for more keys held.
    #[arg(long, env = "RATEKEEPER_STORE_TTL_MARGIN", value_parser = ttl_margin, default_value = "1s")]
    pub store_ttl_margin: Duration,
}

/// `--response-headers` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseHeaders {
    /// No headers on gRPC and /json (nginx and /rate send draft-03's).
    Off,
    /// draft-03's `RateLimit-Limit`, `-Remaining`, `-Reset`.
    Draft03,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit`, on every front end.
    Ietf,
}

/// Parses `--response-headers` (and its env variable): booleans as before (any usual
/// spelling), `draft03`, or `ietf`.
fn response_headers(text: &str) -> Result<ResponseHeaders, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "false" | "f" | "no" | "n" | "off" | "0" => Ok(ResponseHeaders::Off),
        "true" | "t" | "yes" | "y" | "on" | "1" | "draft03" | "draft-03" => {
            Ok(ResponseHeaders::Draft03)
        }
        "ietf" => Ok(ResponseHeaders::Ietf),
        _ => Err(format!(
            "{text:?} is not a header style (expected ietf, draft03, true or false)"
        )),
    }
}

/// `--config-source` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ConfigSource {
    /// The files under --config.
    File,
    /// An xDS management server (--xds-server), state of the world.
    Xds,
}

/// `--peer-fallback` values.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FallbackArg {
    /// Decide on this node's own counter (handed to the owner when it is back).
    Local,
    Allow,
    Deny,
}

impl ServeArgs {
    /// How the limits files become limits, at start and on every reload.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            merge_domains: self.merge_domain_config,
            store: self.store.capabilities(),
        }
    }

    /// The limits to start with: the files' (see `reload::load_at_start`), or none for
    /// xDS, which brings them once the server answers.
    pub fn initial_limits(&self) -> Result<(Limits, u64), ConfigErrors> {
        match self.config_source {
            ConfigSource::File => reloader::load_at_start(
                &self.config,
                self.load_options(),
                self.start_without_config,
            ),
            ConfigSource::Xds => Ok((Limits::default(), 0)),
        }
    }

    /// The xDS subscription, with --config-source xds.
    fn xds_options(&self) -> Option<XdsOptions> {
        if self.config_source != ConfigSource::Xds {
            return None;
        }
        // clap requires --xds-server with --config-source xds.
        let server = self.xds_server.clone().unwrap_or_default();
        Some(XdsOptions {
            node_id: self.xds_node_id.clone(),
            node_metadata: self.xds_node_metadata.clone(),
            headers: self.xds_header.clone(),
            backoff_initial: self.xds_backoff_initial,
            backoff_max: self.xds_backoff_max.max(self.xds_backoff_initial),
            load: self.load_options(),
            ..XdsOptions::new(server)
        })
    }

    /// Whether any cluster flag was given.
    pub fn cluster_mode(&self) -> bool {
        self.advertise.is_some()
            || !self.peers.is_empty()
            || self.peer_dns.is_some()
            || self.peer_addr.is_some()
    }

    fn cluster_options(&self) -> Option<(SocketAddr, ClusterOptions)> {
        if !self.cluster_mode() {
            return None;
        }
        let peer_addr = self
            .peer_addr
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8091)));
        let mut options = ClusterOptions::new(self.advertise.clone().unwrap_or_default());
        options.peers = self.peers.clone();
        options.peer_dns = self.peer_dns.clone();
        options.timeout = self.peer_timeout;
        options.batch_size = self.peer_batch_size;
        options.batch_window = self.peer_batch_window;
        options.ping_interval = self.peer_ping_interval;
        options.down_after = self.peer_down_after;
        options.up_after = self.peer_up_after;
        options.tls = self
            .peer_tls_cert
            .clone()
            .zip(self.peer_tls_key.clone())
            .map(|(cert, key)| TlsOptions {
                cert,
                key,
                client_ca: self.peer_tls_ca.clone(),
                client_san: self.peer_tls_name.clone(),
            });
        options.insecure = self.peer_insecure;
        options.fallback = match self.peer_fallback {
            FallbackArg::Local => Fallback::Local,
            FallbackArg::Allow => Fallback::Policy(FailurePolicy::Allow),
            FallbackArg::Deny => Fallback::Policy(FailurePolicy::Deny),
        };
        Some((peer_addr, options))
    }

    /// TLS on the gRPC listener, when a certificate is given (clap makes sure of the key).
    fn tls_options(&self) -> Option<TlsOptions> {
        let (cert, key) = self.grpc_tls_cert.clone().zip(self.grpc_tls_key.clone())?;
        Some(TlsOptions {
            cert,
            key,
            client_ca: self.grpc_tls_client_ca.clone(),
            client_san: self.grpc_tls_client_san.clone(),
        })
    }

    /// The server options these flags ask for.
    pub fn server_options(&self) -> ServerOptions {
        let mut engine = EngineConfig {
            max_keys: self.max_keys,
            rule_key_share: self.rule_key_share,
            ..EngineConfig::default()
        };
        if let Some(shards) = self.shards {
            engine.shards = usize::from(shards);
        }
        ServerOptions {
            store: match &self.store {
                StoreArg::Memory => None,
                StoreArg::Redis(target) => Some(RedisOptions {
                    timeout: self.store_timeout,
                    pool: usize::from(self.store_pool),
                    failure: match self.store_failure {
                        FailureArg::Allow => FailurePolicy::Allow,
                        FailureArg::Deny => FailurePolicy::Deny,
                    },
                    cooldown: self.store_cooldown,
                    blocked_keys: self.store_blocked_keys,
                    ttl_margin: self.store_ttl_margin,
                    ..RedisOptions::new(Target::clone(target))
                }),
            },
            engine,
            limiter: LimiterOptions {
                response_headers: self.response_headers != ResponseHeaders::Off,
                header_style: match self.response_headers {
                    ResponseHeaders::Ietf => HeaderStyle::Ietf,
                    ResponseHeaders::Off | ResponseHeaders::Draft03 => HeaderStyle::Draft03,
                },
                shadow_mode: self.shadow_mode,
                quota_mode: self.quota_mode,
                count_rejected_hits: self.count_rejected_hits,
                response_dynamic_metadata: self.response_dynamic_metadata,
                header_names: HeaderNames {
                    limit: self.header_limit.as_str().into(),
                    remaining: self.header_remaining.as_str().into(),
                    reset: self.header_reset.as_str().into(),
                },
            },
            metrics: MetricsOptions {
                near_limit_ratio: self.near_limit_ratio,
                max_series: self.metrics_max_series,
            },
            watch: (self.config_source == ConfigSource::File).then(|| self.config.clone()),
            xds: self.xds_options(),
            reload: ReloadOptions {
                recheck_every: self.reload_interval,
                load: self.load_options(),
                ..ReloadOptions::default()
            },
            shutdown_grace: self.shutdown_grace,
            healthy_only_with_config: self.healthy_only_with_config,
            admin: AdminOptions {
                counters: self.admin_counters,
                ui: self.admin_ui,
                counter_names: self.counter_names,
            },
            cluster: self.cluster_options(),
            grpc_uds: self.grpc_uds.clone(),
            grpc_tls: self.tls_options(),
            admin_addr: self.admin_addr,
            admin_token: self.admin_token_file.clone(),
            rlqs: {
                let defaults = RlqsOptions::default();
                RlqsOptions {
                    hub: HubOptions {
                        max_streams: self.rlqs_max_streams,
                        max_buckets_per_stream: self.rlqs_max_buckets_per_stream,
                        max_buckets: self.rlqs_max_buckets,
                        abandon_after: self.rlqs_abandon_after,
                        ..defaults.hub
                    },
                    max_message_bytes: self.rlqs_max_message_bytes,
                    exchange_every: self.rlqs_exchange_every,
                    assignment_ttl: self.rlqs_assignment_ttl,
                    ..defaults
                }
            },
            ..ServerOptions::new(self.grpc_addr, self.http_addr)
        }
    }
}

/// The ids of the arguments given on the command line or by their environment variable
/// (not defaulted), `serve`'s and the global ones.
fn explicitly_given<'a>(top: &'a ArgMatches, serve: &'a ArgMatches) -> BTreeSet<&'a str> {
    [top, serve]
        .into_iter()
        .flat_map(|matches| {
            matches.ids().filter(|id| {
                matches!(
                    matches.value_source(id.as_str()),
                    Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                )
            })
        })
        .map(|id| id.as_str())
        .collect()
}

/// `--rule-key-share`: a fraction of the key cap, from 0.001 to 1.
fn share(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(share) if (0.001..=1.0).contains(&share) => Ok(share),
        _ => Err(format!(
            "expected a share from 0.001 to 1 (0.5 is half of --max-keys), got {text:?}"
        )),
    }
}

fn store(text: &str) -> Result<StoreArg, String> {
    match text {
        "memory" => Ok(StoreArg::Memory),
        _ => Target::parse(text).map(|target| StoreArg::Redis(Box::new(target))),
    }
}

/// `key=value` or `key:value` (split at the first `=`, else the first `:`).
fn pair(text: &str) -> Result<(String, String), String> {
    let split = text.find('=').or_else(|| text.find(':'));
    match split {
        Some(at) if at > 0 => Ok((
            text[..at].trim().to_owned(),
            text[at + 1..].trim().to_owned(),
        )),
        _ => Err(format!("{text:?} is not a key=value pair")),
    }
}

/// A [`pair`] that is valid gRPC metadata (a lowercase ASCII name, a visible ASCII value).
fn grpc_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = pair(text)?;
    let name = name.to_ascii_lowercase();
    tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a valid gRPC metadata name"))?;
    tonic::metadata::MetadataValue::try_from(value.as_str())
        .map_err(|_| format!("the value of {name:?} is not valid gRPC metadata"))?;
    Ok((name, value))
}

fn header_name(text: &str) -> Result<String, String> {
    HeaderNames::check(text).map(|()| text.to_owned())
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).ok_or_else(|| format!("{text:?} is not a duration like 500ms or 30s"))
}

/// `--store-ttl-margin`: a duration within [`crate::store::redis::TTL_MARGINS`].
fn ttl_margin(text: &str) -> Result<Duration, String> {
    duration_within(text, crate::store::redis::TTL_MARGINS)
}

/// `--rlqs-exchange-every`: a duration within
/// [`crate::envoy::rlqs::cluster::EXCHANGE_INTERVALS`].
fn rlqs_exchange_every(text: &str) -> Result<Duration, String> {
    duration_within(text, crate::envoy::rlqs::cluster::EXCHANGE_INTERVALS)
}

/// `--rlqs-assignment-ttl`: whole seconds (all Envoy reads) within
/// [`crate::envoy::rlqs::ASSIGNMENT_TTLS`].
fn rlqs_assignment_ttl(text: &str) -> Result<Duration, String> {
    let ttl = duration_within(text, crate::envoy::rlqs::ASSIGNMENT_TTLS)?;
    if ttl.subsec_nanos() != 0 {
        return Err(format!(
            "{text:?} is not whole seconds (Envoy reads only the seconds)"
        ));
    }
    Ok(ttl)
}

fn duration_within(text: &str, range: RangeInclusive<Duration>) -> Result<Duration, String> {
    let value = duration(text)?;
    if !range.contains(&value) {
        return Err(format!(
            "{text:?} is outside {:?} to {:?}",
            range.start(),
            range.end()
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Command};

    fn limiter_options(args: &[&str]) -> crate::limiter::LimiterOptions {
        let cli = Cli::try_parse_from(args).expect("valid flags");
        let Command::Serve(serve) = cli.command else {
            panic!("serve expected");
        };
        serve.server_options().limiter
    }

    #[test]
    fn the_redis_ttl_margin_is_taken_within_its_range_and_refused_outside_it() {
        let margin = |value: &str| {
            let cli = Cli::try_parse_from([
                "ratekeeper",
                "serve",
                "--store",
                "redis://127.0.0.1:6379",
                "--store-ttl-margin",
                value,
            ]);
            cli.map(|cli| match cli.command {
                Command::Serve(serve) => serve.server_options().store.map(|redis| redis.ttl_margin),
                _ => None,
            })
        };
        assert_eq!(
            margin("30s").expect("valid"),
            Some(std::time::Duration::from_secs(30))
        );
        for bad in ["500ms", "2h", "soon"] {
            let error = margin(bad).expect_err("refused").to_string();
            assert!(error.contains("--store-ttl-margin"), "{error}");
        }
    }

    /// `serve`'s RLQS duration `read` from its defaults and `args`.
    fn rlqs_duration(
        args: &[&str],
        read: fn(&crate::envoy::rlqs::RlqsOptions) -> std::time::Duration,
    ) -> Result<std::time::Duration, clap::Error> {
        let cli = Cli::try_parse_from([&["ratekeeper", "serve"], args].concat())?;
        match cli.command {
            Command::Serve(serve) => Ok(read(&serve.server_options().rlqs)),
            _ => panic!("serve expected"),
        }
    }

    /// One RLQS duration flag: its default, a value taken, values refused.
    struct DurationFlag {
        flag: &'static str,
        read: fn(&crate::envoy::rlqs::RlqsOptions) -> std::time::Duration,
        default_secs: u64,
        good: (&'static str, u64),
        bad: &'static [&'static str],
    }

    #[test]
    fn the_rlqs_durations_have_their_defaults_and_refuse_what_envoy_could_not_use() {
        let flags = [
            // Envoy's report interval; past three reports shares follow demand too slowly.
            DurationFlag {
                flag: "--rlqs-exchange-every",
                read: |rlqs| rlqs.exchange_every,
                default_secs: 5,
                good: ("1s", 1),
                bad: &["500ms", "16s", "often"],
            },
            // Envoy reads whole seconds; one report interval or less would expire between
            // reports.
            DurationFlag {
                flag: "--rlqs-assignment-ttl",
                read: |rlqs| rlqs.assignment_ttl,
                default_secs: 15,
                good: ("8s", 8),
                bad: &["5s", "8500ms", "2h", "long"],
            },
        ];
        let secs = std::time::Duration::from_secs;
        for DurationFlag {
            flag,
            read,
            default_secs,
            good,
            bad,
        } in flags
        {
            let default = rlqs_duration(&[], read).expect("valid");
            assert_eq!(default, secs(default_secs), "{flag}");
            let given = rlqs_duration(&[flag, good.0], read).expect("valid");
            assert_eq!(given, secs(good.1), "{flag}");
            for value in bad {
                let error = rlqs_duration(&[flag, value], read)
                    .expect_err("refused")
                    .to_string();
                assert!(error.contains(flag), "{flag} {value}: {error}");
            }
        }
    }

    #[test]
    fn quota_mode_and_dynamic_metadata_are_off_unless_asked_for() {
        let plain = limiter_options(&["ratekeeper", "serve"]);
        assert!(!plain.quota_mode && !plain.response_dynamic_metadata);
        let both = limiter_options(&[
            "ratekeeper",
            "serve",
            "--quota-mode",
            "--response-dynamic-metadata",
        ]);
        assert!(both.quota_mode && both.response_dynamic_metadata);
        assert!(!both.shadow_mode && !both.response_headers);
    }
}
