//! The `ratekeeper` command: parse the command line, set up logging, load the limits and
//! hand over to the library.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ratekeeper::engine::EngineConfig;
use ratekeeper::limits::Limits;
use ratekeeper::rls::LimiterOptions;
use ratekeeper::server::{Server, ServerOptions};

/// Envoy rate limit service sidecar.
#[derive(Parser)]
#[command(name = "ratekeeper", version)]
struct Cli {
    /// Log filter, `RUST_LOG` syntax (e.g. `info`, `ratekeeper=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "info", global = true)]
    log: String,
    #[command(subcommand)]
    command: Command,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
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
    let limits = match Limits::load(&args.config) {
        Ok(limits) => limits,
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
        grpc_addr: args.grpc_addr,
        http_addr: args.http_addr,
        engine,
        limiter: LimiterOptions {
            response_headers: args.response_headers,
        },
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let server = Server::bind(&options, limits).await?;
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
