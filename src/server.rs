//! Wires the parts into a running process: the engine, the gRPC listener (Envoy's
//! `RateLimitService`) and the HTTP listener.
//!
//! [`Server::bind`] binds both listeners first, so callers (and tests, with port 0) know the
//! addresses before [`Server::run`] serves. `run` returns once `shutdown` resolves and the
//! in-flight requests have been answered.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use crate::admin::{self, Health};
use crate::clock::Clock;
use crate::engine::{Engine, EngineConfig};
use crate::limits::Limits;
use crate::rls::{Limiter, LimiterOptions, RlsService, bounds};

/// Everything `serve` needs besides the limits.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub engine: EngineConfig,
    pub limiter: LimiterOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("grpc listener failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("http listener failed: {0}")]
    Http(std::io::Error),
}

pub struct Server {
    grpc: TcpListener,
    http: TcpListener,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    limiter: Arc<Limiter>,
    health: Arc<Health>,
}

impl Server {
    /// Binds both listeners and starts the engine (on the current tokio runtime).
    pub async fn bind(options: &ServerOptions, limits: Limits) -> Result<Server, ServeError> {
        let bind = |addr: SocketAddr| async move {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind { addr, source })?;
            let bound = listener
                .local_addr()
                .map_err(|source| ServeError::Bind { addr, source })?;
            Ok::<_, ServeError>((listener, bound))
        };
        let (grpc, grpc_addr) = bind(options.grpc_addr).await?;
        let (http, http_addr) = bind(options.http_addr).await?;
        let engine = Engine::spawn(options.engine, Clock::system());
        let limits = Arc::new(ArcSwap::from_pointee(limits));
        let limiter = Arc::new(Limiter::new(limits, engine, options.limiter));
        Ok(Server {
            grpc,
            http,
            grpc_addr,
            http_addr,
            limiter,
            health: Arc::new(Health::new()),
        })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Serves until `shutdown` resolves, then stops accepting and drains in-flight calls.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServeError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            // An error means the sender is gone, which is also a stop.
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let service = RateLimitServiceServer::from_arc(Arc::new(RlsService::new(Arc::clone(
            &self.limiter,
        ))))
        .max_decoding_message_size(bounds::MAX_MESSAGE_BYTES);
        let incoming = TcpIncoming::from(self.grpc).with_nodelay(Some(true));
        let grpc = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone()));
        let app = admin::router(Arc::clone(&self.health), Arc::clone(self.limiter.limits()));
        let http = axum::serve(self.http, app).with_graceful_shutdown(stopped(stop_rx));
        let health = Arc::clone(&self.health);
        let signal = async move {
            shutdown.await;
            tracing::info!("shutting down: draining in-flight requests");
            health.stop_serving();
            let _ = stop_tx.send(true);
        };
        let (grpc, http, ()) = tokio::join!(grpc, async { http.await }, signal);
        grpc?;
        http.map_err(ServeError::Http)?;
        Ok(())
    }
}
