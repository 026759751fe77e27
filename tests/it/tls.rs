//! TLS and mTLS on the gRPC listener, driven by a tonic TLS client: certificates made at
//! test time (rcgen) in a temp dir, the server in-process on `127.0.0.1:0`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{
    Leaf, TempDir, TestCa, eventually_async, http_get, spawn_server, write_atomically,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratekeeper::limits::Limits;
use ratekeeper::server::{Server, ServerOptions};
use ratekeeper::transport::tls::TlsOptions;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const LIMITS: &str = "
domain: tls
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000}
";

/// How long a reload may take to show before a test fails.
const PATIENCE: Duration = Duration::from_secs(10);

fn options(tls: TlsOptions) -> ServerOptions {
    let localhost = "127.0.0.1:0".parse().expect("addr");
    ServerOptions {
        grpc_tls: Some(tls),
        ..ServerOptions::new(localhost, localhost)
    }
}

/// A running server; stops when dropped.
struct Running {
    grpc: SocketAddr,
    http: SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(tls: TlsOptions) -> Running {
    let limits = Limits::parse_str("tls.yaml", LIMITS).expect("valid");
    let server = Server::bind(&options(tls), limits, 0)
        .await
        .unwrap_or_else(|error| panic!("binds: {error}"));
    let grpc = server.grpc_addr().expect("grpc on tcp");
    let http = server.http_addr();
    let (stop, _) = spawn_server(server);
    Running {
        grpc,
        http,
        _stop: stop,
    }
}

/// The server's files: a certificate for `localhost` from `ca`, in `dir`.
fn server_files(dir: &Path, ca: &TestCa) -> TlsOptions {
    let (cert, key) = ca.server(&["localhost"]).write(dir, "server");
    TlsOptions {
        cert,
        key,
        client_ca: None,
        client_san: None,
    }
}

/// A channel to `addr` over TLS, trusting only `ca`, presenting `identity` if given.
async fn connect(
    addr: SocketAddr,
    ca: &TestCa,
    identity: Option<&Leaf>,
) -> Result<RateLimitServiceClient<Channel>, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.cert_pem()))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
    }
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|error| error.to_string())?
        .tls_config(tls)
        .map_err(|error| error.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|error| format!("{error:?}"))?;
    Ok(RateLimitServiceClient::new(channel))
}

/// One `ShouldRateLimit` call on `client`; its overall code, or the error.
async fn ask(client: &mut RateLimitServiceClient<Channel>) -> Result<Code, String> {
    let request = RateLimitRequest {
        domain: "tls".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".to_owned(),
                value: "u1".to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        ..RateLimitRequest::default()
    };
    let response = client
        .should_rate_limit(request)
        .await
        .map_err(|status| format!("{status:?}"))?;
    Ok(response.into_inner().overall_code())
}

/// A fresh connection and one call: what a new client sees.
async fn call(addr: SocketAddr, ca: &TestCa, identity: Option<&Leaf>) -> Result<Code, String> {
    let mut client = connect(addr, ca, identity).await?;
    ask(&mut client).await
}

/// The value of the metric line starting with `prefix` on `/metrics` (a blocking client,
/// off the test's runtime thread, which also runs the server).
async fn metric(http: SocketAddr, prefix: &'static str) -> Option<u64> {
    let metrics = tokio::task::spawn_blocking(move || http_get(http, "/metrics", &[]))
        .await
        .ok()?
        .ok()?
        .body;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(prefix)?.trim().parse().ok())
}

#[tokio::test]
async fn a_tls_client_gets_an_answer_and_a_plaintext_one_does_not() {
    let dir = TempDir::new("tls");
    let ca = TestCa::new("server ca");
    let running = start(server_files(dir.path(), &ca)).await;
    assert_eq!(call(running.grpc, &ca, None).await, Ok(Code::Ok));

    let plaintext = async {
        let mut client = RateLimitServiceClient::connect(format!("http://{}", running.grpc))
            .await
            .map_err(|error| error.to_string())?;
        ask(&mut client).await
    };
    let plaintext = tokio::time::timeout(Duration::from_secs(10), plaintext)
        .await
        .expect("a plaintext client is answered or refused in time");
    assert!(plaintext.is_err(), "plaintext gRPC answered: {plaintext:?}");

    // A client that does not trust the server's CA refuses the connection.
    let stranger = TestCa::new("another ca");
    assert!(call(running.grpc, &stranger, None).await.is_err());
}

#[tokio::test]
async fn mtls_refuses_a_client_without_a_certificate_and_accepts_one_with() {
    let dir = TempDir::new("mtls");
    let server_ca = TestCa::new("server ca");
    let client_ca = TestCa::new("client ca");
    let tls = TlsOptions {
        client_ca: Some(client_ca.write(dir.path(), "clients.pem")),
        ..server_files(dir.path(), &server_ca)
    };
    let running = start(tls).await;

    let without = call(running.grpc, &server_ca, None).await;
    assert!(
        without.is_err(),
        "answered without a client cert: {without:?}"
    );
    let foreign = TestCa::new("unknown client ca").client(&["envoy.internal"]);
    let unknown = call(running.grpc, &server_ca, Some(&foreign)).await;
    assert!(
        unknown.is_err(),
        "answered a cert of another CA: {unknown:?}"
    );

    let client = client_ca.client(&["envoy.internal"]);
    assert_eq!(
        call(running.grpc, &server_ca, Some(&client)).await,
        Ok(Code::Ok)
    );
    // The refused handshakes are counted.
    let failures = metric(
        running.http,
        "ratekeeper_grpc_tls_handshake_failures_total ",
    )
    .await;
    assert!(failures.is_some_and(|n| n >= 2), "{failures:?}");
}

#[tokio::test]
async fn mtls_with_a_san_accepts_only_client_certificates_for_that_name() {
    let dir = TempDir::new("mtls-san");
    let server_ca = TestCa::new("server ca");
    let client_ca = TestCa::new("client ca");
    let tls = TlsOptions {
        client_ca: Some(client_ca.write(dir.path(), "clients.pem")),
        client_san: Some("envoy.internal".to_owned()),
        ..server_files(dir.path(), &server_ca)
    };
    let running = start(tls).await;

    let right = client_ca.client(&["envoy.internal"]);
    assert_eq!(
        call(running.grpc, &server_ca, Some(&right)).await,
        Ok(Code::Ok)
    );
    let wrong = client_ca.client(&["batch.internal"]);
    let refused = call(running.grpc, &server_ca, Some(&wrong)).await;
    assert!(refused.is_err(), "answered another name: {refused:?}");
}

#[tokio::test]
async fn replaced_certificate_files_are_served_to_new_connections() {
    let dir = TempDir::new("tls-reload");
    let old_ca = TestCa::new("old ca");
    let running = start(server_files(dir.path(), &old_ca)).await;
    let mut established = connect(running.grpc, &old_ca, None)
        .await
        .expect("connects");
    assert_eq!(ask(&mut established).await, Ok(Code::Ok));

    // Renewed by another CA, written the way a certificate manager does (key, then cert).
    let new_ca = TestCa::new("new ca");
    let renewed = new_ca.server(&["localhost"]);
    write_atomically(dir.path(), "server.key", &renewed.key_pem);
    write_atomically(dir.path(), "server.crt", &renewed.cert_pem);
    let reloaded = eventually_async(PATIENCE, || async {
        call(running.grpc, &new_ca, None).await == Ok(Code::Ok)
    })
    .await;
    assert!(reloaded, "new connections never saw the new certificate");
    let old = call(running.grpc, &old_ca, None).await;
    assert!(
        old.is_err(),
        "a new connection still got the old cert: {old:?}"
    );
    // The connection made before the swap goes on.
    assert_eq!(ask(&mut established).await, Ok(Code::Ok));
}

#[tokio::test]
async fn a_bad_new_certificate_keeps_the_old_one_serving() {
    let dir = TempDir::new("tls-bad-reload");
    let ca = TestCa::new("server ca");
    let running = start(server_files(dir.path(), &ca)).await;
    let failures = |count: u64| async move {
        metric(
            running.http,
            "ratekeeper_grpc_tls_loads_total{result=\"failure\"} ",
        )
        .await
            == Some(count)
    };
    assert!(failures(0).await);

    // Not a certificate at all.
    write_atomically(dir.path(), "server.crt", "not a certificate\n");
    assert!(
        eventually_async(PATIENCE, || failures(1)).await,
        "the bad file was not noticed"
    );
    assert_eq!(call(running.grpc, &ca, None).await, Ok(Code::Ok));

    // A valid certificate whose key is not the one in server.key.
    let other = TestCa::new("other ca");
    write_atomically(
        dir.path(),
        "server.crt",
        &other.server(&["localhost"]).cert_pem,
    );
    assert!(
        eventually_async(PATIENCE, || failures(2)).await,
        "the mismatched key was not noticed"
    );
    assert_eq!(call(running.grpc, &ca, None).await, Ok(Code::Ok));
    assert!(call(running.grpc, &other, None).await.is_err());

    // A good pair is taken again.
    let fixed = other.server(&["localhost"]);
    write_atomically(dir.path(), "server.key", &fixed.key_pem);
    write_atomically(dir.path(), "server.crt", &fixed.cert_pem);
    let recovered = eventually_async(PATIENCE, || async {
        call(running.grpc, &other, None).await == Ok(Code::Ok)
    })
    .await;
    assert!(recovered, "a fixed certificate was not taken");
}

/// Server::bind's error for `tls`, which must fail.
async fn start_error(tls: TlsOptions) -> String {
    let limits = Limits::parse_str("tls.yaml", LIMITS).expect("valid");
    match Server::bind(&options(tls), limits, 0).await {
        Ok(_) => panic!("started with bad tls files"),
        Err(error) => error.to_string(),
    }
}

#[tokio::test]
async fn bad_tls_files_fail_the_start_naming_the_flag_and_the_file() {
    let dir = TempDir::new("tls-bad-start");
    let ca = TestCa::new("server ca");
    let good = server_files(dir.path(), &ca);
    let missing = dir.path().join("missing.pem");
    let garbage = write_atomically(dir.path(), "garbage.pem", "hello\n");
    let other_key = ca.server(&["localhost"]).write(dir.path(), "other").1;
    let show = |path: &PathBuf| path.display().to_string();

    let cases: [(TlsOptions, String); 7] = [
        (
            TlsOptions {
                cert: missing.clone(),
                ..good.clone()
            },
            format!("--grpc-tls-cert {}: cannot read: ", show(&missing)),
        ),
        (
            TlsOptions {
                cert: garbage.clone(),
                ..good.clone()
            },
            format!(
                "--grpc-tls-cert {}: no PEM certificate found",
                show(&garbage)
            ),
        ),
        (
            TlsOptions {
                key: missing.clone(),
                ..good.clone()
            },
            format!("--grpc-tls-key {}: cannot read: ", show(&missing)),
        ),
        (
            TlsOptions {
                key: garbage.clone(),
                ..good.clone()
            },
            format!(
                "--grpc-tls-key {}: no PEM private key found",
                show(&garbage)
            ),
        ),
        (
            TlsOptions {
                key: other_key.clone(),
                ..good.clone()
            },
            format!(
                "--grpc-tls-key {}: the key does not match the certificate in --grpc-tls-cert {}",
                show(&other_key),
                show(&good.cert)
            ),
        ),
        (
            TlsOptions {
                client_ca: Some(garbage.clone()),
                ..good.clone()
            },
            format!(
                "--grpc-tls-client-ca {}: no PEM certificate found",
                show(&garbage)
            ),
        ),
        (
            TlsOptions {
                client_ca: Some(ca.write(dir.path(), "ca.pem")),
                client_san: Some("not a name!".to_owned()),
                ..good.clone()
            },
            "--grpc-tls-client-san \"not a name!\": not a DNS name or IP address".to_owned(),
        ),
    ];
    for (tls, expected) in cases {
        let error = start_error(tls).await;
        assert!(
            error.starts_with(&expected),
            "expected {expected:?}, got {error:?}"
        );
    }
}
