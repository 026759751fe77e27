//! Wires the parts into a running process: the engine, the limits (and their reloader), the
//! metrics, the gRPC listener (Envoy's `RateLimitService` plus `grpc.health.v1`, on TCP or a
//! Unix socket, optionally with TLS: see [`crate::transport::listener`] and [`crate::transport::tls`]), the HTTP
//! listener and the admin listener (see [`crate::admin`]).
//!
//! [`Server::bind`] loads the TLS files and the admin token (when asked) and binds the
//! listeners first, so bad certificates, a bad token file or an admin listener open to the
//! network without a token fail the start, and callers (and tests, with port 0) know the
//! addresses before [`Server::run`] serves. `run` returns once `shutdown` resolved and the
//! in-flight requests were answered, or the grace period ran out.
//!
//! Shutdown order: mark not ready (`/healthcheck` 503, gRPC health `NOT_SERVING`), keep
//! serving every call for `shutdown_delay` (still the owner of its keys in a cluster), leave
//! the ring, stop accepting (GOAWAY), drain in-flight calls (bounded by `shutdown_grace`),
//! hand the counters over, return.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::transport::listener::{GrpcEndpoint, GrpcListener, ListenError, bind_tcp};
use crate::transport::tls::{self, Tls, TlsError, TlsOptions, TlsWatch};

use crate::admin::auth::{TokenError, TokenFile, TokenWatch};
use crate::admin::names::CounterNames;
use crate::admin::{self, AdminOptions};
use crate::clock::Clock;
use crate::cluster::names::{NameSource, Named, NamesPage};
use crate::cluster::quota::QuotaSource;
use crate::envoy::rlqs::{RlqsOptions, RlqsService};
use crate::envoy::xds::{XdsClient, XdsOptions, XdsStats, XdsTls};
use crate::http::Health;
use crate::limiter::{Limiter, LimiterOptions};
use crate::limits::Limits;
use crate::metrics::reference::Loads;
use crate::metrics::reference::sinks::{self, ReferenceOptions, SinkError};
use crate::metrics::{Metrics, MetricsOptions};
use crate::quota::RlqsStats;
use crate::quota::cluster::{Exchanger, Owner, forget_after};
use crate::reload::{self, ReloadOptions, ReloadStats, Watcher};
use crate::store::cluster::Cluster;
use crate::store::memory::{Engine, EngineConfig};
use crate::store::{BuildError, StoreOptions};

/// The gRPC health service names answered besides the RLS service's full name: the whole
/// server (`""`) and the reference service's `ratelimit`.
const HEALTH_NAMES: [&str; 2] = ["", "ratelimit"];

/// The admin listener's address unless `--admin-addr` says otherwise: loopback, on the
/// reference service's debug port.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:6070";

/// How often gRPC health is brought in line with [`Health`].
const HEALTH_SYNC: Duration = Duration::from_millis(100);

/// How often counter names (`--counter-names`) of counters back to full are forgotten.
pub const NAMES_SWEEP: Duration = Duration::from_secs(10);

/// Sets every gRPC health name this server answers to serving or not.
async fn set_health(reporter: &tonic_health::server::HealthReporter, serving: bool) {
    crate::envoy::rls::set_health(reporter, serving).await;
    let status = match serving {
        true => tonic_health::ServingStatus::Serving,
        false => tonic_health::ServingStatus::NotServing,
    };
    // The reference service also answers its own name; probes written for it ask that.
    for name in HEALTH_NAMES {
        reporter.set_service_status(name, status).await;
    }
}

/// Stops a background task when dropped (the server's `run` returning, however it returns).
pub struct AbortOnDrop(pub tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Forgets, every [`NAMES_SWEEP`], the counter names that no longer name a live counter
/// here, so the bounded map has room for new ones.
async fn sweep_counter_names(names: Arc<CounterNames>, limiter: Arc<Limiter>) {
    let mut tick = tokio::time::interval(NAMES_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(error) = names.sweep(&limiter).await {
            tracing::debug!(%error, "counter names sweep failed; retrying at the next one");
        }
    }
}

/// This node's counter names as the peer service serves them (`Names`), when it keeps any.
fn name_source(names: Option<&Arc<CounterNames>>) -> Option<NameSource> {
    let names = Arc::clone(names?);
    Some(Arc::new(
        move |domain: &str, after: Option<u64>, limit: usize| {
            let (page, more) = names.page(domain, after, limit);
            let figures = names.figures();
            let count = |value: usize| u64::try_from(value).unwrap_or(u64::MAX);
            Some(NamesPage {
                names: page
                    .into_iter()
                    .map(|(route, name)| Named {
                        route,
                        entries: name.entries.to_vec(),
                    })
                    .collect(),
                more,
                kept: count(figures.kept),
                capacity: count(figures.capacity),
                dropped: figures.dropped,
            })
        },
    ))
}

/// Keeps gRPC health equal to `health.is_ready()` (which turns true once limits load, when
/// that is required, and false for good at shutdown).
async fn sync_health(
    health: Arc<Health>,
    reporter: tonic_health::server::HealthReporter,
    mut ready: bool,
) {
    loop {
        tokio::time::sleep(HEALTH_SYNC).await;
        let now = health.is_ready();
        if now != ready {
            set_health(&reporter, now).await;
            ready = now;
        }
    }
}

/// Everything `serve` needs besides the limits.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub grpc_addr: SocketAddr,
    /// Serve gRPC on this Unix domain socket instead of `grpc_addr`.
    pub grpc_uds: Option<PathBuf>,
    /// TLS (and client certificates, when it names a CA) on the gRPC listener.
    pub grpc_tls: Option<TlsOptions>,
    pub http_addr: SocketAddr,
    pub engine: EngineConfig,
    pub limiter: LimiterOptions,
    pub metrics: MetricsOptions,
    /// Watch this path and reload the limits when it changes (`None`: never reload).
    pub watch: Option<PathBuf>,
    pub reload: ReloadOptions,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// How long shutdown keeps serving everything, not ready, before it closes the
    /// listeners (the time for load balancers to stop sending here; zero by default in
    /// the library, `--shutdown-delay` 5 s on the command line).
    pub shutdown_delay: Duration,
    /// Report unhealthy until limits with at least one domain are loaded.
    pub healthy_only_with_config: bool,
    /// Where counters live: this process, the cluster, or Redis.
    pub store: StoreOptions,
    /// Take the limits from an xDS management server (instead of `watch`).
    pub xds: Option<XdsOptions>,
    /// Which operator endpoints the admin listener serves.
    pub admin: AdminOptions,
    /// The admin listener (operator endpoints). Must be a loopback address unless
    /// `admin_token` is set.
    pub admin_addr: SocketAddr,
    /// The bearer token every admin request must carry: this file's content, re-read while
    /// serving (see [`crate::admin::auth`]).
    pub admin_token: Option<PathBuf>,
    /// The Rate Limit Quota Service (`StreamRateLimitQuotas`) on the gRPC listener.
    pub rlqs: RlqsOptions,
    /// The reference service's stats: a StatsD push, a Prometheus listener (off by default).
    pub reference: ReferenceOptions,
}

impl ServerOptions {
    /// Options for the given addresses, everything else at its default; the admin listener
    /// on `127.0.0.1:0` (loopback, any free port: the command line's default is
    /// [`DEFAULT_ADMIN_ADDR`]).
    pub fn new(grpc_addr: SocketAddr, http_addr: SocketAddr) -> ServerOptions {
        ServerOptions {
            grpc_addr,
            grpc_uds: None,
            grpc_tls: None,
            http_addr,
            engine: EngineConfig::default(),
            limiter: LimiterOptions::default(),
            metrics: MetricsOptions::default(),
            watch: None,
            reload: ReloadOptions::default(),
            shutdown_grace: Duration::from_secs(15),
            shutdown_delay: Duration::ZERO,
            healthy_only_with_config: false,
            store: StoreOptions::Memory,
            xds: None,
            admin: AdminOptions::default(),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_token: None,
            rlqs: RlqsOptions::default(),
            reference: ReferenceOptions::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Watch(#[from] reload::ReloadError),
    #[error(transparent)]
    Store(#[from] BuildError),
    #[error("peer listener failed: {0}")]
    Peer(tonic::transport::Error),
    #[error(
        "--admin-addr {0} is not a loopback address, so anyone who reaches it could read and reset counters: give --admin-token-file (a file holding the bearer token callers must send), or bind it to loopback (127.0.0.1:6070) and reach it with kubectl port-forward"
    )]
    AdminWithoutToken(SocketAddr),
    #[error(transparent)]
    AdminToken(#[from] TokenError),
    #[error("http listener failed: {0}")]
    Http(std::io::Error),
    #[error("admin listener failed: {0}")]
    Admin(std::io::Error),
    #[error("cannot handle SIGHUP: {0}")]
    Signal(std::io::Error),
    #[error(transparent)]
    Reference(#[from] SinkError),
}

pub struct Server {
    grpc: GrpcListener,
    http: TcpListener,
    admin_listener: TcpListener,
    admin_addr: SocketAddr,
    peer: Option<(TcpListener, SocketAddr)>,
    secrets: Secrets,
    grpc_endpoint: GrpcEndpoint,
    http_addr: SocketAddr,
    limiter: Arc<Limiter>,
    /// The counter names the limiter feeds (`--counter-names`).
    names: Option<Arc<CounterNames>>,
    /// The store across peers, in cluster mode.
    cluster: Option<Cluster>,
    health: Arc<Health>,
    reload_stats: Arc<ReloadStats>,
    admin: AdminOptions,
    shutdown_grace: Duration,
    shutdown_delay: Duration,
    /// Kept alive while serving (dropping it stops them): the watches and the xDS
    /// subscription.
    watches: Watches,
    xds_stats: Arc<XdsStats>,
    rlqs: RlqsOptions,
    rlqs_stats: RlqsStats,
    /// Why RLQS streams are refused on this node (`--store redis`).
    rlqs_refused: Option<String>,
    /// The reference stats' StatsD push and Prometheus listener, running until dropped.
    reference: Option<sinks::Running>,
}

/// What is read before anything listens, so a bad file fails the start: the gRPC
/// listener's TLS, the admin token, the peers' TLS, the xDS client's TLS.
struct Secrets {
    grpc_tls: Option<Tls>,
    admin_token: Option<TokenFile>,
    peer_tls: Option<Tls>,
    xds_tls: Option<XdsTls>,
}

impl Secrets {
    /// Loads the files `options` name; an admin listener others can reach must have a token.
    fn load(options: &ServerOptions) -> Result<Secrets, ServeError> {
        let grpc_tls = options.grpc_tls.clone().map(Tls::load).transpose()?;
        let admin_token = options
            .admin_token
            .clone()
            .map(TokenFile::load)
            .transpose()?;
        if admin_token.is_none() && !options.admin_addr.ip().to_canonical().is_loopback() {
            return Err(ServeError::AdminWithoutToken(options.admin_addr));
        }
        let peer_tls = options
            .store
            .peer_tls()
            .cloned()
            .map(|files| Tls::load_for(files, &tls::PEER))
            .transpose()?;
        let xds_tls = match &options.xds {
            Some(xds) => xds
                .tls_options()
                .map(|files| XdsTls::load(&files, &xds.url()))
                .transpose()?,
            None => None,
        };
        Ok(Secrets {
            grpc_tls,
            admin_token,
            peer_tls,
            xds_tls,
        })
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        if let Some(tls) = &self.grpc_tls {
            tls.stats().register_metrics(registry);
        }
        if let Some(tls) = &self.peer_tls {
            tls.stats().register_metrics_as(tls::PEER.what, registry);
        }
        if let Some(tls) = &self.xds_tls {
            tls.stats()
                .register_metrics_as(crate::envoy::xds::TLS_FLAGS.what, registry);
        }
    }
}

/// What keeps the limits and the secrets current while serving; each stops when dropped.
struct Watches {
    /// The limits files (`None` with xDS, or without a path to watch).
    limits: Option<Watcher>,
    /// The xDS subscription, with `--config-source xds`.
    _xds: Option<AbortOnDrop>,
    _grpc_tls: Option<TlsWatch>,
    _admin_token: Option<TokenWatch>,
    _peer_tls: Option<TlsWatch>,
    _xds_tls: Option<TlsWatch>,
}

impl Watches {
    /// Starts watching the limits (the files, or the xDS server) into `limits`, and the
    /// secrets' files.
    fn start(
        options: &ServerOptions,
        limits: &Arc<ArcSwap<Limits>>,
        secrets: &Secrets,
        reload_stats: &Arc<ReloadStats>,
        xds_stats: &Arc<XdsStats>,
    ) -> Result<Watches, ServeError> {
        let watcher = match &options.watch {
            Some(path) => Some(reload::watch(
                path.clone(),
                Arc::clone(limits),
                options.reload,
                Arc::clone(reload_stats),
            )?),
            None => None,
        };
        let xds = options.xds.clone().map(|xds| {
            let client = XdsClient::new(
                xds,
                Arc::clone(limits),
                Arc::clone(reload_stats),
                Arc::clone(xds_stats),
            )
            .with_tls(secrets.xds_tls.clone());
            AbortOnDrop(client.spawn().abort_handle())
        });
        Ok(Watches {
            limits: watcher,
            _xds: xds,
            _grpc_tls: secrets.grpc_tls.as_ref().map(Tls::watch).transpose()?,
            _admin_token: secrets.admin_token.as_ref().map(TokenFile::watch),
            _peer_tls: secrets.peer_tls.as_ref().map(Tls::watch).transpose()?,
            _xds_tls: secrets
                .xds_tls
                .as_ref()
                .map(XdsTls::watch)
                .transpose()?
                .flatten(),
        })
    }
}

/// The reload figures at start: the start-up load of the files counts as a success (with
/// xDS there is none until the server answers).
fn reload_stats_at_start(version: u64, from_files: bool) -> Arc<ReloadStats> {
    let stats = Arc::new(ReloadStats::with_version(version));
    if from_files {
        stats.successes.fetch_add(1, Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        stats
            .last_success_unix_seconds
            .store(now, Ordering::Relaxed);
    }
    stats
}

/// The metrics over `registry` (every owner's collector registered), counting the
/// reference service's stats too when a sink for them is asked for, and those sinks.
async fn start_metrics(
    options: &ServerOptions,
    registry: prometheus_client::registry::Registry,
    reloads: &Arc<ReloadStats>,
) -> Result<(Arc<Metrics>, Option<sinks::Running>), ServeError> {
    let loads: Arc<dyn Loads> = Arc::clone(reloads) as _;
    let started = sinks::start(&options.reference, options.metrics, registry, &loads).await?;
    Ok(started)
}

/// Why RLQS streams are refused on this node, if they are.
fn rlqs_refusal(store: &StoreOptions) -> Option<String> {
    store.is_redis().then(|| {
        "rlqs is not served with --store redis: every node would divide each limit alone, admitting up to one limit per node; serve RLQS from ratekeeper nodes with the memory store (one node every Envoy points at, or cluster mode, where the nodes share each limit)"
            .to_owned()
    })
}

impl Server {
    /// Binds the listeners, builds the selected store (and only it: the engine's shards and
    /// their tasks, on the current tokio runtime, only for the memory store) and, when
    /// asked, the reloader. `version` is the content hash of `limits` (see `reload::load`).
    pub async fn bind(
        options: &ServerOptions,
        limits: Limits,
        version: u64,
    ) -> Result<Server, ServeError> {
        // Certificates and the token first: a bad file fails the start before anything
        // listens.
        let secrets = Secrets::load(options)?;
        let grpc = match &options.grpc_uds {
            Some(path) => GrpcListener::bind_unix(path)?,
            None => GrpcListener::bind_tcp(options.grpc_addr).await?,
        };
        let grpc_endpoint = grpc.endpoint().clone();
        let (http, http_addr) = bind_tcp(options.http_addr).await?;
        let (admin_listener, admin_addr) = bind_tcp(options.admin_addr).await?;
        let limits = Arc::new(ArcSwap::from_pointee(limits));
        // The memory store reads the rules' key budgets (and names) from the limits in force.
        let rules: Arc<dyn crate::check::Rules> = Arc::clone(&limits) as _;
        let engine =
            || Engine::spawn_with_rules(options.engine, Clock::system(), Some(Arc::clone(&rules)));
        // Only the selected store is built, and only its metrics registered; each owner of
        // figures registers its own collector.
        let mut registry = Metrics::registry();
        let built = crate::store::build(
            &options.store,
            engine,
            secrets.peer_tls.as_ref(),
            &mut registry,
        )
        .await?;
        let reload_stats = reload_stats_at_start(version, options.xds.is_none());
        reload_stats.register_metrics(&mut registry);
        let xds_stats = Arc::new(XdsStats::default());
        if options.xds.is_some() {
            xds_stats.register_metrics(&mut registry);
        }
        secrets.register_metrics(&mut registry);
        let rlqs_stats = RlqsStats::default();
        rlqs_stats.register(&mut registry);
        let (metrics, reference) = start_metrics(options, registry, &reload_stats).await?;
        let watches = Watches::start(options, &limits, &secrets, &reload_stats, &xds_stats)?;
        // The counter names (`--counter-names`) live with admin, fed by the limiter.
        let names = (options.admin.counter_names > 0)
            .then(|| Arc::new(CounterNames::new(options.admin.counter_names)));
        let mut limiter = Limiter::new(limits, built.store, options.limiter.clone(), metrics);
        if let Some(names) = &names {
            limiter = limiter.with_observer(Arc::clone(names) as _);
        }
        let limiter = Arc::new(limiter);
        let health = Arc::new(match options.healthy_only_with_config {
            true => Health::once_limits_loaded(Arc::clone(limiter.limits())),
            false => Health::new(),
        });
        Ok(Server {
            grpc,
            http,
            admin_listener,
            admin_addr,
            peer: built.peer,
            secrets,
            grpc_endpoint,
            http_addr,
            limiter,
            names,
            cluster: built.cluster,
            health,
            reload_stats,
            admin: options.admin,
            shutdown_grace: options.shutdown_grace,
            shutdown_delay: options.shutdown_delay,
            watches,
            xds_stats,
            rlqs: options.rlqs,
            rlqs_stats,
            rlqs_refused: rlqs_refusal(&options.store),
            reference,
        })
    }

    /// The gRPC listener's TCP address; `None` when it serves on a Unix socket.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        match &self.grpc_endpoint {
            GrpcEndpoint::Tcp(addr) => Some(*addr),
            GrpcEndpoint::Unix(_) => None,
        }
    }

    /// Where the gRPC listener is bound (TCP address or Unix socket path).
    pub fn grpc_endpoint(&self) -> &GrpcEndpoint {
        &self.grpc_endpoint
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Reloads the limits files on demand (SIGHUP) through the watch's path; `None` when the
    /// limits are not read from files (xDS) or not watched.
    pub fn limits_reload(&self) -> Option<reload::ReloadHandle> {
        self.watches.limits.as_ref().map(Watcher::handle)
    }

    /// The admin listener's address (the operator endpoints).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The Prometheus listener's address (`--prometheus-addr`), when it serves.
    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.reference.as_ref()?.prometheus_addr()
    }

    /// The peer listener's address, in cluster mode.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer.as_ref().map(|(_, addr)| *addr)
    }

    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// The in-memory store across peers, in cluster mode.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    pub fn reload_stats(&self) -> &Arc<ReloadStats> {
        &self.reload_stats
    }

    /// The xDS client's figures (all zero without `--config-source xds`).
    pub fn xds_stats(&self) -> &Arc<XdsStats> {
        &self.xds_stats
    }

    /// Serves until `shutdown` resolves, then drains (see the module docs).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServeError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (reporter, health_service) = tonic_health::server::health_reporter();
        let _health_sync = self.start_health_sync(&reporter).await;
        let _names_sweep = self.names.as_ref().map(|names| {
            let sweep = sweep_counter_names(Arc::clone(names), Arc::clone(&self.limiter));
            AbortOnDrop(tokio::spawn(sweep).abort_handle())
        });
        let quota = self.start_rlqs(stop_rx.clone());
        let incoming = self.grpc.incoming(self.secrets.grpc_tls.clone());
        // ShouldRateLimit is answered by `grpc` itself; health (and any other service) by
        // tonic's router, which also takes the calls `grpc` leaves to it.
        let routes = tonic::service::Routes::new(health_service)
            .add_service(crate::envoy::rls::server(Arc::clone(&self.limiter)))
            .add_service(quota.service.into_server())
            .prepare();
        let grpc = crate::envoy::grpc::serve(
            incoming,
            Arc::clone(&self.limiter),
            routes,
            stopped(stop_rx),
        );
        // The HTTP listener (and the peer listener) outlive the gRPC drain, so probes see
        // 503 (not a refused connection), metrics can be scraped while requests drain, and
        // peers' forwards are still answered until the counters are handed over.
        let (grpc_done_tx, grpc_done_rx) = tokio::sync::watch::channel(false);
        let shared = admin::Admin {
            health: Arc::clone(&self.health),
            limiter: Arc::clone(&self.limiter),
            names: self.names.clone(),
            cluster: self.cluster.as_ref().map(Cluster::runtime).cloned(),
            reload: Arc::clone(&self.reload_stats),
            options: self.admin,
            rlqs: quota.hub,
        };
        let http = serve_http(
            (self.http, self.admin_listener),
            shared,
            self.admin_addr,
            self.secrets.admin_token.clone(),
            grpc_done_rx.clone(),
        );
        let cluster = self.cluster.clone();
        let peer = serve_peers(
            self.peer,
            cluster.clone(),
            name_source(self.names.as_ref()),
            quota.source,
            self.secrets.peer_tls,
            grpc_done_rx,
        );
        let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
        let signal = stop_on(
            shutdown,
            Arc::clone(&self.health),
            reporter,
            cluster.clone(),
            stop_tx,
            (self.shutdown_delay, self.shutdown_grace),
            drained_rx,
        );
        let serve = async {
            let grpc = async {
                grpc.await;
                // Drained: hand the counters to their owners, then close the other listeners.
                if let Some(cluster) = &cluster {
                    cluster.hand_over_all().await;
                }
                let _ = grpc_done_tx.send(true);
            };
            let ((), (http, admin), peer) = tokio::join!(grpc, http, peer);
            let _ = drained_tx.send(());
            (http, admin, peer)
        };
        finish(serve, signal).await
    }

    /// Sets gRPC health from `Health` (serving, and limits loaded when that is required)
    /// before the first call, and starts the task that keeps it in line every HEALTH_SYNC.
    async fn start_health_sync(
        &self,
        reporter: &tonic_health::server::HealthReporter,
    ) -> AbortOnDrop {
        let ready = self.health.is_ready();
        set_health(reporter, ready).await;
        let sync = sync_health(Arc::clone(&self.health), reporter.clone(), ready);
        AbortOnDrop(tokio::spawn(sync).abort_handle())
    }

    /// The RLQS service, with its idle-bucket sweep and, in cluster mode, its exchange: the
    /// quota buckets this node owns are divided among the nodes by an `Owner` (answering
    /// the peer service's `Quota`), and the exchanger sends this node's demand to the
    /// owners and divides its shares among its own streams. Streams end when `stop` says
    /// so, so they do not hold up the drain.
    fn start_rlqs(&self, stop: watch::Receiver<bool>) -> Quota {
        let service = RlqsService::new(
            Arc::clone(&self.limiter),
            self.rlqs,
            self.rlqs_stats.clone(),
            self.rlqs_refused.clone(),
            stop,
        );
        let sweep = AbortOnDrop(service.sweeper().spawn().abort_handle());
        let owner = self.cluster.as_ref().map(|_| {
            let forget = forget_after(self.rlqs.exchange_every);
            Arc::new(Owner::new(self.rlqs.hub.max_buckets, forget))
        });
        let exchange = match (&self.cluster, &owner) {
            (Some(cluster), Some(owner)) => {
                let exchanger = Exchanger::new(
                    service.hub(),
                    Arc::clone(cluster.runtime()),
                    Arc::clone(owner),
                    self.rlqs.exchange_every,
                );
                Some(AbortOnDrop(exchanger.spawn().abort_handle()))
            }
            _ => None,
        };
        Quota {
            source: owner.as_ref().map(Owner::source),
            hub: self
                .rlqs_refused
                .is_none()
                .then(|| Arc::clone(service.hub())),
            service,
            _sweep: sweep,
            _exchange: exchange,
        }
    }
}

/// RLQS as this node serves it, and what keeps its tasks running.
struct Quota {
    service: RlqsService,
    /// What the peer service answers other nodes' `Quota` calls with (cluster mode).
    source: Option<QuotaSource>,
    /// The node's RLQS state for the admin listener; `None` when RLQS streams are refused.
    hub: Option<Arc<crate::quota::Hub>>,
    _sweep: AbortOnDrop,
    _exchange: Option<AbortOnDrop>,
}

/// The HTTP listener's and the admin listener's servers (`listeners`, in that order),
/// both until `stop`; answers each one's result.
fn serve_http(
    listeners: (TcpListener, TcpListener),
    shared: admin::Admin,
    admin_addr: SocketAddr,
    token: Option<TokenFile>,
    stop: watch::Receiver<bool>,
) -> impl Future<Output = (std::io::Result<()>, std::io::Result<()>)> {
    let app = crate::http::router(
        Arc::clone(&shared.health),
        Arc::clone(&shared.limiter),
        admin_addr,
    );
    let http = axum::serve(listeners.0, app).with_graceful_shutdown(stopped(stop.clone()));
    let admin_app = admin::admin_router(shared, token, admin_addr);
    let admin = axum::serve(listeners.1, admin_app).with_graceful_shutdown(stopped(stop));
    async move { tokio::join!(async { http.await }, async { admin.await }) }
}

/// Serves until `serve` ends (every listener drained), with `signal` run beside it (the
/// shutdown's first half): returns at once, `Ok`, if the grace period ran out first.
async fn finish(
    serve: impl Future<
        Output = (
            std::io::Result<()>,
            std::io::Result<()>,
            Result<(), ServeError>,
        ),
    >,
    signal: impl Future<Output = bool>,
) -> Result<(), ServeError> {
    tokio::pin!(serve);
    tokio::pin!(signal);
    let mut signal_done = false;
    let (http, admin, peer) = loop {
        tokio::select! {
            results = &mut serve => break results,
            expired = &mut signal, if !signal_done => {
                if expired {
                    return Ok(());
                }
                signal_done = true;
            }
        }
    };
    peer?;
    http.map_err(ServeError::Http)?;
    admin.map_err(ServeError::Admin)?;
    tracing::info!("drained, exiting");
    Ok(())
}

/// Resolves once `stop` says stop (or its sender is gone, which is also a stop).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The peer listener's server in cluster mode (at once `Ok` otherwise), until `stop`.
/// Connections are accepted (and, with mutual TLS, handshaken) like the gRPC listener's;
/// each request carries its connection's client certificate.
async fn serve_peers(
    peer: Option<(TcpListener, SocketAddr)>,
    cluster: Option<Cluster>,
    names: Option<NameSource>,
    quota: Option<QuotaSource>,
    tls: Option<Tls>,
    stop: watch::Receiver<bool>,
) -> Result<(), ServeError> {
    let (Some((listener, _)), Some(cluster)) = (peer, &cluster) else {
        return Ok(());
    };
    let service = cluster.peer_service(names, quota);
    let incoming = GrpcListener::from_tcp(listener)?.incoming(tls);
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, stopped(stop))
        .await
        .map_err(ServeError::Peer)
}

/// Shutdown's first half, once `shutdown` resolves: not ready (`/healthcheck` 503, gRPC
/// health NOT_SERVING) while still serving every call, and still the owner of its keys on
/// the ring, for `delay` (load balancers and Envoy's health checks move away meanwhile);
/// then leave the ring so peers stop sending keys before this node drains and hands its
/// own over, and `stop` the listeners (GOAWAY: calls already received are answered). Answers
/// whether the `grace` period ran out before `drained` (calls still in flight).
async fn stop_on(
    shutdown: impl Future<Output = ()>,
    health: Arc<Health>,
    reporter: tonic_health::server::HealthReporter,
    leaving: Option<Cluster>,
    stop: watch::Sender<bool>,
    (delay, grace): (Duration, Duration),
    drained: tokio::sync::oneshot::Receiver<()>,
) -> bool {
    shutdown.await;
    tracing::info!(delay = ?delay, grace = ?grace, "shutting down: not ready, serving on for the delay");
    health.stop_serving();
    set_health(&reporter, false).await;
    tokio::time::sleep(delay).await;
    tracing::info!("shutdown delay over: leaving, draining in-flight requests");
    if let Some(leaving) = leaving {
        let _ = tokio::time::timeout(grace, leaving.runtime().leave()).await;
    }
    let _ = stop.send(true);
    // Past the grace period, stop waiting for slow calls.
    tokio::select! {
        () = tokio::time::sleep(grace) => {
            tracing::warn!("grace period over with requests still in flight");
            true
        }
        _ = drained => false,
    }
}
