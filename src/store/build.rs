//! The store choice ([`StoreOptions`]: one value, so a pair that cannot work, Redis with
//! peers, cannot be said) and [`build`], which makes the chosen store and nothing of the
//! others: no engine or shards for Redis, no peer listener without a cluster, and only the
//! chosen store's metrics registered.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use super::Store;
use super::cluster::Cluster;
use super::memory::{Engine, MemoryStore};
use super::redis::{RedisOptions, RedisStore};
use crate::clock::Clock;
use crate::cluster::ClusterOptions;
use crate::transport::listener::{ListenError, bind_tcp};
use crate::transport::tls::{Tls, TlsOptions};

/// Where counters live.
#[derive(Clone, Debug, Default)]
pub enum StoreOptions {
    /// In this process's engine (`--store memory`, no peers).
    #[default]
    Memory,
    /// The memory store across peers: the peer listener's address (an empty `advertise` in
    /// `options` means the bound address) and the cluster's settings.
    Cluster {
        peer_addr: SocketAddr,
        options: ClusterOptions,
    },
    /// In Redis, shared by every node (`--store redis://...`).
    Redis(RedisOptions),
}

impl StoreOptions {
    /// The peers' TLS files, in cluster mode.
    pub fn peer_tls(&self) -> Option<&TlsOptions> {
        match self {
            StoreOptions::Cluster { options, .. } => options.tls.as_ref(),
            StoreOptions::Memory | StoreOptions::Redis(_) => None,
        }
    }

    pub fn is_redis(&self) -> bool {
        matches!(self, StoreOptions::Redis(_))
    }
}

/// Why the chosen store could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error(
        "the peer listener on {0} is reachable from other hosts without authentication: give --peer-tls-cert, --peer-tls-key and --peer-tls-ca (mutual tls between peers), or --peer-insecure to accept that"
    )]
    PeerInsecure(SocketAddr),
    #[error("--advertise is needed when the peer listener binds {0} (others cannot reach that)")]
    Advertise(SocketAddr),
    #[error("cannot use the redis store: {0}")]
    Redis(super::redis::SetupError),
}

/// The chosen store, made.
pub struct Built {
    pub store: Arc<dyn Store>,
    /// The store across peers, in cluster mode.
    pub cluster: Option<Cluster>,
    /// The peer listener, bound, and its address, in cluster mode.
    pub peer: Option<(TcpListener, SocketAddr)>,
}

/// Makes the store `options` choose, registering its metrics in `registry`. `engine` makes
/// this node's engine, called only for the memory store and the cluster; `peer_tls` is the
/// peers' loaded TLS (`None`: plain, allowed on loopback or with `--peer-insecure`).
pub async fn build(
    options: &StoreOptions,
    engine: impl FnOnce() -> Engine,
    peer_tls: Option<&Tls>,
    registry: &mut Registry,
) -> Result<Built, BuildError> {
    match options {
        StoreOptions::Redis(redis) => {
            let store =
                RedisStore::new(redis.clone(), Clock::system()).map_err(BuildError::Redis)?;
            store.register_metrics(registry);
            tracing::info!(store = %store.describe(), failure = redis.failure.as_str(), "counters live in redis");
            Ok(Built {
                store: Arc::new(store),
                cluster: None,
                peer: None,
            })
        }
        StoreOptions::Memory => {
            let memory = MemoryStore::new(engine());
            memory.register_metrics(registry);
            Ok(Built {
                store: Arc::new(memory),
                cluster: None,
                peer: None,
            })
        }
        StoreOptions::Cluster { peer_addr, options } => {
            if peer_tls.is_none() && !peer_addr.ip().is_loopback() {
                if !options.insecure {
                    return Err(BuildError::PeerInsecure(*peer_addr));
                }
                tracing::warn!(peer_addr = %peer_addr, "--peer-insecure: the peer listener takes unauthenticated messages (membership, handoffs, resets) from anything that reaches it");
            }
            let (listener, bound) = bind_tcp(*peer_addr).await?;
            let mut options = options.clone();
            if options.advertise.is_empty() {
                if bound.ip().is_unspecified() {
                    return Err(BuildError::Advertise(bound));
                }
                options.advertise = bound.to_string();
            }
            let memory = MemoryStore::new(engine());
            memory.register_metrics(registry);
            let cluster = Cluster::join_with(memory, options, peer_tls.cloned());
            cluster.runtime().register_metrics(registry);
            Ok(Built {
                store: Arc::new(cluster.clone()),
                cluster: Some(cluster),
                peer: Some((listener, bound)),
            })
        }
    }
}
