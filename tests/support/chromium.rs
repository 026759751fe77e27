//! A real headless browser for the dashboard: Debian's `chromium`, installed with apt-get on
//! first use (like nginx), run once per page with `--virtual-time-budget` so the page's
//! scripts (fetches and timers) have run before the DOM is dumped or the screenshot taken.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::run_to_end;
use super::temp::TempDir;
use super::tools::{find_program, found_or_apt_installed, target_dir, tool_from_env};

/// How long one chromium run may take (its virtual time runs faster than real time).
const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// `$RATEKEEPER_CHROMIUM` if set, else `chromium` on `PATH`, else Debian's `chromium`
/// installed with apt-get (as root; one test binary installs while the others wait).
pub fn chromium_binary() -> PathBuf {
    if let Some(path) = tool_from_env("RATEKEEPER_CHROMIUM") {
        return path;
    }
    found_or_apt_installed(
        find_chromium,
        "chromium",
        "or set RATEKEEPER_CHROMIUM to a Chromium or Chrome binary",
    )
}

fn find_chromium() -> Option<PathBuf> {
    find_program(&["chromium", "chromium-browser"], &[])
}

/// Headless chromium loading `url`, with `budget` of virtual time for the page's scripts,
/// then `action` (`--dump-dom`, `--screenshot=...`). Returns stdout; panics with stderr on
/// failure.
fn run(url: &str, budget: Duration, action: &[String]) -> String {
    let profile = TempDir::new("chromium-profile");
    let mut command = Command::new(chromium_binary());
    command
        .args([
            "--headless",
            // Root cannot use the sandbox; the page is our own.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1400,1800",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .args(action)
        .arg(url);
    let (status, stdout, stderr) = run_to_end("chromium", &mut command, RUN_TIMEOUT);
    assert!(
        status.success(),
        "chromium {url}: {status}\nstderr:\n{stderr}"
    );
    stdout
}

/// The DOM of `url` after its scripts ran for `budget` of virtual time.
pub fn dump_dom(url: &str, budget: Duration) -> String {
    run(url, budget, &["--dump-dom".to_owned()])
}

/// A PNG screenshot of `url` after `budget` of virtual time, written to `path`.
pub fn screenshot(url: &str, budget: Duration, path: &Path) {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).unwrap_or_else(|error| panic!("create {}: {error}", dir.display()));
    }
    run(url, budget, &[format!("--screenshot={}", path.display())]);
    let png = fs::read(path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()));
    assert!(
        png.starts_with(b"\x89PNG"),
        "chromium wrote no PNG to {}",
        path.display()
    );
}

/// Where tests keep artifacts for a person to look at: `<target>/test-artifacts`.
pub fn artifacts_dir() -> PathBuf {
    target_dir().join("test-artifacts")
}
