//! RLQS (`StreamRateLimitQuotas`): the real server driven by a tonic client (what Envoy
//! sends and is sent on the wire), then real Envoys with the `rate_limit_quota` filter
//! (`_rlqs::envoy`).

mod cluster;
mod envoy;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use ratekeeper::envoy::rlqs::RlqsOptions;
use ratekeeper::limits::Limits;
use ratekeeper::server::{ServeError, Server, ServerOptions};
use tokio::sync::mpsc;
use ratekeeper::transport::tls::TlsOptions;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status, Streaming};

use crate::support::{Ratekeeper, TempDir, TestCa, metric, spawn_server, write_config};

const LIMITS: &str = "\
domain: quota
descriptors:
  - key: api_key
    rate_limit: { algorithm: token_bucket, unit: second, requests_per_unit: 20, burst: 10 }
  - key: api_key
    value: internal
    rate_limit: { unlimited: true }
  - key: api_key
    value: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
";

/// How long a test waits for one answer on a stream.
const ANSWER: Duration = Duration::from_secs(10);

struct Running {
    grpc: String,
    http: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    dir: TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), ServeError>>,
}

async fn start(rlqs: RlqsOptions) -> Running {
    start_with(rlqs, |options| options).await
}

async fn start_with(
    rlqs: RlqsOptions,
    adjust: impl FnOnce(ServerOptions) -> ServerOptions,
) -> Running {
    let dir = TempDir::new("rlqs");
    let file = write_config(dir.path(), "limits.yaml", LIMITS);
    let localhost = "127.0.0.1:0".parse().expect("addr");
    let options = adjust(ServerOptions {
        rlqs,
        watch: Some(file.clone()),
        ..ServerOptions::new(localhost, localhost)
    });
    let limits = Limits::load(&file).expect("valid limits");
    let server = Server::bind(&options, limits, 0).await.expect("binds");
    let grpc = match server.grpc_addr() {
        Some(addr) => format!("http://{addr}"),
        None => server.grpc_endpoint().to_string(),
    };
    let http = server.http_addr();
    let admin = server.admin_addr();
    let (stop, done) = spawn_server(server);
    Running {
        grpc,
        http,
        admin,
        dir,
        stop: Some(stop),
        done,
    }
}

/// One RLQS stream: reports go in through `reports`, answers come out of `answers`.
struct Stream {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

async fn client(target: &str) -> RateLimitQuotaServiceClient<Channel> {
    let channel = Endpoint::from_shared(target.to_owned())
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connects");
    RateLimitQuotaServiceClient::new(channel)
}

/// Opens a stream and sends `first` on it; the call's own error when it is refused at once.
async fn open(target: &str, first: RateLimitQuotaUsageReports) -> Result<Stream, Status> {
    open_on(client(target).await, first).await
}

/// [`open`] on a client of the caller's (TLS, say).
async fn open_on(
    mut client: RateLimitQuotaServiceClient<Channel>,
    first: RateLimitQuotaUsageReports,
) -> Result<Stream, Status> {
    let (reports, receiver) = mpsc::channel(16);
    reports.send(first).await.expect("queue the first report");
    let outbound = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|report| (report, receiver))
    });
    let answers = client
        .stream_rate_limit_quotas(outbound)
        .await?
        .into_inner();
    Ok(Stream { reports, answers })
}

impl Stream {
    /// The next answer, or the status that ended the stream.
    async fn next(&mut self) -> Result<RateLimitQuotaResponse, Status> {
        match tokio::time::timeout(ANSWER, self.answers.message()).await {
            Err(_) => panic!("no answer within {ANSWER:?}"),
            Ok(Ok(Some(answer))) => Ok(answer),
            Ok(Ok(None)) => Err(Status::ok("the stream ended")),
            Ok(Err(status)) => Err(status),
        }
    }

    async fn send(&self, report: RateLimitQuotaUsageReports) {
        self.reports
            .send(report)
            .await
            .expect("the stream takes reports");
    }
}

fn usage(key: &str, value: &str, allowed: u64, denied: u64, seconds: i64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: HashMap::from([(key.to_owned(), value.to_owned())]),
        }),
        time_elapsed: Some(ProtoDuration { seconds, nanos: 0 }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

fn report(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: usages,
    }
}

fn first(value: &str) -> RateLimitQuotaUsageReports {
    report("quota", vec![usage("api_key", value, 1, 0, 0)])
}

/// What an answer says per bucket value (`api_key`): `tokens N/s burst M`, `allow`, `deny`
/// or `abandon`, with the TTL of assignments.
fn read(answer: &RateLimitQuotaResponse) -> Vec<(String, String)> {
    answer
        .bucket_action
        .iter()
        .map(|action| {
            let id = action
                .bucket_id
                .as_ref()
                .and_then(|id| id.bucket.get("api_key"))
                .cloned()
                .unwrap_or_default();
            let what = match &action.bucket_action {
                Some(Kind::AbandonAction(_)) => "abandon".to_owned(),
                Some(Kind::QuotaAssignmentAction(assignment)) => {
                    let ttl = assignment
                        .assignment_time_to_live
                        .as_ref()
                        .map_or(0, |ttl| ttl.seconds);
                    let strategy = assignment
                        .rate_limit_strategy
                        .as_ref()
                        .and_then(|strategy| strategy.strategy.as_ref());
                    let rule = match strategy {
                        Some(Strategy::BlanketRule(rule))
                            if *rule == BlanketRule::AllowAll as i32 =>
                        {
                            "allow".to_owned()
                        }
                        Some(Strategy::BlanketRule(_)) => "deny".to_owned(),
                        Some(Strategy::TokenBucket(bucket)) => format!(
                            "tokens {}/{}s burst {}",
                            bucket.tokens_per_fill.map_or(0, |fill| fill.value),
                            bucket.fill_interval.as_ref().map_or(0, |fill| fill.seconds),
                            bucket.max_tokens
                        ),
                        other => format!("{other:?}"),
                    };
                    format!("{rule} ttl {ttl}s")
                }
                None => "none".to_owned(),
            };
            (id, what)
        })
        .collect()
}

/// [`metric`] off the runtime (the server answers on this test's runtime).
async fn scrape(http: std::net::SocketAddr, name: &str) -> f64 {
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || metric(http, &name))
        .await
        .expect("scrape")
}

/// `GET /debug/rlqs?domain=quota` on the admin listener, as JSON.
async fn debug_rlqs(admin: std::net::SocketAddr) -> serde_json::Value {
    tokio::task::spawn_blocking(move || {
        let response = crate::support::http_get(admin, "/debug/rlqs?domain=quota", &[])
            .expect("GET /debug/rlqs");
        assert_eq!(response.status, 200, "{}", response.body);
        serde_json::from_str(&response.body).expect("JSON")
    })
    .await
    .expect("debug")
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(id, what)| ((*id).to_owned(), (*what).to_owned()))
        .collect()
}

#[tokio::test]
async fn each_bucket_is_assigned_what_its_limits_say() {
    let running = start(RlqsOptions::default()).await;
    let mut stream = open(
        &running.grpc,
        report(
            "quota",
            vec![
                usage("api_key", "alice", 1, 0, 0),
                usage("api_key", "internal", 1, 0, 0),
                usage("api_key", "blocked", 1, 0, 0),
                usage("tenant", "acme", 1, 0, 0),
            ],
        ),
    )
    .await
    .expect("the stream opens");
    let answer = stream.next().await.expect("an answer");
    let mut got = read(&answer);
    got.sort();
    assert_eq!(
        got,
        pairs(&[
            // `tenant` matches no rule: allowed, as ShouldRateLimit answers OK.
            ("", "allow ttl 15s"),
            // The whole limit (the only reporter) and the limit's burst.
            ("alice", "tokens 20/1s burst 10 ttl 15s"),
            ("blocked", "deny ttl 15s"),
            ("internal", "allow ttl 15s"),
        ])
    );
    // Envoy matches an answer to its bucket by the id: echoed exactly.
    let tenant = answer
        .bucket_action
        .iter()
        .find(|action| {
            action
                .bucket_id
                .as_ref()
                .is_some_and(|id| id.bucket.contains_key("tenant"))
        })
        .expect("the tenant bucket answered");
    assert_eq!(
        tenant.bucket_id.as_ref().map(|id| id.bucket.clone()),
        Some(HashMap::from([("tenant".to_owned(), "acme".to_owned())]))
    );
    assert_eq!(
        scrape(running.http, "ratekeeper_rlqs_streams{domain=\"quota\"}").await,
        1.0
    );
    assert_eq!(
        scrape(
            running.http,
            "ratekeeper_rlqs_reported_allowed_total{domain=\"quota\"}"
        )
        .await,
        4.0
    );
}

#[tokio::test]
async fn streams_share_a_bucket_and_a_closed_stream_gives_its_share_back() {
    let running = start(RlqsOptions::default()).await;
    let mut a = open(&running.grpc, first("alice")).await.expect("opens");
    assert_eq!(
        read(&a.next().await.expect("answer")),
        pairs(&[("alice", "tokens 20/1s burst 10 ttl 15s")])
    );
    // A second Envoy: it gets half at once, and the first is told to shrink at once.
    let mut b = open(&running.grpc, first("alice")).await.expect("opens");
    assert_eq!(
        read(&b.next().await.expect("answer")),
        pairs(&[("alice", "tokens 10/1s burst 5 ttl 15s")])
    );
    assert_eq!(
        read(&a.next().await.expect("a push")),
        pairs(&[("alice", "tokens 10/1s burst 5 ttl 15s")])
    );
    // The admin listener shows the bucket's reporters, their demand and shares.
    let debug = debug_rlqs(running.admin).await;
    assert_eq!(debug["streams"], 2, "{debug}");
    assert_eq!(debug["total"], 1, "{debug}");
    let bucket = &debug["buckets"][0];
    assert_eq!(
        bucket["bucket"],
        serde_json::json!([["api_key", "alice"]]),
        "{debug}"
    );
    assert_eq!(bucket["rule"], "20/second burst 10", "{debug}");
    let shares: Vec<u64> = bucket["reporters"]
        .as_array()
        .expect("reporters")
        .iter()
        .map(|reporter| reporter["share"].as_u64().expect("a share"))
        .collect();
    assert_eq!(shares, vec![10, 10], "{debug}");
    // /debug/explain shows them for the descriptor the bucket reads as.
    let explained = tokio::task::spawn_blocking({
        let admin = running.admin;
        move || {
            crate::support::http_post(
                admin,
                "/debug/explain",
                &[("content-type", "application/json")],
                r#"{"domain":"quota","descriptors":[{"entries":[{"key":"api_key","value":"alice"}]}]}"#,
            )
            .expect("POST /debug/explain")
        }
    })
    .await
    .expect("explain");
    assert_eq!(explained.status, 200, "{}", explained.body);
    let explained: serde_json::Value = serde_json::from_str(&explained.body).expect("JSON");
    let reporters = explained["descriptors"][0]["rlqs"]["reporters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(reporters.len(), 2, "{explained}");
    // The second goes away: the first gets it all back without reporting.
    drop(b);
    assert_eq!(
        read(&a.next().await.expect("a push")),
        pairs(&[("alice", "tokens 20/1s burst 10 ttl 15s")])
    );
    // Reports answer every reported bucket (the TTL renewed), shares from demand.
    a.send(report("quota", vec![usage("api_key", "alice", 40, 10, 5)]))
        .await;
    assert_eq!(
        read(&a.next().await.expect("answer")),
        pairs(&[("alice", "tokens 20/1s burst 10 ttl 15s")])
    );
}

#[tokio::test]
async fn bad_reports_end_the_stream_with_a_status_naming_the_problem() {
    let running = start(RlqsOptions {
        hub: ratekeeper::quota::HubOptions {
            max_streams: 2,
            max_buckets_per_stream: 2,
            ..RlqsOptions::default().hub
        },
        max_message_bytes: 512,
        ..RlqsOptions::default()
    })
    .await;
    let refused = |status: Status, code: Code, text: &str| {
        assert_eq!(status.code(), code, "{status:?}");
        assert!(
            status.message().contains(text),
            "{:?} lacks {text:?}",
            status.message()
        );
    };
    // The first report must name the domain.
    let mut stream = open(
        &running.grpc,
        report("", vec![usage("api_key", "a", 1, 0, 0)]),
    )
    .await
    .expect("opens");
    refused(
        stream.next().await.expect_err("refused"),
        Code::InvalidArgument,
        "domain: the first report of a stream must name the domain",
    );
    // A bucket id that cannot be read as a descriptor (here: no pair; an empty header
    // value makes one) is denied all on its own: the stream and its other buckets go on.
    let mut stream = open(
        &running.grpc,
        report(
            "quota",
            vec![
                BucketQuotaUsage {
                    bucket_id: None,
                    ..usage("api_key", "a", 1, 0, 0)
                },
                usage("api_key", "ok", 1, 0, 0),
            ],
        ),
    )
    .await
    .expect("opens");
    let answer = read(&stream.next().await.expect("answered, not ended"));
    assert_eq!(answer.len(), 2, "{answer:?}");
    let (denied, valid): (Vec<_>, Vec<_>) = answer.iter().partition(|(id, _)| id.is_empty());
    assert!(denied[0].1.starts_with("deny ttl"), "{answer:?}");
    assert!(!valid[0].1.starts_with("deny"), "{answer:?}");
    stream
        .send(report("quota", vec![usage("api_key", "ok", 2, 0, 5)]))
        .await;
    let again = read(&stream.next().await.expect("the stream goes on"));
    assert_eq!(again, valid.into_iter().cloned().collect::<Vec<_>>());
    assert_eq!(
        scrape(
            running.http,
            "ratekeeper_rlqs_invalid_buckets_total{reason=\"empty\"}"
        )
        .await,
        1.0
    );
    drop(stream);
    // Too many buckets for one stream.
    let mut stream = open(
        &running.grpc,
        report(
            "quota",
            vec![
                usage("api_key", "a", 1, 0, 0),
                usage("api_key", "b", 1, 0, 0),
                usage("api_key", "c", 1, 0, 0),
            ],
        ),
    )
    .await
    .expect("opens");
    refused(
        stream.next().await.expect_err("refused"),
        Code::ResourceExhausted,
        "this stream would report 3 buckets, more than the 2 allowed",
    );
    // Too large a report.
    let long = "x".repeat(600);
    let mut stream = open(
        &running.grpc,
        report("quota", vec![usage("api_key", &long, 1, 0, 0)]),
    )
    .await
    .expect("opens");
    refused(
        stream.next().await.expect_err("refused"),
        Code::ResourceExhausted,
        "more than the 512 allowed",
    );
    // Over four times the bound: tonic refuses it while reading.
    let huge = "x".repeat(4 * 512 + 100);
    let mut stream = open(
        &running.grpc,
        report("quota", vec![usage("api_key", &huge, 1, 0, 0)]),
    )
    .await
    .expect("opens");
    refused(
        stream.next().await.expect_err("refused"),
        Code::OutOfRange,
        "decoded message length too large",
    );
    // Too many streams: two are open, the third is refused.
    let mut one = open(&running.grpc, first("a")).await.expect("opens");
    one.next().await.expect("answer");
    let mut two = open(&running.grpc, first("b")).await.expect("opens");
    two.next().await.expect("answer");
    let mut three = open(&running.grpc, first("c")).await.expect("opens");
    refused(
        three.next().await.expect_err("refused"),
        Code::ResourceExhausted,
        "too many rlqs streams on this node: 2 are open",
    );
    // A stream that names another domain later.
    one.send(report("other", vec![usage("api_key", "a", 1, 0, 0)]))
        .await;
    refused(
        one.next().await.expect_err("refused"),
        Code::InvalidArgument,
        "domain: a stream reports one domain",
    );
    assert_eq!(
        scrape(
            running.http,
            "ratekeeper_rlqs_refused_total{reason=\"invalid_argument\"}"
        )
        .await,
        2.0
    );
    assert_eq!(
        scrape(
            running.http,
            "ratekeeper_rlqs_refused_total{reason=\"too_many_streams\"}"
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn an_unknown_domain_is_allowed_all_and_counted() {
    let running = start(RlqsOptions::default()).await;
    let mut stream = open(
        &running.grpc,
        report("nobody", vec![usage("api_key", "a", 1, 0, 0)]),
    )
    .await
    .expect("opens");
    assert_eq!(
        read(&stream.next().await.expect("answer")),
        pairs(&[("a", "allow ttl 15s")])
    );
    assert_eq!(
        scrape(running.http, "ratekeeper_rlqs_unknown_domain_reports_total").await,
        1.0
    );
    assert_eq!(
        scrape(running.http, "ratekeeper_rlqs_streams{domain=\"_unknown\"}").await,
        1.0
    );
}

#[tokio::test]
async fn a_reload_reaches_the_next_report() {
    let running = start(RlqsOptions::default()).await;
    let mut stream = open(&running.grpc, first("alice")).await.expect("opens");
    assert_eq!(
        read(&stream.next().await.expect("answer")),
        pairs(&[("alice", "tokens 20/1s burst 10 ttl 15s")])
    );
    write_config(
        running.dir.path(),
        "limits.yaml",
        &LIMITS.replace(
            "requests_per_unit: 20, burst: 10",
            "requests_per_unit: 8, burst: 4",
        ),
    );
    // The reload itself takes a moment; each report then answers from the live limits.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        stream
            .send(report("quota", vec![usage("api_key", "alice", 1, 0, 1)]))
            .await;
        let got = read(&stream.next().await.expect("answer"));
        if got == pairs(&[("alice", "tokens 8/1s burst 4 ttl 15s")]) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {got:?} after the reload"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn served_on_a_unix_socket_too_and_streams_end_at_shutdown() {
    let dir = TempDir::new("rlqs-uds");
    let socket = dir.path().join("grpc.sock");
    let mut running = start_with(RlqsOptions::default(), |options| ServerOptions {
        grpc_uds: Some(socket.clone()),
        ..options
    })
    .await;
    assert!(running.grpc.starts_with("unix:"), "{}", running.grpc);
    let mut stream = open(&running.grpc, first("alice")).await.expect("opens");
    assert_eq!(
        read(&stream.next().await.expect("answer")),
        pairs(&[("alice", "tokens 20/1s burst 10 ttl 15s")])
    );
    // Stopping the server ends the open stream, so the drain does not wait for Envoy.
    drop(running.stop.take());
    let stopped = tokio::time::timeout(Duration::from_secs(5), &mut running.done).await;
    assert!(
        matches!(stopped, Ok(Ok(Ok(())))),
        "the server did not stop within 5 s with a stream open: {stopped:?}"
    );
    let ended = stream.next().await;
    assert!(ended.is_err(), "the stream should have ended: {ended:?}");
    assert!(
        !Path::new(&socket).exists(),
        "the socket file is removed at exit"
    );
}

#[tokio::test]
async fn served_over_tls_as_configured() {
    let dir = TempDir::new("rlqs-tls");
    let ca = TestCa::new("rlqs-ca");
    let (cert, key) = ca.server(&["localhost"]).write(dir.path(), "server");
    let running = start_with(RlqsOptions::default(), |options| ServerOptions {
        grpc_tls: Some(TlsOptions {
            cert,
            key,
            client_ca: None,
            client_san: None,
        }),
        ..options
    })
    .await;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.cert_pem()))
        .domain_name("localhost");
    let target = running.grpc.replace("http://", "https://");
    let channel = Endpoint::from_shared(target)
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls config")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connects over tls");
    let mut stream = open_on(RateLimitQuotaServiceClient::new(channel), first("alice"))
        .await
        .expect("opens");
    assert_eq!(
        read(&stream.next().await.expect("answer")),
        pairs(&[("alice", "tokens 20/1s burst 10 ttl 15s")])
    );
}

#[test]
fn the_redis_store_refuses_rlqs_streams_with_the_reason() {
    let dir = TempDir::new("rlqs-redis");
    write_config(dir.path(), "limits.yaml", LIMITS);
    // Nothing listens on port 1: the refusal does not depend on Redis being up.
    let server = Ratekeeper::start_unready(dir.path(), &["--store", "redis://127.0.0.1:1"]);
    let target = format!("http://{}", server.grpc_addr());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let status = runtime.block_on(async {
        match open(&target, first("alice")).await {
            Err(status) => status,
            Ok(mut stream) => stream.next().await.expect_err("refused"),
        }
    });
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert!(
        status
            .message()
            .contains("rlqs is not served with --store redis"),
        "{:?}",
        status.message()
    );
}
