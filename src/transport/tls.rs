//! TLS (and mTLS) on the gRPC listener and between cluster peers (and, in `client`, the
//! client side alone, for servers ratekeeper dials: the xDS management server's): the
//! certificate, key and CA files named by `--grpc-tls-*` (or `--peer-tls-*`, [`Flags`] says which), turned into a
//! rustls `ServerConfig` (ring provider, ALPN `h2`) and, for peers, the `ClientConfig` their
//! outgoing connections use (presenting the same certificate, checking the other node's
//! against the same CA), and kept current while serving: [`Tls::watch`] watches the files'
//! directories and swaps in new configs when they change, so new connections see a renewed
//! certificate without a restart.
//!
//! The reference service's `GRPC_SERVER_USE_TLS` / `_TLS_CERT` / `_TLS_KEY` /
//! `GRPC_CLIENT_TLS_CACERT` / `GRPC_CLIENT_TLS_SAN`: with a client CA, clients must present
//! a certificate it signed (for client authentication); with a SAN, that certificate must
//! also be valid for that DNS name.
//!
//! Invariants:
//! - A config is built from all files or not at all: at start a problem is an error naming
//!   the flag and the file; on a reload the old config stays live, the problem is logged
//!   and counted. A reload never leaves the listener without a certificate.
//! - Connections take the config live at their handshake; a swap never touches a
//!   connection already established.
//! - Bounded: files over [`MAX_FILE_BYTES`] are refused; events queue in a fixed-size
//!   channel, and a burst of them costs one reload.

mod client;
mod watch;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use rustls::client::ClientConfig;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, InconsistentKeys, RootCertStore,
    SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

pub use self::client::{ClientTls, ClientTlsOptions};
pub use self::watch::TlsWatch;
use crate::key::fnv1a64;

/// The flags naming each file, for error messages.
pub const CERT_FLAG: &str = "--grpc-tls-cert";
pub const KEY_FLAG: &str = "--grpc-tls-key";
pub const CLIENT_CA_FLAG: &str = "--grpc-tls-client-ca";
pub const CLIENT_SAN_FLAG: &str = "--grpc-tls-client-san";

/// Which listener a [`Tls`] serves: the flags naming its files (for errors), its name in
/// logs and metrics, and whether it also makes a client config (peers dial each other).
#[derive(Debug, PartialEq, Eq)]
pub struct Flags {
    pub cert: &'static str,
    pub key: &'static str,
    pub ca: &'static str,
    pub san: &'static str,
    /// `grpc` or `peer`: in logs, and the metrics' prefix (`{what}_tls_loads`).
    pub what: &'static str,
    pub client: bool,
}

/// The gRPC listener's (`--grpc-tls-*`).
pub const GRPC: Flags = Flags {
    cert: CERT_FLAG,
    key: KEY_FLAG,
    ca: CLIENT_CA_FLAG,
    san: CLIENT_SAN_FLAG,
    what: "grpc",
    client: false,
};

/// The peer listener's and the peer clients' (`--peer-tls-*`): mutual TLS between nodes.
pub const PEER: Flags = Flags {
    cert: "--peer-tls-cert",
    key: "--peer-tls-key",
    ca: "--peer-tls-ca",
    san: "--peer-tls-name",
    what: "peer",
    client: true,
};

/// Certificate and key files larger than this are refused.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Which files make the gRPC listener's TLS config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM: the server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM: the server's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM: CA certificates; when set, clients must present a certificate one of them signed.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: the client certificate must be valid for this DNS name (or IP).
    pub client_san: Option<String>,
}

impl TlsOptions {
    /// The files to watch, each once.
    fn files(&self) -> Vec<&Path> {
        let mut files = vec![self.cert.as_path(), self.key.as_path()];
        files.extend(self.client_ca.as_deref());
        files.dedup();
        files
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} {}: cannot read: {}", path.display(), lowercase_first(source))]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {}: {problem}", path.display())]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        problem: String,
    },
    #[error(
        "{} {}: the key does not match the certificate in {} {}",
        flags.key,
        key.display(),
        flags.cert,
        cert.display()
    )]
    Mismatch {
        flags: &'static Flags,
        cert: PathBuf,
        key: PathBuf,
    },
    #[error("{flag} {san:?}: {problem}")]
    ClientSan {
        flag: &'static str,
        san: String,
        problem: String,
    },
    #[error("{flag} is needed with {cert_flag}: peers must verify each other (mutual tls)")]
    NoCa {
        flag: &'static str,
        cert_flag: &'static str,
    },
    #[error(
        "no CA certificates found on this system to check the server's certificate with: give {flag}"
    )]
    NoRoots { flag: &'static str },
    #[error("cannot set up tls: {0}")]
    Setup(rustls::Error),
    #[error("cannot watch the tls files in {}: {source}", dir.display())]
    Watch { dir: PathBuf, source: notify::Error },
    #[error("cannot watch the tls files: not inside a tokio runtime")]
    NoRuntime,
}

/// Counters of the TLS config and handshakes, read at scrape time.
#[derive(Debug, Default)]
pub struct TlsStats {
    /// Loads of the files that became the live config (the start-up load counts).
    pub loads: AtomicU64,
    /// Reloads that failed (the old config stayed live).
    pub load_failures: AtomicU64,
    /// Connections whose handshake failed or timed out.
    pub handshake_failures: AtomicU64,
}

impl TlsStats {
    /// Registers the gRPC listener's TLS metrics (read at scrape time) in `registry`.
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        self.register_metrics_as(GRPC.what, registry);
    }

    /// Registers the TLS metrics as `{what}_tls_*` (see [`Flags::what`]).
    pub fn register_metrics_as(
        self: &Arc<Self>,
        what: &'static str,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        registry.register_collector(Box::new(watch::TlsCollector {
            stats: Arc::clone(self),
            what,
        }));
    }
}

/// The configs made from one set of files, swapped together.
struct Configs {
    server: Arc<ServerConfig>,
    /// With [`Flags::client`]: for connections this node opens.
    client: Option<Arc<ClientConfig>>,
}

/// A listener's live TLS config (and, for peers, the client side's); cheap to clone (all
/// clones see every swap).
#[derive(Clone)]
pub struct Tls {
    options: Arc<TlsOptions>,
    flags: &'static Flags,
    live: Arc<ArcSwap<Configs>>,
    /// [`Loaded::version`] of the live config.
    version: Arc<AtomicU64>,
    stats: Arc<TlsStats>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("options", &self.options)
            .field("what", &self.flags.what)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Loads the gRPC listener's files; an error names the flag and file at fault.
    pub fn load(options: TlsOptions) -> Result<Tls, TlsError> {
        Tls::load_for(options, &GRPC)
    }

    /// Loads the files named by `flags`; an error names the flag and file at fault.
    pub fn load_for(options: TlsOptions, flags: &'static Flags) -> Result<Tls, TlsError> {
        let loaded = load(&options, flags)?;
        let stats = Arc::new(TlsStats::default());
        stats.loads.fetch_add(1, Ordering::Relaxed);
        Ok(Tls {
            options: Arc::new(options),
            flags,
            live: Arc::new(ArcSwap::from_pointee(loaded.configs)),
            version: Arc::new(AtomicU64::new(loaded.version)),
            stats,
        })
    }

    /// The config for a handshake starting now.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.live.load().server))
    }

    /// The client config for a connection opened now (peers only: `None` otherwise).
    pub fn connector(&self) -> Option<tokio_rustls::TlsConnector> {
        let client = self.live.load().client.clone()?;
        Some(tokio_rustls::TlsConnector::from(client))
    }

    /// The name every certificate must be valid for (`--peer-tls-name`), when one is set.
    pub fn name(&self) -> Option<&str> {
        self.options.client_san.as_deref()
    }

    /// `grpc` or `peer`.
    pub fn what(&self) -> &'static str {
        self.flags.what
    }

    pub fn stats(&self) -> &Arc<TlsStats> {
        &self.stats
    }

    /// Re-reads the files: `Ok(true)` when a changed config was swapped in, `Ok(false)`
    /// when they are unchanged. On error the live config stays, and the failure is counted
    /// and logged. Blocking (reads files).
    pub fn reload_now(&self) -> Result<bool, TlsError> {
        let what = self.flags.what;
        let loaded = match load(&self.options, self.flags) {
            Ok(loaded) => loaded,
            Err(error) => {
                self.stats.load_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%error, what, "cannot reload the tls files, keeping the previous certificate");
                return Err(error);
            }
        };
        if loaded.version == self.version.load(Ordering::Relaxed) {
            return Ok(false);
        }
        self.live.store(Arc::new(loaded.configs));
        self.version.store(loaded.version, Ordering::Relaxed);
        self.stats.loads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(cert = %self.options.cert.display(), what, "tls certificate reloaded");
        Ok(true)
    }

    /// Starts watching the files' directories, reloading on changes; needs a tokio runtime.
    /// Dropping the returned watch stops it.
    pub fn watch(&self) -> Result<TlsWatch, TlsError> {
        watch::start(self.clone())
    }
}

impl watch::Reloadable for Tls {
    fn files(&self) -> Vec<PathBuf> {
        self.options
            .files()
            .into_iter()
            .map(Path::to_owned)
            .collect()
    }

    fn what(&self) -> &'static str {
        Tls::what(self)
    }

    fn reload_now(&self) -> Result<bool, TlsError> {
        Tls::reload_now(self)
    }
}

/// The configs built from the files, and a hash of their bytes.
struct Loaded {
    configs: Configs,
    version: u64,
}

fn load(options: &TlsOptions, flags: &'static Flags) -> Result<Loaded, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cert_pem = read(flags.cert, &options.cert)?;
    let key_pem = read(flags.key, &options.key)?;
    let ca_pem = match &options.client_ca {
        Some(path) => Some((path, read(flags.ca, path)?)),
        None if flags.client => {
            return Err(TlsError::NoCa {
                flag: flags.ca,
                cert_flag: flags.cert,
            });
        }
        None => None,
    };
    let version = files_version(&cert_pem, &key_pem, ca_pem.as_ref().map(|(_, pem)| pem));

    let chain = certificates(flags.cert, &options.cert, &cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| TlsError::Invalid {
        flag: flags.key,
        path: options.key.clone(),
        problem: pem_problem(&error, "private key"),
    })?;
    let client_key = key.clone_key();
    let files = (options.cert.as_path(), options.key.as_path());
    let certified = certified_key(files, flags, chain.clone(), key, &provider)?;

    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?;
    let mut client = None;
    let builder = match ca_pem {
        None => builder.with_no_client_auth(),
        Some((path, pem)) => {
            let roots = Arc::new(roots(flags.ca, path, &pem)?);
            let verifier = client_verifier(
                flags,
                path,
                Arc::clone(&roots),
                options.client_san.as_deref(),
                &provider,
            )?;
            if flags.client {
                client = Some(Arc::new(client_config(
                    flags, options, roots, chain, client_key, &provider,
                )?));
            }
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut server =
        builder.with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)));
    // gRPC is HTTP/2; a client offering only other protocols is refused in the handshake.
    server.alpn_protocols = vec![b"h2".to_vec()];
    let configs = Configs {
        server: Arc::new(server),
        client,
    };
    Ok(Loaded { configs, version })
}

/// A hash of the files' bytes, each file's length first: a change to any file changes it.
fn files_version(cert: &[u8], key: &[u8], ca: Option<&Vec<u8>>) -> u64 {
    let mut version = 0xcbf2_9ce4_8422_2325; // FNV-1a 64's offset basis
    for bytes in [cert, key].into_iter().chain(ca.map(Vec::as_slice)) {
        version = fnv1a64(version, &(bytes.len() as u64).to_le_bytes());
        version = fnv1a64(version, bytes);
    }
    version
}

/// The certificate chain and its private key as one signing identity, refused when the
/// key is unusable or does not belong to the certificate.
fn certified_key(
    (cert_path, key_path): (&Path, &Path),
    flags: &'static Flags,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Result<rustls::sign::CertifiedKey, TlsError> {
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|error| TlsError::Invalid {
            flag: flags.key,
            path: key_path.to_owned(),
            problem: format!("unusable private key: {error}"),
        })?;
    let certified = rustls::sign::CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::Mismatch {
                flags,
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
            })
        }
        Err(error) => Err(TlsError::Invalid {
            flag: flags.cert,
            path: cert_path.to_owned(),
            problem: format!("unusable certificate: {error}"),
        }),
    }
}

/// The client side of mutual TLS between peers: presents this node's certificate, and
/// accepts a server whose certificate one of `roots` signed (valid for the name the
/// connection asks for: see `cluster::dial`).
fn client_config(
    flags: &'static Flags,
    options: &TlsOptions,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &Arc<CryptoProvider>,
) -> Result<ClientConfig, TlsError> {
    let mut config = ClientConfig::builder_with_provider(Arc::clone(provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|error| TlsError::Invalid {
            flag: flags.key,
            path: options.key.clone(),
            problem: format!("cannot present the certificate as a client: {error}"),
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The CA certificates in `pem`.
fn roots(flag: &'static str, path: &Path, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for (index, cert) in certificates(flag, path, pem)?.into_iter().enumerate() {
        roots.add(cert).map_err(|error| TlsError::Invalid {
            flag,
            path: path.to_owned(),
            problem: format!("certificate {index} is not a usable CA: {error}"),
        })?;
    }
    Ok(roots)
}

/// Clients must present a certificate signed by one of `roots` (and valid for `san`, when
/// given).
fn client_verifier(
    flags: &'static Flags,
    path: &Path,
    roots: Arc<RootCertStore>,
    san: Option<&str>,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(provider))
        .build()
        .map_err(|error| TlsError::Invalid {
            flag: flags.ca,
            path: path.to_owned(),
            problem: format!("cannot verify clients with it: {error}"),
        })?;
    let Some(san) = san else {
        return Ok(verifier);
    };
    let name = ServerName::try_from(san.to_owned()).map_err(|error| TlsError::ClientSan {
        flag: flags.san,
        san: san.to_owned(),
        problem: format!("not a DNS name or IP address: {error}"),
    })?;
    Ok(Arc::new(ClientSan {
        inner: verifier,
        name,
    }))
}

/// Every certificate in `pem`, in order; at least one.
fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let invalid = |problem: String| TlsError::Invalid {
        flag,
        path: path.to_owned(),
        problem,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| invalid(pem_problem(&error, "certificate")))?;
    if certs.is_empty() {
        return Err(invalid(pem_problem(
            &rustls_pki_types::pem::Error::NoItemsFound,
            "certificate",
        )));
    }
    Ok(certs)
}

fn pem_problem(error: &rustls_pki_types::pem::Error, what: &str) -> String {
    match error {
        rustls_pki_types::pem::Error::NoItemsFound => format!("no PEM {what} found"),
        other => format!("not a valid PEM {what}: {other}"),
    }
}

/// `No such file or directory` -> `no such file or directory` (messages are lowercase).
fn lowercase_first(error: &std::io::Error) -> String {
    let message = error.to_string();
    let mut chars = message.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => message,
    }
}

/// A file's bytes, at most [`MAX_FILE_BYTES`].
fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let read_error = |source| TlsError::Read {
        flag,
        path: path.to_owned(),
        source,
    };
    crate::files::read_regular(path, MAX_FILE_BYTES).map_err(|error| match error {
        crate::files::ReadError::Io(source) => read_error(source),
        problem => TlsError::Invalid {
            flag,
            path: path.to_owned(),
            problem: problem.to_string(),
        },
    })
}

/// The CA check, then: the client certificate must be valid for `name`
/// (`--grpc-tls-client-san`, the reference's `GRPC_CLIENT_TLS_SAN`).
#[derive(Debug)]
struct ClientSan {
    inner: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for ClientSan {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        cert.verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
