//! TLS to the management server (`--xds-tls`, or an `https://` `--xds-server`; the
//! reference's `CONFIG_GRPC_XDS_SERVER_USE_TLS` and its files): the files, loaded and watched
//! by `transport::tls`'s client side; the connector that dials TCP and shakes hands with the
//! config live at that moment, checking the server's certificate for `--xds-tls-san` (by
//! default the host of `--xds-server`); and [`explain`], which turns a failed handshake into
//! what to check, naming the flag and the file.
//!
//! Invariant: with TLS asked for there is no plaintext fallback; a server whose certificate
//! does not check out is unreachable (and retried with the backoff).

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::{AlertDescription, CertificateError};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::Uri;

use crate::transport::tls::{ClientTls, ClientTlsOptions, Flags, TlsError, TlsStats, TlsWatch};

/// The xDS client's TLS flags, for errors and logs; `xds` is the metrics' prefix
/// (`xds_tls_loads`).
pub const FLAGS: Flags = Flags {
    cert: "--xds-tls-cert",
    key: "--xds-tls-key",
    ca: "--xds-tls-ca",
    san: "--xds-tls-san",
    what: "xds",
    client: true,
};

/// TLS to the management server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XdsTlsOptions {
    /// PEM: the CAs the server's certificate must chain to; `None`: the system's roots.
    pub ca: Option<PathBuf>,
    /// PEM: the client certificate chain and its key, presented when the server asks.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name the server's certificate must be valid for (and the SNI); `None`: the host
    /// of the server URL.
    pub san: Option<String>,
}

/// The live TLS config and the name the server must prove; cheap to clone.
#[derive(Clone, Debug)]
pub struct XdsTls {
    tls: ClientTls,
    name: ServerName<'static>,
    /// The TLS error that ended the last connection, if one did. With TLS 1.3 a server
    /// refuses the client's certificate after the handshake, by an alert that surfaces
    /// under HTTP/2, whose errors do not carry their cause: kept here to explain it.
    failure: Failure,
}

type Failure = Arc<Mutex<Option<rustls::Error>>>;

impl XdsTls {
    /// Loads the files for a server at `url` (`scheme://host:port`); an error names the flag
    /// and the file (or the name) at fault.
    pub fn load(options: &XdsTlsOptions, url: &str) -> Result<XdsTls, TlsError> {
        let name = match &options.san {
            Some(san) => name(FLAGS.san, san)?,
            None => {
                let host = url
                    .parse::<Uri>()
                    .ok()
                    .and_then(|uri| uri.host().map(str::to_owned))
                    .unwrap_or_default();
                let host = host.trim_start_matches('[').trim_end_matches(']');
                name("--xds-server", host)?
            }
        };
        let files = ClientTlsOptions {
            ca: options.ca.clone(),
            identity: options.identity.clone(),
        };
        Ok(XdsTls {
            tls: ClientTls::load(files, &FLAGS)?,
            name,
            failure: Failure::default(),
        })
    }

    pub fn stats(&self) -> &Arc<TlsStats> {
        self.tls.stats()
    }

    /// Watches the files (none to watch: `None`); see `ClientTls::watch`.
    pub fn watch(&self) -> Result<Option<TlsWatch>, TlsError> {
        self.tls.watch()
    }

    /// The connector for the next connection.
    pub(super) fn dial(&self) -> Dial {
        Dial { tls: self.clone() }
    }

    /// The name the server's certificate must be valid for.
    pub fn name(&self) -> String {
        self.name.to_str().into_owned()
    }

    /// What to check when `error` (a connection's or a call's, with its sources) comes
    /// from TLS (or the connection ended on a TLS error): the problem in words, naming the
    /// flag and file; `None` when it is not a TLS problem.
    pub fn explain(&self, error: &(dyn std::error::Error + 'static)) -> Option<String> {
        let mut next = Some(error);
        while let Some(error) = next {
            if let Some(tls) = rustls_error(error) {
                return Some(explain(tls, self.tls.options(), &self.name()));
            }
            next = error.source();
        }
        let recorded = lock(&self.failure).take()?;
        Some(explain(&recorded, self.tls.options(), &self.name()))
    }
}

/// The rustls error `error` is, or an IO error wraps.
fn rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    error.downcast_ref::<rustls::Error>().or_else(|| {
        error
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    })
}

fn lock(failure: &Failure) -> std::sync::MutexGuard<'_, Option<rustls::Error>> {
    failure.lock().unwrap_or_else(PoisonError::into_inner)
}

fn name(flag: &'static str, name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_owned()).map_err(|error| TlsError::ClientSan {
        flag,
        san: name.to_owned(),
        problem: format!(
            "not a DNS name or IP address to check the server's certificate for: {error}"
        ),
    })
}

/// A TLS problem in words: what is wrong, and which flag (and file) to look at.
pub fn explain(error: &rustls::Error, files: &ClientTlsOptions, name: &str) -> String {
    let roots = match &files.ca {
        Some(ca) => format!("the CA of {} {}", FLAGS.ca, ca.display()),
        None => format!(
            "a CA of the system's roots (give {} to name the CA)",
            FLAGS.ca
        ),
    };
    let cert = match &files.identity {
        Some((cert, _)) => format!("the client certificate {} {}", FLAGS.cert, cert.display()),
        None => format!(
            "no client certificate: give {} and {}",
            FLAGS.cert, FLAGS.key
        ),
    };
    let what = match error {
        rustls::Error::InvalidCertificate(problem) => match problem {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                format!("the server's certificate is not signed by {roots}")
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!(
                    "the server's certificate is not valid for {name:?} ({}, by default the host of --xds-server)",
                    FLAGS.san
                )
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "the server's certificate has expired".to_owned()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "the server's certificate is not valid yet".to_owned()
            }
            other => format!("the server's certificate is refused: {other:?}"),
        },
        rustls::Error::AlertReceived(AlertDescription::CertificateRequired) => {
            format!("the server asks for a client certificate and got {cert}")
        }
        rustls::Error::AlertReceived(
            alert @ (AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateRevoked
            | AlertDescription::AccessDenied),
        ) => format!("the server refused {cert} ({alert:?})"),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "the server does not answer in TLS (is it serving plaintext? then drop --xds-tls)"
                .to_owned()
        }
        other => format!("{other}"),
    };
    format!("tls with the xds server failed: {what}")
}

/// Dials TCP, then the TLS handshake with the client config live now.
#[derive(Clone)]
pub(super) struct Dial {
    tls: XdsTls,
}

type Dialed = TokioIo<Recording<tokio_rustls::client::TlsStream<TcpStream>>>;

impl tower_service::Service<Uri> for Dial {
    type Response = Dialed;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Dialed>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = self.tls.tls.connector();
        let name = self.tls.name.clone();
        let stats = Arc::clone(self.tls.stats());
        let failure = Arc::clone(&self.tls.failure);
        // A new connection: what ended the last one no longer explains anything.
        lock(&failure).take();
        Box::pin(async move {
            let host = uri
                .host()
                .map(|host| host.trim_start_matches('[').trim_end_matches(']'))
                .ok_or_else(|| io::Error::other(format!("no host in {uri}")))?;
            let port = uri.port_u16().unwrap_or(443);
            let stream = TcpStream::connect((host, port)).await?;
            stream.set_nodelay(true)?;
            match connector.connect(name, stream).await {
                Ok(inner) => Ok(TokioIo::new(Recording {
                    inner,
                    failure,
                    stats,
                })),
                Err(error) => {
                    stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                    Err(error)
                }
            }
        })
    }
}

/// A TLS stream that keeps the first TLS error it meets (a server's alert) for
/// [`XdsTls::explain`]. A server's alert refusing the client certificate counts as a failed
/// handshake, which it is (TLS 1.3 only tells the client after its side is done).
pub(super) struct Recording<S> {
    inner: S,
    failure: Failure,
    stats: Arc<TlsStats>,
}

impl<S> Recording<S> {
    fn record<T>(&self, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if let Poll::Ready(Err(error)) = &polled
            && let Some(tls) = rustls_error(error)
        {
            let mut failure = lock(&self.failure);
            if failure.is_none() {
                if matches!(tls, rustls::Error::AlertReceived(_)) {
                    self.stats
                        .handshake_failures
                        .fetch_add(1, Ordering::Relaxed);
                }
                *failure = Some(tls.clone());
            }
        }
        polled
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Recording<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.record(polled)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Recording<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.record(polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.record(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.record(polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.record(polled)
    }
}
