//! Envoy Gateway's rate limit Deployment with ratekeeper's image, in cluster mode without
//! Redis (docs/envoy-gateway.md, "Without Redis"). Three pods, each in a network namespace
//! of its own ([`Netns`]), so each listens on the reference's fixed ports (8080 for the
//! kubelet's probes, 8081 for Envoy) with no `PORT` or `GRPC_PORT` set, as Envoy Gateway
//! runs it. Each runs as `/bin/ratelimit` with exactly the environment Envoy Gateway's
//! Deployment sets (its `testdata/deployments/default.yaml`; the certificate paths are the
//! test's files, and `REDIS_URL` names a Redis that does not exist) plus the environment
//! `deploy/envoy-gateway/cluster-mode.yaml` adds, read from that file. A stand-in for Envoy
//! Gateway's control plane serves the limits over mutual TLS under its name
//! `envoy-gateway`, with certificates made as Envoy Gateway's certgen makes them; the
//! test's client calls each pod over TLS with a client certificate, as Envoy Gateway's
//! Envoys do.
//!
//! What must hold: every pod is ready on its own address at 8080 and answers at 8081; the
//! three form one ring through the headless Service's name; the Redis variables are
//! ignored with a warning; a limit of N admits N across the three pods; a policy change
//! pushed over xDS is enforced everywhere within a second. Needs root (namespaces), as the
//! other namespace tests: never skipped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as RequestDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratekeeper::envoy::xds::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use serde_json::Value;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::XdsServer;
use super::tls::Pki;
use crate::support::{
    Leaf, Netns, Ratekeeper, TempDir, TestCa, cluster_members, eventually, http_get,
    ratekeeper_command_as, read_repo_file, yaml_document, yaml_documents,
};

/// The listener's domain, as Envoy Gateway names it (`<namespace>/<gateway>/<listener>`).
const DOMAIN: &str = "default/eg/http";
/// The route rule's descriptor, as Envoy Gateway's translator writes it for a
/// `BackendTrafficPolicy` with a header match on `x-user-id`.
const ROUTE_KEY: &str = "httproute/default/backend/rule/0/match/0/www_example_com";
const USER_KEY: &str = "rule-0-match-0";
/// The name the cluster-mode file gives the peers' headless Service.
const PEERS_SERVICE: &str = "envoy-ratelimit-peers";
/// The rate limit Service's name in Envoy Gateway's certificate, which Envoy checks.
const SERVICE_NAME: &str = "envoy-ratelimit.envoy-gateway-system.svc.cluster.local";
/// How soon a policy pushed over xDS must be enforced on every pod.
const LIVE_WITHIN: Duration = Duration::from_secs(1);

/// The environment of Envoy Gateway's rate limit container, in its order; `{certs}` is
/// where Envoy Gateway mounts the Secret `envoy-rate-limit`.
const ENVOY_GATEWAY_ENV: [(&str, &str); 19] = [
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis.svc:6379"),
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:{xds_port}"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "{certs}/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "{certs}/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "{certs}/ca.crt"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "{certs}/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "{certs}/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "{certs}/ca.crt"),
];

/// A `RateLimitConfig` as Envoy Gateway's translator emits it for one listener: the route
/// rule's descriptor, and under it the header's, limited to `per_hour`.
fn policy(per_hour: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: DOMAIN.to_owned(),
        domain: DOMAIN.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            key: ROUTE_KEY.to_owned(),
            value: ROUTE_KEY.to_owned(),
            descriptors: vec![RateLimitDescriptor {
                key: USER_KEY.to_owned(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Hour.into(),
                    requests_per_unit: per_hour,
                    ..RateLimitPolicy::default()
                }),
                ..RateLimitDescriptor::default()
            }],
            ..RateLimitDescriptor::default()
        }],
    }
}

/// The `env` list `deploy/envoy-gateway/cluster-mode.yaml` adds to the container, as
/// (name, value) with `valueFrom` read as `POD_IP` (the only one it uses) and `$(POD_IP)`
/// expanded as the kubelet expands it.
fn cluster_mode_env(pod_ip: &str, peer_tls: &Path) -> Vec<(String, String)> {
    let file = "deploy/envoy-gateway/cluster-mode.yaml";
    let documents = yaml_documents(file, &read_repo_file(file));
    let config = documents
        .iter()
        .find(|document| document["kind"] == "ConfigMap")
        .and_then(|document| document["data"]["envoy-gateway.yaml"].as_str())
        .unwrap_or_else(|| panic!("{file}: no envoy-gateway-config ConfigMap"));
    let config = yaml_document(file, config);
    let deployment = &config["provider"]["kubernetes"]["rateLimitDeployment"];
    let env = deployment["container"]["env"]
        .as_array()
        .unwrap_or_else(|| panic!("{file}: no container env"));
    let mount = deployment["container"]["volumeMounts"][0]["mountPath"]
        .as_str()
        .unwrap_or_else(|| panic!("{file}: no volume mount"));
    env.iter()
        .map(|variable| {
            let name = variable["name"].as_str().expect("a name").to_owned();
            let value = match &variable["value"] {
                Value::String(value) => value.replace("$(POD_IP)", pod_ip),
                _ => {
                    let field = &variable["valueFrom"]["fieldRef"]["fieldPath"];
                    assert_eq!(field, "status.podIP", "{file}: {name}");
                    pod_ip.to_owned()
                }
            };
            let value = value.replace(mount, &peer_tls.display().to_string());
            (name, value)
        })
        .collect()
}

/// The test's files: Envoy Gateway's Secret for the service, the peers' Secret, the client
/// certificate of Envoy, and `/bin/ratelimit`.
struct Files {
    dir: TempDir,
    pki: Pki,
    envoy: Leaf,
}

impl Files {
    fn new() -> Files {
        let dir = TempDir::new("envoy-gateway-cluster");
        let pki = Pki::new();
        // The service's certificate is valid for its Service name too: Envoy checks it.
        let pki = Pki {
            client: pki.ca.peer(&["envoy-ratelimit", SERVICE_NAME]),
            ..pki
        };
        let (certs, peer_tls) = (dir.path().join("certs"), dir.path().join("peer-tls"));
        for made in [&certs, &peer_tls] {
            std::fs::create_dir_all(made).expect("a directory for a Secret");
        }
        pki.write(&certs);
        let peers = TestCa::new("envoy-ratelimit-peer-ca");
        peers.write(&peer_tls, "ca.crt");
        peers.peer(&[PEERS_SERVICE]).write(&peer_tls, "tls");
        let link = dir.path().join("ratelimit");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ratekeeper"), link).expect("a link");
        let envoy = pki.ca.client(&["envoy"]);
        Files { dir, pki, envoy }
    }

    /// The pod at `pod_ip`'s whole environment.
    fn env(&self, pod_ip: &str, xds_port: u16) -> BTreeMap<String, String> {
        let certs = self.dir.path().join("certs").display().to_string();
        let mut env: BTreeMap<String, String> = ENVOY_GATEWAY_ENV
            .iter()
            .map(|(name, value)| {
                let value = value
                    .replace("{certs}", &certs)
                    .replace("{xds_port}", &xds_port.to_string());
                ((*name).to_owned(), value)
            })
            .collect();
        env.extend(cluster_mode_env(pod_ip, &self.dir.path().join("peer-tls")));
        env
    }
}

/// Starts pod `node` in its namespace as `/bin/ratelimit`, with `env` alone.
fn start_pod(
    net: &Netns,
    node: usize,
    files: &Files,
    env: &BTreeMap<String, String>,
) -> Ratekeeper {
    let prefix = net.exec_prefix(node);
    let mut command = ratekeeper_command_as(Path::new(prefix[0]));
    command
        .args(&prefix[1..])
        .arg(files.dir.path().join("ratelimit"))
        .envs(env);
    Ratekeeper::start_command(&mut command, net.client_ip(node))
}

/// A client of the pod serving gRPC at `addr`, as an Envoy of Envoy Gateway's: over TLS,
/// checking the service's name, presenting its client certificate.
async fn envoy_client(addr: SocketAddr, files: &Files) -> RateLimitServiceClient<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(files.pki.ca.cert_pem()))
        .identity(Identity::from_pem(
            &files.envoy.cert_pem,
            &files.envoy.key_pem,
        ))
        .domain_name(SERVICE_NAME);
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .expect("an endpoint")
        .tls_config(tls)
        .expect("a tls config")
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|error| panic!("connect to {addr}: {error:?}"));
    RateLimitServiceClient::new(channel)
}

/// One request for `user` on the route: its overall code.
async fn ask(client: &mut RateLimitServiceClient<Channel>, user: &str) -> Code {
    let entry = |key: &str, value: &str| Entry {
        key: key.to_owned(),
        value: value.to_owned(),
    };
    let request = RateLimitRequest {
        domain: DOMAIN.to_owned(),
        descriptors: vec![RequestDescriptor {
            entries: vec![entry(ROUTE_KEY, ROUTE_KEY), entry(USER_KEY, user)],
            ..RequestDescriptor::default()
        }],
        hits_addend: 0,
    };
    let response = client.should_rate_limit(request).await.expect("answered");
    response.into_inner().overall_code()
}

/// Asks for `user` round-robin through every pod, `rounds` times each: how many passed.
async fn admitted(
    clients: &mut [RateLimitServiceClient<Channel>],
    user: &str,
    rounds: usize,
) -> usize {
    let mut admitted = 0;
    for _ in 0..rounds {
        for client in clients.iter_mut() {
            admitted += usize::from(ask(client, user).await == Code::Ok);
        }
    }
    admitted
}

/// Whether every pod's `/rlconfig` says the user limit is `per_hour`.
fn every_pod_has(pods: &[Ratekeeper], per_hour: u32) -> bool {
    let wanted = format!("{USER_KEY}: unit=HOUR requests_per_unit={per_hour}");
    pods.iter().all(|pod| {
        http_get(pod.http_addr(), "/rlconfig", &[])
            .is_ok_and(|answer| answer.body.contains(&wanted))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_pods_with_envoy_gateways_environment_share_one_limit_without_redis() {
    let files = Files::new();
    let tls = files.pki.server_tls(&files.pki.server);
    let xds = XdsServer::start_on("0.0.0.0:0".parse().expect("addr"), Some(tls)).await;
    xds.publish("1", &[policy(5)]);
    let mut net = Netns::new(3);
    net.resolve_to_all(PEERS_SERVICE);
    net.resolve_to_host("envoy-gateway");

    // The three pods start at once, as a Deployment's do; each is ready on its own address
    // at 8080 (the kubelet's probe), with no PORT set.
    let (shared, files_ref, port) = (&net, &files, xds.addr.port());
    let pods: Vec<Ratekeeper> = std::thread::scope(|scope| {
        let starting: Vec<_> = (0..3)
            .map(|node| {
                scope.spawn(move || {
                    let env = files_ref.env(&shared.peer_ip(node).to_string(), port);
                    start_pod(shared, node, files_ref, &env)
                })
            })
            .collect();
        starting
            .into_iter()
            .map(|pod| {
                pod.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    for (node, pod) in pods.iter().enumerate() {
        assert_eq!(pod.http_addr(), SocketAddr::new(net.client_ip(node), 8080));
        assert_eq!(pod.grpc_addr(), SocketAddr::new(net.client_ip(node), 8081));
        let stderr = pod.stderr_with("REDIS_URL");
        assert!(
            stderr.contains("REDIS_URL: ignored: cluster mode"),
            "the Redis Envoy Gateway names is ignored, saying why: {stderr}"
        );
        let agreed = eventually(Duration::from_secs(15), || {
            cluster_members(pod) == Some(3.0)
        });
        assert!(agreed, "pod {node} never saw 3 members: {}", pod.stderr());
    }
    let limits = eventually(Duration::from_secs(10), || every_pod_has(&pods, 5));
    assert!(limits, "the policy reached every pod: {}", pods[0].stderr());

    // A limit of 5 per hour admits 5 across the three pods.
    let mut clients = Vec::new();
    for pod in &pods {
        clients.push(envoy_client(pod.grpc_addr(), &files).await);
    }
    assert_eq!(admitted(&mut clients, "alice", 4).await, 5);

    // A policy change goes live on every pod within a second.
    xds.publish("2", &[policy(8)]);
    let pushed = Instant::now();
    let live = eventually(Duration::from_secs(10), || every_pod_has(&pods, 8));
    let took = pushed.elapsed();
    assert!(live && took < LIVE_WITHIN, "the change took {took:?}");
    assert_eq!(admitted(&mut clients, "bob", 4).await, 8);
    drop(pods);
}
