//! What `serve` starts for the reference stats: nothing unless a sink is asked for; else the
//! [`ReferenceStats`] the limiter counts into, the StatsD push and the Prometheus listener
//! (bound before anything is served, so a busy address or a bad mapping file fails the
//! start, naming it).

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::mapper::{Mapper, MapperError};
use super::prometheus::{Page, PrometheusOptions, router};
use super::statsd::{Pusher, StatsdOptions};
use super::{Loads, ReferenceStats};
use crate::metrics::{Metrics, MetricsOptions};

/// The sinks asked for (`--statsd`, `--prometheus-addr`) and the tags of the names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReferenceOptions {
    pub statsd: Option<StatsdOptions>,
    pub prometheus: Option<PrometheusOptions>,
    /// `EXTRA_TAGS`, `--stats-tag`.
    pub tags: Vec<(String, String)>,
}

impl ReferenceOptions {
    pub fn is_on(&self) -> bool {
        self.statsd.is_some() || self.prometheus.is_some()
    }
}

/// Why the sinks cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("--prometheus-mapping {0}")]
    Mapping(#[from] MapperError),
    #[error("--prometheus-addr {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The running sinks; dropping it stops them.
#[derive(Debug)]
pub struct Running {
    prometheus_addr: Option<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Where the Prometheus listener is bound.
    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.prometheus_addr
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The server's metrics over `registry`, counting the reference stats when `options` asks
/// for a sink, and those sinks started.
pub async fn start(
    options: &ReferenceOptions,
    metrics: MetricsOptions,
    registry: Registry,
    reloads: &Arc<dyn Loads>,
) -> Result<(Arc<Metrics>, Option<Running>), SinkError> {
    let max_names = metrics.max_series;
    let metrics = Metrics::new(metrics, registry);
    if !options.is_on() {
        return Ok((Arc::new(metrics), None));
    }
    let stats = Arc::new(ReferenceStats::new(max_names, &options.tags));
    let metrics = Arc::new(metrics.with_reference(Arc::clone(&stats)));
    let mut running = Running {
        prometheus_addr: None,
        tasks: Vec::new(),
    };
    if let Some(statsd) = &options.statsd {
        let pusher = Pusher::new(statsd, Arc::clone(&stats), Arc::clone(reloads));
        running.tasks.push(pusher.spawn());
    }
    if let Some(prometheus) = &options.prometheus {
        let mapper = match &prometheus.mapping {
            Some(path) => Mapper::load(path)?,
            None => Mapper::reference_default(),
        };
        let listener =
            TcpListener::bind(prometheus.addr)
                .await
                .map_err(|source| SinkError::Listen {
                    addr: prometheus.addr,
                    source,
                })?;
        running.prometheus_addr = listener.local_addr().ok();
        let page = Page {
            stats,
            mapper: Arc::new(mapper),
            reloads: Arc::clone(reloads),
            metrics: Arc::clone(&metrics),
        };
        let app = router(page, &prometheus.path);
        running.tasks.push(tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::warn!(%error, "the prometheus listener stopped");
            }
        }));
    }
    Ok((metrics, Some(running)))
}
