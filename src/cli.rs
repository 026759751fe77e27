//! The command line: flags, their environment variables and defaults, and how they map
//! onto the library's options. `main.rs` parses and dispatches; everything here is testable.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::admin::explain::client::ExplainRequest;
use crate::limiter::HeaderNames;
use crate::limits::{Limits, LoadOptions, parse_duration};
use crate::store::Capabilities;
use crate::store::redis::{self, Target};

pub mod docs;
pub mod reference_env;
mod serve;

pub use self::serve::ServeArgs;

/// `--http-addr` unless given (or set by the reference's `HOST`/`PORT`).
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";
/// `--grpc-addr` unless given (or set by the reference's `GRPC_HOST`/`GRPC_PORT`).
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:8081";

/// The help heading of the flags every command takes.
const LOGS: &str = "Logs and tracing";

/// Envoy rate limit service sidecar.
#[derive(Parser)]
#[command(name = "ratekeeper", version)]
pub struct Cli {
    /// Log filter, `RUST_LOG` syntax (e.g. `info`, `ratekeeper=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "info", global = true, help_heading = LOGS)]
    pub log: String,
    /// Log format.
    #[arg(long, env = "RATEKEEPER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true, help_heading = LOGS)]
    pub log_format: LogFormat,
    /// Trace `ShouldRateLimit` calls to this OpenTelemetry collector (e.g.
    /// `http://otel-collector:4317`), as children of the caller's W3C trace context; with
    /// `--otlp-protocol http`, `/v1/traces` is added to its path. Off when neither this
    /// nor --otlp-traces-endpoint is given.
    #[arg(long, env = "RATEKEEPER_OTLP_ENDPOINT", global = true, help_heading = LOGS)]
    pub otlp_endpoint: Option<String>,
    /// The collector's URL for spans, used as given (nothing added to its path); wins over
    /// --otlp-endpoint.
    #[arg(long, env = "RATEKEEPER_OTLP_TRACES_ENDPOINT", global = true, help_heading = LOGS)]
    pub otlp_traces_endpoint: Option<String>,
    /// How spans reach the collector: `grpc` (OTLP/gRPC, port 4317) or `http` (OTLP/HTTP
    /// with protobuf, port 4318).
    #[arg(long, env = "RATEKEEPER_OTLP_PROTOCOL", value_enum, default_value_t = OtlpProtocol::Grpc, global = true, help_heading = LOGS)]
    pub otlp_protocol: OtlpProtocol,
    /// The share of calls traced, from 0 to 1, when the caller sent no trace context; a
    /// caller's sampled (or unsampled) trace decides for its calls.
    #[arg(long, env = "RATEKEEPER_OTLP_SAMPLING_RATE", default_value_t = 1.0, value_parser = sampling_rate, global = true, help_heading = LOGS)]
    pub otlp_sampling_rate: f64,
    /// `service.name` of the traced spans.
    #[arg(
        long,
        env = "RATEKEEPER_OTLP_SERVICE_NAME",
        default_value = "ratekeeper",
        global = true,
        help_heading = LOGS
    )]
    pub otlp_service_name: String,
    /// `service.namespace` of the traced spans.
    #[arg(long, env = "RATEKEEPER_OTLP_SERVICE_NAMESPACE", global = true, help_heading = LOGS)]
    pub otlp_service_namespace: Option<String>,
    /// `service.instance.id` of the traced spans [default: a random UUID per process].
    #[arg(long, env = "RATEKEEPER_OTLP_SERVICE_INSTANCE_ID", global = true, help_heading = LOGS)]
    pub otlp_service_instance_id: Option<String>,
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
        let entry_point = as_reference_entry_point(&mut args);
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
        if entry_point {
            reference_env::entry_point_defaults(&mut env);
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
        use crate::telemetry::{OtlpOptions, http_traces_url};
        let endpoint = match (&self.otlp_traces_endpoint, &self.otlp_endpoint) {
            (Some(traces), _) => traces.clone(),
            (None, Some(base)) => match self.otlp_protocol {
                OtlpProtocol::Grpc => base.clone(),
                OtlpProtocol::Http => http_traces_url(base),
            },
            (None, None) => return None,
        };
        Some(OtlpOptions {
            endpoint,
            http: self.otlp_protocol == OtlpProtocol::Http,
            sampling_rate: self.otlp_sampling_rate,
            service_name: self.otlp_service_name.clone(),
            service_namespace: self.otlp_service_namespace.clone(),
            service_instance_id: self.otlp_service_instance_id.clone(),
        })
    }
}

/// Whether the process runs as the reference's entry point (`/bin/ratelimit`): then it is
/// `serve` (inserted unless a subcommand is named), with the reference's listener defaults.
fn as_reference_entry_point(args: &mut Vec<std::ffi::OsString>) -> bool {
    let program = args.first().map(std::path::Path::new);
    let entry_point = program
        .and_then(std::path::Path::file_name)
        .is_some_and(|name| name == reference_env::REFERENCE_ENTRY_POINT);
    let named = args
        .get(1)
        .and_then(|arg| arg.to_str())
        .is_some_and(|arg| !arg.starts_with('-'));
    if entry_point && !named {
        args.insert(1, "serve".into());
    }
    entry_point
}

/// `--otlp-protocol`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OtlpProtocol {
    Grpc,
    Http,
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
    Webhook(Box<crate::webhook::WebhookArgs>),
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
    /// The limits file, or a directory of them (as `serve --config`).
    pub path: PathBuf,
    /// Merge files that name the same domain, as `serve --merge-domain-config` does.
    #[arg(long, env = "RATEKEEPER_MERGE_DOMAIN_CONFIG")]
    pub merge_domain_config: bool,
    /// Check the limits against what this store can count (`--store` of `serve`).
    #[arg(long, env = "RATEKEEPER_STORE", value_parser = store, default_value = "memory")]
    pub store: StoreArg,
    /// Also print every limit, one per line, as `/rlconfig` shows them (windows of several
    /// units as durations: `100 per 5m`).
    #[arg(long)]
    pub list: bool,
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
                if self.list {
                    print!("{limits}");
                }
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

/// `--otlp-sampling-rate`: from 0 to 1.
fn sampling_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!(
            "expected a rate from 0 (no call traced) to 1 (every call), got {text:?}"
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
/// [`crate::quota::cluster::EXCHANGE_INTERVALS`].
fn rlqs_exchange_every(text: &str) -> Result<Duration, String> {
    duration_within(text, crate::quota::cluster::EXCHANGE_INTERVALS)
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

    /// `serve --help` in sections, in this order, each flag under its own heading; a flag
    /// keeps its name and variable whichever section holds it.
    #[test]
    fn serve_help_groups_its_flags_under_headings() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        // Propagates the global flags to the subcommands, as parsing does.
        cli.build();
        let serve = cli.find_subcommand_mut("serve").expect("serve");
        let help = serve.render_long_help().to_string();
        let headings: Vec<&str> = help
            .lines()
            .filter(|line| !line.starts_with(' ') && line.ends_with(':'))
            .collect();
        assert_eq!(
            headings,
            [
                "Options:",
                "Listeners:",
                "TLS on the gRPC listener:",
                "Limits:",
                "Limits from xDS (--config-source xds):",
                "Answers:",
                "Memory store:",
                "Redis store:",
                "Cluster:",
                "Cluster TLS:",
                "Admin listener:",
                "RLQS:",
                "Metrics:",
                "Metrics in the reference service's names:",
                "Logs and tracing:",
            ]
        );
        let section_of = |flag: &str| -> &str {
            let at = [" ", "\n"]
                .iter()
                .find_map(|end| help.find(&format!("      --{flag}{end}")))
                .unwrap_or_else(|| panic!("--{flag} in:\n{help}"));
            headings
                .iter()
                .rfind(|heading| help.find(*heading).is_some_and(|start| start < at))
                .copied()
                .unwrap_or_default()
        };
        for (flag, heading) in [
            ("grpc-addr", "Listeners:"),
            ("grpc-tls-client-ca", "TLS on the gRPC listener:"),
            ("config", "Limits:"),
            ("xds-server", "Limits from xDS (--config-source xds):"),
            ("xds-tls-san", "Limits from xDS (--config-source xds):"),
            ("quota-mode", "Answers:"),
            ("max-keys", "Memory store:"),
            ("store-ttl-margin", "Redis store:"),
            ("peer-fallback", "Cluster:"),
            ("peer-tls-name", "Cluster TLS:"),
            ("admin-token-file", "Admin listener:"),
            ("rlqs-exchange-every", "RLQS:"),
            ("metrics-max-series", "Metrics:"),
            (
                "prometheus-mapping",
                "Metrics in the reference service's names:",
            ),
            ("otlp-endpoint", "Logs and tracing:"),
        ] {
            assert_eq!(section_of(flag), heading, "--{flag}");
        }
        assert!(help.contains("[env: RATEKEEPER_PEER_TLS_NAME=]"), "{help}");
    }

    /// The store is one choice: memory, the cluster (any peer flag), or Redis; Redis with
    /// peers is refused before anything starts, naming both (and no password).
    #[test]
    fn the_store_is_one_choice_and_redis_with_peers_is_refused() {
        use crate::store::StoreOptions;
        let store = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).expect("valid flags");
            let Command::Serve(serve) = cli.command else {
                panic!("serve expected");
            };
            serve.server_options().map(|options| options.store)
        };
        assert!(matches!(
            store(&["ratekeeper", "serve"]),
            Ok(StoreOptions::Memory)
        ));
        assert!(matches!(
            store(&["ratekeeper", "serve", "--peers", "10.0.0.2:8091"]),
            Ok(StoreOptions::Cluster { .. })
        ));
        assert!(matches!(
            store(&["ratekeeper", "serve", "--store", "redis://127.0.0.1:6379"]),
            Ok(StoreOptions::Redis(_))
        ));
        let refused = store(&[
            "ratekeeper",
            "serve",
            "--store",
            "redis://user:secret@127.0.0.1:6379",
            "--peer-dns",
            "peers:8091",
        ])
        .map(|_| ())
        .expect_err("redis with peers");
        assert!(
            refused.contains("cannot be combined with cluster mode")
                && refused.contains("127.0.0.1:6379")
                && !refused.contains("secret"),
            "{refused}"
        );
    }

    /// TLS to the xDS server is asked for by --xds-tls or an https:// server; its other
    /// flags without it, or --xds-tls with an http:// server, are refused naming the flag.
    #[test]
    fn xds_tls_is_asked_for_by_its_flag_or_an_https_server() {
        use crate::envoy::xds::XdsTlsOptions;
        let xds = |more: &[&str]| {
            let mut args = vec!["ratekeeper", "serve", "--config-source", "xds"];
            args.extend_from_slice(more);
            let cli = Cli::try_parse_from(args).expect("valid flags");
            let Command::Serve(serve) = cli.command else {
                panic!("serve expected");
            };
            serve
                .server_options()
                .map(|options| options.xds.expect("xds").tls)
        };
        assert_eq!(xds(&["--xds-server", "xds:18000"]), Ok(None));
        assert_eq!(
            xds(&["--xds-server", "https://xds:18000"]),
            Ok(Some(XdsTlsOptions::default()))
        );
        assert_eq!(
            xds(&[
                "--xds-server",
                "xds:18000",
                "--xds-tls",
                "--xds-tls-ca",
                "/certs/ca.crt",
                "--xds-tls-cert",
                "/certs/tls.crt",
                "--xds-tls-key",
                "/certs/tls.key",
                "--xds-tls-san",
                "xds.internal",
            ]),
            Ok(Some(XdsTlsOptions {
                ca: Some("/certs/ca.crt".into()),
                identity: Some(("/certs/tls.crt".into(), "/certs/tls.key".into())),
                san: Some("xds.internal".into()),
            }))
        );
        let plain = xds(&["--xds-server", "xds:18000", "--xds-tls-ca", "/certs/ca.crt"])
            .expect_err("a CA without TLS");
        assert!(plain.starts_with("--xds-tls-ca needs --xds-tls"), "{plain}");
        let http =
            xds(&["--xds-server", "http://xds:18000", "--xds-tls"]).expect_err("tls with http://");
        assert!(
            http.contains("--xds-tls with --xds-server http://xds:18000"),
            "{http}"
        );
        let half = Cli::try_parse_from(["ratekeeper", "serve", "--xds-tls-cert", "/certs/tls.crt"]);
        assert!(half.is_err(), "a certificate without its key");
    }

    fn limiter_options(args: &[&str]) -> crate::limiter::LimiterOptions {
        let cli = Cli::try_parse_from(args).expect("valid flags");
        let Command::Serve(serve) = cli.command else {
            panic!("serve expected");
        };
        serve.server_options().expect("valid flags").limiter
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
                Command::Serve(serve) => match serve.server_options().expect("valid flags").store {
                    crate::store::StoreOptions::Redis(redis) => Some(redis.ttl_margin),
                    _ => None,
                },
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
            Command::Serve(serve) => Ok(read(&serve.server_options().expect("valid flags").rlqs)),
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
        assert!(!plain.soft_mode && !plain.response_dynamic_metadata);
        let both = limiter_options(&[
            "ratekeeper",
            "serve",
            "--quota-mode",
            "--response-dynamic-metadata",
        ]);
        assert!(both.soft_mode && both.response_dynamic_metadata);
        assert!(!both.shadow_mode && !both.response_headers);
    }
}
