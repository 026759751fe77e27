use std::sync::Arc;
use std::sync::atomic::Ordering;

use ratekeeper_core::testing::TempDir;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::{ClientTls, ClientTlsOptions};
use crate::transport::tls::Flags;

const FLAGS: Flags = Flags {
    cert: "--test-tls-cert",
    key: "--test-tls-key",
    ca: "--test-tls-ca",
    san: "--test-tls-san",
    what: "test",
    client: true,
};

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("key");
        Ca(CertifiedIssuer::self_signed(params, key).expect("ca"))
    }

    /// A leaf for `name`: (certificate PEM, key PEM).
    fn leaf(&self, name: &str) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec![name.to_owned()])
            .expect("params")
            .signed_by(&key, &self.0)
            .expect("leaf");
        (cert.pem(), key.serialize_pem())
    }
}

/// A server with `leaf` that asks for a client certificate signed by `client_ca` (when
/// given); answers whether a handshake from `tls` for `name` succeeds.
async fn handshake(
    tls: &ClientTls,
    leaf: &(String, String),
    client_ca: Option<&Ca>,
    name: &str,
) -> bool {
    let chain = vec![CertificateDer::from_pem_slice(leaf.0.as_bytes()).expect("cert")];
    let key = PrivateKeyDer::from_pem_slice(leaf.1.as_bytes()).expect("key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.0.der().clone()).expect("root");
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .expect("verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let server = builder.with_single_cert(chain, key).expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let name = ServerName::try_from(name.to_owned()).expect("name");
    let connector = tls.connector();
    let (client, server) = tokio::join!(
        connector.connect(name, client_io),
        acceptor.accept(server_io)
    );
    client.is_ok() && server.is_ok()
}

#[tokio::test]
async fn a_rotated_ca_or_client_certificate_is_used_from_the_next_connection() {
    let dir = TempDir::new("client-tls-rotate");
    let (old_ca, new_ca, client_ca) = (Ca::new(), Ca::new(), Ca::new());
    let ca_path = dir.write("ca.pem", &old_ca.0.pem());
    let client = client_ca.leaf("rate-limit");
    let cert = dir.write("client.crt", &client.0);
    let key = dir.write("client.key", &client.1);
    let options = ClientTlsOptions {
        ca: Some(ca_path.clone()),
        identity: Some((cert.clone(), key.clone())),
    };
    let tls = ClientTls::load(options, &FLAGS).expect("loads");
    let old_server = old_ca.leaf("xds.example");
    let new_server = new_ca.leaf("xds.example");
    assert!(handshake(&tls, &old_server, Some(&client_ca), "xds.example").await);
    assert!(!handshake(&tls, &new_server, Some(&client_ca), "xds.example").await);
    assert!(
        !handshake(&tls, &old_server, None, "other.example").await,
        "another name"
    );

    // A bad CA file keeps the old config, counted.
    dir.write("ca.pem", "not a certificate");
    let error = tls.reload_now().expect_err("a bad file");
    assert!(error.to_string().starts_with("--test-tls-ca "), "{error}");
    assert_eq!(tls.stats().load_failures.load(Ordering::Relaxed), 1);
    assert!(handshake(&tls, &old_server, Some(&client_ca), "xds.example").await);

    // The new CA is used from the next connection on.
    dir.write("ca.pem", &new_ca.0.pem());
    assert!(tls.reload_now().expect("reloads"));
    assert!(!tls.reload_now().expect("unchanged"), "same files, no swap");
    assert_eq!(tls.stats().loads.load(Ordering::Relaxed), 2);
    assert!(handshake(&tls, &new_server, Some(&client_ca), "xds.example").await);
    assert!(!handshake(&tls, &old_server, Some(&client_ca), "xds.example").await);

    // A client certificate from another CA is refused by the server; rotating it back in
    // makes the next handshake pass.
    let stranger = Ca::new().leaf("rate-limit");
    dir.write("client.crt", &stranger.0);
    dir.write("client.key", &stranger.1);
    assert!(tls.reload_now().expect("reloads"));
    assert!(!handshake(&tls, &new_server, Some(&client_ca), "xds.example").await);
    dir.write("client.crt", &client.0);
    dir.write("client.key", &client.1);
    assert!(tls.reload_now().expect("reloads"));
    assert!(handshake(&tls, &new_server, Some(&client_ca), "xds.example").await);
}

#[test]
fn errors_name_the_flag_and_the_file() {
    let dir = TempDir::new("client-tls-errors");
    let ca = Ca::new();
    dir.write("ca.pem", &ca.0.pem());
    let (cert_pem, _) = ca.leaf("a");
    let (_, other_key) = ca.leaf("b");
    let cert = dir.write("tls.crt", &cert_pem);
    let key = dir.write("tls.key", &other_key);
    let load = |ca: Option<&str>, identity: Option<(&str, &str)>| {
        let options = ClientTlsOptions {
            ca: ca.map(|name| dir.join(name)),
            identity: identity.map(|(cert, key)| (dir.join(cert), dir.join(key))),
        };
        ClientTls::load(options, &FLAGS)
            .map(|_| ())
            .map_err(|error| error.to_string())
    };
    let missing = load(Some("missing.pem"), None).expect_err("missing");
    assert!(
        missing.starts_with("--test-tls-ca ") && missing.contains("missing.pem: cannot read"),
        "{missing}"
    );
    let mismatch = load(Some("ca.pem"), Some(("tls.crt", "tls.key"))).expect_err("mismatch");
    assert!(
        mismatch.starts_with(&format!("--test-tls-key {}", key.display()))
            && mismatch.contains(&format!("--test-tls-cert {}", cert.display())),
        "{mismatch}"
    );
    let not_pem = load(Some("tls.key"), None).expect_err("a key is no CA");
    assert!(not_pem.starts_with("--test-tls-ca "), "{not_pem}");
    assert!(load(Some("ca.pem"), None).is_ok());
}
