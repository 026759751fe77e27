//! The gRPC listener's sockets: TCP (`--grpc-addr`) or a Unix domain socket
//! (`--grpc-uds`, instead of TCP, like the reference's `GRPC_UDS`), each optionally behind
//! TLS ([`crate::transport::tls`]). [`GrpcListener::incoming`] is the stream of connections
//! [`crate::envoy::grpc`] serves.
//!
//! One accept task per listener takes connections and hands them over through a bounded
//! channel; with TLS each connection's handshake runs on its own task, so a slow or silent
//! client never holds up the others.
//!
//! Invariants:
//! - Bounded: at most [`MAX_HANDSHAKES`] handshakes at once (accepting waits beyond that),
//!   each at most [`HANDSHAKE_TIMEOUT`]; [`QUEUE`] accepted connections wait to be
//!   served.
//! - When the server drops the stream (shutdown), the accept task ends and the listening socket
//!   closes; a Unix socket's file is removed then (or when the listener is dropped unused),
//!   if it is still the one this process created.
//! - Binding a Unix socket removes a stale socket file left by an earlier run, but never a
//!   file that is not a socket, nor a socket another process still serves.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::server::TlsStream;

use crate::transport::tls::Tls;

/// Handshakes in progress at most; accepting waits while this many are running.
pub const MAX_HANDSHAKES: usize = 256;

/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepted connections waiting to be served.
const QUEUE: usize = 16;

/// Pause after a failed accept (say, out of file descriptors), so it is not a busy loop.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Where the gRPC listener is bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrpcEndpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// `127.0.0.1:8081`, or `unix:/run/ratekeeper.sock`.
impl fmt::Display for GrpcEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GrpcEndpoint::Tcp(addr) => write!(f, "{addr}"),
            GrpcEndpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen on {addr}: {source}")]
    Tcp { addr: SocketAddr, source: io::Error },
    #[error("--grpc-uds {}: {problem}", path.display())]
    Unix { path: PathBuf, problem: String },
}

/// Binds a TCP listener on `addr` (any listener: gRPC, HTTP, admin, peers); the listener
/// and the address it got (the port, for port 0).
pub async fn bind_tcp(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ListenError> {
    let error = |source| ListenError::Tcp { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(error)?;
    let bound = listener.local_addr().map_err(error)?;
    Ok((listener, bound))
}

/// A bound gRPC listening socket.
#[derive(Debug)]
pub struct GrpcListener {
    socket: Socket,
    endpoint: GrpcEndpoint,
}

#[derive(Debug)]
enum Socket {
    Tcp(TcpListener),
    Unix {
        listener: UnixListener,
        /// Removed when this drops, with the listener.
        _file: SocketFile,
    },
}

impl GrpcListener {
    /// Binds `addr` (port 0 picks a free port; [`Self::endpoint`] tells which).
    pub async fn bind_tcp(addr: SocketAddr) -> Result<GrpcListener, ListenError> {
        let (listener, bound) = bind_tcp(addr).await?;
        Ok(GrpcListener {
            socket: Socket::Tcp(listener),
            endpoint: GrpcEndpoint::Tcp(bound),
        })
    }

    /// Binds a Unix domain socket at `path`, replacing a stale socket file. Must be called
    /// inside a tokio runtime.
    pub fn bind_unix(path: &Path) -> Result<GrpcListener, ListenError> {
        let error = |problem: String| ListenError::Unix {
            path: path.to_owned(),
            problem,
        };
        match std::fs::symlink_metadata(path) {
            Ok(metadata) if metadata.file_type().is_socket() => {
                // A socket someone still accepts on belongs to a running process.
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(error(
                        "another process is serving on this socket".to_owned(),
                    ));
                }
                std::fs::remove_file(path)
                    .map_err(|e| error(format!("cannot remove the stale socket file: {e}")))?;
                tracing::info!(path = %path.display(), "removed a stale socket file");
            }
            Ok(_) => {
                return Err(error(
                    "exists and is not a socket (not removing it)".to_owned(),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(error(format!("cannot inspect: {e}"))),
        }
        let listener =
            UnixListener::bind(path).map_err(|e| error(format!("cannot listen: {e}")))?;
        let file = SocketFile::created(path).map_err(|e| error(format!("cannot inspect: {e}")))?;
        Ok(GrpcListener {
            socket: Socket::Unix {
                listener,
                _file: file,
            },
            endpoint: GrpcEndpoint::Unix(path.to_owned()),
        })
    }

    /// A TCP listener bound elsewhere (the peer listener): served the same way.
    pub fn from_tcp(listener: TcpListener) -> Result<GrpcListener, ListenError> {
        let bound = listener.local_addr().map_err(|source| ListenError::Tcp {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        Ok(GrpcListener {
            socket: Socket::Tcp(listener),
            endpoint: GrpcEndpoint::Tcp(bound),
        })
    }

    pub fn endpoint(&self) -> &GrpcEndpoint {
        &self.endpoint
    }

    /// Starts accepting (on a task of the current runtime): the connections, after the TLS
    /// handshake when `tls` is given. Dropping the stream stops accepting and closes the
    /// socket.
    pub fn incoming(self, tls: Option<Tls>) -> Incoming {
        let (sender, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(accept(self.socket, tls, sender));
        Incoming { receiver }
    }
}

/// The socket file this process created; removed on drop if it is still that file.
#[derive(Debug)]
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    fn created(path: &Path) -> io::Result<SocketFile> {
        let metadata = std::fs::symlink_metadata(path)?;
        Ok(SocketFile {
            path: path.to_owned(),
            dev: metadata.dev(),
            ino: metadata.ino(),
        })
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        // Another process may have replaced it since; that one is not ours to remove.
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|metadata| metadata.dev() == self.dev && metadata.ino() == self.ino);
        if ours && let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), %error, "cannot remove the grpc socket file");
        }
    }
}

/// The accept loop: ends when the receiving side is gone.
async fn accept(socket: Socket, tls: Option<Tls>, sender: mpsc::Sender<io::Result<Conn>>) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let accepted = tokio::select! {
            () = sender.closed() => return,
            accepted = socket.accept() => accepted,
        };
        let conn = match accepted {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "grpc listener cannot accept a connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Some(tls) = &tls else {
            if sender.send(Ok(conn)).await.is_err() {
                return;
            }
            continue;
        };
        let permit = tokio::select! {
            () = sender.closed() => return,
            permit = Arc::clone(&handshakes).acquire_owned() => match permit {
                Ok(permit) => permit,
                // The semaphore is never closed; if it were, nothing more could be served.
                Err(_) => return,
            },
        };
        let acceptor = tls.acceptor();
        let stats = Arc::clone(tls.stats());
        let sender = sender.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, conn.handshake(acceptor)).await {
                Ok(Ok(conn)) => {
                    // An error means the server stopped meanwhile: the connection just closes.
                    let _ = sender.send(Ok(conn)).await;
                }
                Ok(Err(error)) => {
                    stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%error, "grpc tls handshake failed");
                }
                Err(_) => {
                    stats.handshake_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("grpc tls handshake timed out");
                }
            }
        });
    }
}

impl Socket {
    async fn accept(&self) -> io::Result<Conn> {
        match self {
            Socket::Tcp(listener) => {
                let (stream, _) = listener.accept().await?;
                // gRPC answers are small and latency-bound.
                stream.set_nodelay(true)?;
                Ok(Conn::Tcp(stream))
            }
            Socket::Unix { listener, .. } => {
                let (stream, _) = listener.accept().await?;
                Ok(Conn::Unix(stream))
            }
        }
    }
}

/// The connections [`crate::envoy::grpc`] serves, from [`GrpcListener::incoming`].
#[derive(Debug)]
pub struct Incoming {
    receiver: mpsc::Receiver<io::Result<Conn>>,
}

impl futures_core::Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver.poll_recv(cx)
    }
}

/// One accepted gRPC connection.
#[derive(Debug)]
pub enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
    TlsTcp(Box<TlsStream<TcpStream>>),
    TlsUnix(Box<TlsStream<UnixStream>>),
}

impl Conn {
    async fn handshake(self, acceptor: tokio_rustls::TlsAcceptor) -> io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(stream) => Conn::TlsTcp(Box::new(acceptor.accept(stream).await?)),
            Conn::Unix(stream) => Conn::TlsUnix(Box::new(acceptor.accept(stream).await?)),
            // Accepted connections are plain; a second handshake is a no-op.
            tls @ (Conn::TlsTcp(_) | Conn::TlsUnix(_)) => tls,
        })
    }
}

/// What a served request knows of its connection (a request extension, through tonic's
/// [`Connected`](tonic::transport::server::Connected)).
#[derive(Clone, Debug, Default)]
pub struct ConnInfo {
    /// The client's address (TCP).
    pub remote: Option<SocketAddr>,
    /// The client's certificate chain, leaf first, when it presented one (mutual TLS).
    pub client_certs: Option<Arc<[CertificateDer<'static>]>>,
}

impl ConnInfo {
    /// The client certificate (the chain's leaf), when there is one.
    pub fn client_cert(&self) -> Option<&CertificateDer<'static>> {
        self.client_certs.as_deref().and_then(<[_]>::first)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        let certs = |certs: Option<&[CertificateDer<'static>]>| -> Option<Arc<[_]>> {
            certs.map(|certs| certs.iter().map(|cert| cert.clone().into_owned()).collect())
        };
        match self {
            Conn::Tcp(stream) => ConnInfo {
                remote: stream.peer_addr().ok(),
                client_certs: None,
            },
            Conn::Unix(_) => ConnInfo::default(),
            Conn::TlsTcp(stream) => ConnInfo {
                remote: stream.get_ref().0.peer_addr().ok(),
                client_certs: certs(stream.get_ref().1.peer_certificates()),
            },
            Conn::TlsUnix(stream) => ConnInfo {
                remote: None,
                client_certs: certs(stream.get_ref().1.peer_certificates()),
            },
        }
    }
}

/// Calls `$method` on whichever stream `$conn` holds (all are `Unpin`).
macro_rules! delegate {
    ($conn:expr, $method:ident ( $($arg:expr),* )) => {
        match $conn.get_mut() {
            Conn::Tcp(stream) => Pin::new(stream).$method($($arg),*),
            Conn::Unix(stream) => Pin::new(stream).$method($($arg),*),
            Conn::TlsTcp(stream) => Pin::new(stream.as_mut()).$method($($arg),*),
            Conn::TlsUnix(stream) => Pin::new(stream.as_mut()).$method($($arg),*),
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        delegate!(self, poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Tcp(stream) => stream.is_write_vectored(),
            Conn::Unix(stream) => stream.is_write_vectored(),
            Conn::TlsTcp(stream) => stream.is_write_vectored(),
            Conn::TlsUnix(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, poll_shutdown(cx))
    }
}
