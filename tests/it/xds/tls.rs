//! The xDS client over TLS and mutual TLS, as Envoy Gateway runs it: its control plane
//! serves xDS with a certificate of its own CA and asks the rate limit service for a client
//! certificate from the same CA. The real binary, started with Envoy Gateway's environment
//! or with ratekeeper's flags, against the stand-in server of `xds.rs` serving TLS.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use super::{Running, WAIT, XdsServer, per_day};
use crate::support::{Leaf, Ratekeeper, TempDir, TestCa, eventually_async, http_get};

/// The control plane's name in Envoy Gateway's certificates.
const CONTROL_PLANE: &str = "envoy-gateway.envoy-gateway-system.svc.cluster.local";

/// Envoy Gateway's certificates (its certgen): one CA signs the control plane's server
/// certificate and the rate limit service's certificate, which both serves and dials.
pub(super) struct Pki {
    pub(super) ca: TestCa,
    pub(super) server: Leaf,
    pub(super) client: Leaf,
}

impl Pki {
    pub(super) fn new() -> Pki {
        let ca = TestCa::new("envoy-gateway");
        let server = ca.server(&[
            "envoy-gateway",
            "envoy-gateway.envoy-gateway-system",
            "envoy-gateway.envoy-gateway-system.svc",
            CONTROL_PLANE,
            "127.0.0.1",
        ]);
        let client = ca.peer(&[
            "envoy-ratelimit",
            "envoy-ratelimit.envoy-gateway-system.svc.cluster.local",
        ]);
        Pki { ca, server, client }
    }

    /// A server config presenting `server` and requiring a client certificate of this CA.
    pub(super) fn server_tls(&self, server: &Leaf) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&server.cert_pem, &server.key_pem))
            .client_ca_root(Certificate::from_pem(self.ca.cert_pem()))
    }

    /// Writes the rate limit service's Secret as Envoy Gateway mounts it: `ca.crt`,
    /// `tls.crt`, `tls.key`.
    pub(super) fn write(&self, dir: &Path) -> Files {
        let ca = self.ca.write(dir, "ca.crt");
        let (cert, key) = self.client.write(dir, "tls");
        Files { ca, cert, key }
    }
}

pub(super) struct Files {
    pub(super) ca: PathBuf,
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
}

impl Files {
    /// ratekeeper's flags for mutual TLS to `server` (`--xds-tls` unless it says
    /// `https://`), with a quick backoff.
    fn flags(&self, server: &str, client_cert: bool) -> Vec<String> {
        let mut flags: Vec<String> = [
            "--config-source",
            "xds",
            "--healthy-only-with-config",
            "--xds-backoff-initial",
            "50ms",
            "--xds-backoff-max",
            "200ms",
            "--xds-server",
            server,
        ]
        .map(str::to_owned)
        .to_vec();
        if !server.starts_with("https://") {
            flags.push("--xds-tls".to_owned());
        }
        flags.extend(["--xds-tls-ca".to_owned(), self.ca.display().to_string()]);
        if client_cert {
            flags.extend(["--xds-tls-cert".to_owned(), self.cert.display().to_string()]);
            flags.extend(["--xds-tls-key".to_owned(), self.key.display().to_string()]);
        }
        flags
    }
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("a certificate")
        .to_vec()
}

/// `ratekeeper serve` with `args` and `env`, not waiting for it to be healthy.
async fn start(args: Vec<String>, env: Vec<(String, String)>) -> Ratekeeper {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        let mut command = crate::support::ratekeeper_command();
        command.envs(env).arg("serve").args([
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ]);
        command.args(args);
        Ratekeeper::start_unready_command(&mut command)
    })
    .await
    .expect("starts")
}

async fn health(http: SocketAddr) -> u16 {
    tokio::task::spawn_blocking(move || {
        http_get(http, "/healthcheck", &[]).map_or(0, |response| response.status)
    })
    .await
    .expect("probe")
}

async fn metrics(http: SocketAddr) -> String {
    tokio::task::spawn_blocking(move || {
        http_get(http, "/metrics", &[]).map_or_else(|_| String::new(), |response| response.body)
    })
    .await
    .expect("scrape")
}

/// `xds_tls_handshake_failures_total`, as scraped now.
async fn handshake_failures(process: &Ratekeeper) -> u64 {
    let scraped = metrics(process.http_addr()).await;
    let failures = scraped
        .lines()
        .find_map(|line| line.strip_prefix("ratekeeper_xds_tls_handshake_failures_total "))
        .and_then(|value| value.trim().parse().ok());
    failures.unwrap_or_else(|| panic!("no handshake failures counted: {scraped}"))
}

/// Waits until the process logged `needle`; fails with its stderr.
async fn until_logged(process: &Ratekeeper, needle: &str) {
    let logged = eventually_async(WAIT, || {
        std::future::ready(process.stderr().contains(needle))
    })
    .await;
    assert!(logged, "{needle:?} never logged: {}", process.stderr());
}

async fn until_healthy(process: &Ratekeeper) {
    let http = process.http_addr();
    let healthy = eventually_async(WAIT, || async move { health(http).await == 200 }).await;
    assert!(healthy, "never healthy: {}", process.stderr());
}

/// Envoy Gateway's Deployment, nothing changed: `CONFIG_GRPC_XDS_SERVER_USE_TLS` and its
/// files (and the SAN, as the server is reached by its IP here); the limits arrive over
/// mutual TLS and are enforced, and the server saw the certificate of the files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_environment_brings_the_limits_over_mutual_tls() {
    let pki = Pki::new();
    let xds = XdsServer::start_with(Some(pki.server_tls(&pki.server))).await;
    xds.publish("1", &[per_day(3)]);
    let dir = TempDir::new("xds-eg-env");
    let files = pki.write(dir.path());
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        ("CONFIG_GRPC_XDS_SERVER_URL", xds.addr.to_string()),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_owned()),
        (
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            files.cert.display().to_string(),
        ),
        (
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
            files.key.display().to_string(),
        ),
        (
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            files.ca.display().to_string(),
        ),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", CONTROL_PLANE.to_owned()),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true".to_owned()),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "50ms".to_owned()),
    ]
    .map(|(name, value)| (name.to_owned(), value))
    .to_vec();
    let process = start(Vec::new(), env).await;
    assert!(xds.answer_to("1").await.error_detail.is_none());
    until_healthy(&process).await;
    let mut ratekeeper = Running::connect(process.grpc_addr()).await;
    ratekeeper.until_limit(Some(3)).await;
    ratekeeper.assert_enforces("eg-user", 3).await;
    assert_eq!(
        xds.client_certs().first(),
        Some(&der(&pki.client.cert_pem)),
        "the certificate of CONFIG_GRPC_XDS_CLIENT_TLS_CERT"
    );
    let scraped = metrics(process.http_addr()).await;
    assert!(
        scraped.contains("ratekeeper_xds_tls_loads_total{result=\"success\"} 1"),
        "{scraped}"
    );
}

/// A server asking for a client certificate refuses a ratekeeper without one: no limits,
/// unhealthy, and the log says to give the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_certificate_the_server_refuses_and_the_log_says_why() {
    let pki = Pki::new();
    let xds = XdsServer::start_with(Some(pki.server_tls(&pki.server))).await;
    xds.publish("1", &[per_day(3)]);
    let dir = TempDir::new("xds-no-client-cert");
    let files = pki.write(dir.path());
    let process = start(files.flags(&xds.addr.to_string(), false), Vec::new()).await;
    until_logged(&process, "--xds-tls-cert and --xds-tls-key").await;
    assert!(
        process.stderr().contains("cannot reach the xds server"),
        "{}",
        process.stderr()
    );
    assert_eq!(health(process.http_addr()).await, 503);
    assert!(xds.requests().is_empty(), "{:?}", xds.requests());
    let mut ratekeeper = Running::connect(process.grpc_addr()).await;
    assert_eq!(ratekeeper.limit().await, None, "no limits");
    assert!(
        handshake_failures(&process).await >= 1,
        "the refusal is counted"
    );
}

/// A server whose certificate another CA signed is never trusted (no limits, unhealthy,
/// the log names the CA flag and file); once a good server takes the address, ratekeeper's
/// retries reach it and it recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_refused_until_a_good_server_answers() {
    let pki = Pki::new();
    let impostor = TestCa::new("impostor").server(&[CONTROL_PLANE, "127.0.0.1"]);
    let bad = XdsServer::start_with(Some(pki.server_tls(&impostor))).await;
    bad.publish("1", &[per_day(9)]);
    let dir = TempDir::new("xds-wrong-ca");
    let files = pki.write(dir.path());
    // An https:// server means TLS without --xds-tls.
    let url = format!("https://{}", bad.addr);
    let process = start(files.flags(&url, true), Vec::new()).await;
    let ca_problem = format!(
        "not signed by the CA of --xds-tls-ca {}",
        files.ca.display()
    );
    until_logged(&process, &ca_problem).await;
    assert_eq!(health(process.http_addr()).await, 503);
    assert!(bad.requests().is_empty(), "{:?}", bad.requests());
    let mut ratekeeper = Running::connect(process.grpc_addr()).await;
    assert_eq!(ratekeeper.limit().await, None, "no limits");
    assert!(handshake_failures(&process).await >= 1);

    let (addr, state) = bad.stop().await;
    let good = XdsServer::serve_with(addr, state, Some(pki.server_tls(&pki.server))).await;
    good.publish("2", &[per_day(4)]);
    assert!(good.answer_to("2").await.error_detail.is_none());
    until_healthy(&process).await;
    ratekeeper.until_limit(Some(4)).await;
}

/// A renewed client certificate (the Secret's files replaced) is reloaded and presented
/// when ratekeeper next connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_client_certificate_is_presented_on_the_next_connection() {
    let pki = Pki::new();
    let xds = XdsServer::start_with(Some(pki.server_tls(&pki.server))).await;
    xds.publish("1", &[per_day(3)]);
    let dir = TempDir::new("xds-renewed");
    let files = pki.write(dir.path());
    let process = start(files.flags(&xds.addr.to_string(), true), Vec::new()).await;
    until_healthy(&process).await;
    let mut ratekeeper = Running::connect(process.grpc_addr()).await;
    ratekeeper.until_limit(Some(3)).await;
    assert_eq!(xds.client_certs(), [der(&pki.client.cert_pem)]);

    let renewed = pki.ca.peer(&["envoy-ratelimit-renewed"]);
    renewed.write(dir.path(), "tls");
    let http = process.http_addr();
    let reloaded = eventually_async(WAIT, || async move {
        metrics(http)
            .await
            .contains("ratekeeper_xds_tls_loads_total{result=\"success\"} 2")
    })
    .await;
    assert!(reloaded, "not reloaded: {}", process.stderr());

    // The server goes away and comes back: the reconnection presents the renewed one.
    let (addr, state) = xds.stop().await;
    let xds = XdsServer::serve_with(addr, state, Some(pki.server_tls(&pki.server))).await;
    xds.publish("2", &[per_day(7)]);
    assert!(xds.answer_to("2").await.error_detail.is_none());
    ratekeeper.until_limit(Some(7)).await;
    assert_eq!(
        xds.client_certs().last(),
        Some(&der(&renewed.cert_pem)),
        "{}",
        process.stderr()
    );
}
