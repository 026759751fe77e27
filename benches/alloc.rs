//! Heap allocations per request, counted by a counting global allocator (deterministic, so
//! unlike time it needs no baseline run).
//!
//! Three layers, each on a single-threaded runtime in this process:
//! - `limiter`: `Limiter::decide` on a prepared `Query` (matching, keys, the store, metrics);
//! - `rls`: `rls::should_rate_limit` on a decoded `RateLimitRequest` (the Envoy adapter:
//!   query conversion and the `RateLimitResponse`);
//! - `grpc`: a whole `ShouldRateLimit` call through tonic (client and server), to the real
//!   server and to a no-op server; the difference is what ratekeeper adds to a do-nothing
//!   RLS server.
//!
//! Workloads: one descriptor on one hot key, one descriptor over 100k keys, four
//! descriptors (four different keys) over 100k keys. Run with `cargo bench --bench alloc`.

mod loadgen;

use std::net::SocketAddr;

use counting_alloc::Counting;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratekeeper::clock::Clock;
use ratekeeper::limiter::{Limiter, LimiterOptions, Query};
use ratekeeper::limits::Limits;
use ratekeeper::metrics::MetricsOptions;
use ratekeeper::store::memory::{Engine, EngineConfig};
use tokio::runtime::Runtime;

#[global_allocator]
static ALLOC: Counting = Counting::new();

/// Requests measured per workload and layer (after a warm-up of the same size).
const REQUESTS: usize = 20_000;
const KEYS: usize = 100_000;

struct Workload {
    name: &'static str,
    descriptors: usize,
    keys: usize,
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "1 descriptor, one hot key",
        descriptors: 1,
        keys: 1,
    },
    Workload {
        name: "1 descriptor, 100k keys",
        descriptors: 1,
        keys: KEYS,
    },
    Workload {
        name: "4 descriptors, 100k keys each",
        descriptors: 4,
        keys: KEYS,
    },
];

impl Workload {
    /// The key values of request `n`: different keys per descriptor, spread over the pool.
    fn values(&self, n: usize) -> Vec<String> {
        (0..self.descriptors)
            .map(|d| format!("key-{}", (n * 7919 + d * 104_729) % self.keys))
            .collect()
    }

    fn request(&self, n: usize) -> RateLimitRequest {
        RateLimitRequest {
            domain: "bench".to_owned(),
            descriptors: self
                .values(n)
                .into_iter()
                .map(|value| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "api_key".to_owned(),
                        value,
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }
}

/// Allocations per call of `call` over `REQUESTS` calls (after as many warm-up calls, so
/// tables and caches have grown).
fn per_call(runtime: &Runtime, mut call: impl AsyncFnMut(usize)) -> f64 {
    runtime.block_on(async {
        for n in 0..REQUESTS {
            call(n).await;
        }
        let before = ALLOC.allocations();
        for n in REQUESTS..2 * REQUESTS {
            call(n).await;
        }
        (ALLOC.allocations() - before) as f64 / REQUESTS as f64
    })
}

fn limiter(runtime: &Runtime) -> Limiter {
    let _entered = runtime.enter();
    let limits =
        Limits::parse_str("bench.yaml", loadgen::API_KEY_LIMITS).expect("the bench limits parse");
    let engine = Engine::spawn(
        EngineConfig {
            shards: 2,
            ..EngineConfig::default()
        },
        Clock::system(),
    );
    Limiter::standalone(
        limits,
        engine,
        LimiterOptions::default(),
        MetricsOptions::default(),
    )
}

fn grpc_per_call(runtime: &Runtime, addr: SocketAddr, workload: &Workload) -> f64 {
    let mut client = runtime
        .block_on(RateLimitServiceClient::connect(format!("http://{addr}")))
        .expect("connect");
    per_call(runtime, async |n| {
        client
            .should_rate_limit(workload.request(n))
            .await
            .expect("answers");
    })
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let limiter = limiter(&runtime);
    let (_stop, stop) = tokio::sync::watch::channel(false);
    let ratekeeper =
        loadgen::start_ratekeeper(&runtime, loadgen::API_KEY_LIMITS, Some(2), stop.clone());
    let noop = loadgen::start_noop(&runtime, stop);
    println!("allocations per request (cargo bench --bench alloc), {REQUESTS} requests each");
    println!(
        "| workload | limiter::decide | rls::should_rate_limit | gRPC call, no-op server | gRPC call, ratekeeper | ratekeeper adds |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for workload in &WORKLOADS {
        // Inputs are built before counting starts: what is counted is the layer's own work.
        let values: Vec<Vec<String>> = (0..2 * REQUESTS).map(|n| workload.values(n)).collect();
        let decide = per_call(&runtime, async |n| {
            let mut query = Query::new("bench");
            for value in &values[n] {
                query.descriptor([("api_key", value.as_str())], 1);
            }
            limiter.decide(&query).await.expect("answers");
        });
        let requests: Vec<RateLimitRequest> =
            (0..2 * REQUESTS).map(|n| workload.request(n)).collect();
        let adapter = per_call(&runtime, async |n| {
            ratekeeper::envoy::rls::should_rate_limit(&limiter, &requests[n])
                .await
                .expect("answers");
        });
        drop(requests);
        let baseline = grpc_per_call(&runtime, noop, workload);
        let full = grpc_per_call(&runtime, ratekeeper, workload);
        println!(
            "| {} | {decide:.2} | {adapter:.2} | {baseline:.2} | {full:.2} | {:+.2} |",
            workload.name,
            full - baseline
        );
    }
}
