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
use std::path::{Path, PathBuf};
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
    Envoy, Leaf, Netns, Ratekeeper, TempDir, TestCa, Upstream, cluster_members, eventually,
    http_get, ratekeeper_command_as, read_repo_file, write_config, yaml_document, yaml_documents,
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

/// The environment of Envoy Gateway's rate limit container, in its order (with its newer
/// releases' Prometheus mode); `{certs}` is where Envoy Gateway mounts the Secret
/// `envoy-rate-limit`, `{statsd_exporter}` its ConfigMap of the mapping file.
const ENVOY_GATEWAY_ENV: [(&str, &str); 23] = [
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
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
    ("PROMETHEUS_MAPPER_YAML", "{statsd_exporter}/conf.yaml"),
];

/// The route rules of the other shapes Envoy Gateway's translator writes: a client IP
/// match (every address of a CIDR counted apart), `requests: 0`, and a shadow-mode limit.
const BY_IP_KEY: &str = "httproute/default/backend/rule/1/match/0/www_example_com";
const BLOCKED_KEY: &str = "httproute/default/backend/rule/2/match/0/www_example_com";
const SHADOW_KEY: &str = "httproute/default/backend/rule/3/match/0/www_example_com";

/// A `RateLimitConfig` as Envoy Gateway's translator emits it for one listener: each route
/// rule's descriptor, and under the first the header's, limited to `per_hour`; under the
/// others a client IP match (2 an hour per address in `0.0.0.0/0`), `requests: 0`, and a
/// shadow-mode limit of 1.
fn policy(per_hour: u32) -> RateLimitConfig {
    let limit = |requests_per_unit: u32| {
        Some(RateLimitPolicy {
            unit: RateLimitUnit::Hour.into(),
            requests_per_unit,
            ..RateLimitPolicy::default()
        })
    };
    let rule = |key: &str, descriptors: Vec<RateLimitDescriptor>| RateLimitDescriptor {
        key: key.to_owned(),
        value: key.to_owned(),
        descriptors,
        ..RateLimitDescriptor::default()
    };
    let leaf = |key: &str, rate_limit| RateLimitDescriptor {
        key: key.to_owned(),
        rate_limit,
        ..RateLimitDescriptor::default()
    };
    let masked = RateLimitDescriptor {
        key: "masked_remote_address".to_owned(),
        value: "0.0.0.0/0".to_owned(),
        descriptors: vec![leaf("remote_address", limit(2))],
        ..RateLimitDescriptor::default()
    };
    let shadow = RateLimitDescriptor {
        shadow_mode: true,
        ..leaf(USER_KEY, limit(1))
    };
    RateLimitConfig {
        name: DOMAIN.to_owned(),
        domain: DOMAIN.to_owned(),
        descriptors: vec![
            rule(ROUTE_KEY, vec![leaf(USER_KEY, limit(per_hour))]),
            rule(BY_IP_KEY, vec![masked]),
            rule(BLOCKED_KEY, vec![leaf(USER_KEY, limit(0))]),
            rule(SHADOW_KEY, vec![shadow]),
        ],
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
        let mapping = dir.path().join("statsd-exporter");
        std::fs::create_dir_all(&mapping).expect("a directory for the ConfigMap");
        let file = "src/metrics/reference/testdata/envoy-gateway-statsd.yaml";
        write_config(&mapping, "conf.yaml", &read_repo_file(file));
        let link = dir.path().join("ratelimit");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ratekeeper"), link).expect("a link");
        let envoy = pki.ca.client(&["envoy"]);
        Files { dir, pki, envoy }
    }

    /// The pod at `pod_ip`'s whole environment.
    fn env(&self, pod_ip: &str, xds_port: u16) -> BTreeMap<String, String> {
        let certs = self.dir.path().join("certs").display().to_string();
        let mapping = self
            .dir
            .path()
            .join("statsd-exporter")
            .display()
            .to_string();
        let mut env: BTreeMap<String, String> = ENVOY_GATEWAY_ENV
            .iter()
            .map(|(name, value)| {
                let value = value
                    .replace("{certs}", &certs)
                    .replace("{statsd_exporter}", &mapping)
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

/// Starts the three pods at once, as a Deployment's start, the control plane at
/// `envoy-gateway:xds_port`.
fn start_pods(net: &Netns, files: &Files, xds_port: u16) -> Vec<Ratekeeper> {
    std::thread::scope(|scope| {
        let starting: Vec<_> = (0..3)
            .map(|node| {
                scope.spawn(move || {
                    let env = files.env(&net.peer_ip(node).to_string(), xds_port);
                    start_pod(net, node, files, &env)
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
    })
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

/// What pod `pod`'s Prometheus listener serves: the reference's stats, mapped; checks that
/// it is at port 19001 on the pod's own address.
fn scrape_reference_stats(pod: &Ratekeeper) -> String {
    let addr = pod.prometheus_addr();
    assert_eq!((addr.ip(), addr.port()), (pod.http_addr().ip(), 19001));
    let scrape = http_get(addr, "/metrics", &[]).expect("the Prometheus listener answers");
    assert_eq!(scrape.status, 200, "{}", scrape.body);
    scrape.body
}

/// The sum of the samples in `scrape` whose line starts with `prefix` (every label set).
fn sample_sum(scrape: &str, prefix: &str) -> f64 {
    scrape
        .lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
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
    let pods = start_pods(&net, &files, xds.addr.port());
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
    // Each pod counts what it answered, under the reference's names as Envoy Gateway's
    // mapping file makes them, on the Prometheus listener at :19001.
    let scrapes: Vec<String> = pods.iter().map(scrape_reference_stats).collect();
    for (stat, count) in [
        ("total_hits", 12.0),
        ("within_limit", 5.0),
        ("over_limit", 7.0),
    ] {
        let name = format!("ratelimit_service_rate_limit_{stat}_total{{");
        let sum: f64 = scrapes.iter().map(|scrape| sample_sum(scrape, &name)).sum();
        assert_eq!(sum, count, "{stat} across the pods: {scrapes:#?}");
    }

    // A policy change goes live on every pod within a second.
    xds.publish("2", &[policy(8)]);
    let pushed = Instant::now();
    let live = eventually(Duration::from_secs(10), || every_pod_has(&pods, 8));
    let took = pushed.elapsed();
    assert!(live && took < LIVE_WITHIN, "the change took {took:?}");
    assert_eq!(admitted(&mut clients, "bob", 4).await, 8);

    // A real Envoy, configured as Envoy Gateway's translator configures it, lets 8 of 12
    // requests of one user through the three pods and answers 429 to the rest.
    let endpoints: Vec<SocketAddr> = pods.iter().map(Ratekeeper::grpc_addr).collect();
    let dir = files.dir.path().to_owned();
    let (cert, key) = files.envoy.write(&dir, "envoy");
    let tls = [cert, key, files.pki.ca.write(&dir, "envoy-ca.crt")];
    let answers = tokio::task::spawn_blocking(move || through_envoy(&dir, &tls, &endpoints))
        .await
        .expect("Envoy's requests");
    let expected = [
        ("/", [vec![200; 8], vec![429; 4]].concat()),
        ("/by-ip", vec![200, 200, 429, 429]),
        ("/blocked", vec![429, 429]),
        ("/shadow", vec![200, 200, 200]),
    ];
    assert_eq!(
        answers,
        expected.map(|(path, statuses)| (path.to_owned(), statuses))
    );
    drop(pods);
}

/// Sends requests of the user `carol` through a real Envoy whose rate limit filter asks
/// `endpoints` over mutual TLS (`tls`: its client certificate and key, and the CA the
/// service's certificate is checked against, with its name), with the routes' actions as
/// Envoy Gateway writes them: each path asked and its answers' statuses, in order (12 on
/// the header's rule, 4 on the client IP's, 2 on the blocked one, 3 on the shadow one).
fn through_envoy(
    dir: &Path,
    tls: &[PathBuf; 3],
    endpoints: &[SocketAddr],
) -> [(String, Vec<u16>); 4] {
    let upstream = Upstream::start();
    let [cert, key, ca] = tls;
    let config = envoy_gateway_bootstrap(upstream.addr().port(), endpoints, [cert, key, ca]);
    let config = write_config(dir, "envoy.yaml", &config);
    let mut envoy = Envoy::start(&config, dir);
    let listener = envoy.listener_addr("default/eg/http");
    [("/", 12), ("/by-ip", 4), ("/blocked", 2), ("/shadow", 3)].map(|(path, count)| {
        let statuses = (0..count)
            .map(|_| {
                let answer = http_get(listener, path, &[("x-user-id", "carol")]);
                answer.map_or(0, |answer| answer.status)
            })
            .collect();
        (path.to_owned(), statuses)
    })
}

/// Envoy's bootstrap as Envoy Gateway's translator writes the parts that matter here: the
/// listener's rate limit filter (its domain, failing open), the route's actions (the route
/// rule's descriptor, then the header's value), and the rate limit cluster over mutual TLS
/// with HTTP/2, its files `tls` (certificate, key, CA).
fn envoy_gateway_bootstrap(upstream: u16, endpoints: &[SocketAddr], tls: [&Path; 3]) -> String {
    let [cert, key, ca] = tls.map(|path| path.display().to_string());
    let endpoints: String = endpoints
        .iter()
        .map(|addr| {
            format!(
                "              - endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }}\n",
                addr.ip(),
                addr.port()
            )
        })
        .collect();
    format!(
        r#"
admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: 0 }}
static_resources:
  listeners:
    - name: default/eg/http
      address:
        socket_address: {{ address: 127.0.0.1, port_value: 0 }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: http
                route_config:
                  name: default/eg/http
                  virtual_hosts:
                    - name: default/eg/http/www_example_com
                      domains: ["*"]
                      routes:
                        - match: {{ path: "/by-ip" }}
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - generic_key: {{ descriptor_key: {BY_IP_KEY}, descriptor_value: {BY_IP_KEY} }}
                                  - masked_remote_address: {{ v4_prefix_mask_len: 0 }}
                                  - remote_address: {{}}
                        - match: {{ path: "/blocked" }}
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - generic_key: {{ descriptor_key: {BLOCKED_KEY}, descriptor_value: {BLOCKED_KEY} }}
                                  - request_headers: {{ header_name: x-user-id, descriptor_key: {USER_KEY} }}
                        - match: {{ path: "/shadow" }}
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - generic_key: {{ descriptor_key: {SHADOW_KEY}, descriptor_value: {SHADOW_KEY} }}
                                  - request_headers: {{ header_name: x-user-id, descriptor_key: {USER_KEY} }}
                        - match: {{ prefix: "/" }}
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - header_value_match:
                                      descriptor_key: {ROUTE_KEY}
                                      descriptor_value: {ROUTE_KEY}
                                      headers: [{{ name: x-user-id, present_match: true }}]
                                  - request_headers:
                                      header_name: x-user-id
                                      descriptor_key: {USER_KEY}
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: {DOMAIN}
                      enable_x_ratelimit_headers: DRAFT_VERSION_03
                      disable_x_envoy_ratelimited_header: true
                      timeout: 1s
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service:
                          envoy_grpc: {{ cluster_name: ratelimit_cluster }}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: app
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: app
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {upstream} }} }} }}
    - name: ratelimit_cluster
      type: STATIC
      connect_timeout: 10s
      lb_policy: LEAST_REQUEST
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {{}}
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: {SERVICE_NAME}
          common_tls_context:
            tls_certificates:
              - certificate_chain: {{ filename: {cert} }}
                private_key: {{ filename: {key} }}
            validation_context:
              trusted_ca: {{ filename: {ca} }}
              match_typed_subject_alt_names:
                - san_type: DNS
                  matcher: {{ exact: {SERVICE_NAME} }}
      load_assignment:
        cluster_name: ratelimit_cluster
        endpoints:
          - lb_endpoints:
{endpoints}"#
    )
}
