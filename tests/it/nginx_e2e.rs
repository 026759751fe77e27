//! End to end through a real nginx: client -> nginx (`auth_request` to ratekeeper's
//! `/nginx/edge`) -> a tiny upstream when allowed, a 429 with the `RateLimit-*` headers when
//! not, and the upstream anyway when ratekeeper is down (the example fails open).
//!
//! nginx is the system's (`crate::support::nginx_binary` installs Debian's package when there is
//! none). Its config is `examples/nginx/nginx.conf` with only the three ports swapped (see
//! [`nginx_config`]), run in a temp prefix, so these tests also prove that the example a user
//! copies works; `nginx -t` checks the file itself verbatim.

use std::net::SocketAddr;
use std::process::Command;

use crate::support::{
    HttpResponse, Nginx, Ratekeeper, START_TIMEOUT, TempDir, UPSTREAM_BODY, Upstream, http_get,
    http_request, nginx_binary, read_repo_file, repo_path, run_to_end, write_config,
};

const EXAMPLE: &str = "examples/nginx/nginx.conf";

/// `api_key` allows 3 requests, `remote_address` 2. Token buckets refilled per hour gain
/// their next token 20 (30) minutes after the first hit, so within a test a denial stays a
/// denial whatever the wall clock says (a fixed window could roll over mid-test).
const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 3, burst: 3}
  - key: remote_address
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 2, burst: 2}
";

/// `examples/nginx/nginx.conf` listening on `127.0.0.1:<port>` and pointing at the test's
/// ratekeeper and upstream. Every replaced text must appear exactly once, so an edit to the
/// example that this derivation no longer understands fails here instead of testing
/// something else.
fn nginx_config(port: u16, ratekeeper_http: SocketAddr, upstream: SocketAddr) -> String {
    let mut config = read_repo_file(EXAMPLE);
    let replacements = [
        (
            "listen 8090;".to_owned(),
            format!("listen 127.0.0.1:{port};"),
        ),
        (
            "server 127.0.0.1:8080;".to_owned(),
            format!("server {ratekeeper_http};"),
        ),
        (
            "server 127.0.0.1:8000;".to_owned(),
            format!("server {upstream};"),
        ),
    ];
    for (from, to) in replacements {
        assert_eq!(
            config.matches(&from).count(),
            1,
            "{EXAMPLE} should contain `{from}` exactly once"
        );
        config = config.replace(&from, &to);
    }
    config
}

/// A ratekeeper with [`LIMITS`] (plus `args`), an upstream, and nginx running the example.
struct Setup {
    // Dropped in this order: nginx first, then the processes it talks to, then the files.
    nginx: Nginx,
    ratekeeper: Ratekeeper,
    upstream: Upstream,
    _dirs: (TempDir, TempDir),
}

impl Setup {
    fn start(args: &[&str]) -> Setup {
        let limits = TempDir::new("nginx-limits");
        write_config(limits.path(), "edge.yaml", LIMITS);
        let ratekeeper = Ratekeeper::start(limits.path(), args);
        let upstream = Upstream::start();
        let prefix = TempDir::new("nginx-prefix");
        let (http, app) = (ratekeeper.http_addr(), upstream.addr());
        let nginx = Nginx::start(prefix.path(), |port| nginx_config(port, http, app));
        Setup {
            nginx,
            ratekeeper,
            upstream,
            _dirs: (limits, prefix),
        }
    }

    /// `method /` through nginx with `headers`; panics with nginx's stderr if it fails.
    fn send(&mut self, method: &str, headers: &[(&str, &str)], body: &str) -> HttpResponse {
        match http_request(self.nginx.addr(), method, "/", headers, body) {
            Ok(response) => response,
            Err(error) => self
                .nginx
                .process()
                .fail(&format!("failed {method} / with {headers:?}: {error}")),
        }
    }

    fn get(&mut self, headers: &[(&str, &str)]) -> HttpResponse {
        self.send("GET", headers, "")
    }

    /// Fails the test with both logs when `holds` is false.
    fn check(&self, holds: bool, what: &str, response: &HttpResponse) {
        assert!(
            holds,
            "{what}; got {} {:?} {:?}\nnginx stderr:\n{}\nratekeeper stderr:\n{}",
            response.status,
            response.headers,
            response.body,
            self.nginx.stderr(),
            self.ratekeeper.stderr()
        );
    }
}

fn number(response: &HttpResponse, name: &str) -> Option<u64> {
    response.header(name)?.parse().ok()
}

/// A 200 from the upstream with `RateLimit-Limit: limit`, `RateLimit-Remaining: remaining`
/// and a `RateLimit-Reset` of the bucket's refill time (`used` tokens, `token_seconds`
/// each, less the seconds since the first hit).
fn assert_allowed(
    setup: &Setup,
    response: &HttpResponse,
    limit: u64,
    remaining: u64,
    used: u64,
    token_seconds: u64,
) {
    let what = format!("expected 200 with limit {limit}, remaining {remaining}");
    setup.check(response.status == 200, &what, response);
    setup.check(response.body == UPSTREAM_BODY, &what, response);
    setup.check(
        number(response, "ratelimit-limit") == Some(limit),
        &what,
        response,
    );
    setup.check(
        number(response, "ratelimit-remaining") == Some(remaining),
        &what,
        response,
    );
    let full = used * token_seconds;
    let reset = number(response, "ratelimit-reset").unwrap_or(0);
    setup.check(
        reset <= full && reset + 60 > full,
        &format!("{what}, reset about {full} s"),
        response,
    );
    setup.check(response.header("retry-after").is_none(), &what, response);
}

/// A 429 from nginx with `RateLimit-Remaining: 0` and a `Retry-After` equal to
/// `RateLimit-Reset` (when the bucket is full again, `full` seconds less the time since the
/// first hit).
fn assert_limited(setup: &Setup, response: &HttpResponse, limit: u64, full: u64) {
    let what = format!("expected 429 with limit {limit}, remaining 0, reset about {full} s");
    setup.check(response.status == 429, &what, response);
    setup.check(response.body.contains("rate limited"), &what, response);
    setup.check(
        number(response, "ratelimit-limit") == Some(limit),
        &what,
        response,
    );
    setup.check(
        number(response, "ratelimit-remaining") == Some(0),
        &what,
        response,
    );
    let reset = number(response, "ratelimit-reset").unwrap_or(0);
    setup.check(reset <= full && reset + 60 > full, &what, response);
    // The buckets refill one token per (full / limit) seconds: that is when a retry passes,
    // while RateLimit-Reset is when the bucket is full again.
    let next_token = full / limit;
    let retry = number(response, "retry-after").unwrap_or(0);
    setup.check(
        retry <= next_token && retry + 60 > next_token,
        &format!("{what}, Retry-After about {next_token} s (the next token)"),
        response,
    );
}

#[test]
fn the_example_config_is_valid_as_shipped() {
    let prefix = TempDir::new("nginx-t");
    let (status, stdout, stderr) = run_to_end(
        "nginx -t",
        Command::new(nginx_binary())
            .arg("-t")
            .arg("-p")
            .arg(prefix.path())
            .args(["-e", "stderr", "-c"])
            .arg(repo_path(EXAMPLE)),
        START_TIMEOUT,
    );
    assert!(
        status.success() && stderr.contains("test is successful"),
        "nginx -t {EXAMPLE}: {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

#[test]
fn requests_are_limited_per_api_key_and_else_per_client_address() {
    let mut setup = Setup::start(&[]);

    // One key: three requests reach the upstream, the fourth is a 429 from nginx; every
    // answer carries the counts, and they count down.
    for used in 1..=3 {
        let response = setup.get(&[("x-api-key", "k1")]);
        assert_allowed(&setup, &response, 3, 3 - used, used, 1200);
    }
    let denied = setup.get(&[("x-api-key", "k1")]);
    assert_limited(&setup, &denied, 3, 3600);
    assert_eq!(
        setup.upstream.requests(),
        3,
        "a denied request never reaches the app"
    );

    // A client cannot pass its own descriptor or hits to ratekeeper.
    let spoofed = setup.get(&[
        ("x-api-key", "k1"),
        ("x-ratelimit-descriptor", "api_key=fresh"),
        ("x-ratelimit-hits", "0"),
    ]);
    assert_limited(&setup, &spoofed, 3, 3600);

    // Other keys have their own counters, whatever the method (the check inherits it).
    let other = setup.get(&[("x-api-key", "k2")]);
    assert_allowed(&setup, &other, 3, 2, 1, 1200);
    let post = setup.send("POST", &[("x-api-key", "k3")], "{\"order\": 1}");
    assert_allowed(&setup, &post, 3, 2, 1, 1200);

    // No key, or one outside the example's pattern (a `,` could add descriptor entries):
    // limited per client address (2 an hour).
    let anonymous = setup.get(&[]);
    assert_allowed(&setup, &anonymous, 2, 1, 1, 1800);
    let odd_key = setup.get(&[("x-api-key", "k1,api_key=fresh")]);
    assert_allowed(&setup, &odd_key, 2, 0, 2, 1800);
    let anonymous = setup.get(&[]);
    assert_limited(&setup, &anonymous, 2, 3600);
    assert_eq!(
        setup.upstream.requests(),
        7,
        "the denied ones never reached the app"
    );
}

#[test]
fn nginx_fails_open_without_ratekeeper() {
    let mut setup = Setup::start(&["--response-headers"]);
    let response = setup.get(&[("x-api-key", "k1")]);
    assert_allowed(&setup, &response, 3, 2, 1, 1200);
    let http = setup.ratekeeper.http_addr();
    setup.ratekeeper.process().kill();
    assert!(
        http_get(http, "/healthcheck", &[]).is_err(),
        "ratekeeper still answers"
    );

    // More requests than the limit allows: all reach the app, without RateLimit headers.
    for attempt in 0..4 {
        let response = setup.get(&[("x-api-key", "k1")]);
        let what = format!("request {attempt} without ratekeeper should fail open");
        setup.check(response.status == 200, &what, &response);
        setup.check(response.body == UPSTREAM_BODY, &what, &response);
        setup.check(
            response.header("ratelimit-limit").is_none(),
            &what,
            &response,
        );
        setup.check(response.header("retry-after").is_none(), &what, &response);
    }
    assert_eq!(setup.upstream.requests(), 5);
    let log = setup.nginx.stderr();
    assert!(
        log.contains("auth request unexpected status: 502"),
        "nginx logs why it failed open:\n{log}"
    );
}
