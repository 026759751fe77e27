//! The `ratekeeper` command: parse the command line, set up logging, load the limits and
//! hand over to the library.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use ratekeeper::cli::{Cli, Command, LogFormat, ServeArgs};
use ratekeeper::server::Server;
use ratekeeper::telemetry;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let json = matches!(cli.log_format, LogFormat::Json);
    // The span exporter needs the runtime; it flushes what is queued when dropped.
    let telemetry =
        runtime.block_on(async { telemetry::init(&cli.log, json, cli.otlp().as_ref()) });
    let _telemetry = match telemetry {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Validate(args) => args.run(),
        Command::Serve(args) => serve(args, &runtime),
        Command::Explain(args) => ratekeeper::admin::explain::client::command(&args.request()),
    }
}

fn serve(args: Box<ServeArgs>, runtime: &tokio::runtime::Runtime) -> ExitCode {
    let (limits, version) = match args.initial_limits() {
        Ok(loaded) => loaded,
        Err(errors) => {
            eprintln!("invalid limits, not starting:\n{errors}");
            return ExitCode::FAILURE;
        }
    };
    let options = args.server_options();
    let result = runtime.block_on(async {
        let server = Server::bind(&options, limits, version).await?;
        // Tests and scripts read this line to learn the bound addresses.
        let peer = server.peer_addr().map(|addr| format!(" peer={addr}")).unwrap_or_default();
        println!("ratekeeper serving grpc={} http={}{peer}", server.grpc_endpoint(), server.http_addr());
        let _ = std::io::stdout().flush();
        tracing::info!(grpc = %server.grpc_endpoint(), http = %server.http_addr(), shards = options.engine.shards, "serving");
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
