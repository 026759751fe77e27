//! The example limits (`examples/limits/`) and the demo script (`examples/demo.sh`).
//!
//! Every example loads (`Limits::load`, and `ratekeeper validate` on the directory), and
//! each does what its comment promises, checked through [`ratekeeper::limiter::Limiter`] on a
//! paused clock: per-IP counters, the VIP override, wildcard paths, shadow mode, the token
//! bucket's burst and refill, the wait queue, and two limits on one key.

use std::ffi::OsStr;
use std::fs;
use std::process::Command;
use std::time::Duration;

use crate::support::{repo_path, run_ratekeeper, run_to_end};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratekeeper::clock::Clock;
use ratekeeper::envoy::rls::should_rate_limit;
use ratekeeper::limiter::{Limiter, LimiterOptions};
use ratekeeper::limits::Limits;
use ratekeeper::metrics::MetricsOptions;
use ratekeeper::store::memory::{Engine, EngineConfig};
use tokio::time::{Instant, advance};

/// The example files, one use case each. A new file needs a behaviour test below.
const EXAMPLES: [&str; 7] = [
    "multi-limit.yaml",
    "per-api-key.yaml",
    "per-ip.yaml",
    "per-path.yaml",
    "shadow-mode.yaml",
    "token-bucket.yaml",
    "wait-queue.yaml",
];

/// 2024-01-04T00:00:10Z: ten seconds into a day, a minute and a second boundary, so the
/// windows the tests fill never roll over unless a test advances the clock.
const START_NANOS: u64 = (1_704_326_400 + 10) * 1_000_000_000;

/// A limiter over one example file, on a clock starting at [`START_NANOS`] that only moves
/// with tokio's (paused) time.
fn limiter(file: &str) -> Limiter {
    let path = repo_path(&format!("examples/limits/{file}"));
    let limits = Limits::load(&path).unwrap_or_else(|errors| panic!("{file}: {errors}"));
    let engine = Engine::spawn(
        EngineConfig {
            shards: 2,
            ..EngineConfig::default()
        },
        Clock::starting_at(START_NANOS),
    );
    Limiter::standalone(
        limits,
        engine,
        LimiterOptions::default(),
        MetricsOptions::default(),
    )
}

/// A request with one descriptor of one entry.
fn request(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn ask(limiter: &Limiter, request: &RateLimitRequest) -> RateLimitResponse {
    should_rate_limit(limiter, request)
        .await
        .unwrap_or_else(|error| panic!("{request:?}: {error}"))
}

/// The one descriptor's status.
async fn status(limiter: &Limiter, request: &RateLimitRequest) -> DescriptorStatus {
    let response = ask(limiter, request).await;
    assert_eq!(response.statuses.len(), 1);
    assert_eq!(response.overall_code, response.statuses[0].code);
    response.statuses[0].clone()
}

/// How many of `count` immediate requests pass.
async fn admitted(limiter: &Limiter, request: &RateLimitRequest, count: usize) -> usize {
    let mut passed = 0;
    for _ in 0..count {
        if status(limiter, request).await.code == Code::Ok as i32 {
            passed += 1;
        }
    }
    passed
}

/// The configured limit reported in a status: (name, requests_per_unit, unit).
fn limit_of(status: &DescriptorStatus) -> (String, u32, Unit) {
    let limit = status.current_limit.as_ref().expect("a limit applies");
    let unit = Unit::try_from(limit.unit).expect("a known unit");
    (limit.name.clone(), limit.requests_per_unit, unit)
}

#[test]
fn every_example_file_loads_and_has_a_behaviour_test() {
    let dir = repo_path("examples/limits");
    let mut present: Vec<String> = fs::read_dir(&dir)
        .expect("examples/limits")
        .map(|entry| entry.expect("a dir entry").file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .collect();
    present.sort();
    assert_eq!(
        present, EXAMPLES,
        "examples/limits changed: update EXAMPLES and the tests"
    );
    for file in EXAMPLES {
        let limits =
            Limits::load(&dir.join(file)).unwrap_or_else(|errors| panic!("{file}: {errors}"));
        assert_eq!(limits.domains().count(), 1, "{file}: one domain per file");
        assert!(limits.limit_count() > 0, "{file}");
    }
}

#[test]
fn the_examples_directory_passes_ratekeeper_validate() {
    let dir = repo_path("examples/limits");
    let (status, stdout, stderr) = run_ratekeeper(&[OsStr::new("validate"), dir.as_os_str()]);
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");
    // One directory, so the domains must also be distinct across files.
    assert!(
        stdout.contains(&format!("ok, {} domains", EXAMPLES.len())),
        "{stdout}"
    );
}

#[tokio::test(start_paused = true)]
async fn per_ip_counts_each_address_on_its_own_and_allow_lists_monitoring() {
    let limiter = limiter("per-ip.yaml");
    let client = request("per_ip", "remote_address", "203.0.113.7");
    assert_eq!(admitted(&limiter, &client, 25).await, 20, "20 per second");
    let other = request("per_ip", "remote_address", "203.0.113.8");
    assert_eq!(status(&limiter, &other).await.code, Code::Ok as i32);
    let monitoring = request("per_ip", "remote_address", "10.0.0.10");
    assert_eq!(admitted(&limiter, &monitoring, 100).await, 100);
    assert_eq!(status(&limiter, &monitoring).await.current_limit, None);
    // The next second, the client may send again.
    advance(Duration::from_secs(1)).await;
    assert_eq!(admitted(&limiter, &client, 25).await, 20);
}

#[tokio::test(start_paused = true)]
async fn api_keys_get_the_default_the_vip_wildcard_or_their_exact_override() {
    let limiter = limiter("per-api-key.yaml");
    let cases = [
        ("k-123", ("standard", 60)),
        ("vip-globex", ("vip", 600)),
        // Matches `vip-*` too, but the exact value wins.
        ("vip-acme", ("acme", 6000)),
    ];
    for (key, (name, per_minute)) in cases {
        let status = status(&limiter, &request("api_keys", "api_key", key)).await;
        assert_eq!(
            limit_of(&status),
            (name.to_owned(), per_minute, Unit::Minute),
            "{key}"
        );
    }
    // The default key runs out at 60 a minute while a VIP key keeps going.
    let standard = request("api_keys", "api_key", "k-456");
    assert_eq!(admitted(&limiter, &standard, 70).await, 60);
    let vip = request("api_keys", "api_key", "vip-initech");
    assert_eq!(admitted(&limiter, &vip, 70).await, 70);
}

#[tokio::test(start_paused = true)]
async fn paths_match_the_first_wildcard_in_file_order() {
    let limiter = limiter("per-path.yaml");
    // `/api/v1/search*` comes before `/api/*`: search gets the tight limit.
    let search = request("paths", "path", "/api/v1/search?q=rust");
    assert_eq!(
        limit_of(&status(&limiter, &search).await),
        ("search".to_owned(), 5, Unit::Second)
    );
    assert_eq!(
        admitted(&limiter, &search, 10).await,
        4,
        "5 per second in all"
    );
    // The counter is the request value's: another search path has its own.
    let other_search = request("paths", "path", "/api/v1/search?q=go");
    assert_eq!(admitted(&limiter, &other_search, 10).await, 5);
    let users = request("paths", "path", "/api/v2/users");
    assert_eq!(
        limit_of(&status(&limiter, &users).await),
        ("api".to_owned(), 100, Unit::Second)
    );
    // Static files: unlimited, reported with the full quota and no limit.
    let asset = request("paths", "path", "/static/app.js");
    for _ in 0..200 {
        let status = status(&limiter, &asset).await;
        assert_eq!(status.code, Code::Ok as i32);
        assert_eq!(status.limit_remaining, u32::MAX);
    }
    // No entry matches: not limited.
    let other = request("paths", "path", "/healthz");
    assert_eq!(status(&limiter, &other).await.current_limit, None);
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_never_rejects_but_counts_what_it_would_have() {
    let limiter = limiter("shadow-mode.yaml");
    let tenant = request("shadow", "tenant", "acme");
    for _ in 0..150 {
        let response = ask(&limiter, &tenant).await;
        assert_eq!(response.overall_code, Code::Ok as i32);
        assert_eq!(response.statuses[0].code, Code::Ok as i32);
    }
    // The 50 hits over the 100-a-minute limit show in the shadow-mode metric.
    let metrics = limiter.metrics().encode();
    let shadow = metrics
        .lines()
        .find(|line| {
            line.starts_with("ratekeeper_limit_shadow_mode_total{")
                && line.contains("tenant_rollout")
        })
        .unwrap_or_else(|| panic!("no shadow-mode series in:\n{metrics}"));
    assert!(shadow.ends_with(" 50"), "{shadow}");
}

#[tokio::test(start_paused = true)]
async fn the_token_bucket_allows_a_burst_then_the_refill_rate() {
    let limiter = limiter("token-bucket.yaml");
    let client = request("burst", "client", "c1");
    assert_eq!(
        admitted(&limiter, &client, 60).await,
        50,
        "the bucket holds 50"
    );
    // 10 per second: one token every 100 ms.
    advance(Duration::from_millis(100)).await;
    assert_eq!(admitted(&limiter, &client, 3).await, 1);
    advance(Duration::from_secs(1)).await;
    assert_eq!(admitted(&limiter, &client, 20).await, 10);
    // A fresh client has its own full bucket.
    let other = request("burst", "client", "c2");
    assert_eq!(admitted(&limiter, &other, 60).await, 50);
}

#[tokio::test(start_paused = true)]
async fn the_wait_queue_delays_a_request_instead_of_rejecting_it() {
    let limiter = limiter("wait-queue.yaml");
    let backend = request("queue", "backend", "legacy");
    let started = Instant::now();
    // Three at once: the first passes now, the second waits its 10 ms turn (within
    // max_wait 15ms), the third would need 20 ms and is rejected.
    let timed = |request: RateLimitRequest| {
        let limiter = &limiter;
        async move {
            let response = ask(limiter, &request).await;
            (response.overall_code, started.elapsed())
        }
    };
    let (first, second, third) = tokio::join!(
        timed(backend.clone()),
        timed(backend.clone()),
        timed(backend.clone())
    );
    assert_eq!(first, (Code::Ok as i32, Duration::ZERO));
    assert_eq!(second.0, Code::Ok as i32);
    assert!(
        second.1 >= Duration::from_millis(10) && second.1 <= Duration::from_millis(15),
        "the second waited {:?}",
        second.1
    );
    assert_eq!(third.0, Code::OverLimit as i32);
    assert!(third.1 <= Duration::from_millis(15), "{:?}", third.1);
}

#[tokio::test(start_paused = true)]
async fn two_limits_on_one_key_and_rejected_requests_spend_no_daily_quota() {
    let limiter = limiter("multi-limit.yaml");
    let key = request("multi", "api_key", "free-1");
    // 15 a second for 100 seconds: the per-second limit admits 10 each second, and the 5
    // it rejects do not count against the day, so the day's 1000 last exactly 100 seconds.
    for second in 0..100 {
        let mut passed = 0;
        for attempt in 0..15 {
            let status = status(&limiter, &key).await;
            if status.code == Code::Ok as i32 {
                passed += 1;
            } else if attempt == 10 && second == 0 {
                assert_eq!(
                    limit_of(&status),
                    ("free_per_second".to_owned(), 10, Unit::Second),
                    "the per-second limit is the one that bit"
                );
            }
        }
        assert_eq!(passed, 10, "second {second}");
        advance(Duration::from_secs(1)).await;
    }
    let over = status(&limiter, &key).await;
    assert_eq!(over.code, Code::OverLimit as i32);
    assert_eq!(
        limit_of(&over),
        ("free_per_day".to_owned(), 1000, Unit::Day),
        "now the daily limit is exhausted"
    );
}

#[test]
fn the_demo_script_parses() {
    let script = repo_path("examples/demo.sh");
    let (status, stdout, stderr) = run_to_end(
        "bash -n",
        Command::new("bash").arg("-n").arg(&script),
        Duration::from_secs(30),
    );
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");
}
