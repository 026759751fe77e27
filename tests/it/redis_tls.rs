//! The Redis store over TLS as Envoy Gateway configures it: a Redis that speaks TLS only,
//! requires a client certificate and a password, reached with our `--store-tls-*` flags
//! and with the reference's variables (`REDIS_TLS`, `REDIS_TLS_CACERT`,
//! `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`, `REDIS_AUTH`); a ratekeeper Redis
//! refuses (no client certificate, another CA, another name) answers by its failure policy
//! and says why; rotated files are taken when the connections must be made again.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::support::{
    Ratekeeper, RedisCluster, RedisServer, RedisTls, TempDir, eventually, http_post, metric,
    write_config,
};

const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      unit: hour
      requests_per_unit: 10
";

const PASSWORD: &str = "s3cret";

/// POSTs one `/json` request: its HTTP status (200 admitted, 429 over the limit).
fn ask(http: SocketAddr, value: &str) -> u16 {
    let body = format!(
        r#"{{"domain": "edge", "descriptors": [{{"entries": [{{"key": "api_key", "value": "{value}"}}]}}]}}"#
    );
    http_post(http, "/json", &[], &body)
        .expect("an answer")
        .status
}

fn path(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// `--store url` over TLS with `tls`'s CA and client certificate, the deny policy, and a
/// store deadline of `timeout`.
fn store_flags<'a>(url: &'a str, tls: &'a RedisTls, timeout: &'a str) -> [&'a str; 12] {
    [
        "--store",
        url,
        "--store-tls-ca",
        path(&tls.ca),
        "--store-tls-cert",
        path(&tls.client_cert),
        "--store-tls-key",
        path(&tls.client_key),
        "--store-failure",
        "deny",
        "--store-timeout",
        timeout,
    ]
}

#[test]
fn limits_are_exact_over_a_tls_redis_requiring_client_certificates() {
    let dir = TempDir::new("redis-tls-exact");
    let tls = RedisTls::write(dir.path(), &["127.0.0.1", "localhost"]);
    let redis = RedisServer::start_tls(dir.path(), &tls, &["--requirepass", PASSWORD]);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let url = format!("rediss://:{PASSWORD}@127.0.0.1:{}", redis.port());
    let ours = Ratekeeper::start(&config, &store_flags(&url, &tls, "5s"));
    // Envoy Gateway's variables, nothing of ours but the limits and the listeners.
    let port = redis.port().to_string();
    let reference = Ratekeeper::start_with_env(
        &config,
        &["--store-failure", "deny"],
        &[
            // The TLS handshake on a loaded machine may take longer than the default 100ms.
            ("REDIS_TIMEOUT", "5s"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &format!("127.0.0.1:{port}")),
            ("REDIS_AUTH", PASSWORD),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", path(&tls.ca)),
            ("REDIS_TLS_CLIENT_CERT", path(&tls.client_cert)),
            ("REDIS_TLS_CLIENT_KEY", path(&tls.client_key)),
        ],
    );
    let mut admitted = 0;
    for _ in 0..8 {
        for node in [&ours, &reference] {
            match ask(node.http_addr(), "shared") {
                200 => admitted += 1,
                429 => {}
                other => panic!("status {other}"),
            }
        }
    }
    assert_eq!(
        admitted, 10,
        "one limit of 10 across both, counted in redis"
    );
    let stderr = reference.stderr();
    assert!(
        stderr.contains("REDIS_TLS_CACERT")
            && stderr.contains("--store-tls-ca=")
            && !stderr.contains(PASSWORD),
        "the applied line names the variables, never the password: {stderr}"
    );
    for node in [&ours, &reference] {
        let policy = metric(node.http_addr(), "ratekeeper_store_policy_decisions_total");
        assert_eq!(policy, 0.0, "every check was decided in redis");
    }
}

/// A ratekeeper whose handshake Redis refuses (or that refuses Redis's certificate): every
/// check is decided by `--store-failure deny` (429), and the log says why.
fn refused(dir: &Path, url: &str, tls_args: &[&str], why: &[&str]) {
    let config = write_config(dir, "limits.yaml", LIMITS);
    let mut args = vec!["--store", url, "--store-failure", "deny"];
    args.extend_from_slice(tls_args);
    let node = Ratekeeper::start(&config, &args);
    for _ in 0..3 {
        assert_eq!(ask(node.http_addr(), "k"), 429, "deny: {tls_args:?}");
    }
    let stderr = node.stderr_with("a direct connection says why");
    assert!(
        why.iter().any(|why| stderr.contains(why)),
        "{tls_args:?}: the log says why ({why:?}): {stderr}"
    );
    assert!(metric(node.http_addr(), "ratekeeper_store_policy_decisions_total") >= 3.0);
}

#[test]
fn a_client_redis_refuses_or_that_refuses_redis_gets_the_failure_policy_and_a_reason() {
    let dir = TempDir::new("redis-tls-refused");
    let tls = RedisTls::write(dir.path(), &["redis.internal"]);
    let redis = RedisServer::start_tls(dir.path(), &tls, &[]);
    let url = format!("rediss://127.0.0.1:{}", redis.port());
    let other = TempDir::new("redis-tls-other-ca");
    let other_ca = RedisTls::write(other.path(), &["127.0.0.1"]);
    let client = [
        "--store-tls-cert",
        path(&tls.client_cert),
        "--store-tls-key",
        path(&tls.client_key),
    ];
    let skip = "--store-tls-skip-hostname-verification";
    // No client certificate: Redis ends the handshake.
    refused(
        dir.path(),
        &url,
        &["--store-tls-ca", path(&tls.ca), skip],
        &[
            "CertificateRequired",
            "certificate required",
            "reset by peer",
        ],
    );
    // Redis's certificate is not signed by the CA given.
    let mut wrong_ca = vec!["--store-tls-ca", path(&other_ca.ca), skip];
    wrong_ca.extend(client);
    refused(dir.path(), &url, &wrong_ca, &["invalid peer certificate"]);
    // Redis's certificate names redis.internal, not 127.0.0.1.
    let mut wrong_name = vec!["--store-tls-ca", path(&tls.ca)];
    wrong_name.extend(client);
    refused(
        dir.path(),
        &url,
        &wrong_name,
        &["NotValidForName", "not valid for name"],
    );
    // The same with the name check skipped (the chain still checked): counted in Redis.
    wrong_name.push(skip);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    // A loaded machine's handshake may outlast the default 100ms deadline.
    let mut args = vec![
        "--store",
        &url,
        "--store-failure",
        "deny",
        "--store-timeout",
        "5s",
    ];
    args.extend(wrong_name);
    let node = Ratekeeper::start(&config, &args);
    let statuses: Vec<u16> = (0..11).map(|_| ask(node.http_addr(), "k")).collect();
    assert_eq!(
        statuses.iter().filter(|&&status| status == 200).count(),
        10,
        "{statuses:?}"
    );
}

#[test]
fn tls_files_that_cannot_serve_stop_the_start_naming_flag_and_file() {
    let dir = TempDir::new("redis-tls-start");
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let missing = dir.path().join("missing-ca.crt");
    let (status, _, stderr) = crate::support::run_ratekeeper(&[
        "serve",
        "--config",
        path(&config),
        "--grpc-addr=127.0.0.1:0",
        "--http-addr=127.0.0.1:0",
        "--admin-addr=127.0.0.1:0",
        "--store",
        "rediss://127.0.0.1:1",
        "--store-tls-ca",
        path(&missing),
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!(
            "--store-tls-ca {}: cannot read",
            missing.display()
        )),
        "{stderr}"
    );
    let (status, _, stderr) = crate::support::run_ratekeeper(&[
        "serve",
        "--config",
        path(&config),
        "--grpc-addr=127.0.0.1:0",
        "--http-addr=127.0.0.1:0",
        "--admin-addr=127.0.0.1:0",
        "--store",
        "redis://127.0.0.1:1",
        "--store-tls-skip-hostname-verification",
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains("needs a TLS store: rediss:// or rediss-cluster://"),
        "{stderr}"
    );
}

/// cert-manager renews everything (a new CA, Redis's certificate, ratekeeper's client
/// certificate) and Redis restarts with the new files: ratekeeper's connections are gone,
/// its old certificate is refused and the old CA refuses Redis's; after the failed calls it
/// reads its files again and counts in Redis again, without a restart.
#[test]
fn rotated_files_are_taken_when_redis_must_be_reached_again() {
    let dir = TempDir::new("redis-tls-rotation");
    let tls = RedisTls::write(dir.path(), &["127.0.0.1"]);
    let mut redis = RedisServer::start_tls(dir.path(), &tls, &[]);
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let url = format!("rediss://127.0.0.1:{}", redis.port());
    let node = Ratekeeper::start(&config, &store_flags(&url, &tls, "2s"));
    assert_eq!(ask(node.http_addr(), "before"), 200, "counted in redis");
    redis.kill();
    // The same paths, every file renewed under a new CA.
    let renewed = RedisTls::write(dir.path(), &["127.0.0.1"]);
    assert_eq!(renewed.client_cert, tls.client_cert);
    redis.restart();
    let counted_again = eventually(Duration::from_secs(20), || {
        ask(node.http_addr(), "after") == 200
    });
    assert!(counted_again, "{}", node.stderr());
    assert!(
        node.stderr_with("redis tls files changed")
            .contains("connecting again with them"),
        "the reload is logged"
    );
}

/// A Redis Cluster over TLS (`--tls-cluster yes`, client certificates required):
/// `rediss-cluster://` with the same flags keeps one exact limit per key across its masters.
#[test]
fn a_tls_redis_cluster_keeps_exact_limits() {
    let dir = TempDir::new("redis-tls-cluster");
    let tls = RedisTls::write(dir.path(), &["127.0.0.1"]);
    let cluster = RedisCluster::start_tls(dir.path(), 3, &tls);
    let url = cluster.url();
    assert!(url.starts_with("rediss-cluster://"), "{url}");
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let node = Ratekeeper::start(&config, &store_flags(&url, &tls, "5s"));
    // Keys spread over the masters' slots; each has its own limit of 10.
    for key in ["a", "b", "c", "d"] {
        let admitted = (0..12)
            .filter(|_| ask(node.http_addr(), key) == 200)
            .count();
        assert_eq!(admitted, 10, "key {key}: {}", node.stderr());
    }
    let policy = metric(node.http_addr(), "ratekeeper_store_policy_decisions_total");
    assert_eq!(policy, 0.0, "every check was decided in redis");
}
