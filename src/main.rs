//! The `ratekeeper` command: parse the command line, set up logging, load the limits and
//! hand over to the library.

use std::io::Write;
use std::process::ExitCode;

use ratekeeper::cli::{Cli, Command, LogFormat, ServeArgs};
use ratekeeper::reload::ReloadHandle;
use ratekeeper::server::{AbortOnDrop, ServeError, Server};
use ratekeeper::telemetry;
use tokio::signal::unix::Signal;

fn main() -> ExitCode {
    ratekeeper::allocator::configure();
    let (cli, reference) = match Cli::parse_with_reference_env() {
        Ok(parsed) => parsed,
        Err(error) => return fail(error),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => return fail(format!("cannot start the tokio runtime: {error}")),
    };
    let json = matches!(cli.log_format, LogFormat::Json);
    // The span exporter needs the runtime; it flushes what is queued when dropped.
    let telemetry =
        runtime.block_on(async { telemetry::init(&cli.log, json, cli.otlp().as_ref()) });
    let _telemetry = match telemetry {
        Ok(telemetry) => telemetry,
        Err(error) => return fail(error),
    };
    if let Some(reference) = &reference {
        reference.log();
    }
    match cli.command {
        Command::Validate(args) => args.run(),
        Command::Serve(args) => serve(args, &runtime),
        Command::Explain(args) => ratekeeper::admin::explain::client::command(&args.request()),
        Command::Inject(args) => args.run(),
        Command::Webhook(args) => args.run(&runtime, shutdown_signal()),
    }
}

fn serve(args: Box<ServeArgs>, runtime: &tokio::runtime::Runtime) -> ExitCode {
    let (limits, version) = match args.initial_limits() {
        Ok(loaded) => loaded,
        Err(errors) => return fail(format!("invalid limits, not starting:\n{errors}")),
    };
    let options = match args.server_options() {
        Ok(options) => options,
        Err(error) => return fail(error),
    };
    let result = runtime.block_on(async {
        let server = Server::bind(&options, limits, version).await?;
        // Handled before the serving line, so a SIGHUP right after it never kills us.
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(ServeError::Signal)?;
        let _reloads = AbortOnDrop(tokio::spawn(reload_on_sighup(hangup, server.limits_reload())).abort_handle());
        // Tests and scripts read this line to learn the bound addresses.
        let peer = server.peer_addr().map(|addr| format!(" peer={addr}")).unwrap_or_default();
        let prometheus = server.prometheus_addr().map(|addr| format!(" prometheus={addr}")).unwrap_or_default();
        println!("ratekeeper serving grpc={} http={} admin={}{peer}{prometheus}", server.grpc_endpoint(), server.http_addr(), server.admin_addr());
        let _ = std::io::stdout().flush();
        tracing::info!(grpc = %server.grpc_endpoint(), http = %server.http_addr(), shards = options.engine.shards, "serving");
        server.run(shutdown_signal()).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error),
    }
}

/// Prints why the command failed; its exit code.
fn fail(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("{error}");
    ExitCode::FAILURE
}

/// Reloads the limits files on every SIGHUP, as the watch would (with xDS there are none).
async fn reload_on_sighup(mut hangup: Signal, reload: Option<ReloadHandle>) {
    while hangup.recv().await.is_some() {
        match &reload {
            Some(reload) => {
                tracing::info!(path = %reload.path().display(), "SIGHUP: reloading limits");
                // Logged and counted inside; on error the old limits stay.
                let _ = reload.reload().await;
            }
            None => tracing::info!("SIGHUP: the limits come from xDS, no files to reload"),
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
