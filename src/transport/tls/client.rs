//! The client side of TLS to a server that is not a peer (the xDS management server): the
//! CA the server's certificate must chain to (or, without one, the system's roots, as
//! `rediss://` takes them) and, for mutual TLS, the certificate to present when the server
//! asks for one. Made into a rustls `ClientConfig` (ring, ALPN `h2`) and kept current like
//! the listener's: [`ClientTls::watch`] reloads it when the files change, and a connection
//! takes the config live when it opens, so a renewed certificate or CA is used from the next
//! connection on.
//!
//! Invariants (those of the listener's config, `tls`): a config is built from all its files
//! or not at all; at start a problem is an error naming the flag and the file; on a reload
//! the old config stays live and the problem is logged and counted.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::client::ClientConfig;
use rustls::sign::SingleCertAndKey;
use rustls_pki_types::PrivateKeyDer;
use rustls_pki_types::pem::PemObject;

use super::{
    Flags, TlsError, TlsStats, TlsWatch, certificates, certified_key, pem_problem, read, roots,
};
use crate::key::fnv1a64;

/// Which files make a client's TLS config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTlsOptions {
    /// PEM: the CA certificates the server's certificate must chain to; `None`: the
    /// system's roots.
    pub ca: Option<PathBuf>,
    /// PEM: the certificate chain (leaf first) and the private key to present (mutual TLS).
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl ClientTlsOptions {
    /// The files to watch, each once.
    fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.ca.iter().cloned().collect();
        if let Some((cert, key)) = &self.identity {
            files.extend([cert.clone(), key.clone()]);
        }
        files.dedup();
        files
    }
}

/// A client's live TLS config; cheap to clone (all clones see every swap).
#[derive(Clone)]
pub struct ClientTls {
    options: Arc<ClientTlsOptions>,
    flags: &'static Flags,
    live: Arc<ArcSwap<ClientConfig>>,
    /// A hash of the files the live config was made from.
    version: Arc<AtomicU64>,
    stats: Arc<TlsStats>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("options", &self.options)
            .field("what", &self.flags.what)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Loads the files (and, without a CA file, the system's roots); an error names the flag
    /// and the file at fault.
    pub fn load(options: ClientTlsOptions, flags: &'static Flags) -> Result<ClientTls, TlsError> {
        let (config, version) = load(&options, flags)?;
        let stats = Arc::new(TlsStats::default());
        stats.loads.fetch_add(1, Ordering::Relaxed);
        Ok(ClientTls {
            options: Arc::new(options),
            flags,
            live: Arc::new(ArcSwap::from_pointee(config)),
            version: Arc::new(AtomicU64::new(version)),
            stats,
        })
    }

    /// The connector for a connection opened now.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.live.load_full())
    }

    pub fn options(&self) -> &ClientTlsOptions {
        &self.options
    }

    pub fn flags(&self) -> &'static Flags {
        self.flags
    }

    /// What the config is for, in logs and metrics (`xds`).
    pub fn what(&self) -> &'static str {
        self.flags.what
    }

    pub fn stats(&self) -> &Arc<TlsStats> {
        &self.stats
    }

    /// The files the config is made from.
    pub fn files(&self) -> Vec<PathBuf> {
        self.options.files()
    }

    /// Re-reads the files: `Ok(true)` when a changed config was swapped in, `Ok(false)`
    /// when they are unchanged. On error the live config stays, and the failure is counted
    /// and logged. Blocking (reads files).
    pub fn reload_now(&self) -> Result<bool, TlsError> {
        let what = self.flags.what;
        let (config, version) = match load(&self.options, self.flags) {
            Ok(loaded) => loaded,
            Err(error) => {
                self.stats.load_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%error, what, "cannot reload the tls files, keeping the previous ones");
                return Err(error);
            }
        };
        if version == self.version.load(Ordering::Relaxed) {
            return Ok(false);
        }
        self.live.store(Arc::new(config));
        self.version.store(version, Ordering::Relaxed);
        self.stats.loads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(files = ?self.files(), what, "tls client files reloaded, used from the next connection");
        Ok(true)
    }

    /// Starts watching the files' directories, reloading on changes (`None` when there is
    /// no file to watch: the system's roots and no client certificate); needs a tokio
    /// runtime. Dropping the returned watch stops it.
    pub fn watch(&self) -> Result<Option<TlsWatch>, TlsError> {
        if self.files().is_empty() {
            return Ok(None);
        }
        super::watch::start(self.clone()).map(Some)
    }
}

impl super::watch::Reloadable for ClientTls {
    fn files(&self) -> Vec<PathBuf> {
        ClientTls::files(self)
    }

    fn what(&self) -> &'static str {
        ClientTls::what(self)
    }

    fn reload_now(&self) -> Result<bool, TlsError> {
        ClientTls::reload_now(self)
    }
}

/// The config made from the files, and a hash of their bytes.
fn load(
    options: &ClientTlsOptions,
    flags: &'static Flags,
) -> Result<(ClientConfig, u64), TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut version = 0xcbf2_9ce4_8422_2325; // FNV-1a 64's offset basis
    let mut mix = |bytes: &[u8]| {
        version = fnv1a64(version, &(bytes.len() as u64).to_le_bytes());
        version = fnv1a64(version, bytes);
    };
    let roots = match &options.ca {
        Some(path) => {
            let pem = read(flags.ca, path)?;
            mix(&pem);
            roots(flags.ca, path, &pem)?
        }
        None => system_roots(flags)?,
    };
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?
        .with_root_certificates(roots);
    let mut config = match &options.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let cert_pem = read(flags.cert, cert)?;
            let key_pem = read(flags.key, key)?;
            mix(&cert_pem);
            mix(&key_pem);
            let chain = certificates(flags.cert, cert, &cert_pem)?;
            let private =
                PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| TlsError::Invalid {
                    flag: flags.key,
                    path: key.clone(),
                    problem: pem_problem(&error, "private key"),
                })?;
            let certified = certified_key((cert, key), flags, chain, private, &provider)?;
            builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(certified)))
        }
    };
    // gRPC is HTTP/2, and gRPC servers refuse a client that does not say so in ALPN.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok((config, version))
}

/// The system's CA certificates; an error naming `flags.ca` when there are none.
fn system_roots(flags: &'static Flags) -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::debug!(%error, what = flags.what, "a system CA certificate could not be read");
    }
    let mut roots = RootCertStore::empty();
    let (added, _unusable) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(TlsError::NoRoots { flag: flags.ca });
    }
    Ok(roots)
}

#[cfg(test)]
mod tests;
