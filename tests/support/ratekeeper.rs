//! The binary under test: [`Ratekeeper`] runs `ratekeeper serve` on `127.0.0.1:0` (or,
//! with [`Ratekeeper::start_in`], behind a command prefix such as `ip netns exec NS`) and
//! learns its addresses from the serving line; [`run_ratekeeper`] runs a one-shot command.
//! The operator endpoints are on the admin listener ([`Ratekeeper::admin_addr`]);
//! [`Ratekeeper::admin_request`] reaches them with the admin token when the node has one.
//!
//! Every run strips the caller's `RATEKEEPER_*` environment and the reference service's
//! variables ([`ratekeeper_command`]) so a developer's shell cannot change what a test runs.

use std::ffi::OsStr;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};

use super::http::{HttpResponse, http_get, http_request};
use super::poll::eventually;
use super::process::{Process, START_TIMEOUT, run_to_end};
use super::temp::{TempDir, write_config};

/// A real `ratekeeper serve` on ephemeral ports.
#[derive(Debug)]
pub struct Ratekeeper {
    process: Process,
    grpc: Grpc,
    http_addr: SocketAddr,
    admin_addr: SocketAddr,
    peer_addr: Option<SocketAddr>,
    /// The Prometheus listener (`--prometheus-addr`), when it serves one.
    prometheus_addr: Option<SocketAddr>,
    /// The admin listener's bearer token, when it was started with one.
    admin_token: Option<String>,
    /// Files the process reads (its token file), kept as long as it runs.
    kept: Option<TempDir>,
}

impl Ratekeeper {
    /// Starts `ratekeeper serve --config <config> <extra_args>` on `127.0.0.1:0` and waits
    /// until `/healthcheck` answers 200 (see [`ratekeeper_command`] for the environment).
    pub fn start(config: &Path, extra_args: &[&str]) -> Ratekeeper {
        Ratekeeper::start_with_env(config, extra_args, &[])
    }

    /// [`Ratekeeper::start`] with `env` variables set (`RATEKEEPER_*` ones included).
    pub fn start_with_env(config: &Path, extra_args: &[&str], env: &[(&str, &str)]) -> Ratekeeper {
        Ratekeeper::spawn(config, extra_args, env).healthy()
    }

    /// Starts `prefix... ratekeeper serve --config <config> <extra_args>` (e.g. behind
    /// `ip netns exec NS`), without the default listen addresses: `extra_args` choose them.
    /// A listener bound to an unspecified address (`0.0.0.0:PORT`) is reached at
    /// `reach:PORT`. Waits until `/healthcheck` answers 200 there.
    pub fn start_in(
        prefix: &[&str],
        reach: IpAddr,
        config: &Path,
        extra_args: &[&str],
    ) -> Ratekeeper {
        let Some((program, prefix_args)) = prefix.split_first() else {
            panic!("start_in needs a command prefix (use Ratekeeper::start without one)");
        };
        let mut command = Command::new(program);
        command
            .args(prefix_args)
            .arg(env!("CARGO_BIN_EXE_ratekeeper"));
        clean_environment(&mut command);
        command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(extra_args);
        Ratekeeper::launch(&mut command, Some(reach)).healthy()
    }

    /// Starts `command` (a [`ratekeeper_command`] that chose its own arguments and
    /// environment) and waits until `/healthcheck` answers 200; listeners bound to an
    /// unspecified address are reached at `reach`.
    pub fn start_command(command: &mut Command, reach: IpAddr) -> Ratekeeper {
        Ratekeeper::launch(command, Some(reach)).healthy()
    }

    /// Starts `command` (a [`ratekeeper_command`] that chose its own arguments and
    /// environment) without waiting for `/healthcheck` (for a process that is meant to be
    /// unhealthy at first): returns once it printed its serving line.
    pub fn start_unready_command(command: &mut Command) -> Ratekeeper {
        Ratekeeper::launch(command, None)
    }

    /// Waits until `/healthcheck` answers 200; fails with the child's stderr otherwise.
    fn healthy(mut self) -> Ratekeeper {
        let http_addr = self.http_addr;
        let healthy = eventually(START_TIMEOUT, || {
            http_get(http_addr, "/healthcheck", &[]).is_ok_and(|response| response.status == 200)
        });
        if !healthy {
            self.process.fail(&format!(
                "did not answer GET /healthcheck with 200 on {http_addr}"
            ));
        }
        self
    }

    /// [`Ratekeeper::start`] without waiting for `/healthcheck` (for a process that is meant
    /// to be unhealthy at first): returns once it printed its serving line.
    pub fn start_unready(config: &Path, extra_args: &[&str]) -> Ratekeeper {
        Ratekeeper::spawn(config, extra_args, &[])
    }

    fn spawn(config: &Path, extra_args: &[&str], env: &[(&str, &str)]) -> Ratekeeper {
        let mut command = ratekeeper_command();
        command.envs(env.iter().copied());
        command.arg("serve").arg("--config").arg(config).args([
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ]);
        // The admin listener on a free loopback port, unless the test chooses its own.
        if !extra_args.contains(&"--admin-addr") {
            command.args(["--admin-addr", "127.0.0.1:0"]);
        }
        command.args(extra_args);
        Ratekeeper::launch(&mut command, None)
    }

    /// Spawns `command` and reads its serving line; listeners bound to an unspecified
    /// address are reached at `reach` when given.
    fn launch(command: &mut Command, reach: Option<IpAddr>) -> Ratekeeper {
        let mut process = Process::spawn("ratekeeper", command);
        let line = process.stdout_line(START_TIMEOUT);
        let Some(Serving {
            mut grpc,
            mut http_addr,
            mut admin_addr,
            peer_addr,
            mut prometheus_addr,
        }) = parse_serving_line(&line)
        else {
            process.fail(&format!("printed {line:?} instead of the serving line"));
        };
        if let Some(reach) = reach {
            let reached = |addr: SocketAddr| {
                if addr.ip().is_unspecified() {
                    SocketAddr::new(reach, addr.port())
                } else {
                    addr
                }
            };
            http_addr = reached(http_addr);
            admin_addr = reached(admin_addr);
            prometheus_addr = prometheus_addr.map(reached);
            if let Grpc::Tcp(addr) = grpc {
                grpc = Grpc::Tcp(reached(addr));
            }
        }
        Ratekeeper {
            process,
            grpc,
            http_addr,
            admin_addr,
            peer_addr,
            prometheus_addr,
            admin_token: None,
            kept: None,
        }
    }

    /// Keeps `dir` (files the process reads) as long as this handle.
    pub fn keeping(mut self, dir: TempDir) -> Ratekeeper {
        self.kept = Some(dir);
        self
    }

    /// Sends `token` on [`Ratekeeper::admin_request`] from now on (a node started with
    /// `--admin-token-file` holding it).
    pub fn with_admin_token(mut self, token: &str) -> Ratekeeper {
        self.admin_token = Some(token.to_owned());
        self
    }

    /// The admin listener (operator endpoints: `/counters`, `/debug/explain`, `/ui`).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// `method path` with `body` on the admin listener, with the admin token when the node
    /// has one (see [`http_request`]).
    pub fn admin_request(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> std::io::Result<HttpResponse> {
        let authorization = self
            .admin_token
            .as_ref()
            .map(|token| format!("Bearer {token}"));
        let headers: Vec<(&str, &str)> = authorization
            .iter()
            .map(|value| ("Authorization", value.as_str()))
            .collect();
        http_request(self.admin_addr, method, path, &headers, body)
    }

    /// The Prometheus listener's address (with `--prometheus-addr` only).
    pub fn prometheus_addr(&self) -> SocketAddr {
        match self.prometheus_addr {
            Some(addr) => addr,
            None => panic!("this ratekeeper serves no Prometheus listener"),
        }
    }

    /// The peer listener's address (cluster mode only).
    pub fn peer_addr(&self) -> SocketAddr {
        match self.peer_addr {
            Some(addr) => addr,
            None => panic!("this ratekeeper was not started in cluster mode"),
        }
    }

    /// The gRPC listener's TCP address (panics when it serves on a Unix socket).
    pub fn grpc_addr(&self) -> SocketAddr {
        match &self.grpc {
            Grpc::Tcp(addr) => *addr,
            Grpc::Unix(path) => panic!("grpc is served on the unix socket {}", path.display()),
        }
    }

    /// The gRPC listener's Unix socket (panics when it serves on TCP).
    pub fn grpc_uds(&self) -> &Path {
        match &self.grpc {
            Grpc::Unix(path) => path,
            Grpc::Tcp(addr) => panic!("grpc is served on tcp {addr}"),
        }
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    pub fn child(&mut self) -> &mut Child {
        self.process.child()
    }

    pub fn stderr(&self) -> String {
        self.process.stderr()
    }

    /// See [`Process::stderr_with`].
    pub fn stderr_with(&self, needle: &str) -> String {
        self.process.stderr_with(needle)
    }
}

/// `ratekeeper serve` over a fresh [`TempDir`] (labelled `label`) that holds `limits` as
/// `limits.yaml`, with `extra_args`; the process reads the directory, so a test may write
/// more files into it. Keep the dir as long as the process.
pub fn serve_limits(label: &str, limits: &str, extra_args: &[&str]) -> (TempDir, Ratekeeper) {
    serve_limits_with_env(label, limits, extra_args, &[])
}

/// [`serve_limits`] with `env` variables set (see [`Ratekeeper::start_with_env`]).
pub fn serve_limits_with_env(
    label: &str,
    limits: &str,
    extra_args: &[&str],
    env: &[(&str, &str)],
) -> (TempDir, Ratekeeper) {
    let dir = TempDir::new(label);
    write_config(dir.path(), "limits.yaml", limits);
    let server = Ratekeeper::start_with_env(dir.path(), extra_args, env);
    (dir, server)
}

/// Where the gRPC listener is: `grpc=ADDR` or `grpc=unix:PATH`.
#[derive(Debug)]
enum Grpc {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// The addresses of a serving line.
struct Serving {
    grpc: Grpc,
    http_addr: SocketAddr,
    admin_addr: SocketAddr,
    peer_addr: Option<SocketAddr>,
    prometheus_addr: Option<SocketAddr>,
}

/// `ratekeeper serving grpc=ADDR http=ADDR admin=ADDR [peer=ADDR] [prometheus=ADDR]`.
fn parse_serving_line(line: &str) -> Option<Serving> {
    let rest = line.trim().strip_prefix("ratekeeper serving ")?;
    let text = |name: &str| {
        rest.split(' ')
            .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
    };
    let field = |name: &str| text(name).and_then(|addr| addr.parse().ok());
    let grpc = match text("grpc")?.strip_prefix("unix:") {
        Some(path) => Grpc::Unix(PathBuf::from(path)),
        None => Grpc::Tcp(field("grpc")?),
    };
    Some(Serving {
        grpc,
        http_addr: field("http")?,
        admin_addr: field("admin")?,
        peer_addr: field("peer"),
        prometheus_addr: field("prometheus"),
    })
}

/// The ratekeeper binary under test, without the caller's `RATEKEEPER_*` environment (so
/// a developer's shell settings cannot change what a test runs) and with plain-text logs
/// (`NO_COLOR`), which read well in a failure message.
pub fn ratekeeper_command() -> Command {
    ratekeeper_command_as(Path::new(env!("CARGO_BIN_EXE_ratekeeper")))
}

/// [`ratekeeper_command`] run through `program` (a link to the binary under another name,
/// such as the reference's `ratelimit`).
pub fn ratekeeper_command_as(program: &Path) -> Command {
    let mut command = Command::new(program);
    clean_environment(&mut command);
    command
}

/// Removes the caller's `RATEKEEPER_*` variables and the reference service's (`PORT`,
/// `LOG_LEVEL`, ..., which ratekeeper reads too) from `command`, asks for plain-text logs
/// (`NO_COLOR`) and no shutdown delay; see [`ratekeeper_command`].
fn clean_environment(command: &mut Command) {
    command.env("NO_COLOR", "1");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RATEKEEPER_") {
            command.env_remove(name);
        }
    }
    // A test's SIGTERM stops at once, unless it passes `--shutdown-delay` (a flag wins
    // over its variable) to test the delay.
    command.env("RATEKEEPER_SHUTDOWN_DELAY", "0s");
    let reference = ::ratekeeper::cli::reference_env::VARIABLES;
    for name in reference
        .iter()
        .chain(&::ratekeeper::cli::reference_env::OTEL_ENDPOINTS)
    {
        command.env_remove(name);
    }
}

/// Runs the binary to completion (e.g. `validate`) within [`START_TIMEOUT`]; returns status,
/// stdout and stderr.
pub fn run_ratekeeper<S: AsRef<OsStr>>(args: &[S]) -> (ExitStatus, String, String) {
    let mut command = ratekeeper_command();
    command.args(args);
    run_to_end("ratekeeper", &mut command, START_TIMEOUT)
}
