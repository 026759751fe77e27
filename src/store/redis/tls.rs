//! TLS to Redis beyond what a `rediss://` (or `rediss-cluster://`) URL says: the CA that signs the server's
//! certificate (instead of the system's roots), a client certificate for a Redis that
//! requires one (`tls-auth-clients yes`), and checking the server's certificate against
//! the CA without its name (`--store-tls-*`; the reference's `REDIS_TLS_CACERT`,
//! `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`, `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`).
//!
//! Invariants:
//! - The files are read and checked at start: a problem there is an error naming the flag
//!   and the file, and ratekeeper does not start.
//! - The certificate chain is always checked against the roots; only the name check can be
//!   skipped. Turning every check off (`rediss://...#insecure`) is refused
//!   ([`super::Target::parse`]).
//! - Rotation: established connections keep what their handshake presented and accepted
//!   (TLS checks certificates only then). After a failed call the files are read again (at
//!   most once per [`RECHECK_EVERY`]); when they changed, the connections are made again
//!   with them. Files that cannot be read or are invalid then leave the last good ones in
//!   use, logged.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::{ClientTlsConfig, ConnectionAddr, ConnectionInfo, RedisResult, TlsCertificates};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::key::fnv1a64;

/// The flags naming each file, for error messages.
pub const CA_FLAG: &str = "--store-tls-ca";
pub const CERT_FLAG: &str = "--store-tls-cert";
pub const KEY_FLAG: &str = "--store-tls-key";
pub const SKIP_HOSTNAME_FLAG: &str = "--store-tls-skip-hostname-verification";

/// Files larger than this are refused.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// After a failed call, the files are read again at most this often.
pub const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// The TLS settings of a `rediss://` or `rediss-cluster://` store beyond the URL's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisTlsOptions {
    /// PEM: the CA certificates the server's certificate must chain to (else the system's).
    pub ca: Option<PathBuf>,
    /// PEM: the client certificate chain and its private key, presented to Redis.
    pub client: Option<(PathBuf, PathBuf)>,
    /// Check the server's certificate chain but not that it names the host dialled.
    pub skip_hostname_verification: bool,
}

impl RedisTlsOptions {
    /// Whether nothing beyond the URL's defaults is asked.
    pub fn is_default(&self) -> bool {
        *self == RedisTlsOptions::default()
    }

    /// The first flag given, for an error when the store is not `rediss://`.
    pub fn first_flag(&self) -> Option<&'static str> {
        if self.ca.is_some() {
            Some(CA_FLAG)
        } else if self.client.is_some() {
            Some(CERT_FLAG)
        } else if self.skip_hostname_verification {
            Some(SKIP_HOSTNAME_FLAG)
        } else {
            None
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    #[error("{flag} {}: cannot read: {problem}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        problem: String,
    },
    #[error("{flag} {}: {problem}", path.display())]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        problem: String,
    },
}

/// The files as redis-rs takes them, and a hash of their bytes.
#[derive(Clone)]
struct Material {
    certificates: TlsCertificates,
    version: u64,
}

/// The TLS files of a Redis store, loaded; the connections take [`TlsFiles::client`].
pub struct TlsFiles {
    options: RedisTlsOptions,
    live: ArcSwap<Material>,
    /// When the files were last read after a failure.
    checked: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl TlsFiles {
    /// Reads and checks the files; an error names the flag and the file at fault.
    pub fn load(options: RedisTlsOptions) -> Result<TlsFiles, TlsFileError> {
        let material = load(&options)?;
        Ok(TlsFiles {
            options,
            live: ArcSwap::from_pointee(material),
            checked: Mutex::new(None),
        })
    }

    /// A client for `info` (a `rediss://` address) with the live files.
    pub fn client(&self, info: &ConnectionInfo) -> RedisResult<redis::Client> {
        let material = self.live.load();
        let client = redis::Client::build_with_tls(info.clone(), material.certificates.clone())?;
        redis::Client::open(self.addr(client.get_connection_info().clone()))
    }

    /// The live files, as redis-rs takes them (a Redis Cluster's client).
    pub fn certificates(&self) -> TlsCertificates {
        self.live.load().certificates.clone()
    }

    /// Whether Redis's certificate need not name the host dialled.
    pub fn skips_hostname(&self) -> bool {
        self.options.skip_hostname_verification
    }

    /// `info` with the name check off when asked (the chain is still checked).
    fn addr(&self, info: ConnectionInfo) -> ConnectionInfo {
        if !self.options.skip_hostname_verification {
            return info;
        }
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(true);
        info.set_addr(addr)
    }

    /// After a failed call: reads the files again (at most once per [`RECHECK_EVERY`]);
    /// whether they changed, so connections must be made again. Blocking (reads files).
    pub fn changed(&self) -> bool {
        {
            let mut checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
            if checked.is_some_and(|at| at.elapsed() < RECHECK_EVERY) {
                return false;
            }
            *checked = Some(Instant::now());
        }
        match load(&self.options) {
            Ok(material) if material.version == self.live.load().version => false,
            Ok(material) => {
                self.live.store(std::sync::Arc::new(material));
                tracing::info!("redis tls files changed: connecting again with them");
                true
            }
            Err(error) => {
                tracing::error!(%error, "cannot reload the redis tls files, keeping the previous ones");
                false
            }
        }
    }
}

fn load(options: &RedisTlsOptions) -> Result<Material, TlsFileError> {
    let mut version = 0xcbf2_9ce4_8422_2325; // FNV-1a 64's offset basis
    let mut hash = |bytes: &[u8]| {
        version = fnv1a64(version, &(bytes.len() as u64).to_le_bytes());
        version = fnv1a64(version, bytes);
    };
    let root_cert = match &options.ca {
        Some(path) => {
            let pem = read(CA_FLAG, path)?;
            roots(path, &pem)?;
            hash(&pem);
            Some(pem)
        }
        None => None,
    };
    let client_tls = match &options.client {
        Some((cert, key)) => {
            let cert_pem = read(CERT_FLAG, cert)?;
            let key_pem = read(KEY_FLAG, key)?;
            check_pair(cert, &cert_pem, key, &key_pem)?;
            hash(&cert_pem);
            hash(&key_pem);
            Some(ClientTlsConfig {
                client_cert: cert_pem,
                client_key: key_pem,
            })
        }
        None => None,
    };
    Ok(Material {
        certificates: TlsCertificates {
            client_tls,
            root_cert,
        },
        version,
    })
}

/// A file's bytes, at most [`MAX_FILE_BYTES`].
fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    crate::files::read_regular(path, MAX_FILE_BYTES).map_err(|error| match error {
        crate::files::ReadError::Io(source) => TlsFileError::Read {
            flag,
            path: path.to_owned(),
            problem: source.to_string().to_lowercase(),
        },
        problem => TlsFileError::Invalid {
            flag,
            path: path.to_owned(),
            problem: problem.to_string(),
        },
    })
}

/// Every certificate in `pem`; at least one.
fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let invalid = |problem: String| TlsFileError::Invalid {
        flag,
        path: path.to_owned(),
        problem,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| invalid(format!("not a valid PEM certificate: {error}")))?;
    if certs.is_empty() {
        return Err(invalid("no PEM certificate found".to_owned()));
    }
    Ok(certs)
}

/// The CA file: certificates that can each be a root.
fn roots(path: &Path, pem: &[u8]) -> Result<(), TlsFileError> {
    let mut roots = RootCertStore::empty();
    for (index, cert) in certificates(CA_FLAG, path, pem)?.into_iter().enumerate() {
        roots.add(cert).map_err(|error| TlsFileError::Invalid {
            flag: CA_FLAG,
            path: path.to_owned(),
            problem: format!("certificate {index} is not a usable CA: {error}"),
        })?;
    }
    Ok(())
}

/// The client certificate and its key: both parse, and the key is the certificate's.
fn check_pair(
    cert: &Path,
    cert_pem: &[u8],
    key: &Path,
    key_pem: &[u8],
) -> Result<(), TlsFileError> {
    let chain = certificates(CERT_FLAG, cert, cert_pem)?;
    let invalid = |problem: String| TlsFileError::Invalid {
        flag: KEY_FLAG,
        path: key.to_owned(),
        problem,
    };
    let private = PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| match error {
        rustls_pki_types::pem::Error::NoItemsFound => invalid("no PEM private key found".into()),
        other => invalid(format!("not a valid PEM private key: {other}")),
    })?;
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(private)
        .map_err(|error| invalid(format!("unusable private key: {error}")))?;
    match rustls::sign::CertifiedKey::new(chain, signing).keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(()),
        Err(_) => Err(invalid(format!(
            "the key does not match the certificate in {CERT_FLAG} {}",
            cert.display()
        ))),
    }
}

/// Why `#insecure` is refused.
pub const INSECURE_REFUSED: &str = "#insecure would accept any certificate from anyone; give \
    the CA that signed Redis's certificate (--store-tls-ca) and, if its name does not match the \
    host, --store-tls-skip-hostname-verification";

/// Whether `info` asks to skip every check of the server's certificate
/// (`rediss://...#insecure`).
pub fn is_insecure(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { insecure: true, .. })
}

#[cfg(test)]
mod tests;
