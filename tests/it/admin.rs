//! The admin listener through the real binary: the operator endpoints (`/counters`,
//! `/debug/explain`, `/debug/rlqs`, `/ui`) live on `--admin-addr` only, the HTTP listener
//! answers their paths 403 naming it while the probes stay open there; `GET /` on the admin
//! listener lists its routes; with `--admin-token-file` every
//! admin request needs the bearer token (401 otherwise), a rotated file takes effect without
//! a restart, and an admin listener others could reach without a token refuses to start.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::{
    HttpResponse, Ratekeeper, TempDir, eventually, http_get, http_request, run_ratekeeper,
    serve_limits, write_config,
};
use serde_json::{Value, json};

const LIMITS: &str = "\
domain: edge
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: day, requests_per_unit: 5}
";

/// How long a rotated token file may take to be seen (it is re-read every second).
const ROTATION: Duration = Duration::from_secs(10);

fn explain_body() -> String {
    json!({"domain": "edge", "descriptors": [{"entries": [{"key": "api_key", "value": "a"}]}]})
        .to_string()
}

/// The operator requests: (method, path, body).
fn admin_requests() -> Vec<(&'static str, &'static str, String)> {
    vec![
        ("GET", "/counters/edge", String::new()),
        (
            "DELETE",
            "/counters/edge?descriptor=api_key=a",
            String::new(),
        ),
        ("POST", "/debug/explain", explain_body()),
        ("GET", "/debug/rlqs", String::new()),
        ("GET", "/ui", String::new()),
        ("GET", "/ui/data", String::new()),
    ]
}

fn error_of(response: &HttpResponse) -> String {
    let body: Value = serde_json::from_str(&response.body)
        .unwrap_or_else(|error| panic!("{error} in {:?}", response.body));
    body["error"].as_str().unwrap_or_default().to_owned()
}

fn send(
    addr: SocketAddr,
    (method, path, body): &(&str, &str, String),
    token: Option<&str>,
) -> HttpResponse {
    let authorization = token.map(|token| format!("Bearer {token}"));
    let headers: Vec<(&str, &str)> = authorization
        .iter()
        .map(|value| ("Authorization", value.as_str()))
        .collect();
    http_request(addr, method, path, &headers, body).expect("answers")
}

#[test]
fn the_http_listener_refuses_the_operator_endpoints_naming_the_admin_listener_and_keeps_the_probes_open()
 {
    let (_dir, server) = serve_limits("admin-split", LIMITS, &["--counter-names", "10"]);
    let (http, admin) = (server.http_addr(), server.admin_addr());
    for request in admin_requests() {
        let refused = send(http, &request, None);
        assert_eq!(refused.status, 403, "{request:?} on the http listener");
        let error = error_of(&refused);
        assert!(
            error.contains("admin listener")
                && error.contains("--admin-addr")
                && error.contains(&admin.to_string()),
            "{request:?}: {error}"
        );
        let served = send(admin, &request, None);
        assert_eq!(served.status, 200, "{request:?} on the admin listener");
    }
    for probe in ["/healthcheck", "/metrics"] {
        let response = http_get(http, probe, &[]).expect("answers");
        assert_eq!(
            response.status, 200,
            "{probe} stays open on the http listener"
        );
    }
}

/// `GET /` on the admin listener: an index of its routes, open like the dashboard's page,
/// while the routes it lists keep their token.
#[test]
fn the_admin_listener_lists_its_routes_at_its_root() {
    let files = TempDir::new("admin-index");
    let token = write_config(files.path(), "token", "index-token\n");
    let token = token.to_string_lossy().into_owned();
    let (_dir, server) = serve_limits(
        "admin-index-limits",
        LIMITS,
        &["--admin-token-file", &token],
    );
    let index = http_get(server.admin_addr(), "/", &[]).expect("answers");
    index.assert_html_page();
    for path in [
        "/ui",
        "/ui/data",
        "/debug/explain",
        "/debug/rlqs",
        "/counters/{domain}",
        "/rlconfig",
        "/stats",
        "/metrics",
        "/healthcheck",
    ] {
        assert!(index.body.contains(path), "{path} in {}", index.body);
    }
    assert!(!index.body.contains(">/json<"), "{}", index.body);
    let listed = ("GET", "/debug/rlqs", String::new());
    assert_eq!(send(server.admin_addr(), &listed, None).status, 401);
}

#[test]
fn with_a_token_file_only_the_token_passes_and_a_rotated_file_takes_effect_without_a_restart() {
    let files = TempDir::new("admin-token");
    let token_file = write_config(files.path(), "token", "first-token\n");
    let token_arg = token_file.to_string_lossy().into_owned();
    let (_dir, server) = serve_limits(
        "admin-token-limits",
        LIMITS,
        &["--counter-names", "10", "--admin-token-file", &token_arg],
    );
    let admin = server.admin_addr();
    let explain = ("POST", "/debug/explain", explain_body());
    for request in admin_requests() {
        let (_, path, _) = request;
        if path == "/ui" {
            // The page alone is static and holds no data; it sends the token itself.
            assert_eq!(
                send(admin, &request, None).status,
                200,
                "the dashboard page"
            );
            continue;
        }
        let missing = send(admin, &request, None);
        assert_eq!(missing.status, 401, "{request:?} without a token");
        assert!(
            missing
                .header("www-authenticate")
                .is_some_and(|value| value.starts_with("Bearer")),
            "{:?}",
            missing.headers
        );
        assert!(
            error_of(&missing).contains("needs a token")
                && error_of(&missing).contains("--admin-token-file"),
            "{}",
            missing.body
        );
        let wrong = send(admin, &request, Some("second-token"));
        assert_eq!(wrong.status, 401, "{request:?} with a wrong token");
        assert!(
            wrong
                .header("www-authenticate")
                .is_some_and(|value| value.contains("invalid_token")),
            "{:?}",
            wrong.headers
        );
        assert_eq!(
            send(admin, &request, Some("first-token")).status,
            200,
            "{request:?} with the token"
        );
    }

    // Rotated in place (as a Secret update does): the new token passes, the old one no more.
    std::fs::write(&token_file, "second-token").expect("rotates the token");
    let rotated = eventually(ROTATION, || {
        send(admin, &explain, Some("second-token")).status == 200
    });
    assert!(rotated, "the new token is accepted: {}", server.stderr());
    assert_eq!(send(admin, &explain, Some("first-token")).status, 401);

    // An emptied file keeps the token in use, and says why.
    std::fs::write(&token_file, "\n").expect("empties the file");
    let logged = eventually(ROTATION, || server.stderr().contains("holds no token"));
    assert!(logged, "the bad file is reported: {}", server.stderr());
    assert_eq!(send(admin, &explain, Some("second-token")).status, 200);
    assert!(
        !server.stderr().contains("second-token"),
        "the token is never logged"
    );
}

#[test]
fn an_admin_listener_others_can_reach_needs_a_token_file() {
    let dir = TempDir::new("admin-open");
    let config = write_config(dir.path(), "limits.yaml", LIMITS);
    let config = config.to_string_lossy().into_owned();
    let (status, stdout, stderr) = run_ratekeeper(&[
        "serve",
        "--config",
        &config,
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "0.0.0.0:0",
    ]);
    assert!(!status.success(), "refuses to start: {stdout}");
    assert!(
        stderr.contains("--admin-addr 0.0.0.0:0 is not a loopback address")
            && stderr.contains("--admin-token-file"),
        "{stderr}"
    );
    assert!(!stdout.contains("ratekeeper serving"), "{stdout}");

    // With a token file it starts there.
    let files = TempDir::new("admin-open-token");
    let token = write_config(files.path(), "token", "open-token");
    let token = token.to_string_lossy().into_owned();
    let server = Ratekeeper::start(
        std::path::Path::new(&config),
        &["--admin-addr", "0.0.0.0:0", "--admin-token-file", &token],
    )
    .with_admin_token("open-token");
    assert!(server.admin_addr().ip().is_unspecified());
    let reached = SocketAddr::from(([127, 0, 0, 1], server.admin_addr().port()));
    let request = ("POST", "/debug/explain", explain_body());
    assert_eq!(send(reached, &request, None).status, 401);
    assert_eq!(send(reached, &request, Some("open-token")).status, 200);
}

#[test]
fn the_explain_command_asks_the_admin_listener_with_the_token() {
    let files = TempDir::new("admin-explain");
    let token = write_config(files.path(), "token", "explain-token\n");
    let token = token.to_string_lossy().into_owned();
    let (_dir, server) = serve_limits(
        "admin-explain-limits",
        LIMITS,
        &["--admin-token-file", &token],
    );
    let admin = format!("http://{}", server.admin_addr());
    let http = format!("http://{}", server.http_addr());
    let explain = |addr: &str, extra: &[&str]| {
        let mut args = vec![
            "explain",
            "--addr",
            addr,
            "--domain",
            "edge",
            "--descriptor",
            "api_key=a",
        ];
        args.extend_from_slice(extra);
        run_ratekeeper(&args)
    };
    let (status, stdout, stderr) = explain(&admin, &["--admin-token-file", &token]);
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("limit per_key: 5 per day"), "{stdout}");

    let (status, _, stderr) = explain(&admin, &[]);
    assert!(!status.success());
    assert!(
        stderr.contains("ratekeeper answered 401: this admin listener needs a token"),
        "{stderr}"
    );
    let (status, _, stderr) = explain(&http, &["--admin-token-file", &token]);
    assert!(!status.success());
    assert!(
        stderr.contains("ratekeeper answered 403: this endpoint is served on the admin listener"),
        "{stderr}"
    );
}
