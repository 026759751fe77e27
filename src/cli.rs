//! The command line: flags, their environment variables and defaults, and how they map
//! onto the library's options. `main.rs` parses and dispatches; everything here is testable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::engine::EngineConfig;
use crate::limits::parse_duration;
use crate::metrics::MetricsOptions;
use crate::reload::ReloadOptions;
use crate::rls::LimiterOptions;
use crate::server::ServerOptions;

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
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve Envoy's RateLimitService over gRPC, plus the HTTP endpoints.
    Serve(ServeArgs),
    /// Load and check a limits file or directory exactly as `serve` would.
    Validate { path: PathBuf },
}

#[derive(Args)]
pub struct ServeArgs {
    /// Limits: a YAML file, or a directory of *.yaml / *.yml files.
    #[arg(long, env = "RATEKEEPER_CONFIG", default_value = "config/")]
    pub config: PathBuf,
    #[arg(long, env = "RATEKEEPER_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    pub grpc_addr: SocketAddr,
    #[arg(long, env = "RATEKEEPER_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
    /// Shard actors [default: the number of cores].
    #[arg(long, env = "RATEKEEPER_SHARDS", value_parser = clap::value_parser!(u16).range(1..))]
    pub shards: Option<u16>,
    /// Live keys kept at most, across all shards.
    #[arg(long, env = "RATEKEEPER_MAX_KEYS", default_value_t = EngineConfig::default().max_keys)]
    pub max_keys: usize,
    /// Add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset headers to responses.
    #[arg(long, env = "RATEKEEPER_RESPONSE_HEADERS")]
    pub response_headers: bool,
    /// Also re-read the limits this often (e.g. `30s`), for filesystems without change events.
    #[arg(long, env = "RATEKEEPER_RELOAD_INTERVAL", value_parser = duration)]
    pub reload_interval: Option<Duration>,
    /// How long shutdown waits for in-flight requests.
    #[arg(long, env = "RATEKEEPER_SHUTDOWN_GRACE", value_parser = duration, default_value = "15s")]
    pub shutdown_grace: Duration,
    /// A hit is counted as near the limit when at least this share of it is used.
    #[arg(long, env = "RATEKEEPER_NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    pub near_limit_ratio: f64,
    /// Most per-limit metric series (label sets).
    #[arg(long, env = "RATEKEEPER_METRICS_MAX_SERIES", default_value_t = 10_000)]
    pub metrics_max_series: usize,
}

impl ServeArgs {
    /// The server options these flags ask for.
    pub fn server_options(&self) -> ServerOptions {
        let mut engine = EngineConfig {
            max_keys: self.max_keys,
            ..EngineConfig::default()
        };
        if let Some(shards) = self.shards {
            engine.shards = usize::from(shards);
        }
        ServerOptions {
            engine,
            limiter: LimiterOptions {
                response_headers: self.response_headers,
            },
            metrics: MetricsOptions {
                near_limit_ratio: self.near_limit_ratio,
                max_series: self.metrics_max_series,
            },
            watch: Some(self.config.clone()),
            reload: ReloadOptions {
                recheck_every: self.reload_interval,
                ..ReloadOptions::default()
            },
            shutdown_grace: self.shutdown_grace,
            ..ServerOptions::new(self.grpc_addr, self.http_addr)
        }
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).ok_or_else(|| format!("{text:?} is not a duration like 500ms or 30s"))
}
