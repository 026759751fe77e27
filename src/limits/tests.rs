//! Tests of the limits module: validation messages, matching, loading from disk.

mod bounds;
mod key_budgets;
pub(crate) mod loading;
mod matching;
mod newer_keys;
mod validation;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{ConfigErrors, Limits};

// Compiled limits are shared across request tasks behind an `ArcSwap`.
const _: fn() = || {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<Limits>();
};

/// Compiles `yaml` as file `t.yaml`, failing the test with every error if it is invalid.
fn limits(yaml: &str) -> Limits {
    match Limits::parse_str("t.yaml", yaml) {
        Ok(limits) => limits,
        Err(errors) => panic!("config rejected:\n{errors}"),
    }
}

/// The error lines for `yaml` as file `t.yaml`, failing the test if it is accepted.
fn errors(yaml: &str) -> Vec<String> {
    lines(Limits::parse_str("t.yaml", yaml).map(|limits| limits.to_string()))
}

fn lines(result: Result<String, ConfigErrors>) -> Vec<String> {
    match result {
        Ok(dump) => panic!("config accepted, expected errors; loaded:\n{dump}"),
        Err(errors) => errors.errors().iter().map(ToString::to_string).collect(),
    }
}

/// A fresh directory under the system temp dir, removed when dropped.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(test: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "ratekeeper-test-{}-{test}-{unique}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    /// Writes `dir/name` (creating parent dirs) and returns its path.
    pub(crate) fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create parent dir");
        }
        fs::write(&path, text).expect("write file");
        path
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
