//! Redis: the server binary ([`redis_server_binary`], found or installed from Debian's
//! `redis-server` package), a [`RedisServer`] on a free port that can be killed and
//! restarted on the same port, and a [`RedisCluster`] of masters created with
//! `redis-cli --cluster create`.
//!
//! Servers keep nothing on disk (`--save ""`, no AOF) unless a test asks, and are killed on
//! drop.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::http::free_port;
use super::poll::eventually;
use super::process::{Process, START_TIMEOUT, run_to_end};
use super::tools::{find_program, found_or_apt_installed};

/// `redis-server` on `PATH` (or in `/usr/bin`, `/usr/local/bin`), else Debian's
/// `redis-server` package installed with apt-get (one test binary installs while the others
/// wait on a lock file). Any failure panics: a Redis test never silently skips.
pub fn redis_server_binary() -> PathBuf {
    found_or_apt_installed(
        || find("redis-server"),
        "redis-server",
        "or put redis-server on PATH",
    )
}

/// `redis-cli`, which comes with `redis-server`.
pub fn redis_cli_binary() -> PathBuf {
    redis_server_binary();
    find("redis-cli").unwrap_or_else(|| panic!("redis-server is installed but redis-cli is not"))
}

fn find(program: &str) -> Option<PathBuf> {
    find_program(&[program], &["/usr/bin", "/usr/local/bin"])
}

/// A running `redis-server` on `127.0.0.1:port`.
#[derive(Debug)]
pub struct RedisServer {
    process: Option<Process>,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    /// TLS only (`--port 0 --tls-port PORT`), clients presenting a certificate.
    tls: Option<RedisTls>,
}

/// The files of a TLS Redis ([`RedisServer::start_tls`]): one CA signs the server's
/// certificate (for `127.0.0.1` and `localhost`) and the client's.
#[derive(Debug, Clone)]
pub struct RedisTls {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl RedisTls {
    /// A CA, a server certificate for `names` and a client certificate, written in `dir`.
    pub fn write(dir: &Path, names: &[&str]) -> RedisTls {
        let ca = super::certs::TestCa::new("redis test ca");
        // Redis presents it as a client too, to other nodes of a TLS cluster.
        let (server_cert, server_key) = ca.peer(names).write(dir, "redis");
        let (client_cert, client_key) = ca.client(&["ratekeeper"]).write(dir, "client");
        RedisTls {
            ca: ca.write(dir, "redis-ca.crt"),
            server_cert,
            server_key,
            client_cert,
            client_key,
        }
    }

    /// `redis-cli`'s arguments to speak TLS with the client certificate.
    pub fn cli_args(&self) -> Vec<String> {
        let text = |path: &Path| path.to_string_lossy().into_owned();
        vec![
            "--tls".to_owned(),
            "--cacert".to_owned(),
            text(&self.ca),
            "--cert".to_owned(),
            text(&self.client_cert),
            "--key".to_owned(),
            text(&self.client_key),
        ]
    }

    fn args(&self, port: &str) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec!["--port".into(), "0".into()];
        for (flag, value) in [
            ("--tls-port", Path::new(port)),
            ("--tls-cert-file", &self.server_cert),
            ("--tls-key-file", &self.server_key),
            ("--tls-ca-cert-file", &self.ca),
        ] {
            args.push(flag.into());
            args.push(value.into());
        }
        args.extend(["--tls-auth-clients".into(), "yes".into()]);
        args
    }

    /// Whether the server on `port` answers PING over TLS with the client certificate
    /// (`password`, when it asks for one), whatever name its certificate is for.
    fn ping(&self, port: u16, password: Option<&str>) -> bool {
        let read = |path: &Path| fs::read(path).unwrap_or_default();
        let certificates = redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read(&self.client_cert),
                client_key: read(&self.client_key),
            }),
            root_cert: Some(read(&self.ca)),
        };
        let auth = password.map(|pw| format!(":{pw}@")).unwrap_or_default();
        let url = format!("rediss://{auth}127.0.0.1:{port}");
        let Ok(client) = redis::Client::build_with_tls(url, certificates) else {
            return false;
        };
        // Readiness only: the server's certificate may name another host.
        let info = client.get_connection_info().clone();
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(true);
        let Ok(client) = redis::Client::open(info.set_addr(addr)) else {
            return false;
        };
        let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_millis(500))
        else {
            return false;
        };
        redis::cmd("PING")
            .query::<String>(&mut connection)
            .is_ok_and(|pong| pong == "PONG")
    }
}

impl RedisServer {
    /// A server on a free port, its files in `dir`, with `args` added to the command line.
    pub fn start(dir: &Path, args: &[&str]) -> RedisServer {
        let mut server = RedisServer {
            process: None,
            port: free_port(),
            dir: dir.to_owned(),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            tls: None,
        };
        server.restart();
        server
    }

    /// A server that speaks TLS only and requires a client certificate signed by `tls`'s
    /// CA, with `args` added (a `--requirepass PASSWORD` among them is used by the PING
    /// that waits for it).
    pub fn start_tls(dir: &Path, tls: &RedisTls, args: &[&str]) -> RedisServer {
        let mut server = RedisServer {
            process: None,
            port: free_port(),
            dir: dir.to_owned(),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            tls: Some(tls.clone()),
        };
        server.restart();
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL): in-memory data is lost.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Starts the server again on the same port (after [`RedisServer::kill`]), and waits
    /// until it answers PING.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.port.to_string();
        let mut command = Command::new(redis_server_binary());
        command.current_dir(&self.dir);
        match &self.tls {
            None => command.args(["--port", &port]),
            Some(tls) => command.args(tls.args(&port)),
        };
        command
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--protected-mode", "no"])
            .args(["--dir"])
            .arg(&self.dir)
            .args(&self.args);
        let mut process = Process::spawn(&format!("redis-server :{port}"), &mut command);
        let password = self
            .args
            .iter()
            .position(|arg| arg == "--requirepass")
            .and_then(|at| self.args.get(at + 1));
        let answers = || match &self.tls {
            None => ping(self.port),
            Some(tls) => tls.ping(self.port, password.map(String::as_str)),
        };
        if !eventually(START_TIMEOUT, answers) {
            process.fail("redis-server did not answer PING");
        }
        self.process = Some(process);
    }

    /// Runs one command with `redis-cli` against this server (over TLS for a TLS server)
    /// and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let tls = self
            .tls
            .as_ref()
            .map(RedisTls::cli_args)
            .unwrap_or_default();
        let mut all: Vec<&str> = tls.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        redis_cli(self.port, &all)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a Redis server on `port` answers PING.
pub fn ping(port: u16) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
        return false;
    };
    let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
        return false;
    };
    redis::cmd("PING")
        .query::<String>(&mut connection)
        .is_ok_and(|pong| pong == "PONG")
}

/// `redis-cli -p PORT ARGS...`'s stdout; panics if it fails.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let mut command = Command::new(redis_cli_binary());
    command.args(["-p", &port.to_string()]).args(args);
    let (status, stdout, stderr) = run_to_end("redis-cli", &mut command, START_TIMEOUT);
    assert!(
        status.success(),
        "redis-cli {args:?}: {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

/// A Redis Cluster of masters (no replicas), one directory each under `dir`.
#[derive(Debug)]
pub struct RedisCluster {
    pub masters: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `count` masters with cluster mode on, joins them with
    /// `redis-cli --cluster create` and waits until every node says `cluster_state:ok`.
    pub fn start(dir: &Path, count: usize) -> RedisCluster {
        RedisCluster::start_with(dir, count, None)
    }

    /// [`RedisCluster::start`] over TLS only (`--tls-cluster yes`), clients presenting a
    /// certificate `tls`'s CA signed.
    pub fn start_tls(dir: &Path, count: usize, tls: &RedisTls) -> RedisCluster {
        RedisCluster::start_with(dir, count, Some(tls))
    }

    fn start_with(dir: &Path, count: usize, tls: Option<&RedisTls>) -> RedisCluster {
        let masters: Vec<RedisServer> = (0..count)
            .map(|index| {
                let node_dir = dir.join(format!("node{index}"));
                fs::create_dir_all(&node_dir)
                    .unwrap_or_else(|error| panic!("create {}: {error}", node_dir.display()));
                let args = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ];
                match tls {
                    None => RedisServer::start(&node_dir, &args),
                    Some(tls) => {
                        let args = [&args[..], &["--tls-cluster", "yes"]].concat();
                        RedisServer::start_tls(&node_dir, tls, &args)
                    }
                }
            })
            .collect();
        let nodes: Vec<String> = masters
            .iter()
            .map(|master| format!("127.0.0.1:{}", master.port()))
            .collect();
        let tls_args = tls.map(RedisTls::cli_args).unwrap_or_default();
        let mut args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
        args.extend(["--cluster", "create"]);
        args.extend(nodes.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        redis_cli(masters[0].port(), &args);
        let cluster = RedisCluster { masters };
        cluster.wait_ok();
        cluster
    }

    /// Waits until every master says `cluster_state:ok`.
    pub fn wait_ok(&self) {
        for master in &self.masters {
            let ok = eventually(START_TIMEOUT, || {
                master
                    .cli(&["cluster", "info"])
                    .contains("cluster_state:ok")
            });
            assert!(ok, "redis cluster node {} never became ok", master.port());
        }
    }

    /// `redis-cluster://127.0.0.1:P1,127.0.0.1:P2,...` (`rediss-cluster://` over TLS).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .masters
            .iter()
            .map(|master| format!("127.0.0.1:{}", master.port()))
            .collect();
        let tls = self.masters.iter().any(|master| master.tls.is_some());
        let scheme = if tls { "rediss" } else { "redis" };
        format!("{scheme}-cluster://{}", nodes.join(","))
    }
}

/// A running Redis Sentinel (`redis-server CONF --sentinel`) on a free port.
#[derive(Debug)]
pub struct Sentinel {
    _process: Process,
    port: u16,
}

impl Sentinel {
    /// Starts a sentinel with `conf` (which it rewrites as it learns) and waits until it
    /// answers PING.
    pub fn start(conf: &Path) -> Sentinel {
        let port = free_port();
        let mut command = Command::new(redis_server_binary());
        command.arg(conf).args([
            "--sentinel",
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ]);
        let mut process = Process::spawn(&format!("redis-sentinel :{port}"), &mut command);
        if !eventually(START_TIMEOUT, || ping(port)) {
            process.fail("redis sentinel did not answer PING");
        }
        Sentinel {
            _process: process,
            port,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}
