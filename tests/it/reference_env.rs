//! The reference service's environment given to ratekeeper's binary, with no ratekeeper
//! flag: the Kubernetes example's variables put it on the same ports, with the same limits
//! files, counting in the same Redis, and `DEBUG_PORT` answers `/rlconfig`; a variable
//! ratekeeper cannot honour stops the start naming it, a harmless one is a warning.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::{
    Ratekeeper, RedisServer, TempDir, away_from_a_window_end, edge_decide, free_port, grpc_client,
    http_get, ratekeeper_command, run_to_end, write_config,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      unit: hour
      requests_per_unit: 3
";

/// Istio's `samples/ratelimit/rate-limit-service.yaml` (the reference's Kubernetes
/// example), with the runtime root and the Redis address of this test; the ports are the
/// example's defaults unless the test sets `PORT`, `GRPC_PORT` and `DEBUG_PORT`.
fn kubernetes_env(root: &Path, redis: &RedisServer) -> Vec<(String, String)> {
    [
        ("LOG_LEVEL", "debug".to_owned()),
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port())),
        ("USE_STATSD", "false".to_owned()),
        ("RUNTIME_ROOT", root.to_string_lossy().into_owned()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
        ("RUNTIME_WATCH_ROOT", "false".to_owned()),
        ("RUNTIME_IGNOREDOTFILES", "true".to_owned()),
        ("HOST", "::".to_owned()),
        ("GRPC_HOST", "::".to_owned()),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect()
}

/// `ratekeeper serve` with `env` and no flag.
fn serve_command(env: &[(String, String)]) -> Command {
    let mut command = ratekeeper_command();
    command.arg("serve");
    command.envs(env.iter().map(|(name, value)| (name, value)));
    command
}

/// A ratekeeper started from the example's environment on free ports; its ports.
fn start(env: &[(String, String)]) -> (Ratekeeper, [u16; 3]) {
    let ports = [free_port(), free_port(), free_port()];
    let mut env = env.to_vec();
    for (name, port) in ["PORT", "GRPC_PORT", "DEBUG_PORT"].into_iter().zip(ports) {
        env.push((name.to_owned(), port.to_string()));
    }
    let node = Ratekeeper::start_command(&mut serve_command(&env), IpAddr::V6(Ipv6Addr::LOCALHOST));
    (node, ports)
}

/// Whether a TCP socket listens on every IPv4 interface at `port` (`/proc/net/tcp`).
fn listens_on_every_interface(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("reads /proc/net/tcp");
    let wanted = format!("00000000:{port:04X}");
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&wanted.as_str()) && fields.get(3) == Some(&"0A")
    })
}

/// The image answers to the reference's entry point, `/bin/ratelimit`, which Envoy Gateway's
/// Deployment runs with no argument: it serves, reads the reference's environment, and
/// applies the reference's listener defaults, every interface (the ports are set here, to
/// free ones; the hosts are not).
#[test]
fn the_reference_entry_point_serves_on_every_interface_with_no_argument() {
    let dir = TempDir::new("entry-point");
    let config = dir.path().join("rl").join("config");
    std::fs::create_dir_all(&config).expect("the runtime directory");
    write_config(&config, "limits.yaml", LIMITS);
    let link = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ratekeeper"), &link).expect("a link");
    let (http, grpc) = (free_port(), free_port());
    let mut command = crate::support::ratekeeper_command_as(&link);
    command.envs([
        ("RUNTIME_ROOT", dir.path().to_string_lossy().into_owned()),
        ("RUNTIME_SUBDIRECTORY", "rl".to_owned()),
        ("PORT", http.to_string()),
        ("GRPC_PORT", grpc.to_string()),
    ]);
    let node = Ratekeeper::start_command(&mut command, IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    for port in [http, grpc] {
        assert!(
            listens_on_every_interface(port),
            "0.0.0.0:{port}: {}",
            node.stderr()
        );
    }
    // The admin listener stays on loopback.
    let admin = node.admin_addr();
    assert!(admin.ip().is_loopback(), "{admin}");
    let limits = http_get(node.http_addr(), "/rlconfig", &[]).expect("answers");
    assert!(
        limits.body.contains("edge.api_key: unit=HOUR"),
        "{}",
        limits.body
    );
}

/// Envoy Gateway runs the container with a read-only root filesystem: the reference's entry
/// point, in a mount namespace whose root (the limits files' directory included) is
/// remounted read-only, starts, answers, reloads its limits on SIGHUP and exits cleanly on
/// SIGTERM, and never met a read-only file system on the way. Needs root (`unshare`), as
/// the other namespace tests.
#[tokio::test(flavor = "multi_thread")]
async fn the_reference_entry_point_runs_on_a_read_only_root_filesystem() {
    let dir = TempDir::new("read-only-root");
    let config = dir.path().join("rl").join("config");
    std::fs::create_dir_all(&config).expect("the runtime directory");
    write_config(&config, "limits.yaml", LIMITS);
    let link = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ratekeeper"), &link).expect("a link");
    let (http, grpc) = (free_port(), free_port());
    // `unshare` and `sh` exec: the process signalled below is ratekeeper itself.
    let mut command = crate::support::ratekeeper_command_as(Path::new("unshare"));
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -o remount,bind,ro / && exec "$0""#)
        .arg(&link)
        .envs([
            ("RUNTIME_ROOT", dir.path().to_string_lossy().into_owned()),
            ("RUNTIME_SUBDIRECTORY", "rl".to_owned()),
            ("PORT", http.to_string()),
            ("GRPC_PORT", grpc.to_string()),
            // Not the default 6070, which the test above takes at the same time.
            ("DEBUG_PORT", free_port().to_string()),
        ]);
    let mut node = tokio::task::spawn_blocking(move || {
        Ratekeeper::start_command(&mut command, IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
    })
    .await
    .expect("starts");
    let written = std::fs::write(dir.path().join("probe"), "x");
    assert!(written.is_ok(), "the test's own view stays writable");
    let mut client = grpc_client(&node).await;
    assert_eq!(edge_decide(&mut client, "read-only").await, Code::Ok);
    node.process().signal("-HUP");
    let reloaded = node.stderr_with("SIGHUP: reloading limits");
    assert!(reloaded.contains("SIGHUP: reloading limits"), "{reloaded}");
    assert_eq!(edge_decide(&mut client, "read-only").await, Code::Ok);
    node.process().signal("-TERM");
    let exited =
        crate::support::eventually_some(Duration::from_secs(10), || node.process().exited());
    let stderr = node.stderr();
    assert!(exited.is_some_and(|status| status.success()), "{stderr}");
    assert!(!stderr.contains("Read-only file system"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kubernetes_example_environment_alone_serves_its_ports_files_and_redis() {
    let root = TempDir::new("reference-env");
    let config = root.path().join("ratelimit/config");
    std::fs::create_dir_all(config.join("..data")).expect("mkdir");
    write_config(&config, "config.yaml", LIMITS);
    // A ConfigMap mount's hidden copy: skipped, as RUNTIME_IGNOREDOTFILES asks.
    write_config(&config.join("..data"), "config.yaml", LIMITS);
    let redis_dir = TempDir::new("reference-env-redis");
    let redis = RedisServer::start(redis_dir.path(), &[]);
    let env = kubernetes_env(root.path(), &redis);
    let (first, [http, grpc, debug]) = start(&env);
    let (second, _) = start(&env);

    // HOST, GRPC_HOST (::) and the ports: every interface, the ports asked for.
    assert_eq!(
        first.http_addr(),
        SocketAddr::from((Ipv6Addr::LOCALHOST, http))
    );
    assert_eq!(
        first.grpc_addr(),
        SocketAddr::from((Ipv6Addr::LOCALHOST, grpc))
    );
    // DEBUG_PORT without DEBUG_HOST: the admin listener, on loopback.
    assert_eq!(first.admin_addr().port(), debug);
    assert!(
        first.admin_addr().ip().is_loopback(),
        "{}",
        first.admin_addr()
    );
    let applied = first.stderr_with("applied the reference service's environment");
    assert!(
        applied.contains("applied the reference service's environment: HOST, PORT, GRPC_HOST")
            && applied.contains("RUNTIME_ROOT, RUNTIME_SUBDIRECTORY")
            && applied.contains("REDIS_URL, REDIS_SOCKET_TYPE"),
        "{applied}"
    );

    // The limits of RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, counted in REDIS_URL's Redis:
    // the two processes share the 3 hits of the hour.
    away_from_a_window_end(Duration::from_secs(3600), Duration::from_secs(30)).await;
    let (mut a, mut b) = (grpc_client(&first).await, grpc_client(&second).await);
    assert_eq!(edge_decide(&mut a, "k1").await, Code::Ok);
    assert_eq!(edge_decide(&mut b, "k1").await, Code::Ok);
    assert_eq!(edge_decide(&mut a, "k1").await, Code::Ok);
    assert_eq!(edge_decide(&mut b, "k1").await, Code::OverLimit);
    assert_eq!(edge_decide(&mut a, "k1").await, Code::OverLimit);
    let keys: u64 = redis.cli(&["DBSIZE"]).trim().parse().expect("a count");
    assert!(keys >= 1, "the counter is in REDIS_URL's Redis");

    // The reference's debug port answers /rlconfig and /stats; /healthcheck too.
    let debug_addr = first.admin_addr();
    let rlconfig = http_get(debug_addr, "/rlconfig", &[]).expect("answers");
    assert_eq!(rlconfig.status, 200);
    assert!(rlconfig.body.contains("edge.api_key"), "{}", rlconfig.body);
    for path in ["/stats", "/metrics"] {
        let stats = http_get(debug_addr, path, &[]).expect("answers");
        assert_eq!(stats.status, 200, "{path}");
        assert!(stats.body.contains("ratekeeper_"), "{path}: {}", stats.body);
    }
    let health = http_get(debug_addr, "/healthcheck", &[]).expect("answers");
    assert_eq!((health.status, health.body.as_str()), (200, "OK"));
    // And PORT, the HTTP listener, as before.
    let health = http_get(first.http_addr(), "/healthcheck", &[]).expect("answers");
    assert_eq!(health.status, 200);
}

/// Runs `serve` with `env` (and `args`) to its end within a bound; its status and stderr.
fn run_serve(env: &[(&str, &str)], args: &[&str]) -> (bool, String) {
    let mut command = ratekeeper_command();
    command.arg("serve").args(args).envs(env.iter().copied());
    let (status, _, stderr) = run_to_end("ratekeeper", &mut command, Duration::from_secs(20));
    (status.success(), stderr)
}

#[test]
fn a_variable_ratekeeper_cannot_honour_stops_the_start_naming_it() {
    for (env, expected) in [
        (
            &[("BACKEND_TYPE", "memcache")][..],
            "BACKEND_TYPE: ratekeeper has no memcache",
        ),
        (
            &[("REDIS_PERSECOND", "true")],
            "REDIS_PERSECOND: ratekeeper has no separate Redis",
        ),
        (
            &[("USE_DOG_STATSD", "true")],
            "USE_DOG_STATSD: ratekeeper does not send DogStatsD",
        ),
    ] {
        let (started, stderr) = run_serve(env, &[]);
        assert!(!started, "{env:?} started");
        assert!(stderr.contains(expected), "{env:?}: {stderr}");
        assert!(stderr.contains("not starting"), "{stderr}");
    }
}

#[test]
fn a_harmless_variable_starts_with_a_warning_and_our_flags_win() {
    let dir = TempDir::new("reference-env-warn");
    write_config(dir.path(), "limits.yaml", LIMITS);
    // Ratekeeper::start_with_env gives --http-addr 127.0.0.1:0, which wins over PORT, and
    // --statsd wins over USE_STATSD's address.
    let node = Ratekeeper::start_with_env(
        dir.path(),
        &["--statsd", "127.0.0.1:9"],
        &[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "statsd"),
            ("EXPIRATION_JITTER_MAX_SECONDS", "300"),
            ("PORT", "1"),
            ("SHADOW_MODE", "true"),
        ],
    );
    assert_ne!(node.http_addr().port(), 1);
    let stderr = node.stderr_with("EXPIRATION_JITTER_MAX_SECONDS: ignored");
    assert!(
        stderr.contains("EXPIRATION_JITTER_MAX_SECONDS: ignored")
            && !stderr.contains("USE_STATSD: ignored"),
        "{stderr}"
    );
    assert!(
        stderr.contains("applied the reference service's environment: SHADOW_MODE")
            && stderr.contains("won over PORT (--http-addr)")
            && stderr.contains("USE_STATSD (--statsd), STATSD_HOST (--statsd)"),
        "{stderr}"
    );
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false` (the reference's default) counts
/// rejected hits, as the reference does: 2 of 3 used, a request of 2 is rejected and takes
/// the last one, so a request of 1 is rejected too. Unset, ratekeeper's default: the
/// rejected request consumed nothing and the 1 passes. Before, false stopped the start.
#[tokio::test(flavor = "multi_thread")]
async fn stop_cache_key_increment_when_overlimit_false_counts_rejected_hits() {
    let dir = TempDir::new("reference-env-stop");
    write_config(dir.path(), "limits.yaml", LIMITS);
    away_from_a_window_end(Duration::from_secs(3600), Duration::from_secs(30)).await;
    for (env, counted) in [
        (
            &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false")][..],
            true,
        ),
        (&[][..], false),
        (
            &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")][..],
            false,
        ),
    ] {
        let node = Ratekeeper::start_with_env(dir.path(), &[], env);
        if counted {
            let stderr = node.stderr_with("applied the reference service's environment");
            assert!(
                stderr.contains("applied the reference service's environment: STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"),
                "{stderr}"
            );
        }
        let mut client = grpc_client(&node).await;
        assert_eq!(edge_decide(&mut client, "k").await, Code::Ok);
        assert_eq!(edge_decide(&mut client, "k").await, Code::Ok);
        let mut two = crate::support::edge_request("k");
        two.hits_addend = 2;
        let rejected = client.should_rate_limit(two).await.expect("answered");
        assert_eq!(
            rejected.into_inner().overall_code,
            Code::OverLimit as i32,
            "{env:?}"
        );
        let last = edge_decide(&mut client, "k").await;
        let expected = if counted { Code::OverLimit } else { Code::Ok };
        assert_eq!(last, expected, "{env:?}: the one left after the rejection");
    }
}
