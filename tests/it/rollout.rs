//! Deploys without a hole (#35): three ratekeeper nodes in cluster mode behind one real
//! Envoy whose rate limit cluster lists all three (as a Kubernetes Service would), with the
//! shipped Envoy settings (gRPC health checks on the cluster, a retry policy on the
//! `GrpcService` retrying only calls that never reached a node) and `failure_mode_deny:
//! false`, so a failed call would let its request pass unchecked. A steady load goes
//! through Envoy on one limited key and on unlimited ones while every node in turn gets
//! SIGTERM and starts again on the same addresses (a rolling update).
//!
//! What must hold: Envoy's `ratelimit.error` and `ratelimit.failure_mode_allowed` stay 0
//! (no call failed, so no request passed unchecked), and the limited key admits at most its
//! limit plus the handoff bound (docs/cluster.md, "While a handoff is in flight": a new owner
//! that has not yet received a key's counter counts it from zero, up to `L` more per
//! handoff; a restart moves the key at most twice, away and back).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::support::{
    Envoy, Ratekeeper, START_TIMEOUT, TempDir, Upstream, eventually, eventually_some, free_port,
    http_get, ratekeeper_command, ratelimit_bootstrap, wait_for_members, write_config,
};

/// The limited key's limit per day.
const LIMIT: u64 = 30;
const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 30}
  - key: api_key
    value: open-*
    rate_limit: {unlimited: true}
";
/// How long a stopping node keeps serving while not ready: longer than Envoy's health
/// check interval below, so Envoy has moved away before the node closes.
const SHUTDOWN_DELAY: &str = "--shutdown-delay=2s";

/// One node's fixed addresses, kept across its restarts.
struct Slot {
    grpc: u16,
    peer: u16,
}

fn start_node(config: &std::path::Path, slot: &Slot, peers: &[&Slot]) -> Ratekeeper {
    let peers: Vec<String> = peers
        .iter()
        .map(|peer| format!("127.0.0.1:{}", peer.peer))
        .collect();
    let mut command = ratekeeper_command();
    command.arg("serve").arg("--config").arg(config).args([
        "--grpc-addr",
        &format!("127.0.0.1:{}", slot.grpc),
        "--http-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
        "--peer-addr",
        &format!("127.0.0.1:{}", slot.peer),
        "--peers",
        &peers.join(","),
        "--peer-timeout",
        "2s",
        SHUTDOWN_DELAY,
    ]);
    Ratekeeper::start_command(&mut command, IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// Envoy in front of `upstream`, asking the three nodes' gRPC ports, with the health checks
/// and the retry policy of `examples/envoy.yaml`.
fn envoy_config(upstream: SocketAddr, slots: &[Slot]) -> String {
    let route = r#"                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - request_headers: { header_name: x-api-key, descriptor_key: api_key }
"#;
    let one = ratelimit_bootstrap(route, false, upstream.port(), slots[0].grpc);
    let endpoint = |port: u16| {
        format!(
            "              - endpoint:
                  address:
                    socket_address: {{ address: 127.0.0.1, port_value: {port} }}
"
        )
    };
    let endpoints: String = slots.iter().map(|slot| endpoint(slot.grpc)).collect();
    let replaced = [
        (endpoint(slots[0].grpc), endpoints),
        (
            "                          envoy_grpc: { cluster_name: ratekeeper }\n".to_owned(),
            "                          envoy_grpc: { cluster_name: ratekeeper }
                          retry_policy:
                            retry_on: connect-failure,refused-stream
                            num_retries: 1
"
            .to_owned(),
        ),
        (
            "    - name: ratekeeper\n      type: STATIC\n      connect_timeout: 1s\n".to_owned(),
            "    - name: ratekeeper
      type: STATIC
      connect_timeout: 1s
      health_checks:
        - timeout: 0.5s
          interval: 0.5s
          no_traffic_interval: 0.5s
          unhealthy_threshold: 1
          healthy_threshold: 1
          grpc_health_check: { service_name: envoy.service.ratelimit.v3.RateLimitService }
"
            .to_owned(),
        ),
    ];
    let mut config = one;
    for (from, to) in replaced {
        assert_eq!(
            config.matches(&from).count(),
            1,
            "`{from}` once in:\n{config}"
        );
        config = config.replace(&from, &to);
    }
    config
}

/// Requests through Envoy until stopped: the limited key and an unlimited one, alternately,
/// from `threads` threads, as fast as they are answered.
struct Load {
    stop: Arc<AtomicBool>,
    limited_admitted: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
    unexpected: Arc<std::sync::Mutex<Vec<String>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(listener: SocketAddr, threads: usize) -> Load {
        let load = Load {
            stop: Arc::new(AtomicBool::new(false)),
            limited_admitted: Arc::new(AtomicU64::new(0)),
            sent: Arc::new(AtomicU64::new(0)),
            unexpected: Arc::default(),
            threads: Vec::new(),
        };
        let threads = (0..threads)
            .map(|thread| {
                let (stop, admitted, sent, unexpected) = (
                    Arc::clone(&load.stop),
                    Arc::clone(&load.limited_admitted),
                    Arc::clone(&load.sent),
                    Arc::clone(&load.unexpected),
                );
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let open = format!("open-{thread}-{n}");
                        let key = if n.is_multiple_of(2) {
                            "limited"
                        } else {
                            open.as_str()
                        };
                        sent.fetch_add(1, Ordering::Relaxed);
                        match http_get(listener, "/", &[("x-api-key", key)]) {
                            Ok(response) if response.status == 200 => {
                                if key == "limited" {
                                    admitted.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Ok(response) if response.status == 429 && key == "limited" => {}
                            Ok(response) => unexpected
                                .lock()
                                .expect("lock")
                                .push(format!("{key}: {}", response.status)),
                            Err(error) => unexpected
                                .lock()
                                .expect("lock")
                                .push(format!("{key}: {error}")),
                        }
                    }
                })
            })
            .collect();
        Load { threads, ..load }
    }

    fn stop(self) -> (u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("a load thread");
        }
        let unexpected = self.unexpected.lock().expect("lock").clone();
        (
            self.limited_admitted.load(Ordering::Relaxed),
            self.sent.load(Ordering::Relaxed),
            unexpected,
        )
    }
}

/// Envoy's counter `cluster.app.ratelimit.NAME`.
fn ratelimit_stat(envoy: &mut Envoy, name: &str) -> u64 {
    let prefix = format!("cluster.app.ratelimit.{name}: ");
    envoy
        .stats("cluster.app.ratelimit.")
        .lines()
        .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_rolling_restart_under_load_through_envoy_fails_no_call_and_keeps_the_limit() {
    let dir = TempDir::new("rollout");
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let slots: Vec<Slot> = (0..3)
        .map(|_| Slot {
            grpc: free_port(),
            peer: free_port(),
        })
        .collect();
    let mut nodes: Vec<Ratekeeper> = Vec::new();
    for index in 0..slots.len() {
        let peers: Vec<&Slot> = slots[..index].iter().collect();
        nodes.push(start_node(&config, &slots[index], &peers));
    }
    wait_for_members(&nodes, 3);
    let upstream = Upstream::start();
    let envoy_yaml = write_config(
        dir.path(),
        "envoy.yaml",
        &envoy_config(upstream.addr(), &slots),
    );
    let mut envoy = Envoy::start(&envoy_yaml, dir.path());
    let listener = envoy.listener_addr("edge");
    let through = eventually(START_TIMEOUT, || {
        http_get(listener, "/", &[("x-api-key", "open-warmup")])
            .is_ok_and(|response| response.status == 200)
    });
    assert!(through, "Envoy proxies: {}", envoy.stderr());

    let load = Load::start(listener, 4);
    let mut retired: Vec<Ratekeeper> = Vec::new();
    std::thread::sleep(Duration::from_secs(1));
    for index in 0..nodes.len() {
        nodes[index].process().signal("-TERM");
        let exited = eventually_some(START_TIMEOUT, || nodes[index].process().exited());
        let exit = exited.expect("a node exits after its delay and drain");
        assert!(exit.success(), "{}", nodes[index].stderr());
        let peers: Vec<&Slot> = slots
            .iter()
            .enumerate()
            .filter(|(other, _)| *other != index)
            .map(|(_, slot)| slot)
            .collect();
        let stopped = std::mem::replace(
            &mut nodes[index],
            start_node(&config, &slots[index], &peers),
        );
        retired.push(stopped);
        wait_for_members(&nodes, 3);
        // Envoy's next health check finds it serving.
        std::thread::sleep(Duration::from_secs(1));
    }
    let (admitted, sent, unexpected) = load.stop();

    let stats = envoy.stats("cluster.app.ratelimit.");
    let failed = ratelimit_stat(&mut envoy, "error");
    let allowed_unchecked = ratelimit_stat(&mut envoy, "failure_mode_allowed");
    eprintln!(
        "rollout: {sent} requests, limited key admitted {admitted} of {LIMIT}; envoy: {stats}"
    );
    let warnings: Vec<String> = nodes
        .iter()
        .chain(&retired)
        .flat_map(|node| {
            node.stderr()
                .lines()
                .filter(|line| line.contains("WARN") || line.contains("ERROR"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        (failed, allowed_unchecked),
        (0, 0),
        "no rate limit call may fail during a rolling restart:\n{stats}\nnodes' warnings:\n{}\nenvoy:\n{}",
        warnings.join("\n"),
        envoy
            .stats("cluster.ratekeeper.")
            .lines()
            .filter(|line| !line.ends_with(": 0"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(unexpected.is_empty(), "unexpected answers: {unexpected:?}");
    // Three restarts, each moving the key's counter at most twice (away, back).
    let bound = LIMIT + 6 * LIMIT;
    assert!(
        admitted <= bound,
        "{admitted} admitted, more than {LIMIT} + the handoff bound ({bound})"
    );
    assert!(admitted >= LIMIT, "the limit was used: {admitted}");
    assert!(sent > 200, "a steady load: {sent} requests");
}
