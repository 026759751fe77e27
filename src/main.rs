//! The `ratekeeper` command: parse the command line, set up logging, load the limits and
//! hand over to the library.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ratekeeper::engine::EngineConfig;
use ratekeeper::limits::{Limits, parse_duration};
use ratekeeper::metrics::MetricsOptions;
use ratekeeper::reload::{self, ReloadOptions};
use ratekeeper::rls::LimiterOptions;
use ratekeeper::server::{Server, ServerOptions};

/// Envoy rate limit service sidecar.
#[derive(Parser)]
#[command(name = "ratekeeper", version)]
struct Cli {
    /// Log filter, `RUST_LOG` syntax (e.g. `info`, `ratekeeper=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "info", global = true)]
    log: String,
    /// Log format.
    #[arg(long, env = "RATEKEEPER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve Envoy's RateLimitService over gRPC, plus the HTTP endpoints.
    Serve(ServeArgs),
    /// Load and check a limits file or directory exactly as `serve` would.
    Validate { path: PathBuf },
}

#[derive(Args)]
struct ServeArgs {
    /// Limits: a YAML file, or a directory of *.yaml / *.yml files.
    #[arg(long, env = "RATEKEEPER_CONFIG", default_value = "config/")]
    config: PathBuf,
    #[arg(long, env = "RATEKEEPER_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    grpc_addr: SocketAddr,
    #[arg(long, env = "RATEKEEPER_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// Shard actors [default: the number of cores].
    #[arg(long, env = "RATEKEEPER_SHARDS", value_parser = clap::value_parser!(u16).range(1..))]
    shards: Option<u16>,
    /// Live keys kept at most, across all shards.
    #[arg(long, env = "RATEKEEPER_MAX_KEYS", default_value_t = EngineConfig::default().max_keys)]
    max_keys: usize,
    /// Add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset headers to responses.
    #[arg(long, env = "RATEKEEPER_RESPONSE_HEADERS")]
    response_headers: bool,
    /// Also re-read the limits this often (e.g. `30s`), for filesystems without change events.
    #[arg(long, env = "RATEKEEPER_RELOAD_INTERVAL", value_parser = duration)]
    reload_interval: Option<Duration>,
    /// How long shutdown waits for in-flight requests.
    #[arg(long, env = "RATEKEEPER_SHUTDOWN_GRACE", value_parser = duration, default_value = "15s")]
    shutdown_grace: Duration,
    /// A hit is counted as near the limit when at least this share of it is used.
    #[arg(long, env = "RATEKEEPER_NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    near_limit_ratio: f64,
    /// Most per-limit metric series (label sets).
    #[arg(long, env = "RATEKEEPER_METRICS_MAX_SERIES", default_value_t = 10_000)]
    metrics_max_series: usize,
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).ok_or_else(|| format!("{text:?} is not a duration like 500ms or 30s"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    match cli.command {
        Command::Validate { path } => validate(&path),
        Command::Serve(args) => serve(args),
    }
}

fn validate(path: &std::path::Path) -> ExitCode {
    match Limits::load(path) {
        Ok(limits) => {
            let domains: Vec<&str> = limits.domains().map(|domain| domain.name()).collect();
            println!(
                "{}: ok, {} domains ({}), {} limits",
                path.display(),
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

fn serve(args: ServeArgs) -> ExitCode {
    let (limits, version) = match reload::load(&args.config) {
        Ok(loaded) => loaded,
        Err(errors) => {
            eprintln!("invalid limits, not starting:\n{errors}");
            return ExitCode::FAILURE;
        }
    };
    let mut engine = EngineConfig {
        max_keys: args.max_keys,
        ..EngineConfig::default()
    };
    if let Some(shards) = args.shards {
        engine.shards = usize::from(shards);
    }
    let options = ServerOptions {
        engine,
        limiter: LimiterOptions {
            response_headers: args.response_headers,
        },
        metrics: MetricsOptions {
            near_limit_ratio: args.near_limit_ratio,
            max_series: args.metrics_max_series,
        },
        watch: Some(args.config.clone()),
        reload: ReloadOptions {
            recheck_every: args.reload_interval,
            ..ReloadOptions::default()
        },
        shutdown_grace: args.shutdown_grace,
        ..ServerOptions::new(args.grpc_addr, args.http_addr)
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let server = Server::bind(&options, limits, version).await?;
        // Tests and scripts read this line to learn the bound addresses.
        println!("ratekeeper serving grpc={} http={}", server.grpc_addr(), server.http_addr());
        let _ = std::io::stdout().flush();
        tracing::info!(grpc = %server.grpc_addr(), http = %server.http_addr(), shards = options.engine.shards, "serving");
        server.run(shutdown_signal()).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
