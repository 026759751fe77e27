//! How this node opens connections to a peer: plain HTTP/2, or with mutual TLS
//! (`--peer-tls-*`) through a connector that takes the client config live at each
//! connection (so a renewed certificate is used from the next connection on, without a
//! restart) and checks the server's certificate for the dialled host (or the shared
//! `--peer-tls-name`): see `identity`.
//!
//! Invariant: with TLS configured there is no plain fallback; a peer whose certificate does
//! not check out is unreachable.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::identity;
use crate::transport::tls::Tls;

/// A lazily connecting channel to `address` with `endpoint`'s settings (built by
/// [`endpoint`]); over TLS when `tls` is given.
pub fn channel(address: &str, endpoint: Endpoint, tls: Option<&Tls>) -> Result<Channel, String> {
    let Some(tls) = tls else {
        return Ok(endpoint.connect_lazy());
    };
    let name = identity::name_for(address, tls.name())?;
    Ok(endpoint.connect_with_connector_lazy(TlsDial {
        tls: tls.clone(),
        name,
    }))
}

/// The endpoint of `address` (the URI's scheme stays `http`: TLS, when used, is the
/// connector's).
pub fn endpoint(address: &str) -> Result<Endpoint, String> {
    Endpoint::from_shared(format!("http://{address}"))
        .map_err(|error| format!("bad address: {error}"))
}

/// Dials TCP, then the TLS handshake with the client config live now.
#[derive(Clone)]
struct TlsDial {
    tls: Tls,
    /// What the server's certificate must be valid for.
    name: ServerName<'static>,
}

type Dialed = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;

impl tower_service::Service<Uri> for TlsDial {
    type Response = Dialed;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Dialed>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = self.tls.connector();
        let name = self.name.clone();
        Box::pin(async move {
            let connector = connector
                .ok_or_else(|| io::Error::other("the peer tls config has no client side"))?;
            let host = uri
                .host()
                .map(|host| host.trim_start_matches('[').trim_end_matches(']'))
                .ok_or_else(|| io::Error::other(format!("no host in {uri}")))?;
            let port = uri
                .port_u16()
                .ok_or_else(|| io::Error::other(format!("no port in {uri}")))?;
            let stream = TcpStream::connect((host, port)).await?;
            // Forwards are small and latency-bound.
            stream.set_nodelay(true)?;
            Ok(TokioIo::new(connector.connect(name, stream).await?))
        })
    }
}
