//! nginx: the binary ([`nginx_binary`], found or installed with apt-get, and checked for
//! the auth_request module) and a running [`Nginx`] serving a test's config on a free port.
//!
//! nginx is stopped with SIGTERM so its workers go too.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::http::{HTTP_TIMEOUT, free_port};
use super::poll::eventually;
use super::process::{Process, START_TIMEOUT, run_to_end};
use super::tools::{find_program, found_or_apt_installed, tool_from_env};

/// The nginx binary: `$RATEKEEPER_NGINX` if set, else `nginx` on `PATH` (or in the usual
/// `sbin` directories), else Debian's `nginx` package installed with apt-get (as root; one
/// test binary installs while the others wait on a lock file). It must have the
/// auth_request module. Any failure panics: an nginx test never silently skips.
pub fn nginx_binary() -> PathBuf {
    if let Some(path) = tool_from_env("RATEKEEPER_NGINX") {
        check_auth_request(&path);
        return path;
    }
    let nginx = found_or_apt_installed(
        find_nginx,
        "nginx",
        "or set RATEKEEPER_NGINX to an nginx built with auth_request",
    );
    check_auth_request(&nginx);
    nginx
}

/// `nginx` on `PATH`, or in the `sbin` directories that a non-root `PATH` often lacks.
fn find_nginx() -> Option<PathBuf> {
    find_program(
        &["nginx"],
        &["/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin"],
    )
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
