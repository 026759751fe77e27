//! Real Envoys (1.40, `rate_limit_quota` filter) sharing one ratekeeper: the limit divided
//! among them under uneven load and a newcomer, and a ratekeeper restart; and two Envoys,
//! each behind its own node of a cluster, sharing the limit through the bucket's owner.
//!
//! The Envoy config is `examples/rlqs/envoy.yaml` with only its addresses swapped, and the
//! limits are `examples/rlqs/limits.yaml` as shipped: 20 requests per second per api key,
//! burst 10. The windows are 20 s (not the 60 s) so the tests stay well under a
//! minute; Envoy reports every 5 s, so a window still spans four report intervals.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{
    Envoy, Ratekeeper, START_TIMEOUT, TempDir, Upstream, eventually, example_envoy_config,
    ratekeeper_command, start_cluster,
};

/// The example limits: 20 per second, burst 10.
const LIMIT_PER_SECOND: f64 = 20.0;
const BURST: f64 = 10.0;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `examples/rlqs/envoy.yaml` pointed at the test's ratekeeper and upstream; every replaced
/// text must appear exactly once, so an edit to the example this no longer understands
/// fails here.
fn envoy_config(ratekeeper: SocketAddr, upstream: SocketAddr) -> String {
    let more = vec![(
        "socket_address: { address: 127.0.0.1, port_value: 8081 }".to_owned(),
        format!(
            "socket_address: {{ address: 127.0.0.1, port_value: {} }}",
            ratekeeper.port()
        ),
    )];
    example_envoy_config("examples/rlqs/envoy.yaml", upstream, more)
}

/// An Envoy of the example, and its listener.
fn start_envoy(
    dir: &TempDir,
    name: &str,
    ratekeeper: SocketAddr,
    upstream: SocketAddr,
) -> (Envoy, SocketAddr) {
    let envoy_dir = dir.path().join(name);
    fs::create_dir_all(&envoy_dir).expect("envoy dir");
    let config = envoy_dir.join("envoy.yaml");
    fs::write(&config, envoy_config(ratekeeper, upstream)).expect("write envoy config");
    let mut envoy = Envoy::start(&config, &envoy_dir);
    let listener = envoy.listener_addr("edge");
    (envoy, listener)
}

/// `ratekeeper serve` of the example limits with its gRPC listener on `grpc` (`:0`: any),
/// and `extra` flags.
fn start_ratekeeper(grpc: &str, extra: &[&str]) -> Ratekeeper {
    let mut command = ratekeeper_command();
    command
        .arg("serve")
        .arg("--config")
        .arg(repo_file("examples/rlqs/limits.yaml"))
        .args([
            "--grpc-addr",
            grpc,
            "--http-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .args(extra);
    Ratekeeper::start_command(&mut command, [127, 0, 0, 1].into())
}

/// What one client saw: when each answer came (since the client's start) and whether it
/// was admitted (200) or denied (429).
#[derive(Debug, Default)]
struct Seen {
    answers: Vec<(Duration, bool)>,
}

impl Seen {
    fn admitted(&self) -> usize {
        self.answers.iter().filter(|(_, ok)| *ok).count()
    }

    fn denied_between(&self, from: Duration, to: Duration) -> usize {
        self.answers
            .iter()
            .filter(|(at, ok)| !ok && *at >= from && *at < to)
            .count()
    }

    fn answered_between(&self, from: Duration, to: Duration) -> usize {
        self.answers
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .count()
    }
}

/// A keep-alive HTTP/1.1 client of one Envoy listener. (Reading each answer to EOF with
/// `Connection: close`, as `http_get` does, waits on Envoy's delayed close: ~10 requests a
/// second at most.)
struct Client {
    addr: SocketAddr,
    connection: Option<BufReader<TcpStream>>,
}

impl Client {
    fn new(addr: SocketAddr) -> Client {
        Client {
            addr,
            connection: None,
        }
    }

    /// `GET /` with `x-api-key: key`: the status.
    fn get(&mut self, key: &str) -> io::Result<u16> {
        let connection = match &mut self.connection {
            Some(connection) => connection,
            None => {
                let stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))?;
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                stream.set_nodelay(true)?;
                self.connection.insert(BufReader::new(stream))
            }
        };
        let request = format!("GET / HTTP/1.1\r\nHost: envoy\r\nx-api-key: {key}\r\n\r\n");
        connection.get_mut().write_all(request.as_bytes())?;
        let mut line = String::new();
        connection.read_line(&mut line)?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, format!("status line {line:?}"))
            })?;
        let mut length = 0usize;
        let mut close = false;
        loop {
            line.clear();
            if connection.read_line(&mut line)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "headers cut off",
                ));
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("connection") {
                    close = value.trim().eq_ignore_ascii_case("close");
                }
            }
        }
        let mut body = vec![0u8; length];
        connection.read_exact(&mut body)?;
        if close {
            self.connection = None;
        }
        Ok(status)
    }
}

/// The 80/20 load of the sharing tests on `alice` from `origin` for `window`: 24 requests a
/// second through `busy`, 6 through `light`.
fn busy_and_light(
    busy: SocketAddr,
    light: SocketAddr,
    origin: Instant,
    window: Duration,
    stop: &Arc<AtomicBool>,
) -> [thread::JoinHandle<Seen>; 2] {
    [(busy, 24.0), (light, 6.0)].map(|(listener, per_second)| {
        paced(
            listener,
            "alice",
            per_second,
            origin,
            Duration::ZERO,
            window,
            Arc::clone(stop),
        )
    })
}

/// What Envoys sharing the limit over `window` admitted in all: within 10 % of the limit
/// plus one burst, and at least 80 % of the limit (the shares leave none of it unused).
fn shared_within_the_bound(admitted: &[usize], window: Duration) {
    let total: usize = admitted.iter().sum();
    let seconds = window.as_secs_f64();
    let bound = 1.1 * LIMIT_PER_SECOND * seconds + BURST;
    assert!(
        (total as f64) <= bound,
        "admitted {admitted:?} = {total} over {seconds} s, more than the bound {bound}"
    );
    assert!(
        (total as f64) >= 0.8 * LIMIT_PER_SECOND * seconds,
        "admitted {admitted:?} = {total}: the shares leave the limit unused"
    );
}

/// Sends `per_second` requests a second with `x-api-key: key` to `listener`, from `start`
/// (after the clock `origin`) for `length`, or until `stop` is set; panics on anything but
/// 200 or 429. Requests go one after another on their schedule (a late one is sent at
/// once), so the offered load does not drop when answers slow down.
fn paced(
    listener: SocketAddr,
    key: &'static str,
    per_second: f64,
    origin: Instant,
    start: Duration,
    length: Duration,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Seen> {
    thread::spawn(move || {
        let mut seen = Seen::default();
        let mut client = Client::new(listener);
        let gap = Duration::from_secs_f64(1.0 / per_second);
        let mut next = origin + start;
        let end = origin + start + length;
        while next < end && !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if next > now {
                thread::sleep(next - now);
            }
            let status = client.get(key).unwrap_or_else(|error| {
                // A dropped keep-alive connection: once more on a new one.
                client.connection = None;
                client.get(key).unwrap_or_else(|error2| {
                    panic!("GET through Envoy {listener}: {error}, then {error2}")
                })
            });
            let ok = match status {
                200 => true,
                429 => false,
                other => panic!("Envoy {listener} answered {other}"),
            };
            seen.answers.push((origin.elapsed(), ok));
            next += gap;
        }
        seen
    })
}

/// Three Envoys share the key `alice` (20 per second, burst 10) through one ratekeeper over
/// a 20 s window: a busy one offers 24 per second and a light one 6 (80/20) throughout,
/// and a third joins at 10 s offering 6. Together they stay within 10 % of the limit plus
/// one burst, and the busy one gets at least 70 % of what it could: the limit less the
/// others' demand (14 per second, then 8).
#[test]
fn envoys_share_one_limit_by_demand_and_a_newcomer_gets_a_share() {
    let dir = TempDir::new("rlqs-envoys");
    let upstream = Upstream::start();
    let ratekeeper = start_ratekeeper("127.0.0.1:0", &[]);
    let grpc = ratekeeper.grpc_addr();
    let (_busy_envoy, busy) = start_envoy(&dir, "busy", grpc, upstream.addr());
    let (_light_envoy, light) = start_envoy(&dir, "light", grpc, upstream.addr());
    let (_late_envoy, late) = start_envoy(&dir, "late", grpc, upstream.addr());
    let window = Duration::from_secs(20);
    let half = window / 2;
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let [busy_seen, light_seen] = busy_and_light(busy, light, origin, window, &stop);
    let late_seen = paced(late, "alice", 6.0, origin, half, half, Arc::clone(&stop));
    let busy_seen = busy_seen.join().expect("the busy client");
    let light_seen = light_seen.join().expect("the light client");
    let late_seen = late_seen.join().expect("the late client");
    let admitted = [
        busy_seen.admitted(),
        light_seen.admitted(),
        late_seen.admitted(),
    ];
    // The limit is used, not starved: the Envoys offer 660 against a limit of 400.
    shared_within_the_bound(&admitted, window);
    let seconds = window.as_secs_f64();
    let busy_could = (LIMIT_PER_SECOND - 6.0) * half.as_secs_f64()
        + (LIMIT_PER_SECOND - 12.0) * half.as_secs_f64();
    assert!(
        admitted[0] as f64 >= 0.7 * busy_could,
        "the busy Envoy got {} of the {busy_could} it could (admitted {admitted:?})",
        admitted[0]
    );
    // The light ones get about what they ask for (6 per second).
    assert!(
        light_seen.admitted() as f64 >= 0.7 * 6.0 * seconds,
        "the light Envoy got {} of its {} requests",
        light_seen.admitted(),
        light_seen.answers.len()
    );
    let streams = crate::support::metric(
        ratekeeper.http_addr(),
        "ratekeeper_rlqs_streams{domain=\"quota\"}",
    );
    assert_eq!(streams, 3.0, "one stream per Envoy");
    // The dashboard's data lists the bucket with its three reporters.
    let data =
        crate::support::http_get(ratekeeper.admin_addr(), "/ui/data", &[]).expect("GET /ui/data");
    let data: serde_json::Value = serde_json::from_str(&data.body).expect("JSON");
    let reporters = data["rlqs"]["buckets"][0]["reporters"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(reporters, 3, "{}", data["rlqs"]);
}

/// The assignment TTL of the restart test (`--rlqs-assignment-ttl`; 15 s by default): past
/// one of Envoy's 5 s reports, short enough to keep the test short.
const TTL: &str = "8s";

/// ratekeeper stops while an Envoy is over its share: Envoy keeps enforcing its assignment
/// until the TTL (8 s here) passes, then falls back to `expired_assignment_behavior` (allow
/// all), and enforces a new assignment soon after ratekeeper is back (it reconnects at its
/// next 5 s report).
#[test]
fn envoy_keeps_its_assignment_until_the_ttl_then_falls_back_then_gets_a_new_one() {
    let dir = TempDir::new("rlqs-restart");
    let upstream = Upstream::start();
    let ttl_flag = ["--rlqs-assignment-ttl", TTL];
    let mut ratekeeper = start_ratekeeper("127.0.0.1:0", &ttl_flag);
    let grpc = ratekeeper.grpc_addr();
    let (envoy, listener) = start_envoy(&dir, "envoy", grpc, upstream.addr());
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // 40 per second against 20: about half denied while an assignment holds.
    let load = paced(
        listener,
        "alice",
        40.0,
        origin,
        Duration::ZERO,
        Duration::from_secs(120),
        Arc::clone(&stop),
    );
    // Enforced: denials within the first 6 s (the first assignment comes at once).
    thread::sleep(Duration::from_secs(6));
    ratekeeper.process().kill();
    let killed = origin.elapsed();
    let killed_stderr = ratekeeper.stderr();
    // The last assignment came at most 5 s before the kill: it holds for at least 3 s more.
    // Past every TTL (8 s after the last possible assignment), then a few seconds of fallback.
    thread::sleep(Duration::from_secs(12));
    let restart_at = origin.elapsed();
    let ratekeeper = start_ratekeeper(&grpc.to_string(), &ttl_flag);
    let restarted = origin.elapsed();
    // Envoy reconnects at its next report and enforces the new assignment.
    let back = eventually(START_TIMEOUT, || {
        thread::sleep(Duration::from_millis(500));
        crate::support::metric(
            ratekeeper.http_addr(),
            "ratekeeper_rlqs_streams{domain=\"quota\"}",
        ) == 1.0
    });
    assert!(
        back,
        "Envoy did not reconnect within {START_TIMEOUT:?}:\n{}",
        envoy.stderr()
    );
    let reconnected = origin.elapsed();
    thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Release);
    let seen = load.join().expect("the client");
    let end = origin.elapsed();
    let second = Duration::from_secs(1);
    assert!(
        seen.denied_between(Duration::ZERO, killed) > 0,
        "no denials while ratekeeper served ({} answers)",
        seen.answered_between(Duration::ZERO, killed)
    );
    assert!(
        seen.denied_between(killed + second, killed + Duration::from_secs(3)) > 0,
        "Envoy dropped its assignment as soon as ratekeeper stopped (TTL {TTL})"
    );
    let fallback = (killed + Duration::from_secs(9), restart_at);
    assert!(
        seen.answered_between(fallback.0, fallback.1) > 0,
        "no requests in the fallback"
    );
    assert_eq!(
        seen.denied_between(fallback.0, fallback.1),
        0,
        "past the TTL Envoy should allow all (expired_assignment_behavior)"
    );
    assert!(
        seen.denied_between(reconnected, end) > 0,
        "no denials after ratekeeper came back at {restarted:?} (reconnected by {reconnected:?})"
    );
    let stopped = killed_stderr;
    assert!(
        !stopped.contains("panicked"),
        "the first ratekeeper panicked:\n{stopped}"
    );
    assert!(
        !ratekeeper.stderr().contains("panicked"),
        "the second ratekeeper panicked:\n{}",
        ratekeeper.stderr()
    );
}

/// Cluster mode: two ratekeeper nodes, each with its own Envoy (a sidecar each), share the
/// key `alice` (20 per second, burst 10) through the bucket's owner on the ring over a
/// 25 s window: the busy Envoy offers 24 per second, the light one 6. Until the owner's
/// first answer each node divides half the limit (16 per second admitted together), then
/// the owner divides by demand. Together they stay within 10 % of the limit plus one burst,
/// the limit is used, the light Envoy gets what it asks for, and the nodes' shares add up to
/// the limit.
#[test]
fn envoys_behind_two_cluster_nodes_share_one_limit() {
    let dir = TempDir::new("rlqs-envoys-cluster");
    let upstream = Upstream::start();
    let nodes = start_cluster(&repo_file("examples/rlqs/limits.yaml"), 2, &[]);
    let (_busy_envoy, busy) = start_envoy(&dir, "busy", nodes[0].grpc_addr(), upstream.addr());
    let (_light_envoy, light) = start_envoy(&dir, "light", nodes[1].grpc_addr(), upstream.addr());
    let window = Duration::from_secs(25);
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let [busy_seen, light_seen] = busy_and_light(busy, light, origin, window, &stop);
    let busy_seen = busy_seen.join().expect("the busy client");
    let light_seen = light_seen.join().expect("the light client");
    let admitted = [busy_seen.admitted(), light_seen.admitted()];
    shared_within_the_bound(&admitted, window);
    let total: usize = admitted.iter().sum();
    let seconds = window.as_secs_f64();
    assert!(
        light_seen.admitted() as f64 >= 0.8 * 6.0 * seconds,
        "the light Envoy got {} of its {} requests",
        light_seen.admitted(),
        light_seen.answers.len()
    );
    eprintln!("admitted {admitted:?} = {total} over {seconds} s");
    // Each node shows the share it divides among its Envoys: together, the limit.
    let node_shares: Vec<u64> = nodes
        .iter()
        .map(|node| {
            let answer = crate::support::http_get(node.admin_addr(), "/debug/rlqs", &[])
                .expect("GET /debug/rlqs");
            let debug: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
            debug["buckets"][0]["node_share"].as_u64().unwrap_or(0)
        })
        .collect();
    assert_eq!(
        node_shares.iter().sum::<u64>(),
        20,
        "the nodes' shares {node_shares:?} (admitted {admitted:?})"
    );
    assert!(
        node_shares[0] > node_shares[1],
        "the busy node's share is larger: {node_shares:?}"
    );
}
