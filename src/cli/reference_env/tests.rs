use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use clap::Parser;

use super::{Mapping, VARIABLES, entry_point_defaults, go_duration, map};
use crate::cli::{Cli, Command};

/// The mapping of `env` with ratekeeper's own arguments `given` (clap ids).
fn mapping(env: &[(&str, &str)], given: &[&str]) -> Mapping {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    let given: BTreeSet<&str> = given.iter().copied().collect();
    map(&env, &given)
}

/// The flags `env` adds (`--flag=value`), asserting it is accepted without warnings.
fn flags(env: &[(&str, &str)]) -> Vec<String> {
    let mapping = mapping(env, &[]);
    assert!(mapping.errors.is_empty(), "{env:?}: {:?}", mapping.errors);
    assert!(
        mapping.warnings.is_empty(),
        "{env:?}: {:?}",
        mapping.warnings
    );
    mapping.args().collect()
}

fn check(env: &[(&str, &str)], expected: &[&str]) {
    assert_eq!(flags(env), expected, "{env:?}");
}

/// The variables `env` is refused for, asserting each error names its variable.
fn refused(env: &[(&str, &str)]) -> Vec<&'static str> {
    let mapping = mapping(env, &[]);
    for error in &mapping.errors {
        assert!(error.to_string().starts_with(error.variable), "{error}");
    }
    mapping.errors.iter().map(|error| error.variable).collect()
}

/// The variables `env` is warned about (and nothing refused, no flag added).
fn ignored(env: &[(&str, &str)]) -> Vec<&'static str> {
    let mapping = mapping(env, &[]);
    assert!(mapping.errors.is_empty(), "{env:?}: {:?}", mapping.errors);
    assert!(mapping.flags.is_empty(), "{env:?}: {:?}", mapping.flags);
    for warning in &mapping.warnings {
        assert!(warning.text.starts_with("ignored"), "{warning}");
    }
    mapping
        .warnings
        .iter()
        .map(|warning| warning.variable)
        .collect()
}

/// Istio's `samples/ratelimit/rate-limit-service.yaml`, the reference's Kubernetes example.
const KUBERNETES: [(&str, &str); 10] = [
    ("LOG_LEVEL", "debug"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis:6379"),
    ("USE_STATSD", "false"),
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("HOST", "::"),
    ("GRPC_HOST", "::"),
];

#[test]
fn the_kubernetes_example_listens_reads_and_counts_where_the_reference_would() {
    check(
        &KUBERNETES,
        &[
            "--http-addr=[::]:8080",
            "--grpc-addr=[::]:8081",
            "--log=ratekeeper=debug,info",
            "--config=/data/ratelimit/config",
            "--store=redis://redis:6379",
        ],
    );
    let mapping = mapping(&KUBERNETES, &[]);
    let mut applied = mapping.applied.clone();
    applied.sort_unstable();
    let mut all: Vec<&str> = KUBERNETES.iter().map(|(name, _)| *name).collect();
    all.sort_unstable();
    assert_eq!(applied, all, "every variable of the example is honoured");
}

#[test]
fn listeners_take_the_set_parts_and_keep_ratekeepers_for_the_rest() {
    // A service port alone listens on every interface, as with the reference.
    check(&[("PORT", "9000")], &["--http-addr=0.0.0.0:9000"]);
    check(&[("GRPC_PORT", "9001")], &["--grpc-addr=0.0.0.0:9001"]);
    check(&[("HOST", "0.0.0.0")], &["--http-addr=0.0.0.0:8080"]);
    check(
        &[("GRPC_HOST", "[::1]"), ("GRPC_PORT", "0")],
        &["--grpc-addr=[::1]:0"],
    );
    check(&[("HOST", "localhost")], &["--http-addr=127.0.0.1:8080"]);
    check(
        &[("GRPC_UDS", "/run/rl.sock")],
        &["--grpc-uds=/run/rl.sock"],
    );
    check(&[("PROTO", "tcp")], &[]);
    // DEBUG_PORT is the admin listener, on loopback unless DEBUG_HOST says otherwise.
    check(&[("DEBUG_PORT", "7070")], &["--admin-addr=127.0.0.1:7070"]);
    check(&[("DEBUG_HOST", "::1")], &["--admin-addr=[::1]:6070"]);
    assert_eq!(refused(&[("PORT", "http")]), ["PORT"]);
    assert_eq!(refused(&[("HOST", "ratelimit.svc")]), ["HOST"]);
    assert_eq!(refused(&[("GRPC_PORT", "70000")]), ["GRPC_PORT"]);
    assert_eq!(refused(&[("PROTO", "udp")]), ["PROTO"]);
}

#[test]
fn a_debug_host_beyond_loopback_needs_the_admin_token() {
    let open = [("DEBUG_HOST", "0.0.0.0"), ("DEBUG_PORT", "6070")];
    assert_eq!(refused(&open), ["DEBUG_HOST"]);
    let error = mapping(&open, &[]).errors[0].to_string();
    assert!(error.contains("--admin-token-file"), "{error}");
    let with_token = mapping(&open, &["admin_token_file"]);
    assert!(with_token.errors.is_empty(), "{:?}", with_token.errors);
    assert_eq!(
        with_token.args().collect::<Vec<_>>(),
        ["--admin-addr=0.0.0.0:6070"]
    );
    // ratekeeper's own --admin-addr wins, so DEBUG_HOST opens nothing.
    let ours = mapping(&open, &["admin_addr"]);
    assert!(ours.errors.is_empty() && ours.flags.is_empty(), "{ours:?}");
}

#[test]
fn grpc_tls_is_on_only_with_use_tls_and_its_files() {
    check(
        &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/tls/cert.pem"),
            ("GRPC_SERVER_TLS_KEY", "/tls/key.pem"),
            ("GRPC_CLIENT_TLS_CACERT", "/tls/ca.pem"),
            ("GRPC_CLIENT_TLS_SAN", "envoy.local"),
        ],
        &[
            "--grpc-tls-cert=/tls/cert.pem",
            "--grpc-tls-key=/tls/key.pem",
            "--grpc-tls-client-ca=/tls/ca.pem",
            "--grpc-tls-client-san=envoy.local",
        ],
    );
    assert_eq!(
        refused(&[("GRPC_SERVER_USE_TLS", "true")]),
        ["GRPC_SERVER_USE_TLS"]
    );
    assert_eq!(
        ignored(&[("GRPC_SERVER_TLS_CERT", "/tls/cert.pem")]),
        ["GRPC_SERVER_TLS_CERT"]
    );
    assert_eq!(
        refused(&[("GRPC_SERVER_USE_TLS", "yes")]),
        ["GRPC_SERVER_USE_TLS"],
        "Go's booleans only"
    );
}

/// Envoy Gateway names the client CA `GRPC_SERVER_TLS_CA_CERT` (its Envoy presents a client
/// certificate): it asks for one as the reference's `GRPC_CLIENT_TLS_CACERT` does; both
/// naming different files is refused, never a guess.
#[test]
fn envoy_gateways_client_ca_variable_asks_for_client_certificates() {
    let tls = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ];
    let with = |more: &[(&'static str, &'static str)]| [&tls[..], more].concat();
    check(
        &with(&[("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt")]),
        &[
            "--grpc-tls-cert=/certs/tls.crt",
            "--grpc-tls-key=/certs/tls.key",
            "--grpc-tls-client-ca=/certs/ca.crt",
        ],
    );
    check(
        &with(&[
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
        ]),
        &[
            "--grpc-tls-cert=/certs/tls.crt",
            "--grpc-tls-key=/certs/tls.key",
            "--grpc-tls-client-ca=/certs/ca.crt",
        ],
    );
    assert_eq!(
        refused(&with(&[
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("GRPC_CLIENT_TLS_CACERT", "/other/ca.crt"),
        ])),
        ["GRPC_SERVER_TLS_CA_CERT"]
    );
    assert_eq!(
        ignored(&[("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt")]),
        ["GRPC_SERVER_TLS_CA_CERT"],
        "without GRPC_SERVER_USE_TLS, TLS stays off"
    );
}

#[test]
fn logs_take_the_references_levels_and_formats() {
    check(&[("LOG_LEVEL", "WARNING")], &["--log=warn"]);
    check(&[("LOG_LEVEL", "fatal")], &["--log=error"]);
    check(&[("LOG_LEVEL", "info")], &["--log=info"]);
    check(&[("LOG_LEVEL", "trace")], &["--log=ratekeeper=trace,info"]);
    check(&[("LOG_FORMAT", "json")], &["--log-format=json"]);
    assert_eq!(refused(&[("LOG_LEVEL", "loud")]), ["LOG_LEVEL"]);
    assert_eq!(refused(&[("LOG_FORMAT", "xml")]), ["LOG_FORMAT"]);
}

#[test]
fn the_limits_files_are_runtime_root_subdirectory_and_appdirectory() {
    check(&[("RUNTIME_ROOT", "/data")], &["--config=/data/config"]);
    check(
        &[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_APPDIRECTORY", "limits"),
        ],
        &["--config=/data/limits"],
    );
    // filepath.Join's way: "/" adds nothing.
    check(
        &[("RUNTIME_ROOT", "/srv"), ("RUNTIME_SUBDIRECTORY", "/")],
        &["--config=/srv/config"],
    );
    check(
        &[("RUNTIME_SUBDIRECTORY", "ratelimit")],
        &["--config=/srv/runtime_data/current/ratelimit/config"],
    );
    check(&[("RUNTIME_WATCH_ROOT", "true")], &[]);
    assert_eq!(
        ignored(&[("RUNTIME_IGNOREDOTFILES", "false")]),
        ["RUNTIME_IGNOREDOTFILES"]
    );
    check(
        &[
            ("CONFIG_TYPE", "FILE"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ],
        &["--config-source=file", "--start-without-config"],
    );
}

#[test]
fn xds_takes_its_server_node_headers_and_backoff() {
    check(
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000"),
            ("CONFIG_GRPC_XDS_NODE_ID", "rl-1"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone:a,team=b"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-token:t"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1m30s"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "2m"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false"),
        ],
        &[
            "--config-source=xds",
            "--xds-server=xds:18000",
            "--xds-node-id=rl-1",
            "--xds-node-metadata=zone:a,team=b",
            "--xds-header=x-token:t",
            "--xds-backoff-initial=90s",
            "--xds-backoff-max=120s",
        ],
    );
    check(
        &[
            ("CONFIG_TYPE", "grpc_xds_sotw"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "500ms"),
        ],
        &[
            "--config-source=xds",
            "--xds-server=xds:18000",
            "--xds-backoff-initial=500ms",
        ],
    );
    assert_eq!(
        refused(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")]),
        ["CONFIG_TYPE"],
        "no localhost:18000 default"
    );
    assert_eq!(refused(&[("CONFIG_TYPE", "CONSUL")]), ["CONFIG_TYPE"]);
    // With files, the xDS variables are unused, as in the reference.
    assert_eq!(
        ignored(&[("CONFIG_GRPC_XDS_NODE_ID", "rl-1")]),
        ["CONFIG_GRPC_XDS_NODE_ID"]
    );
}

/// Envoy Gateway's rate limit Deployment: its control plane over mutual TLS.
const ENVOY_GATEWAY_XDS: [(&str, &str); 6] = [
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    (
        "CONFIG_GRPC_XDS_SERVER_URL",
        "envoy-gateway.envoy-gateway-system.svc.cluster.local:18001",
    ),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
];

#[test]
fn xds_over_tls_takes_the_ca_the_client_certificate_and_the_san() {
    check(
        &ENVOY_GATEWAY_XDS,
        &[
            "--config-source=xds",
            "--xds-server=envoy-gateway.envoy-gateway-system.svc.cluster.local:18001",
            "--xds-tls",
            "--xds-tls-cert=/certs/tls.crt",
            "--xds-tls-key=/certs/tls.key",
            "--xds-tls-ca=/certs/ca.crt",
        ],
    );
    let mut all: Vec<&str> = ENVOY_GATEWAY_XDS.iter().map(|(name, _)| *name).collect();
    let mut applied = mapping(&ENVOY_GATEWAY_XDS, &[]).applied;
    all.sort_unstable();
    applied.sort_unstable();
    assert_eq!(applied, all, "every variable is honoured");
    let mut args = vec!["ratekeeper".to_owned(), "serve".to_owned()];
    args.extend(flags(&ENVOY_GATEWAY_XDS));
    let cli = Cli::try_parse_from(&args).expect("ratekeeper takes the flags");
    let Command::Serve(serve) = cli.command else {
        panic!("serve expected");
    };
    let xds = serve
        .server_options()
        .expect("valid flags")
        .xds
        .expect("xds");
    assert_eq!(
        xds.url(),
        "https://envoy-gateway.envoy-gateway-system.svc.cluster.local:18001"
    );
    assert_eq!(
        xds.tls,
        Some(crate::envoy::xds::XdsTlsOptions {
            ca: Some("/certs/ca.crt".into()),
            identity: Some(("/certs/tls.crt".into(), "/certs/tls.key".into())),
            san: None,
        })
    );
    // The SAN; the system's roots without a CA; TLS without a client certificate.
    check(
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "10.0.0.5:18000"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "True"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.internal"),
        ],
        &[
            "--config-source=xds",
            "--xds-server=10.0.0.5:18000",
            "--xds-tls",
            "--xds-tls-san=xds.internal",
        ],
    );
    // A certificate without its key is ignored, as the reference ignores it.
    let half = mapping(
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ],
        &[],
    );
    assert!(half.errors.is_empty(), "{:?}", half.errors);
    let warned: Vec<&str> = half.warnings.iter().map(|note| note.variable).collect();
    assert_eq!(warned, ["CONFIG_GRPC_XDS_CLIENT_TLS_CERT"]);
    assert!(!half.args().any(|arg| arg.starts_with("--xds-tls-cert")));
    // Without USE_TLS the files are unused, and TLS stays off.
    let plain = mapping(
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ],
        &[],
    );
    assert_eq!(
        plain.args().collect::<Vec<_>>(),
        ["--config-source=xds", "--xds-server=xds:18000"]
    );
    assert_eq!(
        plain.warnings[0].variable,
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"
    );
    assert_eq!(
        refused(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "yes"),
        ]),
        ["CONFIG_GRPC_XDS_SERVER_USE_TLS"]
    );
}

#[test]
fn our_xds_tls_flags_win_over_the_variables() {
    let ours = mapping(
        &ENVOY_GATEWAY_XDS,
        &["xds_tls_ca", "xds_tls_cert", "xds_tls_key"],
    );
    assert!(ours.errors.is_empty(), "{:?}", ours.errors);
    assert_eq!(
        ours.args().collect::<Vec<_>>(),
        [
            "--config-source=xds",
            "--xds-server=envoy-gateway.envoy-gateway-system.svc.cluster.local:18001",
            "--xds-tls",
        ]
    );
    for (variable, flag) in [
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "--xds-tls-cert"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "--xds-tls-key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "--xds-tls-ca"),
    ] {
        assert!(
            ours.overridden.contains(&(variable, flag)),
            "{variable}: {:?}",
            ours.overridden
        );
    }
}

#[test]
fn switches_and_header_names_map_to_their_flags() {
    check(
        &[
            ("SHADOW_MODE", "true"),
            ("QUOTA_MODE", "1"),
            ("RESPONSE_DYNAMIC_METADATA", "T"),
            ("MERGE_DOMAIN_CONFIG", "True"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "TRUE"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_LIMIT_HEADER", "X-Limit"),
            ("LIMIT_REMAINING_HEADER", "X-Remaining"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
            ("NEAR_LIMIT_RATIO", "0.9"),
        ],
        &[
            "--merge-domain-config",
            "--near-limit-ratio=0.9",
            "--response-headers=true",
            "--header-limit=X-Limit",
            "--header-remaining=X-Remaining",
            "--header-reset=X-Reset",
            "--healthy-only-with-config",
            "--shadow-mode",
            "--quota-mode",
            "--response-dynamic-metadata",
        ],
    );
    // false is ratekeeper's default: honoured, nothing to add.
    let off = mapping(&[("SHADOW_MODE", "false"), ("QUOTA_MODE", "0")], &[]);
    assert!(off.flags.is_empty() && off.warnings.is_empty() && off.errors.is_empty());
    assert_eq!(off.applied, ["SHADOW_MODE", "QUOTA_MODE"]);
    assert_eq!(
        refused(&[("NEAR_LIMIT_RATIO", "1.5")]),
        ["NEAR_LIMIT_RATIO"]
    );
}

#[test]
fn redis_urls_follow_redis_type_auth_and_tls() {
    check(
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.internal:6380"),
            ("REDIS_AUTH", "app:p@ss word"),
            ("REDIS_TLS", "true"),
            ("REDIS_POOL_SIZE", "20"),
            ("REDIS_TIMEOUT", "250ms"),
        ],
        &[
            "--store=rediss://app:p%40ss%20word@redis.internal:6380",
            "--store-pool=20",
            "--store-timeout=250ms",
        ],
    );
    check(
        &[("REDIS_URL", "r:6379"), ("REDIS_AUTH", "secret")],
        &["--store=redis://:secret@r:6379"],
    );
    check(
        &[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ],
        &["--store=redis-sentinel://s1:26379,s2:26379/mymaster"],
    );
    check(
        &[("REDIS_TYPE", "cluster"), ("REDIS_URL", "a:7000,b:7001")],
        &["--store=redis-cluster://a:7000,b:7001"],
    );
    check(
        &[
            ("REDIS_URL", "redis://u:p@r:6379/2"),
            ("REDIS_AUTH", "other"),
        ],
        &["--store=redis://u:p@r:6379/2"],
    );
    // Without BACKEND_TYPE or REDIS_URL the counters stay in memory.
    assert_eq!(
        ignored(&[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_POOL_SIZE", "5")]),
        ["REDIS_SOCKET_TYPE", "REDIS_POOL_SIZE"]
    );
    assert_eq!(
        refused(&[("REDIS_URL", "/var/run/redis.sock")]),
        ["REDIS_SOCKET_TYPE"]
    );
    assert_eq!(
        refused(&[("REDIS_SOCKET_TYPE", "unix"), ("REDIS_URL", "r:1")]),
        ["REDIS_SOCKET_TYPE"]
    );
    assert_eq!(refused(&[("BACKEND_TYPE", "redis")]), ["BACKEND_TYPE"]);
    assert_eq!(refused(&[("REDIS_URL", "redis")]), ["REDIS_URL"]);
    assert_eq!(
        refused(&[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "s1:26379")]),
        ["REDIS_URL"]
    );
    assert_eq!(
        refused(&[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "m,s:1"),
            ("REDIS_TLS", "true")
        ]),
        ["REDIS_TLS"]
    );
    assert_eq!(
        refused(&[
            ("REDIS_URL", "r:1"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", "/tls.crt")
        ]),
        ["REDIS_TLS_CLIENT_CERT"],
        "a certificate without its key"
    );
    assert_eq!(
        refused(&[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "m,s:1"),
            ("REDIS_SENTINEL_AUTH", "x")
        ]),
        ["REDIS_SENTINEL_AUTH"]
    );
    assert_eq!(
        refused(&[("REDIS_URL", "r:1"), ("REDIS_POOL_SIZE", "0")]),
        ["REDIS_POOL_SIZE"]
    );
}

/// Envoy Gateway's Redis: TLS with a client certificate and a CA from mounted files, a
/// password, the URL from a Secret. The files become `--store-tls-*`; ours win.
#[test]
fn envoy_gateway_redis_tls_files_become_the_store_tls_flags() {
    let env = [
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.eg:6379"),
        ("REDIS_AUTH", "secret"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
        ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
        ("REDIS_TLS_CACERT", "/redis-certs/ca.crt"),
    ];
    check(
        &env,
        &[
            "--store=rediss://:secret@redis.eg:6379",
            "--store-tls-cert=/redis-certs/tls.crt",
            "--store-tls-key=/redis-certs/tls.key",
            "--store-tls-ca=/redis-certs/ca.crt",
        ],
    );
    let skip = [
        ("REDIS_URL", "10.0.0.5:6379"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ];
    check(
        &skip,
        &[
            "--store=rediss://10.0.0.5:6379",
            "--store-tls-skip-hostname-verification",
        ],
    );
    check(
        &[
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "a:1,b:2"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/ca.crt"),
        ],
        &["--store=rediss-cluster://a:1,b:2", "--store-tls-ca=/ca.crt"],
    );
    let ours = mapping(&env, &["store_tls_ca"]);
    assert!(
        ours.overridden
            .contains(&("REDIS_TLS_CACERT", "--store-tls-ca")),
        "{ours:?}"
    );
    assert!(!ours.args().any(|arg| arg.starts_with("--store-tls-ca")));
    let plain = mapping(
        &[("REDIS_URL", "r:1"), ("REDIS_TLS_CACERT", "/ca.crt")],
        &[],
    );
    assert_eq!(
        plain.warnings[0].to_string(),
        "REDIS_TLS_CACERT: ignored: REDIS_TLS is not true"
    );
    assert!(!plain.args().any(|arg| arg.starts_with("--store-tls")));
}

#[test]
fn tracing_speaks_either_protocol_with_the_references_sampling_and_resource() {
    // Envoy Gateway's: the reference's default protocol (http) to a base endpoint.
    check(
        &[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
            ("TRACING_SERVICE_NAME", "rl"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "rl-0"),
            ("TRACING_SAMPLING_RATE", "0.25"),
        ],
        &[
            "--otlp-protocol=http",
            "--otlp-endpoint=http://otel:4318",
            "--otlp-service-name=rl",
            "--otlp-service-namespace=envoy-gateway-system",
            "--otlp-service-instance-id=rl-0",
            "--otlp-sampling-rate=0.25",
        ],
    );
    check(
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://otel:4317"),
        ],
        &[
            "--otlp-protocol=grpc",
            "--otlp-traces-endpoint=http://otel:4317",
        ],
    );
    assert_eq!(
        refused(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318")
        ]),
        ["TRACING_EXPORTER_PROTOCOL"]
    );
    assert_eq!(
        refused(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "http")
        ]),
        ["TRACING_ENABLED"],
        "no endpoint"
    );
    for rate in ["1.5", "-0.1", "half"] {
        assert_eq!(
            refused(&[
                ("TRACING_ENABLED", "true"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
                ("TRACING_SAMPLING_RATE", rate)
            ]),
            ["TRACING_SAMPLING_RATE"],
            "{rate}"
        );
    }
    let ours = mapping(
        &[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
        ],
        &["otlp_protocol", "otlp_endpoint"],
    );
    assert!(ours.args().next().is_none(), "{:?}", ours.flags);
    assert!(
        ours.overridden
            .contains(&("TRACING_ENABLED", "--otlp-protocol"))
            && ours
                .overridden
                .contains(&("TRACING_ENABLED", "--otlp-endpoint")),
        "{:?}",
        ours.overridden
    );
}

/// The mapped tracing flags parse, and `Cli::otlp` resolves the endpoint as OTLP/HTTP
/// defines it: `/v1/traces` added to OTEL_EXPORTER_OTLP_ENDPOINT, nothing to
/// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.
#[test]
fn the_otlp_http_endpoint_is_resolved_as_the_spec_says() {
    let otlp = |args: &[&str]| {
        let mut argv = vec!["ratekeeper", "serve"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("parses").otlp()
    };
    let base = otlp(&["--otlp-protocol=http", "--otlp-endpoint=http://otel:4318/"]);
    assert_eq!(
        base.map(|otlp| otlp.endpoint).as_deref(),
        Some("http://otel:4318/v1/traces")
    );
    let full = otlp(&[
        "--otlp-protocol=http",
        "--otlp-endpoint=http://otel:4318",
        "--otlp-traces-endpoint=http://otel:4318/custom",
    ]);
    assert_eq!(
        full.map(|otlp| otlp.endpoint).as_deref(),
        Some("http://otel:4318/custom")
    );
    let grpc = otlp(&["--otlp-endpoint=http://otel:4317"]).expect("on");
    assert_eq!(
        (grpc.endpoint.as_str(), grpc.http),
        ("http://otel:4317", false)
    );
    assert!(otlp(&[]).is_none(), "off without an endpoint");
    let error = Cli::try_parse_from(["ratekeeper", "serve", "--otlp-sampling-rate=2"])
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("--otlp-sampling-rate"), "{error}");
}

#[test]
fn ours_win_over_the_references_and_are_reported() {
    let env = [
        ("PORT", "9000"),
        ("LOG_LEVEL", "debug"),
        ("REDIS_URL", "r:6379"),
        ("SHADOW_MODE", "true"),
        ("GRPC_PORT", "9001"),
    ];
    let mapping = mapping(&env, &["http_addr", "log", "store", "shadow_mode"]);
    assert!(
        mapping.errors.is_empty() && mapping.warnings.is_empty(),
        "{mapping:?}"
    );
    assert_eq!(
        mapping.args().collect::<Vec<_>>(),
        ["--grpc-addr=0.0.0.0:9001"]
    );
    assert_eq!(
        mapping.overridden,
        [
            ("PORT", "--http-addr"),
            ("LOG_LEVEL", "--log"),
            ("SHADOW_MODE", "--shadow-mode"),
            ("REDIS_URL", "--store"),
        ]
    );
    let summary = mapping.summary().expect("a line");
    assert!(
        summary.contains("GRPC_PORT")
            && summary.contains("won over")
            && summary.contains("PORT (--http-addr)"),
        "{summary}"
    );
}

#[test]
fn what_ratekeeper_does_not_do_is_refused_naming_the_variable() {
    for (env, variable) in [
        (&[("BACKEND_TYPE", "memcache")][..], "BACKEND_TYPE"),
        (&[("REDIS_PERSECOND", "true")], "REDIS_PERSECOND"),
        (&[("USE_DOG_STATSD", "true")], "USE_DOG_STATSD"),
        (&[("CONFIG_TYPE", "KUBERNETES")], "CONFIG_TYPE"),
        (
            &[("REDIS_URL", "r:1"), ("CACHE_KEY_PREFIX", "a_")],
            "CACHE_KEY_PREFIX",
        ),
    ] {
        assert_eq!(refused(env), [variable], "{env:?}");
    }
}

#[test]
fn counting_rejected_hits_follows_stop_cache_key_increment_when_overlimit() {
    // false (the reference's default, also when set but empty) counts rejected hits.
    for value in ["false", "0", ""] {
        check(
            &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", value)],
            &["--count-rejected-hits"],
        );
        let mapping = mapping(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", value)], &[]);
        assert_eq!(mapping.applied, ["STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"]);
    }
    // Unset: ratekeeper's default (a rejected request consumes nothing).
    assert!(mapping(&[], &[]).flags.is_empty());
    // Ours wins: --count-rejected-hits given keeps it, whatever the variable says.
    let ours = mapping(
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
        &["count_rejected_hits"],
    );
    assert!(ours.flags.is_empty() && ours.applied.is_empty());
    assert_eq!(
        ours.overridden,
        [(
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
            "--count-rejected-hits"
        )]
    );
    // And the flag means what the variable meant.
    let mut args = vec!["ratekeeper".to_owned(), "serve".to_owned()];
    args.extend(flags(&[(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "false",
    )]));
    let cli = Cli::try_parse_from(&args).expect("ratekeeper takes the flag");
    let Command::Serve(serve) = cli.command else {
        panic!("serve expected");
    };
    assert!(
        serve
            .server_options()
            .expect("valid flags")
            .limiter
            .count_rejected_hits
    );
}

#[test]
fn harmless_variables_are_ignored_with_a_warning_that_says_so() {
    let env = [
        // Set without USE_STATSD or USE_PROMETHEUS, they change nothing.
        ("STATSD_HOST", "statsd"),
        ("STATSD_PORT", "9125"),
        ("STATS_FLUSH_INTERVAL", "5s"),
        ("EXTRA_TAGS", "env:prod"),
        ("PROMETHEUS_ADDR", ":9090"),
        ("GRPC_MAX_CONNECTION_AGE", "1h"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "60"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
        ("REDIS_PIPELINE_WINDOW", "150us"),
    ];
    let mut warned = ignored(&env);
    warned.sort_unstable();
    let mut all: Vec<&str> = env.iter().map(|(name, _)| *name).collect();
    all.sort_unstable();
    assert_eq!(warned, all);
    // Equal to ratekeeper's behaviour: accepted without a word.
    let same = mapping(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")], &[]);
    assert!(same.warnings.is_empty() && same.errors.is_empty() && same.flags.is_empty());
    assert_eq!(same.applied, ["STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"]);
}

/// Envoy Gateway's two ways: a statsd_exporter sidecar fed by `USE_STATSD`, or the
/// reference's own Prometheus listener with its mapping file.
#[test]
fn stats_map_to_the_statsd_push_and_the_prometheus_listener() {
    check(
        &[("USE_STATSD", "true"), ("STATSD_PORT", "9125")],
        &["--statsd=localhost:9125"],
    );
    check(
        &[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "fd00::1"),
            ("STATSD_PORT", "9125"),
            ("STATS_FLUSH_INTERVAL", "5s"),
            ("EXTRA_TAGS", "env:prod,zone:a"),
        ],
        &[
            "--statsd=[fd00::1]:9125",
            "--statsd-flush-interval=5s",
            "--stats-tag=env:prod,zone:a",
        ],
    );
    let newer = [
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":19001"),
        ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
    ];
    let expected = [
        "--prometheus-addr=:19001",
        "--prometheus-mapping=/etc/statsd-exporter/conf.yaml",
    ];
    check(&newer, &expected);
    check(
        &[("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "/stats")],
        &["--prometheus-addr=:9090", "--prometheus-path=/stats"],
    );
    // What the flags mean: the listener on every interface, the mapping file.
    let mut args = vec!["ratekeeper".to_owned(), "serve".to_owned()];
    args.extend(flags(&newer));
    let cli = Cli::try_parse_from(&args).expect("ratekeeper takes the flags");
    let Command::Serve(serve) = cli.command else {
        panic!("serve expected");
    };
    let reference = serve.server_options().expect("valid flags").reference;
    let prometheus = reference.prometheus.expect("a listener");
    assert_eq!(
        prometheus.addr,
        "0.0.0.0:19001".parse().expect("an address")
    );
    assert_eq!(prometheus.path, "/metrics");
    assert_eq!(
        prometheus.mapping.as_deref(),
        Some(std::path::Path::new("/etc/statsd-exporter/conf.yaml"))
    );
    assert_eq!(reference.statsd, None);
    // The interval is read at each scrape with Prometheus; nothing at all with
    // DISABLE_STATS, as the reference.
    let scrape = [("USE_PROMETHEUS", "true"), ("STATS_FLUSH_INTERVAL", "1s")];
    assert_eq!(mapping(&scrape, &[]).warnings.len(), 1);
    let disabled = [("DISABLE_STATS", "true"), ("USE_STATSD", "true")];
    assert_eq!(ignored(&disabled), ["USE_STATSD"]);
    // Ours win.
    let ours = mapping(&[("USE_STATSD", "true")], &["statsd"]);
    assert!(ours.flags.is_empty());
    assert_eq!(ours.overridden, [("USE_STATSD", "--statsd")]);
}

#[test]
fn stats_the_reference_would_refuse_are_refused() {
    for (env, variable) in [
        (
            &[("USE_STATSD", "true"), ("USE_PROMETHEUS", "true")][..],
            "USE_PROMETHEUS",
        ),
        (
            &[("USE_STATSD", "true"), ("STATSD_PORT", "x")],
            "STATSD_PORT",
        ),
        (
            &[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", "nowhere")],
            "PROMETHEUS_ADDR",
        ),
        (
            &[("USE_STATSD", "true"), ("EXTRA_TAGS", "a:b,c")],
            "EXTRA_TAGS",
        ),
    ] {
        assert_eq!(refused(env), [variable], "{env:?}");
    }
}

#[test]
fn every_reference_variable_is_answered_and_in_the_manuals_table() {
    let manual = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/migrating.md"));
    let table = manual
        .split("## Environment variables")
        .nth(1)
        .expect("docs/migrating.md has the variables' section");
    for &variable in VARIABLES {
        for value in ["true", "false", "1", "x"] {
            let mapping = mapping(&[(variable, value)], &[]);
            assert!(
                mapping.mentions(variable),
                "{variable}={value}: {mapping:?}"
            );
        }
        assert!(
            table.contains(&format!("`{variable}`")),
            "docs/migrating.md's table lacks `{variable}`"
        );
    }
    assert!(mapping(&[("UNRELATED", "1")], &[]).is_empty());
}

#[test]
fn the_summary_names_what_was_applied_and_hides_the_redis_password() {
    let mapping = mapping(
        &[
            ("PORT", "9000"),
            ("REDIS_URL", "r:1"),
            ("REDIS_AUTH", "hunter2"),
        ],
        &[],
    );
    let summary = mapping.summary().expect("a line");
    assert!(summary.contains("PORT, REDIS_URL, REDIS_AUTH"), "{summary}");
    assert!(summary.contains("--store=redis://:***@r:1"), "{summary}");
    assert!(!summary.contains("hunter2"), "{summary}");
    assert!(mapping.args().any(|arg| arg.contains("hunter2")));
    assert_eq!(map(&BTreeMap::new(), &BTreeSet::new()).summary(), None);
}

#[test]
fn the_flags_are_ones_ratekeeper_parses_into_the_same_meaning() {
    let env = [
        ("HOST", "0.0.0.0"),
        ("PORT", "18080"),
        ("GRPC_PORT", "18081"),
        ("DEBUG_PORT", "16070"),
        ("REDIS_URL", "redis:6379"),
        ("REDIS_POOL_SIZE", "12"),
        ("REDIS_TIMEOUT", "2s"),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("SHADOW_MODE", "true"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("NEAR_LIMIT_RATIO", "0.5"),
        ("LOG_LEVEL", "warn"),
        ("LOG_FORMAT", "json"),
    ];
    let mut args = vec!["ratekeeper".to_owned(), "serve".to_owned()];
    args.extend(flags(&env));
    let cli = Cli::try_parse_from(&args).expect("ratekeeper takes the flags");
    assert_eq!(cli.log, "warn");
    assert!(matches!(cli.log_format, crate::cli::LogFormat::Json));
    let Command::Serve(serve) = cli.command else {
        panic!("serve expected");
    };
    assert_eq!(
        serve.limits.config,
        std::path::Path::new("/data/ratelimit/config")
    );
    let options = serve.server_options().expect("valid flags");
    assert_eq!(options.http_addr.to_string(), "0.0.0.0:18080");
    assert_eq!(options.grpc_addr.to_string(), "0.0.0.0:18081");
    assert_eq!(options.admin_addr.to_string(), "127.0.0.1:16070");
    let crate::store::StoreOptions::Redis(redis) = options.store else {
        panic!("a Redis store: {:?}", options.store)
    };
    assert_eq!((redis.pool, redis.timeout), (12, Duration::from_secs(2)));
    assert!(options.limiter.shadow_mode && options.limiter.response_headers);
}

#[test]
fn go_durations_parse_as_go_does() {
    let ms = Duration::from_millis;
    for (text, expected) in [
        ("0", Some(Duration::ZERO)),
        ("10s", Some(ms(10_000))),
        ("1m30s", Some(ms(90_000))),
        ("1.5h", Some(ms(5_400_000))),
        ("150us", Some(Duration::from_micros(150))),
        ("300ms", Some(ms(300))),
        ("24h", Some(ms(86_400_000))),
        ("10", None),
        ("s", None),
        ("-1s", None),
        ("1d", None),
        ("", None),
    ] {
        assert_eq!(go_duration(text), expected, "{text:?}");
    }
}

/// As the reference's entry point (`/bin/ratelimit`), its listener defaults apply: every
/// interface, 8080 and 8081, unless the host or port of a listener is set; nothing else
/// (no Redis, the admin listener on loopback).
#[test]
fn the_reference_entry_point_listens_where_the_reference_does() {
    let defaults = |env: &[(&str, &str)]| {
        let mut env: BTreeMap<String, String> = env
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        entry_point_defaults(&mut env);
        let mapping = map(&env, &BTreeSet::new());
        assert!(mapping.errors.is_empty(), "{:?}", mapping.errors);
        mapping.args().collect::<Vec<String>>()
    };
    assert_eq!(
        defaults(&[]),
        ["--http-addr=0.0.0.0:8080", "--grpc-addr=0.0.0.0:8081"]
    );
    assert_eq!(
        defaults(&[("GRPC_PORT", "9000"), ("HOST", "127.0.0.1")]),
        ["--http-addr=127.0.0.1:8080", "--grpc-addr=0.0.0.0:9000"]
    );
    // `ratekeeper serve` keeps its own loopback defaults: unset variables change nothing.
    assert!(mapping(&[], &[]).args().next().is_none());
}

/// Envoy Gateway always sets `REDIS_URL` (its `rateLimit.backend` requires one); with
/// ratekeeper's peers given (its cluster-mode patch), the cluster keeps the counters and the
/// Redis variables are ignored, each with a warning, instead of stopping the start.
#[test]
fn peers_win_over_envoy_gateways_redis_with_a_warning() {
    let env = [
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.redis.svc:6379"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
        ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
    ];
    for given in ["peers", "peer_dns"] {
        let mapping = mapping(&env, &[given]);
        assert!(mapping.errors.is_empty(), "{:?}", mapping.errors);
        assert!(
            mapping.args().all(|flag| !flag.starts_with("--store")),
            "{:?}",
            mapping.flags
        );
        let warned: Vec<&str> = mapping.warnings.iter().map(|w| w.variable).collect();
        assert_eq!(warned, env.map(|(name, _)| name), "{given}");
        for warning in &mapping.warnings {
            assert!(warning.text.contains("cluster mode"), "{warning}");
        }
    }
    // Without peers, the same variables choose the Redis store.
    let mapping = mapping(&env[..2], &[]);
    assert!(
        mapping
            .args()
            .any(|flag| flag.starts_with("--store=redis://")),
        "{:?}",
        mapping.flags
    );
}
