//! The project's gRPC load generator (`benches/loadgen`) as a command, to load a running
//! ratekeeper (or any RLS server) by hand with many keys and descriptors, which h2load
//! cannot vary:
//!
//! ```text
//! cargo run --release --example loadgen -- addr=127.0.0.1:8081 seconds=10 descriptors=4 keys=100000
//! ```
//!
//! Requests carry domain `bench` and descriptors `api_key = key-<n>`, so the server needs
//! limits for them, e.g.
//! `{domain: bench, descriptors: [{key: api_key, rate_limit: {unit: second, requests_per_unit: 1000}}]}`.
//! It prints one JSON line (req/s, p50 to p99.9, max, its own CPU per request) and exits 1
//! if any answer was not a well-formed OK or OVER_LIMIT. The settings and their defaults
//! are in BENCHMARKS.md, "The load generator".

#[path = "../benches/loadgen/mod.rs"]
mod loadgen;

const USAGE: &str = "usage: loadgen addr=HOST:PORT [seconds=4 | requests=N] [connections=8] \
[streams=32] [warmup=1] [descriptors=1] [keys=1] [first=0] [rate=0 (closed loop)] \
[threads=1] [body=build|pool] [seed=1] [statuses=N] [timeout=60]";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|arg| arg == "-h" || arg == "--help") {
        eprintln!("{USAGE}");
        std::process::exit(if args.is_empty() { 2 } else { 0 });
    }
    loadgen::client::run_and_exit(&args.join(" "), "loadgen");
}
