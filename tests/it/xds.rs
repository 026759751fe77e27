//! Limits from an xDS management server (`--config-source xds`): an in-test ADS server on
//! `127.0.0.1:0` serves `RateLimitConfig` resources, state of the world; ratekeeper
//! enforces them over gRPC, follows updates, NACKs a bad one (keeping the old limits) and
//! reconnects when the server comes back. Over TLS and mutual TLS: `xds/tls.rs`.

mod envoy_gateway;
mod tls;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as RequestDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::Any;
use futures_core::Stream;
use prost::Message;
use ratekeeper::envoy::xds::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use ratekeeper::envoy::xds::{TYPE_URL, XdsOptions};
use ratekeeper::server::{Server, ServerOptions};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::transport::{Channel, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

const WAIT: Duration = Duration::from_secs(10);

type Responses<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// What the management server serves and what it was told; outlives restarts.
#[derive(Default)]
struct State {
    /// The response every stream sends (again, when it changes).
    snapshot: Mutex<Option<watch::Sender<Option<DiscoveryResponse>>>>,
    requests: Mutex<Vec<DiscoveryRequest>>,
    /// Over mutual TLS: the client certificate (DER, the leaf) each stream came with.
    client_certs: Mutex<Vec<Vec<u8>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Clone)]
struct Ads {
    state: Arc<State>,
    snapshot: watch::Receiver<Option<DiscoveryResponse>>,
    /// True once this incarnation of the server is stopped: its streams end.
    stopped: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Responses<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        if let Some(certs) = request.peer_certs()
            && let Some(leaf) = certs.first()
        {
            lock(&self.state.client_certs).push(leaf.to_vec());
        }
        let mut incoming = request.into_inner();
        let state = Arc::clone(&self.state);
        let mut snapshot = self.snapshot.clone();
        let mut stopped = self.stopped.clone();
        let (send, receive) = mpsc::channel(4);
        tokio::spawn(async move {
            // Answer once the client asked, then whenever the snapshot changes.
            snapshot.mark_changed();
            let mut asked = false;
            loop {
                tokio::select! {
                    request = incoming.message() => match request {
                        Ok(Some(request)) => {
                            lock(&state.requests).push(request);
                            asked = true;
                        }
                        _ => return,
                    },
                    changed = snapshot.changed(), if asked => {
                        if changed.is_err() {
                            return;
                        }
                        let response = snapshot.borrow_and_update().clone();
                        if let Some(response) = response
                            && send.send(Ok(response)).await.is_err()
                        {
                            return;
                        }
                    }
                    _ = async { stopped.wait_for(|stopped| *stopped).await.is_ok() } => {
                        let _ = send.send(Err(Status::unavailable("going away"))).await;
                        return;
                    }
                }
            }
        });
        let stream = futures_util::stream::unfold(receive, |mut receive| async move {
            receive.recv().await.map(|item| (item, receive))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// A running management server; [`XdsServer::stop`] takes it away, [`XdsServer::restart`]
/// brings it back on the same address.
struct XdsServer {
    addr: SocketAddr,
    state: Arc<State>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl XdsServer {
    async fn start() -> XdsServer {
        XdsServer::start_with(None).await
    }

    /// A server on `127.0.0.1:0`, over TLS with `tls` when given.
    async fn start_with(tls: Option<ServerTlsConfig>) -> XdsServer {
        XdsServer::start_on("127.0.0.1:0".parse().expect("addr"), tls).await
    }

    /// A server on `addr`, over TLS with `tls` when given.
    async fn start_on(addr: SocketAddr, tls: Option<ServerTlsConfig>) -> XdsServer {
        let state = Arc::new(State::default());
        let (snapshot, _) = watch::channel(None);
        *lock(&state.snapshot) = Some(snapshot);
        XdsServer::serve_with(addr, state, tls).await
    }

    async fn serve(addr: SocketAddr, state: Arc<State>) -> XdsServer {
        XdsServer::serve_with(addr, state, None).await
    }

    async fn serve_with(
        addr: SocketAddr,
        state: Arc<State>,
        tls: Option<ServerTlsConfig>,
    ) -> XdsServer {
        let listener = TcpListener::bind(addr).await.expect("binds");
        let addr = listener.local_addr().expect("bound");
        let (stop, stopped) = watch::channel(false);
        let snapshot = lock(&state.snapshot)
            .as_ref()
            .map(watch::Sender::subscribe)
            .expect("snapshot channel");
        let ads = Ads {
            state: Arc::clone(&state),
            snapshot,
            stopped,
        };
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).expect("a server tls config");
        }
        let task = tokio::spawn(async move {
            let _ = builder
                .add_service(AggregatedDiscoveryServiceServer::new(ads))
                .serve_with_incoming(incoming)
                .await;
        });
        XdsServer {
            addr,
            state,
            stop,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves `configs` as `version` to every stream, now and from now on.
    fn publish(&self, version: &str, configs: &[RateLimitConfig]) {
        let response = DiscoveryResponse {
            version_info: version.to_owned(),
            resources: configs
                .iter()
                .map(|config| Any {
                    type_url: TYPE_URL.to_owned(),
                    value: config.encode_to_vec(),
                })
                .collect(),
            type_url: TYPE_URL.to_owned(),
            nonce: format!("nonce-{version}"),
            ..DiscoveryResponse::default()
        };
        if let Some(snapshot) = lock(&self.state.snapshot).as_ref() {
            snapshot.send_replace(Some(response));
        }
    }

    fn requests(&self) -> Vec<DiscoveryRequest> {
        lock(&self.state.requests).clone()
    }

    /// The client certificates streams came with, in order (mutual TLS).
    fn client_certs(&self) -> Vec<Vec<u8>> {
        lock(&self.state.client_certs).clone()
    }

    /// The request answering `version`'s response (matched by nonce), once it came.
    async fn answer_to(&self, version: &str) -> DiscoveryRequest {
        let nonce = format!("nonce-{version}");
        let mut found = None;
        let came = crate::support::eventually_async(WAIT, || {
            found = self
                .requests()
                .into_iter()
                .find(|request| request.response_nonce == nonce);
            std::future::ready(found.is_some())
        })
        .await;
        assert!(
            came,
            "no answer to version {version}: {:?}",
            self.requests()
        );
        found.expect("found")
    }

    /// Ends every stream and stops listening.
    async fn stop(self) -> (SocketAddr, Arc<State>) {
        self.stop.send_replace(true);
        self.task.abort();
        let _ = self.task.await;
        (self.addr, self.state)
    }
}

fn config(name: &str, requests_per_unit: u32, unit: RateLimitUnit) -> RateLimitConfig {
    RateLimitConfig {
        name: name.to_owned(),
        domain: "xds".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".to_owned(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit.into(),
                requests_per_unit,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }
}

fn per_day(requests_per_unit: u32) -> RateLimitConfig {
    config("users", requests_per_unit, RateLimitUnit::Day)
}

struct Running {
    client: RateLimitServiceClient<Channel>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    stats: Arc<ratekeeper::envoy::xds::XdsStats>,
    /// A fresh descriptor value per probe.
    probes: u32,
}

async fn start_ratekeeper(xds: &XdsServer) -> Running {
    let options = ServerOptions {
        xds: Some(XdsOptions {
            node_id: "test-node".to_owned(),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(200),
            ..XdsOptions::new(xds.url())
        }),
        ..ServerOptions::new(
            "127.0.0.1:0".parse().expect("addr"),
            "127.0.0.1:0".parse().expect("addr"),
        )
    };
    let limits = ratekeeper::limits::Limits::default();
    let server = Server::bind(&options, limits, 0).await.expect("binds");
    let grpc = server.grpc_addr().expect("tcp");
    let stats = Arc::clone(server.xds_stats());
    let (stop, _) = crate::support::spawn_server(server);
    let mut running = Running::connect(grpc).await;
    running.stop = Some(stop);
    running.stats = stats;
    running
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Running {
    /// A client of the ratekeeper serving gRPC at `grpc` (a process of its own: no stats).
    async fn connect(grpc: SocketAddr) -> Running {
        let client = RateLimitServiceClient::connect(format!("http://{grpc}"))
            .await
            .expect("connects");
        Running {
            client,
            stop: None,
            stats: Arc::default(),
            probes: 0,
        }
    }

    /// One request for `user`: its code and the limit that applied (`None`: no limit).
    async fn check(&mut self, user: &str) -> (Code, Option<u32>) {
        let request = RateLimitRequest {
            domain: "xds".to_owned(),
            descriptors: vec![RequestDescriptor {
                entries: vec![Entry {
                    key: "user".to_owned(),
                    value: user.to_owned(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let response = self
            .client
            .should_rate_limit(request)
            .await
            .expect("answers")
            .into_inner();
        let status = response.statuses.first().expect("one status");
        let limit = status
            .current_limit
            .as_ref()
            .map(|limit| limit.requests_per_unit);
        (response.overall_code(), limit)
    }

    /// The limit a fresh user gets now.
    async fn limit(&mut self) -> Option<u32> {
        self.probes += 1;
        let user = format!("probe-{}", self.probes);
        self.check(&user).await.1
    }

    /// Waits until a fresh user gets `want`; fails with what it last saw.
    async fn until_limit(&mut self, want: Option<u32>) {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut seen = None;
        while tokio::time::Instant::now() < deadline {
            seen = self.limit().await;
            if seen == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the limit stayed {seen:?}, expected {want:?}");
    }

    /// `n + 1` requests for `user`: the first `n` pass, the last is over the limit.
    async fn assert_enforces(&mut self, user: &str, n: u32) {
        for i in 0..n {
            let (code, _) = self.check(user).await;
            assert_eq!(code, Code::Ok, "request {} of {n}", i + 1);
        }
        let (code, limit) = self.check(user).await;
        assert_eq!((code, limit), (Code::OverLimit, Some(n)));
    }
}

#[tokio::test]
async fn limits_from_the_xds_server_are_enforced_acked_and_updated() {
    let xds = XdsServer::start().await;
    let mut ratekeeper = start_ratekeeper(&xds).await;
    // Nothing served yet: no limits, every request passes.
    assert_eq!(ratekeeper.check("early").await, (Code::Ok, None));

    xds.publish("1", &[per_day(2)]);
    let ack = xds.answer_to("1").await;
    assert_eq!(ack.version_info, "1");
    assert_eq!(ack.type_url, TYPE_URL);
    assert!(ack.error_detail.is_none(), "{ack:?}");
    assert_eq!(
        ack.node.as_ref().map(|node| node.id.as_str()),
        Some("test-node")
    );
    let first = &xds.requests()[0];
    assert_eq!(
        (first.version_info.as_str(), first.response_nonce.as_str()),
        ("", "")
    );
    ratekeeper.until_limit(Some(2)).await;
    ratekeeper.assert_enforces("alice", 2).await;

    xds.publish("2", &[per_day(5)]);
    assert!(xds.answer_to("2").await.error_detail.is_none());
    ratekeeper.until_limit(Some(5)).await;
    ratekeeper.assert_enforces("bob", 5).await;

    // State of the world: a response without the resource removes its limits.
    xds.publish("3", &[]);
    assert!(xds.answer_to("3").await.error_detail.is_none());
    ratekeeper.until_limit(None).await;
}

/// Every unit of the reference's proto arrives over xDS and is enforced with its unit:
/// Envoy Gateway's weekly (7), monthly (5) and yearly (6) policies included, each ACKed.
#[tokio::test]
async fn every_unit_is_accepted_over_xds_weeks_months_and_years_included() {
    let xds = XdsServer::start().await;
    let mut ratekeeper = start_ratekeeper(&xds).await;
    let units = [
        RateLimitUnit::Second,
        RateLimitUnit::Minute,
        RateLimitUnit::Hour,
        RateLimitUnit::Day,
        RateLimitUnit::Week,
        RateLimitUnit::Month,
        RateLimitUnit::Year,
    ];
    for (index, unit) in units.into_iter().enumerate() {
        let version = format!("{}", index + 1);
        let limit = 10 + index as u32;
        xds.publish(&version, &[config("users", limit, unit)]);
        let answer = xds.answer_to(&version).await;
        assert!(answer.error_detail.is_none(), "{unit:?} NACKed: {answer:?}");
        ratekeeper.until_limit(Some(limit)).await;
        let request = RateLimitRequest {
            domain: "xds".to_owned(),
            descriptors: vec![RequestDescriptor {
                entries: vec![Entry {
                    key: "user".to_owned(),
                    value: format!("unit-{index}"),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let response = ratekeeper
            .client
            .should_rate_limit(request)
            .await
            .expect("answers")
            .into_inner();
        let current = response.statuses[0]
            .current_limit
            .as_ref()
            .expect("a limit");
        assert_eq!(current.unit, i32::from(unit), "{unit:?}");
    }
}

#[tokio::test]
async fn a_bad_resource_is_nacked_and_the_old_limits_stay() {
    let xds = XdsServer::start().await;
    let mut ratekeeper = start_ratekeeper(&xds).await;
    xds.publish("1", &[per_day(3)]);
    assert!(xds.answer_to("1").await.error_detail.is_none());
    ratekeeper.until_limit(Some(3)).await;

    let bad = config("team-b", 10, RateLimitUnit::Unknown);
    xds.publish("2", &[bad]);
    let nack = xds.answer_to("2").await;
    let detail = nack.error_detail.expect("a nack carries error_detail");
    // Still at the last good version; the message names the resource, the place, the problem.
    assert_eq!(nack.version_info, "1");
    assert_eq!(detail.code, 3, "INVALID_ARGUMENT");
    for part in [
        "xds resource team-b",
        "domain xds > descriptors[0] (key user)",
        "missing unit",
    ] {
        assert!(
            detail.message.contains(part),
            "{part:?} not in {:?}",
            detail.message
        );
    }
    assert_eq!(ratekeeper.limit().await, Some(3));
    ratekeeper.assert_enforces("carol", 3).await;
    assert_eq!(
        ratekeeper
            .stats
            .nacks
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // The next good version is taken.
    xds.publish("3", &[per_day(4)]);
    assert!(xds.answer_to("3").await.error_detail.is_none());
    ratekeeper.until_limit(Some(4)).await;
}

#[tokio::test]
async fn ratekeeper_reconnects_when_the_server_comes_back() {
    let xds = XdsServer::start().await;
    let mut ratekeeper = start_ratekeeper(&xds).await;
    xds.publish("1", &[per_day(2)]);
    assert!(xds.answer_to("1").await.error_detail.is_none());
    ratekeeper.until_limit(Some(2)).await;

    let (addr, state) = xds.stop().await;
    // The limits stay while the server is away.
    ratekeeper.assert_enforces("dave", 2).await;
    let connected = |running: &Running| {
        running
            .stats
            .connected
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert!(
        crate::support::eventually_async(WAIT, || std::future::ready(!connected(&ratekeeper)))
            .await,
        "still connected to a stopped server"
    );

    let xds = XdsServer::serve(addr, state).await;
    xds.publish("2", &[per_day(6)]);
    // Reconnecting, it tells the server the version it has.
    let resumed = crate::support::eventually_async(WAIT, || {
        std::future::ready(
            xds.requests()
                .iter()
                .any(|request| request.version_info == "1" && request.response_nonce.is_empty()),
        )
    })
    .await;
    assert!(resumed, "no resumed request: {:?}", xds.requests());
    assert!(xds.answer_to("2").await.error_detail.is_none());
    ratekeeper.until_limit(Some(6)).await;
    assert!(
        ratekeeper
            .stats
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
    );
}

/// The real binary: the flags, `--healthy-only-with-config` until the first ACK, metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_is_unhealthy_until_the_first_ack_with_healthy_only_with_config() {
    let xds = XdsServer::start().await;
    let url = xds.url();
    let process = tokio::task::spawn_blocking(move || {
        crate::support::Ratekeeper::start_unready(
            std::path::Path::new("/nonexistent/limits"),
            &[
                "--config-source",
                "xds",
                "--xds-server",
                &url,
                "--xds-node-id",
                "node-a",
                "--xds-node-metadata",
                "zone=z1",
                "--healthy-only-with-config",
            ],
        )
    })
    .await
    .expect("starts");
    let http = process.http_addr();
    let health = move || {
        crate::support::http_get(http, "/healthcheck", &[]).map_or(0, |response| response.status)
    };
    // It subscribed (with its node), and stays unhealthy with nothing served.
    let subscribed =
        crate::support::eventually_async(WAIT, || std::future::ready(!xds.requests().is_empty()))
            .await;
    assert!(subscribed, "no subscription: {}", process.stderr());
    let node = xds.requests()[0].node.clone().expect("node");
    assert_eq!(node.id, "node-a");
    let zone = node.metadata.expect("metadata").fields.get("zone").cloned();
    assert!(format!("{zone:?}").contains("z1"), "{zone:?}");
    assert_eq!(
        tokio::task::spawn_blocking(health).await.expect("probe"),
        503
    );

    xds.publish("v1", &[per_day(2)]);
    assert!(xds.answer_to("v1").await.error_detail.is_none());
    let healthy = crate::support::eventually_async(WAIT, || async move {
        tokio::task::spawn_blocking(health).await.expect("probe") == 200
    })
    .await;
    assert!(
        healthy,
        "still unhealthy after the ack: {}",
        process.stderr()
    );
    let metrics =
        tokio::task::spawn_blocking(move || crate::support::http_get(http, "/metrics", &[]))
            .await
            .expect("scrape")
            .expect("metrics");
    assert!(
        metrics
            .body
            .contains("xds_responses_total{result=\"ack\"} 1"),
        "{}",
        metrics.body
    );
    assert!(metrics.body.contains("xds_connected 1"), "{}", metrics.body);
    drop(process);
}
