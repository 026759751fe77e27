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
use std::time::{Duration, Instant};

use crate::support::{
    Envoy, Ratekeeper, START_TIMEOUT, TempDir, Upstream, cluster_members, eventually,
    eventually_some, free_port, http_get, ratekeeper_command, ratelimit_bootstrap, write_config,
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
/// How a stack is set up: Envoy's health checks on the rate limit cluster or none, and the
/// nodes' shutdown delay.
#[derive(Clone, Copy)]
struct Setup {
    health_checks: bool,
    shutdown_delay: &'static str,
}

/// The shipped settings: health checks, and a delay longer than their interval, so Envoy
/// has moved away before a stopping node closes.
const SHIPPED: Setup = Setup {
    health_checks: true,
    shutdown_delay: "--shutdown-delay=2s",
};

/// One node's fixed addresses, kept across its restarts.
struct Slot {
    grpc: u16,
    peer: u16,
}

fn start_node(config: &std::path::Path, slot: &Slot, peers: &[&Slot], delay: &str) -> Ratekeeper {
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
        delay,
    ]);
    Ratekeeper::start_command(&mut command, IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// Envoy in front of `upstream`, asking the nodes' gRPC ports, with the retry policy of
/// `examples/envoy.yaml` and its health checks if `health_checks`.
fn envoy_config(upstream: SocketAddr, slots: &[Slot], health_checks: bool) -> String {
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
                            retry_host_predicate:
                              - name: envoy.retry_host_predicates.previous_hosts
                                typed_config:
                                  \"@type\": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate
                            host_selection_retry_max_attempts: 3
                            retry_back_off: { base_interval: 0.005s, max_interval: 0.25s }
"
            .to_owned(),
        ),
        (
            "                      timeout: 5s\n".to_owned(),
            "                      timeout: 0.25s\n".to_owned(),
        ),
        (
            "    - name: ratekeeper\n      type: STATIC\n      connect_timeout: 1s\n".to_owned(),
            "    - name: ratekeeper
      type: STATIC
      connect_timeout: 1s
      # Every call may retry once at the same time (Envoy's default allows 3 retries in
      # flight per cluster: a load meeting a dead endpoint overflows it).
      circuit_breakers:
        thresholds:
          - { max_retries: 1000000 }
"
            .to_owned()
                + if health_checks { HEALTH_CHECKS } else { "" },
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

/// The rate limit cluster's health checks, as shipped but faster.
const HEALTH_CHECKS: &str = "      health_checks:
        - timeout: 0.5s
          interval: 0.5s
          no_traffic_interval: 0.5s
          unhealthy_threshold: 1
          healthy_threshold: 1
          grpc_health_check: { service_name: envoy.service.ratelimit.v3.RateLimitService }
";

/// Requests through Envoy until stopped: the limited key and an unlimited one, alternately,
/// from `threads` threads, as fast as they are answered.
struct Load {
    stop: Arc<AtomicBool>,
    limited_admitted: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
    /// The slowest answer, in microseconds.
    slowest: Arc<AtomicU64>,
    unexpected: Arc<std::sync::Mutex<Vec<String>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(listener: SocketAddr, threads: usize) -> Load {
        let load = Load {
            stop: Arc::new(AtomicBool::new(false)),
            limited_admitted: Arc::new(AtomicU64::new(0)),
            sent: Arc::new(AtomicU64::new(0)),
            slowest: Arc::new(AtomicU64::new(0)),
            unexpected: Arc::default(),
            threads: Vec::new(),
        };
        let threads = (0..threads)
            .map(|thread| {
                let (stop, admitted, sent, slowest, unexpected) = (
                    Arc::clone(&load.stop),
                    Arc::clone(&load.limited_admitted),
                    Arc::clone(&load.sent),
                    Arc::clone(&load.slowest),
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
                        let asked = Instant::now();
                        let answer = http_get(listener, "/", &[("x-api-key", key)]);
                        let took = asked.elapsed().as_micros().try_into().unwrap_or(u64::MAX);
                        slowest.fetch_max(took, Ordering::Relaxed);
                        match answer {
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

    fn stop(self) -> Outcome {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("a load thread");
        }
        let unexpected = self.unexpected.lock().expect("lock").clone();
        Outcome {
            admitted: self.limited_admitted.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
            slowest: Duration::from_micros(self.slowest.load(Ordering::Relaxed)),
            unexpected,
        }
    }
}

/// What a [`Load`] saw.
struct Outcome {
    /// Requests on the limited key that were let through.
    admitted: u64,
    sent: u64,
    /// The slowest answer through Envoy.
    slowest: Duration,
    /// Answers other than 200, or 429 on the limited key.
    unexpected: Vec<String>,
}

/// Envoy's counter `cluster.app.ratelimit.NAME`.
fn ratelimit_stat(envoy: &mut Envoy, name: &str) -> u64 {
    envoy_stat(envoy, &format!("cluster.app.ratelimit.{name}"))
}

/// Envoy's counter or gauge `name` (0 when absent).
fn envoy_stat(envoy: &mut Envoy, name: &str) -> u64 {
    let prefix = format!("{name}: ");
    envoy
        .stats(name)
        .lines()
        .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0)
}

/// `slots` node addresses (some of them running) behind one Envoy listing them all, an
/// upstream, and the nodes that stopped (their logs, for failure messages). Fields drop in
/// order: Envoy first.
struct Stack {
    envoy: Envoy,
    nodes: Vec<Option<Ratekeeper>>,
    stopped: Vec<Ratekeeper>,
    slots: Vec<Slot>,
    listener: SocketAddr,
    _upstream: Upstream,
    config: std::path::PathBuf,
    setup: Setup,
    _dir: TempDir,
}

impl Stack {
    /// [`Stack::start_with`] the shipped settings.
    fn start(label: &str, slots: usize, running: usize) -> Stack {
        Stack::start_with(label, slots, running, SHIPPED)
    }

    /// The first `running` of `slots` nodes started (a cluster), then Envoy listing all of
    /// them (ratekeeper serves before Envoy starts, as a native sidecar or a Deployment
    /// already running does).
    fn start_with(label: &str, slots: usize, running: usize, setup: Setup) -> Stack {
        let dir = TempDir::new(label);
        let config = write_config(dir.path(), "limits.yaml", LIMITS);
        let slots: Vec<Slot> = (0..slots)
            .map(|_| Slot {
                grpc: free_port(),
                peer: free_port(),
            })
            .collect();
        let mut nodes: Vec<Option<Ratekeeper>> = (0..slots.len()).map(|_| None).collect();
        for index in 0..running {
            let peers: Vec<&Slot> = slots[..index].iter().collect();
            nodes[index] = Some(start_node(
                &config,
                &slots[index],
                &peers,
                setup.shutdown_delay,
            ));
        }
        let upstream = Upstream::start();
        let envoy_yaml = envoy_config(upstream.addr(), &slots, setup.health_checks);
        let envoy_yaml = write_config(dir.path(), "envoy.yaml", &envoy_yaml);
        let mut stack = Stack {
            envoy: Envoy::start(&envoy_yaml, dir.path()),
            nodes,
            stopped: Vec::new(),
            slots,
            listener: SocketAddr::from(([127, 0, 0, 1], 0)),
            _upstream: upstream,
            config,
            setup,
            _dir: dir,
        };
        stack.wait_for_members(running);
        stack.listener = stack.envoy.listener_addr("edge");
        let listener = stack.listener;
        let through = eventually(START_TIMEOUT, || {
            http_get(listener, "/", &[("x-api-key", "open-warmup")])
                .is_ok_and(|response| response.status == 200)
        });
        assert!(through, "Envoy proxies: {}", stack.envoy.stderr());
        stack
    }

    /// Starts node `index` on its addresses, joining the running ones.
    fn start_node(&mut self, index: usize) {
        let peers: Vec<&Slot> = (0..self.slots.len())
            .filter(|other| *other != index && self.nodes[*other].is_some())
            .map(|other| &self.slots[other])
            .collect();
        let (config, delay) = (&self.config, self.setup.shutdown_delay);
        self.nodes[index] = Some(start_node(config, &self.slots[index], &peers, delay));
    }

    /// SIGTERM to node `index`; waits until it exited cleanly.
    fn stop_node(&mut self, index: usize) {
        let mut node = self.nodes[index].take().expect("a running node");
        node.process().signal("-TERM");
        let exited = eventually_some(START_TIMEOUT, || node.process().exited());
        let exit = exited.expect("a node exits after its delay and drain");
        assert!(exit.success(), "{}", node.stderr());
        self.stopped.push(node);
    }

    fn running(&self) -> impl Iterator<Item = &Ratekeeper> {
        self.nodes.iter().flatten()
    }

    /// Waits until every running node has `n` members on its ring and Envoy's health checks
    /// (if any) count `n` healthy endpoints.
    fn wait_for_members(&mut self, n: usize) {
        for node in self.running() {
            let agreed = eventually(START_TIMEOUT, || cluster_members(node) == Some(n as f64));
            assert!(agreed, "a node never saw {n} members: {}", node.stderr());
        }
        if !self.setup.health_checks {
            return;
        }
        let envoy = &mut self.envoy;
        let healthy = eventually(START_TIMEOUT, || {
            envoy_stat(envoy, "cluster.ratekeeper.membership_healthy") == n as u64
        });
        assert!(
            healthy,
            "Envoy never saw {n} healthy: {}",
            envoy.stats("cluster.ratekeeper.")
        );
    }

    /// Asserts Envoy saw no failed rate limit call (none passed unchecked), with what the
    /// nodes and Envoy said otherwise.
    fn assert_no_failed_call(&mut self, what: &str) {
        let stats = self.envoy.stats("cluster.app.ratelimit.");
        let failed = (
            ratelimit_stat(&mut self.envoy, "error"),
            ratelimit_stat(&mut self.envoy, "failure_mode_allowed"),
        );
        if failed == (0, 0) {
            return;
        }
        let warnings: Vec<String> = self
            .running()
            .chain(&self.stopped)
            .flat_map(|node| {
                let stderr = node.stderr();
                stderr
                    .lines()
                    .filter(|line| line.contains("WARN") || line.contains("ERROR"))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        let upstream_stats: Vec<String> = self
            .envoy
            .stats("cluster.ratekeeper.")
            .lines()
            .filter(|line| !line.ends_with(": 0"))
            .map(str::to_owned)
            .collect();
        panic!(
            "{what}: rate limit calls failed (error, failure_mode_allowed) = {failed:?}:\n{stats}\n\
             nodes' warnings:\n{}\nEnvoy's ratekeeper cluster:\n{}",
            warnings.join("\n"),
            upstream_stats.join("\n")
        );
    }
}

/// Asserts the load saw only 200s and the limited key's 429s, a steady load, and the
/// limited key admitted at least its limit and at most its limit plus `handoffs` times it.
fn assert_load(what: &str, outcome: Outcome, handoffs: u64) {
    let Outcome {
        admitted,
        sent,
        slowest,
        unexpected,
    } = outcome;
    eprintln!(
        "{what}: {sent} requests, the limited key admitted {admitted} of {LIMIT}, the slowest \
         answer took {slowest:?}"
    );
    assert!(
        unexpected.is_empty(),
        "{what}: unexpected answers: {unexpected:?}"
    );
    let bound = LIMIT + handoffs * LIMIT;
    assert!(
        admitted <= bound,
        "{what}: {admitted} admitted, more than {LIMIT} + the handoff bound ({bound})"
    );
    assert!(admitted >= LIMIT, "{what}: the limit was used: {admitted}");
    assert!(sent > 200, "{what}: a steady load: {sent} requests");
}

#[test]
fn a_rolling_restart_under_load_through_envoy_fails_no_call_and_keeps_the_limit() {
    let mut stack = Stack::start("rollout", 3, 3);
    let load = Load::start(stack.listener, 4);
    std::thread::sleep(Duration::from_secs(1));
    for index in 0..3 {
        stack.stop_node(index);
        stack.start_node(index);
        stack.wait_for_members(3);
    }
    let outcome = load.stop();
    stack.assert_no_failed_call("a rolling restart");
    // Three restarts, each moving the key's counter at most twice (away, back).
    assert_load("a rolling restart", outcome, 6);

    // The failure case, reported and not judged by the same bar: a node killed (no
    // SIGTERM) fails the calls Envoy had sent it until the health checks and the others'
    // detectors notice.
    let load = Load::start(stack.listener, 4);
    std::thread::sleep(Duration::from_secs(1));
    if let Some(node) = stack.nodes[1].as_mut() {
        node.process().signal("-KILL");
    }
    std::thread::sleep(Duration::from_secs(3));
    let Outcome { admitted, sent, .. } = load.stop();
    let failed = ratelimit_stat(&mut stack.envoy, "failure_mode_allowed");
    eprintln!(
        "kill -9 of one node: {failed} of {sent} calls failed and passed unchecked; the \
         limited key admitted {admitted} more"
    );
}

/// Scale out from 3 to 5 nodes and back to 3 under load, Envoy listing all five endpoints
/// (two not running at first: its health checks and the retry policy keep them out).
#[test]
fn scaling_out_and_in_under_load_through_envoy_fails_no_call_and_keeps_the_limit() {
    let mut stack = Stack::start("scale", 5, 3);
    let load = Load::start(stack.listener, 4);
    std::thread::sleep(Duration::from_secs(1));
    for (index, members) in [(3, 4), (4, 5)] {
        stack.start_node(index);
        stack.wait_for_members(members);
    }
    for (index, members) in [(4, 4), (3, 3)] {
        stack.stop_node(index);
        stack.wait_for_members(members);
    }
    let outcome = load.stop();
    stack.assert_no_failed_call("scaling out and in");
    // Four membership changes, each moving the key's counter at most once.
    assert_load("scaling out and in", outcome, 4);
}

/// With nothing to warn Envoy ahead (no health checks, no shutdown delay), a node stopped
/// under load still fails no call: its final GOAWAY names the last call it took, so Envoy
/// retries the calls that crossed it on the other node (`refused-stream`), and the calls
/// it then sends to the closed port as well (`connect-failure`). The node answers every
/// call it took before it exits.
#[test]
fn calls_crossing_the_final_goaway_are_retried_on_the_other_node() {
    let setup = Setup {
        health_checks: false,
        shutdown_delay: "--shutdown-delay=0s",
    };
    let mut stack = Stack::start_with("goaway", 2, 2, setup);
    let load = Load::start(stack.listener, 4);
    std::thread::sleep(Duration::from_secs(1));
    stack.stop_node(1);
    // Envoy still picks the stopped node for about half of the calls.
    std::thread::sleep(Duration::from_secs(1));
    let outcome = load.stop();
    // Envoy's back-off before the retry is short (5 ms at first): its default for this retry
    // policy is up to a second, longer than the call's timeout.
    assert!(
        outcome.slowest < Duration::from_millis(500),
        "the slowest answer took {:?}",
        outcome.slowest
    );
    let goaways = envoy_stat(
        &mut stack.envoy,
        "cluster.ratekeeper.upstream_cx_close_notify",
    );
    let retried = envoy_stat(&mut stack.envoy, "cluster.ratekeeper.upstream_rq_retry");
    eprintln!("a node stopped unannounced: {goaways} GOAWAY, {retried} calls retried");
    stack.assert_no_failed_call("a node stopped without Envoy being told ahead");
    assert!(goaways >= 1, "the stopping node said GOAWAY");
    assert!(
        retried >= 1,
        "the calls sent to the stopped node were retried"
    );
    // One stop moves the key's counter at most once.
    assert_load("a node stopped unannounced", outcome, 1);
}

/// One ratekeeper as the only endpoint of one Envoy (a sidecar, or a plain container that
/// gets SIGTERM while Envoy still runs): on SIGTERM it reports not ready, and Envoy, with
/// no other endpoint, keeps asking it (its panic mode); every call is still answered while
/// the shutdown delay lasts.
#[test]
fn a_lone_ratekeeper_keeps_answering_envoy_through_its_shutdown_delay() {
    let mut stack = Stack::start("lone", 1, 1);
    let load = Load::start(stack.listener, 4);
    std::thread::sleep(Duration::from_secs(1));
    let signalled = std::time::Instant::now();
    if let Some(node) = stack.nodes[0].as_mut() {
        node.process().signal("-TERM");
    }
    // Well inside the 2 s delay.
    std::thread::sleep(Duration::from_millis(1500));
    let Outcome {
        admitted,
        sent,
        unexpected,
        ..
    } = load.stop();
    assert!(
        signalled.elapsed() < Duration::from_secs(2),
        "the load stopped within the delay"
    );
    stack.assert_no_failed_call("a lone ratekeeper stopping");
    assert!(unexpected.is_empty(), "unexpected answers: {unexpected:?}");
    assert!(sent > 100, "a steady load: {sent} requests");
    assert!(admitted <= LIMIT, "{admitted} admitted, limit {LIMIT}");
}
