//! Fuzz harnesses: one `pub fn name(data: &[u8])` per cargo-fuzz target in `fuzz/`.
//!
//! The targets in `fuzz/fuzz_targets/` only call these, and the stable replay tests
//! (`fuzzing::tests`) run the same functions on every file of `fuzz/corpus/<target>/` and
//! `fuzz/regressions/<target>/`, so what was fuzzed and what `cargo test` replays cannot
//! drift. See fuzz/README.md.
//!
//! Each harness feeds outside bytes to the code that reads them in production and asserts
//! what must hold for any input: no panic, errors answered as bad input (never `UNKNOWN` or
//! an internal error), and round trips where there is one.
//!
//! Invariants:
//! - Not part of the API: hidden from the docs, and nothing else in the crate calls it.
//! - No IO beyond the process: no sockets, no files; time is the process's own clock.
//! - Checks never wait: the fixtures configure no `max_wait` and the peer harness clears a
//!   peer's `max_wait_nanos`, so one input is one short step, not a queue for seconds.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use tonic::{Code, Request};

use crate::admin::{Admin, AdminOptions};
use crate::algorithm::{Algorithm, Rate, Unit};
use crate::check::{Check, Checks, Counter};
use crate::clock::Clock;
use crate::cluster::lease::Leases;
use crate::cluster::proto::v1 as wire;
use crate::cluster::proto::v1::peer_server::Peer;
use crate::cluster::service::PeerService;
use crate::cluster::{ClusterOptions, convert};
use crate::error::ErrorKind;
use crate::http::Health;
use crate::key::KeyId;
use crate::limiter::{Limiter, LimiterOptions};
use crate::limits::{Limits, LoadOptions, Source};
use crate::store::cluster::Cluster;
use crate::store::memory::{Engine, EngineConfig, MemoryStore};

/// The limits every fixture decides with: each algorithm, a nested descriptor, a wildcard,
/// an unlimited entry, shadow and quota mode, named limits and a `replaces`.
pub const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 5, name: per_key}
  - key: api_key
    value: "vip-*"
    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 100, burst: 20}
  - key: api_key
    value: healthchecker
  - key: path
    rate_limit: {algorithm: sliding_window, unit: second, requests_per_unit: 10, name: per_path}
    descriptors:
      - key: method
        value: POST
        rate_limits:
          - {algorithm: gcra, unit: hour, requests_per_unit: 1000, burst: 50}
          - {unit: day, requests_per_unit: 20000, replaces: [{name: per_path}]}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: unlimited
    rate_limit: {unlimited: true}
    metadata: {team: search, tier: 2}
"#;

/// What the decide harnesses share: a runtime, and a limiter over [`LIMITS`] on a small
/// in-memory engine.
struct Fixture {
    runtime: tokio::runtime::Runtime,
    limiter: Arc<Limiter>,
    /// The HTTP listener's routes over `limiter` (`/json`, `/nginx`, `/rate`, probes).
    http: axum::Router,
    /// The admin listener's routes (`/counters` and `/debug/explain` on, the dashboard off).
    admin: axum::Router,
}

/// A current-thread runtime with timers, on which a fixture's engine runs its tasks.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        // The harness cannot run without a runtime; failing here is not an input's fault.
        .expect("a tokio runtime")
}

/// A small engine on the system clock, spawned on `runtime`.
fn engine(runtime: &tokio::runtime::Runtime) -> Engine {
    let config = EngineConfig {
        shards: 2,
        max_keys: 10_000,
        max_waiters: 16,
        rule_key_share: 1.0,
    };
    runtime.block_on(async { Engine::spawn(config, Clock::system()) })
}

impl Fixture {
    /// The one fixture of this process: every response option on, counter names kept.
    fn get() -> &'static Fixture {
        static FIXTURE: OnceLock<Fixture> = OnceLock::new();
        FIXTURE.get_or_init(|| {
            Fixture::new(LimiterOptions {
                response_headers: true,
                response_dynamic_metadata: true,
                ..LimiterOptions::default()
            })
        })
    }

    fn new(options: LimiterOptions) -> Fixture {
        let runtime = runtime();
        let limits = Limits::parse_str("fuzz.yaml", LIMITS).expect("the fixture's limits");
        let engine = engine(&runtime);
        let names = Arc::new(crate::admin::names::CounterNames::new(100));
        let limiter = Arc::new(
            Limiter::standalone(
                limits,
                engine,
                options,
                crate::metrics::MetricsOptions::default(),
            )
            .with_observer(Arc::clone(&names) as _),
        );
        let state = Admin {
            health: Arc::new(Health::new()),
            limiter: Arc::clone(&limiter),
            names: Some(names),
            cluster: None,
            reload: Arc::new(crate::reload::ReloadStats::with_version(1)),
            options: AdminOptions {
                counters: true,
                ui: false,
                counter_names: 100,
            },
            rlqs: None,
        };
        let admin_addr = std::net::SocketAddr::from(([127, 0, 0, 1], 6070));
        let http = crate::http::router(Arc::clone(&state.health), Arc::clone(&limiter), admin_addr);
        let admin = crate::admin::admin_router(state, None, admin_addr);
        Fixture {
            runtime,
            limiter,
            http,
            admin,
        }
    }

    /// The answer to `request`, from the listener that serves its path (the operator
    /// endpoints on the admin listener, the rest on the HTTP listener): status and body.
    fn admin(&self, request: http::Request<axum::body::Body>) -> (http::StatusCode, Bytes) {
        use tower_service::Service;
        let path = request.uri().path();
        let operator = ["/counters", "/debug", "/ui"]
            .iter()
            .any(|prefix| path.starts_with(prefix));
        self.runtime.block_on(async {
            let mut router = if operator {
                self.admin.clone()
            } else {
                self.http.clone()
            };
            let response = match router.call(request).await {
                Ok(response) => response,
                Err(infallible) => match infallible {},
            };
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("an admin answer's body");
            (status, body)
        })
    }
}

/// Reads a fuzz input front to back; past its end every number is 0.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        let Some((&first, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        first
    }

    fn u64(&mut self) -> u64 {
        let mut bytes = [0; 8];
        for byte in &mut bytes {
            *byte = self.byte();
        }
        u64::from_le_bytes(bytes)
    }

    fn take(&mut self, len: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(len.min(self.0.len()));
        self.0 = rest;
        taken
    }

    fn rest(self) -> &'a [u8] {
        self.0
    }
}

/// `ShouldRateLimit`: request bytes -> prost -> [`crate::envoy::rls::query`] -> the limiter ->
/// [`crate::envoy::rls::response`] -> bytes. A request that decodes is answered or refused as
/// `INVALID_ARGUMENT`; the answer has one status per descriptor and decodes back to itself.
pub fn rls(data: &[u8]) {
    let Ok(request) = RateLimitRequest::decode(data) else {
        return;
    };
    let fixture = Fixture::get();
    let answer = fixture
        .runtime
        .block_on(crate::envoy::rls::should_rate_limit(
            &fixture.limiter,
            &request,
        ));
    match answer {
        Ok(response) => {
            assert_eq!(response.statuses.len(), request.descriptors.len());
            let bytes = response.encode_to_vec();
            let decoded =
                RateLimitResponse::decode(bytes.as_slice()).expect("an encoded response decodes");
            assert_eq!(decoded, response);
        }
        Err(error) => {
            // Bad input, or a store at its key bound (the fixture's engine is small).
            let kind = error.kind();
            assert!(
                matches!(kind, ErrorKind::InvalidArgument | ErrorKind::Full),
                "{kind:?}: {error}"
            );
        }
    }
}

/// The limits loader on one file's text, as the reloader compiles it: compiled limits, or
/// errors that each name the file, on one line.
pub fn limits(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let source = Source {
        name: "fuzz.yaml".to_owned(),
        text: text.to_owned(),
    };
    for merge_domains in [false, true] {
        let options = LoadOptions {
            merge_domains,
            ..LoadOptions::default()
        };
        match Limits::from_sources_with(std::slice::from_ref(&source), options) {
            Ok(limits) => {
                // What `/rlconfig` prints must not panic either.
                let _ = limits.to_string();
            }
            Err(errors) => {
                assert!(!errors.errors().is_empty(), "a failure without an error");
                for error in errors.errors() {
                    assert_eq!(error.file(), "fuzz.yaml");
                    let line = error.to_string();
                    assert!(!line.contains('\n'), "a message on two lines: {line:?}");
                }
            }
        }
    }
}

/// A statsd_exporter mapping file's text (`--prometheus-mapping`), then a few reference
/// stat names through it: loaded, or one error naming the file; a mapped name is a valid
/// Prometheus name and its labels have valid names.
pub fn stats_mapping(data: &[u8]) {
    use crate::metrics::reference::mapper::{Mapped, Mapper};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mapper = match Mapper::parse("fuzz.yaml", text) {
        Ok(mapper) => mapper,
        Err(error) => {
            assert!(error.to_string().starts_with("fuzz.yaml: "), "{error}");
            return;
        }
    };
    fn metric_char(ch: char) -> bool {
        ch.is_ascii_alphanumeric() || ch == '_' || ch == ':'
    }
    fn label_char(ch: char) -> bool {
        ch.is_ascii_alphanumeric() || ch == '_'
    }
    // Valid when the first character is one of `rest` but no digit.
    let valid = |name: &str, rest: fn(char) -> bool| {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|ch| rest(ch) && !ch.is_ascii_digit())
            && chars.all(rest)
    };
    for name in [
        "ratelimit.service.rate_limit.edge.api_key_vip.path.over_limit",
        "ratelimit_server.ShouldRateLimit.total_requests",
        "ratelimit.service.config_load_success.__env=a",
        "",
    ] {
        let Mapped::Metric { name, labels, .. } = mapper.map_counter(name) else {
            continue;
        };
        assert!(name.is_empty() || valid(&name, metric_char), "{name:?}");
        for (label, _) in labels {
            assert!(valid(&label, label_char), "{label:?}");
        }
    }
}

/// The gRPC fast path's framing ([`crate::envoy::grpc`]): the first byte is the length of a
/// `grpc-timeout` value that follows, the rest is the request body. A body is one message
/// of exactly its declared length (then decided as [`crate::envoy::rls`] does), or refused
/// with tonic's codes; a timeout is bounded.
pub fn grpc(data: &[u8]) {
    let mut input = Input(data);
    let len = usize::from(input.byte() % 16);
    let timeout = input.take(len);
    if let Ok(value) = http::HeaderValue::from_bytes(timeout) {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-timeout", value);
        if let Some(timeout) = crate::envoy::grpc::grpc_timeout(&headers) {
            assert!(timeout <= std::time::Duration::from_secs(99_999_999 * 3600));
        }
    }
    let body = input.rest();
    match crate::envoy::grpc::unframe(Bytes::copy_from_slice(body)) {
        Ok(message) => {
            assert_eq!(body[0], 0, "a compressed message was read");
            let declared = u32::from_be_bytes([body[1], body[2], body[3], body[4]]);
            assert_eq!(message.len(), declared as usize);
            assert_eq!(body.len(), 5 + message.len());
            assert!(message.len() <= crate::envoy::rls::MAX_MESSAGE_BYTES);
            rls(&message);
        }
        Err(status) => assert!(
            matches!(
                status.code(),
                Code::Internal | Code::OutOfRange | Code::InvalidArgument
            ),
            "{status:?}"
        ),
    }
}

/// Peer messages are chosen by the first byte.
const PEER_MESSAGES: u8 = 14;

/// The peer protocol (`ratekeeper.peer.v1`): the first byte picks a message type, the rest
/// is that message's protobuf. Requests go through this node's [`PeerService`] as a peer's
/// would (validation, then the engine); replies through what the asking node does with
/// them (decisions, error codes, leases, pages of names). Whatever a peer sends is refused
/// as `INVALID_ARGUMENT` (or `FAILED_PRECONDITION` for another version), never a panic.
///
/// `Join` and `Leave` are checked through `Ping` (the same validation): applying them would
/// add members (and connections) to the fixture's node. Waits are cleared (see the module
/// docs).
pub fn peer(data: &[u8]) {
    let mut input = Input(data);
    let kind = input.byte() % PEER_MESSAGES;
    let bytes = input.rest();
    let fixture = PeerFixture::get();
    if matches!(kind, 9..=11 | 13) {
        peer_reply(fixture, kind, bytes);
        return;
    }
    let answered = fixture
        .runtime
        .block_on(peer_request(&fixture.service, kind, bytes));
    if let Err(status) = answered {
        assert!(
            matches!(
                status.code(),
                Code::InvalidArgument | Code::FailedPrecondition
            ),
            "{status:?}"
        );
    }
}

/// A request a peer sends, of message `kind`, answered by the peer service: in bounds, or
/// refused as invalid.
async fn peer_request(service: &PeerService, kind: u8, bytes: &[u8]) -> Result<(), tonic::Status> {
    match kind {
        0 => check_batch(service, bytes).await?,
        1 => {
            let Ok(batch) = wire::HandoffBatch::decode(bytes) else {
                return Ok(());
            };
            let offered = batch.counters.len();
            let reply = service.handoff(Request::new(batch)).await?.into_inner();
            assert!(reply.accepted as usize <= offered);
        }
        2..=4 => {
            let Ok(member) = wire::Member::decode(bytes) else {
                return Ok(());
            };
            let reply = service.ping(Request::new(member)).await?.into_inner();
            assert_eq!(reply.addresses, [PeerFixture::ME]);
        }
        5 => {
            let Ok(message) = wire::ResetRequest::decode(bytes) else {
                return Ok(());
            };
            let keys = message.keys.len();
            let reply = service.reset(Request::new(message)).await?.into_inner();
            assert!(reply.removed as usize <= keys);
        }
        6 => {
            let Ok(batch) = wire::RefundBatch::decode(bytes) else {
                return Ok(());
            };
            service.refund(Request::new(batch)).await?;
        }
        7 => {
            let Ok(message) = wire::PeekRequest::decode(bytes) else {
                return Ok(());
            };
            let counters: usize = message
                .checks
                .iter()
                .map(|check| check.counters.len())
                .sum();
            let reply = service.peek(Request::new(message)).await?.into_inner();
            assert_eq!(reply.decisions.len(), counters);
        }
        8 => {
            let Ok(message) = wire::NamesRequest::decode(bytes) else {
                return Ok(());
            };
            service.names(Request::new(message)).await?;
        }
        _ => {
            let Ok(report) = wire::QuotaReport::decode(bytes) else {
                return Ok(());
            };
            // The fixture serves no RLQS: the report is validated, then no share given.
            let reply = service.quota(Request::new(report)).await?.into_inner();
            assert!(!reply.serves_quota && reply.shares.is_empty());
        }
    }
    Ok(())
}

/// A batch of checks a peer forwards, decided without waiting: one answer per group, each
/// decided or refused as this node's own overload (`Full`).
async fn check_batch(service: &PeerService, bytes: &[u8]) -> Result<(), tonic::Status> {
    let Ok(mut batch) = wire::CheckBatch::decode(bytes) else {
        return Ok(());
    };
    for check in batch.groups.iter_mut().flat_map(|group| &mut group.checks) {
        check.max_wait_nanos = 0;
    }
    let groups = batch.groups.len();
    let reply = service.check(Request::new(batch)).await?.into_inner();
    assert_eq!(reply.groups.len(), groups);
    for group in &reply.groups {
        if group.code != 0 {
            let kind = convert::error_from_wire(group.code);
            assert_eq!(kind, ErrorKind::Full, "{}", group.error);
        }
    }
    Ok(())
}

/// A reply a peer answers, of message `kind`: what is accepted crosses the wire back
/// unchanged.
fn peer_reply(fixture: &PeerFixture, kind: u8, bytes: &[u8]) {
    match kind {
        9 => {
            let Ok(reply) = wire::CheckBatchReply::decode(bytes) else {
                return;
            };
            fixture.check_batch_reply(&reply);
        }
        10 => {
            let Ok(reply) = wire::NamesReply::decode(bytes) else {
                return;
            };
            names_reply(reply);
        }
        13 => {
            let Ok(reply) = wire::QuotaReply::decode(bytes) else {
                return;
            };
            quota_reply(reply);
        }
        _ => {
            let Ok(reply) = wire::PeekReply::decode(bytes) else {
                return;
            };
            for decision in &reply.decisions {
                let read = convert::decision_from_wire(decision);
                let again = convert::decision_from_wire(&convert::decision_to_wire(&read));
                assert_eq!(again, read);
            }
        }
    }
}

/// A page of names a peer answered: in bounds and order, or refused; what is accepted
/// crosses the wire back unchanged.
fn names_reply(reply: wire::NamesReply) {
    const LIMIT: usize = 100;
    let Ok(Some(page)) = convert::names_from_wire("edge", LIMIT, reply) else {
        return;
    };
    let again = convert::names_from_wire("edge", LIMIT, convert::names_to_wire(Some(page.clone())));
    assert_eq!(again, Ok(Some(page)));
}

/// An owner's answer to a `Quota` report of two buckets: one share per bucket, each at most
/// its limit, or refused.
fn quota_reply(reply: wire::QuotaReply) {
    use crate::cluster::quota::{QuotaBucket, QuotaDemand};
    let sent = [10, u64::from(u32::MAX)].map(|limit| QuotaDemand {
        bucket: QuotaBucket {
            route: limit,
            id: limit,
        },
        limit,
        demand: limit,
    });
    if let Ok(Some(shares)) = convert::quota_shares_from_wire(&sent, reply) {
        assert_eq!(shares.len(), sent.len());
        for (share, demand) in shares.iter().zip(&sent) {
            assert!(share.is_none_or(|share| (1..=demand.limit).contains(&share)));
        }
    }
}

/// A node in cluster mode with no other member, and the leases its remotes would keep.
struct PeerFixture {
    runtime: tokio::runtime::Runtime,
    service: PeerService,
    leases: Leases,
    /// The checks a [`wire::CheckBatchReply`] is read against: two keys, each in two
    /// checks, so grants for one key meet.
    checks: Checks,
}

impl PeerFixture {
    /// The fixture node's address (nothing listens there: it has no peers to call it).
    const ME: &str = "127.0.0.1:1";

    fn get() -> &'static PeerFixture {
        static FIXTURE: OnceLock<PeerFixture> = OnceLock::new();
        FIXTURE.get_or_init(|| {
            let runtime = runtime();
            let engine = engine(&runtime);
            let cluster = runtime.block_on(async {
                Cluster::join(MemoryStore::new(engine), ClusterOptions::new(Self::ME))
            });
            let service = cluster.unwrapped_peer_service(None, None);
            let check = |route: u64| Check {
                counters: smallvec::smallvec![Counter {
                    key: KeyId {
                        route,
                        id: [route, 7],
                    },
                    rate: Rate::fixed(100, Unit::Minute),
                }],
                cost: 1,
                wait: None,
                charge: crate::check::Charge::Admitted,
            };
            PeerFixture {
                runtime,
                service,
                leases: Leases::default(),
                checks: [check(1), check(2), check(1), check(2)]
                    .into_iter()
                    .collect(),
            }
        })
    }

    /// What a node does with an owner's answer to its batch: each group's decisions (and
    /// the leases they grant), or its error's kind.
    fn check_batch_reply(&self, reply: &wire::CheckBatchReply) {
        let lender: Arc<str> = Arc::from("127.0.0.1:2");
        let now = tokio::time::Instant::now();
        for group in &reply.groups {
            if !group.error.is_empty() || group.code != 0 {
                convert::error_from_wire(group.code);
                continue;
            }
            let counters = self.checks.iter().flat_map(|check| check.counters.iter());
            for (counter, decision) in counters.zip(&group.decisions) {
                convert::decision_from_wire(decision);
                if let Some(grant) = crate::cluster::remote::grant(&lender, decision) {
                    self.leases.take(counter, grant, now);
                }
            }
        }
        for check in &self.checks {
            if let Some(spent) = self.leases.spend(check, now) {
                assert!(spent.decision.allowed);
            }
        }
        for refund in self.leases.collect(now, true) {
            assert!(refund.units > 0);
        }
    }
}

/// The Redis store's reading of its script's answer ([`crate::store::redis`]): the first
/// bytes pick the checks asked (1 to 4, each 1 to 3 counters of any algorithm) and the time,
/// the rest is the reply. A reply is either read whole (one decision per counter) or
/// refused; never a panic, whatever Redis (or whoever answers in its place) sends.
pub fn redis_reply(data: &[u8]) {
    const RATES: [(u32, Unit, u32); 4] = [
        (5, Unit::Second, 5),
        (100, Unit::Minute, 20),
        (1, Unit::Hour, 1),
        (1_000_000, Unit::Day, 10),
    ];
    let mut input = Input(data);
    let count = 1 + input.byte() % 4;
    let mut checks = Checks::new();
    for index in 0..count {
        let shape = input.byte();
        let counters = (0..1 + (shape >> 4) % 3)
            .map(|counter| {
                let algorithm = match (shape >> (2 * counter)) & 3 {
                    0 => Algorithm::FixedWindow,
                    1 => Algorithm::SlidingWindow,
                    2 => Algorithm::TokenBucket,
                    _ => Algorithm::Gcra,
                };
                let (requests, unit, burst) = RATES[usize::from((shape >> 6) ^ counter) % 4];
                Counter {
                    key: KeyId {
                        route: u64::from(index),
                        id: [u64::from(counter), 0],
                    },
                    rate: Rate::new(algorithm, requests, unit, Some(burst)),
                }
            })
            .collect();
        let cost = input.byte();
        // The high bits pick the charge: refunds and counted rejections read alike.
        let charge = match cost >> 6 {
            0 | 1 => crate::check::Charge::Admitted,
            2 => crate::check::Charge::Always,
            _ => crate::check::Charge::Refund,
        };
        checks.push(Check {
            counters,
            cost: u64::from(cost % 8),
            wait: None,
            charge,
        });
    }
    let now = input.u64();
    let reply = input.rest();
    let decided = crate::store::redis::read_reply(&checks, now, reply, |_, states, at, _| {
        assert!(at >= now, "decided before it was asked");
        assert!(!states.is_empty());
    });
    if let Some(decisions) = decided {
        let counters: usize = checks.iter().map(|check| check.counters.len()).sum();
        assert_eq!(decisions.len(), counters);
        assert!(crate::store::redis::part_len(&checks, reply, 0).is_some());
    }
}

/// The admin listener's JSON bodies: the first byte's parity picks `POST /json` or
/// `POST /debug/explain`, the rest is the body. The answer is JSON, and a request is
/// decided, over its limit, or refused as a bad request (400) or a full store (503).
pub fn admin_body(data: &[u8]) {
    let mut input = Input(data);
    let path = if input.byte() % 2 == 0 {
        "/json"
    } else {
        "/debug/explain"
    };
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(input.rest().to_vec()))
        .expect("a request to a fixed path");
    let (status, body) = Fixture::get().admin(request);
    assert!(
        matches!(status.as_u16(), 200 | 400 | 429 | 503),
        "{status}: {}",
        String::from_utf8_lossy(&body)
    );
    serde_json::from_slice::<serde_json::Value>(&body).expect("a json answer");
}

/// Any admin request, written as text: `METHOD TARGET`, header lines `name: value`, an empty
/// line, the body (seeds aim at `/nginx`, `/rate` and `/counters`). Requests hyper would
/// refuse (a malformed method, target or header) are skipped. No answer is a 500.
pub fn admin_request(data: &[u8]) {
    let (head, body) = match data.windows(2).position(|pair| pair == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &[][..]),
    };
    let mut lines = head.split(|&byte| byte == b'\n');
    let first = lines.next().unwrap_or_default();
    let Some(space) = first.iter().position(|&byte| byte == b' ') else {
        return;
    };
    let (Ok(method), Ok(uri)) = (
        http::Method::from_bytes(&first[..space]),
        http::Uri::try_from(&first[space + 1..]),
    ) else {
        return;
    };
    if uri.scheme().is_some() || !uri.path().starts_with('/') {
        return;
    }
    let mut request = http::Request::new(axum::body::Body::from(body.to_vec()));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    for line in lines {
        let Some(colon) = line.iter().position(|&byte| byte == b':') else {
            return;
        };
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(&line[..colon]),
            http::HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            return;
        };
        request.headers_mut().append(name, value);
    }
    let (status, body) = Fixture::get().admin(request);
    assert_ne!(
        status,
        http::StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        String::from_utf8_lossy(&body)
    );
}

/// The webhook's AdmissionReviews: the first byte's parity picks the path (`/inject` or
/// `/inject/namespace`), the rest is the body. Bytes that are not JSON are refused; any
/// JSON is answered "allowed", with the request's uid when it has one, and a patch that is
/// a base64 JSON list of operations.
pub fn admission_review(data: &[u8]) {
    use base64::Engine as _;

    use crate::inject::review::{Scope, answer};
    let mut input = Input(data);
    let scope = if input.byte() % 2 == 0 {
        Scope::Annotated
    } else {
        Scope::Namespace
    };
    let body = input.rest();
    let is_json = serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
    let Ok(answer) = answer(body, scope, &crate::inject::SettingsArgs::default()) else {
        assert!(!is_json, "json refused");
        return;
    };
    assert!(is_json, "bytes that are not json answered");
    let response = &answer.review["response"];
    assert_eq!(response["allowed"], serde_json::Value::Bool(true));
    assert!(response["uid"].is_string());
    if let Some(patch) = response.get("patch") {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch.as_str().expect("a base64 string"))
            .expect("base64");
        let ops: serde_json::Value = serde_json::from_slice(&bytes).expect("a json patch");
        assert!(ops.as_array().is_some_and(|ops| !ops.is_empty()));
    }
}

/// `ratekeeper inject`'s input (any text, other kinds passed through): refused with an
/// error naming the document, or written so that injecting the output again changes
/// nothing and `--uninject` of the output is `--uninject` of the input.
pub fn inject_yaml(data: &[u8]) {
    use crate::inject::workload::{Mode, Options, rewrite};
    let text = String::from_utf8_lossy(data);
    let mut options = Options {
        mode: Mode::Inject,
        strict: false,
        settings: crate::inject::SettingsArgs::default(),
    };
    let injected = match rewrite(&text, &options) {
        Ok(injected) => injected,
        Err(error) => {
            assert!(error.to_string().starts_with("document "), "{error}");
            return;
        }
    };
    let again = rewrite(&injected.yaml, &options).expect("inject's own output is read back");
    assert_eq!(again.yaml, injected.yaml, "a second inject changed it");
    options.mode = Mode::Uninject;
    let back = rewrite(&injected.yaml, &options).expect("uninject of inject's output");
    let original = rewrite(&text, &options).expect("uninject of the input");
    assert_eq!(
        back.yaml, original.yaml,
        "uninject did not give back the input"
    );
}

/// RLQS: report bytes -> prost -> [`crate::envoy::rlqs::usages`] -> a hub stream's report
/// (rules read from the fixture limits) -> [`crate::envoy::rlqs::response`] -> bytes. A report
/// that decodes is answered, one action per distinct bucket, or refused as
/// `INVALID_ARGUMENT` / `RESOURCE_EXHAUSTED`; the answer decodes back to itself; the stream's
/// state is gone once it closes.
pub fn rlqs(data: &[u8]) {
    use crate::envoy::rlqs;
    use crate::quota::{Hub, HubError, HubOptions, RlqsStats};
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        RateLimitQuotaResponse, RateLimitQuotaUsageReports,
    };
    static HUB: OnceLock<Hub> = OnceLock::new();
    let Ok(report) = RateLimitQuotaUsageReports::decode(data) else {
        return;
    };
    let rlqs::Usages {
        valid: usages,
        invalid,
    } = rlqs::usages(&report);
    assert_eq!(
        usages.len() + invalid.len(),
        report.bucket_quota_usages.len(),
        "every bucket is read or set apart"
    );
    for bucket in &invalid {
        assert!(
            bucket.problem.starts_with("bucket_quota_usages["),
            "{}",
            bucket.problem
        );
    }
    let distinct: std::collections::HashSet<_> =
        usages.iter().map(|usage| usage.bucket.clone()).collect();
    let hub = HUB.get_or_init(|| {
        Hub::new(
            HubOptions {
                max_streams: 4,
                max_buckets_per_stream: 64,
                max_buckets: 64,
                stale_after: std::time::Duration::from_secs(15),
                abandon_after: std::time::Duration::from_secs(60),
            },
            RlqsStats::default(),
        )
    });
    let Ok(id) = hub.open(&report.domain, "fuzz", Box::new(|_| true)) else {
        panic!("a stream opens (each input closes its own)");
    };
    let limits = Fixture::get().limiter.limits().load();
    let domain = limits.domain(&report.domain);
    let reported = hub.report(
        id,
        usages,
        |bucket| crate::quota::resolve(domain, bucket, false),
        tokio::time::Instant::now(),
    );
    hub.close(id);
    assert_eq!(hub.stream_count(), 0);
    match reported {
        Ok(reported) => {
            assert_eq!(reported.actions.len(), distinct.len());
            let response = rlqs::response(reported.actions, std::time::Duration::from_secs(15));
            let bytes = response.encode_to_vec();
            let decoded = RateLimitQuotaResponse::decode(bytes.as_slice())
                .expect("an encoded response decodes");
            assert_eq!(decoded, response);
        }
        Err(error) => assert!(
            matches!(error, HubError::TooManyBuckets { .. }),
            "{error:?}"
        ),
    }
    for bucket in &distinct {
        assert!(hub.reporters(&report.domain, bucket).is_empty());
    }
}

#[cfg(test)]
mod tests;
