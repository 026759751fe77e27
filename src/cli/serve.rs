//! `ratekeeper serve`'s flags, in sections: each group of flags is a struct with its own
//! help heading, flattened into [`ServeArgs`], and [`ServeArgs::server_options`] maps them
//! onto the library's options. Flag names, environment variables and defaults are the
//! contract with operators (and with the reference service's environment, which
//! `reference_env` turns into these flags): a group may move a flag, never rename it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{
    ConfigSource, DEFAULT_GRPC_ADDR, DEFAULT_HTTP_ADDR, FailureArg, FallbackArg, ResponseHeaders,
    StoreArg, duration, grpc_header, header_name, pair, response_headers, rlqs_assignment_ttl,
    rlqs_exchange_every, share, store, ttl_margin,
};
use crate::admin::AdminOptions;
use crate::cluster::{ClusterOptions, Fallback};
use crate::envoy::rlqs::RlqsOptions;
use crate::envoy::xds::{XdsOptions, XdsTlsOptions};
use crate::failure::FailurePolicy;
use crate::limiter::{HeaderNames, HeaderStyle, LimiterOptions};
use crate::limits::{ConfigErrors, Limits, LoadOptions};
use crate::metrics::MetricsOptions;
use crate::metrics::reference::prometheus::PrometheusOptions;
use crate::metrics::reference::sinks::ReferenceOptions;
use crate::metrics::reference::statsd::StatsdOptions;
use crate::quota::HubOptions;
use crate::reload::{self as reloader, ReloadOptions};
use crate::server::ServerOptions;
use crate::store::StoreOptions;
use crate::store::memory::EngineConfig;
use crate::store::redis::{RedisOptions, RedisTlsOptions, Target};
use crate::transport::tls::TlsOptions;

/// `ratekeeper serve`.
#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub listen: ListenArgs,
    #[command(flatten)]
    pub grpc_tls: GrpcTlsArgs,
    #[command(flatten)]
    pub limits: LimitsArgs,
    #[command(flatten)]
    pub xds: XdsArgs,
    #[command(flatten)]
    pub answers: AnswerArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub peer_tls: PeerTlsArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    #[command(flatten)]
    pub rlqs: RlqsArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub reference_stats: ReferenceStatsArgs,
}

// Where ratekeeper listens, and how long it drains at shutdown.
#[derive(Args)]
#[command(next_help_heading = "Listeners")]
pub struct ListenArgs {
    /// Envoy's RateLimitService (and RLQS, and gRPC health) on this TCP address.
    #[arg(long, env = "RATEKEEPER_GRPC_ADDR", default_value = DEFAULT_GRPC_ADDR)]
    pub grpc_addr: SocketAddr,
    /// Serve gRPC on this Unix domain socket instead of --grpc-addr (a stale socket file
    /// from an earlier run is replaced; the file is removed at exit).
    #[arg(long, env = "RATEKEEPER_GRPC_UDS")]
    pub grpc_uds: Option<PathBuf>,
    /// Health, metrics and the check front ends (/json, /rate, /nginx); the operator
    /// endpoints answer 403 here, naming --admin-addr.
    #[arg(long, env = "RATEKEEPER_HTTP_ADDR", default_value = DEFAULT_HTTP_ADDR)]
    pub http_addr: SocketAddr,
    /// The admin listener: /counters, /debug/explain and the dashboard (/ui). A non-loopback
    /// address needs --admin-token-file.
    #[arg(long, env = "RATEKEEPER_ADMIN_ADDR", default_value = crate::server::DEFAULT_ADMIN_ADDR)]
    pub admin_addr: SocketAddr,
    /// How long shutdown waits for in-flight requests.
    #[arg(long, env = "RATEKEEPER_SHUTDOWN_GRACE", value_parser = duration, default_value = "15s")]
    pub shutdown_grace: Duration,
    /// On SIGTERM, how long to keep serving every call while reporting not ready (and, in a
    /// cluster, keeping its keys), before closing the listeners: the time Kubernetes takes
    /// to remove the pod's endpoint everywhere. Replaces a preStop sleep (do not use both).
    #[arg(long, env = "RATEKEEPER_SHUTDOWN_DELAY", value_parser = duration, default_value = "5s")]
    pub shutdown_delay: Duration,
}

// Where the limits come from and how they load.
#[derive(Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitsArgs {
    /// Limits: a YAML file, or a directory read recursively, every file in it whatever its
    /// name ends with, names starting with `.` skipped (with --config-source file).
    #[arg(long, env = "RATEKEEPER_CONFIG", default_value = "config/")]
    pub config: PathBuf,
    /// Where the limits come from: `file` (--config, watched and reloaded) or `xds` (an
    /// xDS management server, --xds-server; no limits until its first valid response).
    #[arg(long, env = "RATEKEEPER_CONFIG_SOURCE", value_enum, default_value_t = ConfigSource::File)]
    pub config_source: ConfigSource,
    /// Merge files that name the same domain into one domain (else a duplicate domain is
    /// an error); a top-level descriptor defined in two of them is an error.
    #[arg(long, env = "RATEKEEPER_MERGE_DOMAIN_CONFIG")]
    pub merge_domain_config: bool,
    /// Also re-read the limits this often (e.g. `30s`), for filesystems without change events.
    #[arg(long, env = "RATEKEEPER_RELOAD_INTERVAL", value_parser = duration)]
    pub reload_interval: Option<Duration>,
    /// Start even when the limits do not load (invalid, or no file yet), with no limits,
    /// and pick up the first valid files when they appear.
    #[arg(long, env = "RATEKEEPER_START_WITHOUT_CONFIG")]
    pub start_without_config: bool,
    /// Report unhealthy (/healthcheck 503, gRPC health NOT_SERVING) until limits with at
    /// least one domain are loaded.
    #[arg(long, env = "RATEKEEPER_HEALTHY_ONLY_WITH_CONFIG")]
    pub healthy_only_with_config: bool,
}

// The xDS subscription.
#[derive(Args)]
#[command(next_help_heading = "Limits from xDS (--config-source xds)")]
pub struct XdsArgs {
    /// The xDS management server (`host:port`, `http://host:port`, or `https://host:port`
    /// for TLS), with --config-source xds.
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
    /// The longest delay between two attempts to reach the xDS server.
    #[arg(long, env = "RATEKEEPER_XDS_BACKOFF_MAX", value_parser = duration, default_value = "60s")]
    pub xds_backoff_max: Duration,
    /// Connect to the xDS server over TLS (an `https://` --xds-server means the same),
    /// checking its certificate against --xds-tls-ca, or the system's roots without it.
    #[arg(long, env = "RATEKEEPER_XDS_TLS")]
    pub xds_tls: bool,
    /// The CA certificates (PEM) the xDS server's certificate must chain to, instead of
    /// the system's roots; watched, a new CA is used from the next connection.
    #[arg(long, env = "RATEKEEPER_XDS_TLS_CA")]
    pub xds_tls_ca: Option<PathBuf>,
    /// The client certificate chain (PEM) to present to the xDS server (mutual TLS), with
    /// --xds-tls-key; watched, a renewed one is presented from the next connection.
    #[arg(long, env = "RATEKEEPER_XDS_TLS_CERT", requires = "xds_tls_key")]
    pub xds_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --xds-tls-cert.
    #[arg(long, env = "RATEKEEPER_XDS_TLS_KEY", requires = "xds_tls_cert")]
    pub xds_tls_key: Option<PathBuf>,
    /// The name the xDS server's certificate must be valid for (a DNS name or an IP
    /// address, also sent as SNI); default: the host of --xds-server.
    #[arg(long, env = "RATEKEEPER_XDS_TLS_SAN")]
    pub xds_tls_san: Option<String>,
}

impl XdsArgs {
    /// TLS to the xDS server: asked for by --xds-tls or an `https://` server; the other
    /// `--xds-tls-*` flags need it, and an `http://` server refuses it.
    fn tls(&self) -> Result<Option<XdsTlsOptions>, String> {
        let server = self.xds_server.as_deref().unwrap_or_default();
        let scheme = |scheme: &str| {
            server
                .get(..scheme.len())
                .is_some_and(|start| start.eq_ignore_ascii_case(scheme))
        };
        if self.xds_tls && scheme("http://") {
            return Err(format!(
                "--xds-tls with --xds-server {server}: write https:// (or host:port alone) for TLS"
            ));
        }
        if !self.xds_tls && !scheme("https://") {
            let given = [
                ("--xds-tls-ca", self.xds_tls_ca.is_some()),
                ("--xds-tls-cert", self.xds_tls_cert.is_some()),
                ("--xds-tls-san", self.xds_tls_san.is_some()),
            ];
            return match given.iter().find(|(_, given)| *given) {
                Some((flag, _)) => Err(format!(
                    "{flag} needs --xds-tls (or an https:// --xds-server): the xds server is reached in plaintext without it"
                )),
                None => Ok(None),
            };
        }
        Ok(Some(XdsTlsOptions {
            ca: self.xds_tls_ca.clone(),
            identity: self.xds_tls_cert.clone().zip(self.xds_tls_key.clone()),
            san: self.xds_tls_san.clone(),
        }))
    }
}

// What every limit does and what the answers carry.
#[derive(Args)]
#[command(next_help_heading = "Answers")]
pub struct AnswerArgs {
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
    /// Return what was decided in the gRPC response's dynamic metadata (domain, descriptors,
    /// quota-mode violations, the matched entries' `metadata`).
    #[arg(long, env = "RATEKEEPER_RESPONSE_DYNAMIC_METADATA")]
    pub response_dynamic_metadata: bool,
    /// Send each limit's unit_multiplier in gRPC answers as Envoy's pending
    /// RateLimit.unit_multiplier (field 4, envoyproxy/envoy#47307). Off until Envoy
    /// releases it: its number and type may still change, and Envoy 1.40 ignores it.
    #[arg(long, env = "RATEKEEPER_UNIT_MULTIPLIER_FIELD")]
    pub unit_multiplier_field: bool,
}

// The counters of this node (the memory store, alone or in a cluster).
#[derive(Args)]
#[command(next_help_heading = "Memory store")]
pub struct EngineArgs {
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
}

// Where counters live, and the Redis store's settings.
#[derive(Args)]
#[command(next_help_heading = "Redis store")]
pub struct StoreArgs {
    /// Where counters live: `memory` (this process; with --peers, the cluster), or Redis:
    /// `redis://[USER:PASSWORD@]HOST:PORT[/DB]`, `rediss://...` (TLS),
    /// `redis-sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT]/MASTER[/DB]`,
    /// `redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT]`, `rediss-cluster://...` (TLS).
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
    /// TLS to Redis (`rediss://`, `rediss-cluster://`): the CA certificates (PEM) Redis's
    /// certificates must chain to, instead of the system's roots.
    #[arg(long, env = "RATEKEEPER_STORE_TLS_CA", value_name = "FILE")]
    pub store_tls_ca: Option<PathBuf>,
    /// TLS to Redis: a client certificate chain (PEM) to present, for a Redis that requires
    /// one (`tls-auth-clients yes`).
    #[arg(
        long,
        env = "RATEKEEPER_STORE_TLS_CERT",
        value_name = "FILE",
        requires = "store_tls_key"
    )]
    pub store_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --store-tls-cert.
    #[arg(
        long,
        env = "RATEKEEPER_STORE_TLS_KEY",
        value_name = "FILE",
        requires = "store_tls_cert"
    )]
    pub store_tls_key: Option<PathBuf>,
    /// TLS to Redis: check that Redis's certificate chains to the CA, but not that it names
    /// the host dialled (for a certificate issued to another name).
    #[arg(long, env = "RATEKEEPER_STORE_TLS_SKIP_HOSTNAME_VERIFICATION")]
    pub store_tls_skip_hostname_verification: bool,
}

impl StoreArgs {
    /// The `--store-tls-*` flags.
    fn tls(&self) -> RedisTlsOptions {
        RedisTlsOptions {
            ca: self.store_tls_ca.clone(),
            client: self.store_tls_cert.clone().zip(self.store_tls_key.clone()),
            skip_hostname_verification: self.store_tls_skip_hostname_verification,
        }
    }
}

// Cluster mode: the memory store across peers.
#[derive(Args)]
#[command(next_help_heading = "Cluster")]
pub struct ClusterArgs {
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
    /// Serve the peer listener without mutual TLS on a non-loopback address: anything that
    /// reaches it can change the membership, hand over and reset counters.
    #[arg(
        long,
        env = "RATEKEEPER_PEER_INSECURE",
        conflicts_with = "peer_tls_cert"
    )]
    pub peer_insecure: bool,
}

// TLS, and mutual TLS, on the gRPC listener.
#[derive(Args)]
#[command(next_help_heading = "TLS on the gRPC listener")]
pub struct GrpcTlsArgs {
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
}

// Mutual TLS between peers.
#[derive(Args)]
#[command(next_help_heading = "Cluster TLS")]
pub struct PeerTlsArgs {
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
}

// The operator endpoints.
#[derive(Args)]
#[command(next_help_heading = "Admin listener")]
pub struct AdminArgs {
    /// Every request to the admin listener must send `Authorization: Bearer <token>`, the
    /// token being this file's content (surrounding whitespace ignored); re-read every
    /// second, so a rotated Secret takes effect without a restart.
    #[arg(long, env = "RATEKEEPER_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Serve GET and DELETE /counters/{domain} (listing and resetting counters) on the
    /// admin listener; `--admin-counters=false` answers 404 there.
    #[arg(long, env = "RATEKEEPER_ADMIN_COUNTERS", default_value_t = true, action = clap::ArgAction::Set)]
    pub admin_counters: bool,
    /// Serve the dashboard (GET /ui and /ui/data) on the admin listener.
    #[arg(long, env = "RATEKEEPER_ADMIN_UI", default_value_t = true, action = clap::ArgAction::Set)]
    pub admin_ui: bool,
    /// Keep the descriptor values of up to this many live counters, so
    /// GET /counters/{domain} can list them (0: keep none, the endpoint answers 404).
    #[arg(long, env = "RATEKEEPER_COUNTER_NAMES", default_value_t = 0)]
    pub counter_names: usize,
}

// The Rate Limit Quota Service (Envoy's rate_limit_quota filter).
#[derive(Args)]
#[command(next_help_heading = "RLQS")]
pub struct RlqsArgs {
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
}

// Metrics.
#[derive(Args)]
#[command(next_help_heading = "Metrics")]
pub struct MetricsArgs {
    /// A hit is counted as near the limit when at least this share of it is used.
    #[arg(long, env = "RATEKEEPER_NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    pub near_limit_ratio: f64,
    /// Most per-limit metric series (label sets).
    #[arg(long, env = "RATEKEEPER_METRICS_MAX_SERIES", default_value_t = 10_000)]
    pub metrics_max_series: usize,
}

// The reference service's stats, where Envoy Gateway looks for them.
#[derive(Args)]
#[command(next_help_heading = "Metrics in the reference service's names")]
pub struct ReferenceStatsArgs {
    /// Push the reference service's stats (ratelimit.service.rate_limit.*, as its USE_STATSD
    /// does) to this StatsD server, HOST:PORT, over UDP.
    #[arg(long, env = "RATEKEEPER_STATSD")]
    pub statsd: Option<String>,
    /// How often the StatsD push sends what was counted since the last one.
    #[arg(long, env = "RATEKEEPER_STATSD_FLUSH_INTERVAL", value_parser = duration, default_value = "10s")]
    pub statsd_flush_interval: Duration,
    /// Serve the reference service's stats with Prometheus names (as its USE_PROMETHEUS
    /// does), and ratekeeper's own metrics, on a listener of its own at this address
    /// (`:PORT`: every interface).
    #[arg(long, env = "RATEKEEPER_PROMETHEUS_ADDR", value_parser = listen_addr)]
    pub prometheus_addr: Option<SocketAddr>,
    /// The one path the Prometheus listener serves.
    #[arg(long, env = "RATEKEEPER_PROMETHEUS_PATH", value_parser = url_path, default_value = "/metrics")]
    pub prometheus_path: String,
    /// A statsd_exporter mapping file giving the Prometheus listener's names and labels
    /// (default: the reference service's default mapping).
    #[arg(long, env = "RATEKEEPER_PROMETHEUS_MAPPING")]
    pub prometheus_mapping: Option<PathBuf>,
    /// A tag for the reference service's stat names, KEY:VALUE (repeat it, or separate
    /// tags with commas), as its EXTRA_TAGS.
    #[arg(long = "stats-tag", env = "RATEKEEPER_STATS_TAGS", value_parser = stats_tag, value_delimiter = ',')]
    pub stats_tags: Vec<(String, String)>,
}

impl ReferenceStatsArgs {
    /// The sinks these flags ask for.
    fn options(&self) -> Result<ReferenceOptions, String> {
        if self.statsd_flush_interval.is_zero() {
            return Err("--statsd-flush-interval must be longer than 0s".into());
        }
        Ok(ReferenceOptions {
            statsd: self.statsd.clone().map(|addr| StatsdOptions {
                addr,
                flush_every: self.statsd_flush_interval,
            }),
            prometheus: self.prometheus_addr.map(|addr| PrometheusOptions {
                addr,
                path: self.prometheus_path.clone(),
                mapping: self.prometheus_mapping.clone(),
            }),
            tags: self.stats_tags.clone(),
        })
    }
}

/// A listen address; `:PORT` (Go's way to say every interface) is `0.0.0.0:PORT`.
pub fn listen_addr(text: &str) -> Result<SocketAddr, String> {
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_owned(),
    };
    full.parse()
        .map_err(|_| format!("{text:?} is not IP:PORT or :PORT"))
}

/// A path to serve: starting with `/`, without the router's `{`, `}` or `*`.
fn url_path(text: &str) -> Result<String, String> {
    if !text.starts_with('/') || text.contains(['{', '}', '*']) {
        return Err(format!(
            "{text:?} is not a path starting with / (without {{, }} or *)"
        ));
    }
    Ok(text.to_owned())
}

/// `KEY:VALUE`.
fn stats_tag(text: &str) -> Result<(String, String), String> {
    match text.split_once(':') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY:VALUE")),
    }
}

impl ServeArgs {
    /// How the limits files become limits, at start and on every reload.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            merge_domains: self.limits.merge_domain_config,
            store: self.store.store.capabilities(),
        }
    }

    /// The limits to start with: the files' (see `reload::load_at_start`), or none for
    /// xDS, which brings them once the server answers.
    pub fn initial_limits(&self) -> Result<(Limits, u64), ConfigErrors> {
        match self.limits.config_source {
            ConfigSource::File => reloader::load_at_start(
                &self.limits.config,
                self.load_options(),
                self.limits.start_without_config,
            ),
            ConfigSource::Xds => Ok((Limits::default(), 0)),
        }
    }

    /// The xDS subscription, with --config-source xds.
    fn xds_options(&self) -> Result<Option<XdsOptions>, String> {
        if self.limits.config_source != ConfigSource::Xds {
            return Ok(None);
        }
        // clap requires --xds-server with --config-source xds.
        let server = self.xds.xds_server.clone().unwrap_or_default();
        Ok(Some(XdsOptions {
            tls: self.xds.tls()?,
            node_id: self.xds.xds_node_id.clone(),
            node_metadata: self.xds.xds_node_metadata.clone(),
            headers: self.xds.xds_header.clone(),
            backoff_initial: self.xds.xds_backoff_initial,
            backoff_max: self.xds.xds_backoff_max.max(self.xds.xds_backoff_initial),
            load: self.load_options(),
            ..XdsOptions::new(server)
        }))
    }

    /// Whether any cluster flag was given.
    pub fn cluster_mode(&self) -> bool {
        self.cluster.advertise.is_some()
            || !self.cluster.peers.is_empty()
            || self.cluster.peer_dns.is_some()
            || self.cluster.peer_addr.is_some()
    }

    fn cluster_options(&self) -> Option<(SocketAddr, ClusterOptions)> {
        if !self.cluster_mode() {
            return None;
        }
        let peer_addr = self
            .cluster
            .peer_addr
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8091)));
        let mut options = ClusterOptions::new(self.cluster.advertise.clone().unwrap_or_default());
        options.peers = self.cluster.peers.clone();
        options.peer_dns = self.cluster.peer_dns.clone();
        options.timeout = self.cluster.peer_timeout;
        options.batch_size = self.cluster.peer_batch_size;
        options.batch_window = self.cluster.peer_batch_window;
        options.ping_interval = self.cluster.peer_ping_interval;
        options.down_after = self.cluster.peer_down_after;
        options.up_after = self.cluster.peer_up_after;
        options.tls = self
            .peer_tls
            .peer_tls_cert
            .clone()
            .zip(self.peer_tls.peer_tls_key.clone())
            .map(|(cert, key)| TlsOptions {
                cert,
                key,
                client_ca: self.peer_tls.peer_tls_ca.clone(),
                client_san: self.peer_tls.peer_tls_name.clone(),
            });
        options.insecure = self.cluster.peer_insecure;
        options.fallback = match self.cluster.peer_fallback {
            FallbackArg::Local => Fallback::Local,
            FallbackArg::Allow => Fallback::Policy(FailurePolicy::Allow),
            FallbackArg::Deny => Fallback::Policy(FailurePolicy::Deny),
        };
        Some((peer_addr, options))
    }

    /// TLS on the gRPC listener, when a certificate is given (clap makes sure of the key).
    fn tls_options(&self) -> Option<TlsOptions> {
        let (cert, key) = self
            .grpc_tls
            .grpc_tls_cert
            .clone()
            .zip(self.grpc_tls.grpc_tls_key.clone())?;
        Some(TlsOptions {
            cert,
            key,
            client_ca: self.grpc_tls.grpc_tls_client_ca.clone(),
            client_san: self.grpc_tls.grpc_tls_client_san.clone(),
        })
    }

    /// Where counters live: Redis (never together with peers: every node already shares
    /// its counters there), the cluster, or this process.
    fn store_options(&self) -> Result<StoreOptions, String> {
        let cluster = self.cluster_options();
        let tls = self.store.tls();
        if let (StoreArg::Memory, Some(flag)) = (&self.store.store, tls.first_flag()) {
            return Err(format!(
                "{flag} is for a Redis store: give a rediss:// --store"
            ));
        }
        let target = match (&self.store.store, cluster) {
            (StoreArg::Memory, None) => return Ok(StoreOptions::Memory),
            (StoreArg::Memory, Some((peer_addr, options))) => {
                return Ok(StoreOptions::Cluster { peer_addr, options });
            }
            (StoreArg::Redis(target), Some(_)) => {
                return Err(format!(
                    "--store {} cannot be combined with cluster mode (--peers, --peer-dns): \
                     every node already shares the counters in Redis",
                    target.describe()
                ));
            }
            (StoreArg::Redis(target), None) => target,
        };
        Ok(StoreOptions::Redis(RedisOptions {
            timeout: self.store.store_timeout,
            pool: usize::from(self.store.store_pool),
            failure: match self.store.store_failure {
                FailureArg::Allow => FailurePolicy::Allow,
                FailureArg::Deny => FailurePolicy::Deny,
            },
            cooldown: self.store.store_cooldown,
            blocked_keys: self.store.store_blocked_keys,
            ttl_margin: self.store.store_ttl_margin,
            tls,
            ..RedisOptions::new(Target::clone(target))
        }))
    }

    /// The server options these flags ask for; an error says which flags cannot go
    /// together.
    pub fn server_options(&self) -> Result<ServerOptions, String> {
        let mut engine = EngineConfig {
            max_keys: self.engine.max_keys,
            rule_key_share: self.engine.rule_key_share,
            ..EngineConfig::default()
        };
        if let Some(shards) = self.engine.shards {
            engine.shards = usize::from(shards);
        }
        Ok(ServerOptions {
            store: self.store_options()?,
            engine,
            limiter: LimiterOptions {
                response_headers: self.answers.response_headers != ResponseHeaders::Off,
                header_style: match self.answers.response_headers {
                    ResponseHeaders::Ietf => HeaderStyle::Ietf,
                    ResponseHeaders::Off | ResponseHeaders::Draft03 => HeaderStyle::Draft03,
                },
                shadow_mode: self.answers.shadow_mode,
                soft_mode: self.answers.quota_mode,
                count_rejected_hits: self.answers.count_rejected_hits,
                response_dynamic_metadata: self.answers.response_dynamic_metadata,
                unit_multiplier_field: self.answers.unit_multiplier_field,
                header_names: HeaderNames {
                    limit: self.answers.header_limit.as_str().into(),
                    remaining: self.answers.header_remaining.as_str().into(),
                    reset: self.answers.header_reset.as_str().into(),
                },
            },
            metrics: MetricsOptions {
                near_limit_ratio: self.metrics.near_limit_ratio,
                max_series: self.metrics.metrics_max_series,
            },
            reference: self.reference_stats.options()?,
            watch: (self.limits.config_source == ConfigSource::File)
                .then(|| self.limits.config.clone()),
            xds: self.xds_options()?,
            reload: ReloadOptions {
                recheck_every: self.limits.reload_interval,
                load: self.load_options(),
                ..ReloadOptions::default()
            },
            shutdown_grace: self.listen.shutdown_grace,
            shutdown_delay: self.listen.shutdown_delay,
            healthy_only_with_config: self.limits.healthy_only_with_config,
            admin: AdminOptions {
                counters: self.admin.admin_counters,
                ui: self.admin.admin_ui,
                counter_names: self.admin.counter_names,
            },
            grpc_uds: self.listen.grpc_uds.clone(),
            grpc_tls: self.tls_options(),
            admin_addr: self.listen.admin_addr,
            admin_token: self.admin.admin_token_file.clone(),
            rlqs: {
                let defaults = RlqsOptions::default();
                RlqsOptions {
                    hub: HubOptions {
                        max_streams: self.rlqs.rlqs_max_streams,
                        max_buckets_per_stream: self.rlqs.rlqs_max_buckets_per_stream,
                        max_buckets: self.rlqs.rlqs_max_buckets,
                        abandon_after: self.rlqs.rlqs_abandon_after,
                        ..defaults.hub
                    },
                    max_message_bytes: self.rlqs.rlqs_max_message_bytes,
                    exchange_every: self.rlqs.rlqs_exchange_every,
                    assignment_ttl: self.rlqs.rlqs_assignment_ttl,
                    ..defaults
                }
            },
            ..ServerOptions::new(self.listen.grpc_addr, self.listen.http_addr)
        })
    }
}
