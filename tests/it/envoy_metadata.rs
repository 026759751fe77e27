//! End to end through a real Envoy: ratekeeper's response dynamic metadata
//! (`--response-dynamic-metadata`) as Envoy's ratelimit filter stores it, read back with
//! `%DYNAMIC_METADATA(envoy.filters.http.ratelimit:...)%` in the route's response headers.
//!
//! The case it exists for is quota-based routing: two models, each a quota-mode descriptor
//! with a `metadata` naming its backend. While one model still has quota, requests pass and
//! the metadata says which quota was exceeded and which backend has quota left (the passed
//! descriptors' `metadata`, read as `...ratelimit:metadata:backend`, as with the reference
//! service); once both are out, Envoy answers 429.

use std::net::SocketAddr;

use crate::support::{
    Envoy, HttpResponse, Ratekeeper, START_TIMEOUT, TempDir, UPSTREAM_BODY, Upstream, eventually,
    http_get, ratelimit_bootstrap, write_config,
};

/// Token buckets refilled per hour: within a test no token comes back, whatever the clock.
const LIMITS: &str = "\
domain: edge
descriptors:
  - key: model
    value: gpt-a
    quota_mode: true
    metadata: {backend: a}
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
  - key: model
    value: gpt-b
    quota_mode: true
    metadata: {backend: b}
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
";

/// One descriptor per header (`x-primary`, `x-fallback`), and three response headers read
/// from the ratelimit filter's dynamic metadata (Envoy adds them to its own 429 too).
fn envoy_config(ratekeeper: SocketAddr, upstream: SocketAddr) -> String {
    ratelimit_bootstrap(
        r#"                          response_headers_to_add:
                            - header: { key: x-quota-violations, value: "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:quotaModeViolations)%" }
                            - header: { key: x-backend, value: "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:backend)%" }
                            - header: { key: x-rl-domain, value: "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:domain)%" }
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - request_headers: { header_name: x-primary, descriptor_key: model }
                              - actions:
                                  - request_headers: { header_name: x-fallback, descriptor_key: model }
"#,
        false,
        upstream.port(),
        ratekeeper.port(),
    )
}

/// ratekeeper, an upstream and Envoy; fields drop in order, so Envoy goes first.
struct Stack {
    envoy: Envoy,
    ratekeeper: Ratekeeper,
    _upstream: Upstream,
    listener: SocketAddr,
    _dir: TempDir,
}

impl Stack {
    fn start(ratekeeper_args: &[&str]) -> Stack {
        let dir = TempDir::new("envoy-metadata");
        let limits = write_config(dir.path(), "limits.yaml", LIMITS);
        let ratekeeper = Ratekeeper::start(&limits, ratekeeper_args);
        let upstream = Upstream::start();
        let config = envoy_config(ratekeeper.grpc_addr(), upstream.addr());
        let envoy_yaml = write_config(dir.path(), "envoy.yaml", &config);
        let mut envoy = Envoy::start(&envoy_yaml, dir.path());
        let listener = envoy.listener_addr("edge");
        // No model headers: no descriptor, so this waits for Envoy and the upstream only.
        let through = eventually(START_TIMEOUT, || {
            http_get(listener, "/", &[]).is_ok_and(|response| response.status == 200)
        });
        if !through {
            envoy.process().fail("did not proxy GET / to the upstream");
        }
        Stack {
            envoy,
            ratekeeper,
            _upstream: upstream,
            listener,
            _dir: dir,
        }
    }

    /// `GET /` asking for both models.
    fn get(&mut self) -> HttpResponse {
        let headers = [("x-primary", "gpt-a"), ("x-fallback", "gpt-b")];
        match http_get(self.listener, "/", &headers) {
            Ok(response) => response,
            Err(error) => panic!(
                "GET / via Envoy failed: {error}\nenvoy stderr:\n{}\nratekeeper stderr:\n{}",
                self.envoy.stderr(),
                self.ratekeeper.stderr()
            ),
        }
    }
}

/// The three metadata headers: quota violations, backend, domain.
fn metadata_headers(response: &HttpResponse) -> [Option<&str>; 3] {
    ["x-quota-violations", "x-backend", "x-rl-domain"].map(|name| response.header(name))
}

#[test]
fn envoy_sees_quota_violations_and_the_backend_with_quota_left() {
    let mut stack = Stack::start(&["--response-dynamic-metadata"]);

    let first = stack.get();
    assert_eq!(first.status, 200, "{first:#?}");
    assert_eq!(first.body, UPSTREAM_BODY);
    // Both have quota; of the two entries' metadata (under `metadata`, as the reference
    // puts it) the first descriptor's wins.
    assert_eq!(
        metadata_headers(&first),
        [Some("[]"), Some("a"), Some("edge")],
        "{first:#?}"
    );

    // gpt-a is out of quota: the request still passes, routed by what the metadata says.
    let second = stack.get();
    assert_eq!(second.status, 200, "{second:#?}");
    assert_eq!(
        metadata_headers(&second),
        [Some("[0]"), Some("b"), Some("edge")],
        "{second:#?}"
    );

    // Both out of quota: Envoy answers 429, and no backend is offered.
    let third = stack.get();
    assert_eq!(third.status, 429, "{third:#?}");
    assert_eq!(
        metadata_headers(&third),
        [Some("[0,1]"), None, Some("edge")],
        "{third:#?}"
    );
}

#[test]
fn without_the_flag_envoy_gets_no_dynamic_metadata() {
    let mut stack = Stack::start(&[]);
    let first = stack.get();
    assert_eq!(first.status, 200, "{first:#?}");
    assert_eq!(metadata_headers(&first), [None, None, None], "{first:#?}");
    // Quota mode itself does not depend on the flag.
    assert_eq!(stack.get().status, 200);
    assert_eq!(stack.get().status, 429);
}
