//! The docs written from the code (`docs/routes.md`, `docs/cli.md`, `docs/metrics.md`):
//! each has a test comparing the file with what the code renders now, which fails naming
//! the command that rewrites it.

use std::path::Path;

/// Fails unless `file` (from the repository root) holds `expected`; with
/// `RATEKEEPER_REGENERATE` set, writes it first. `filter` is the test filter that
/// regenerates this file alone.
pub(crate) fn check(file: &str, expected: &str, filter: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    if std::env::var_os("RATEKEEPER_REGENERATE").is_some() {
        std::fs::write(&path, expected).unwrap_or_else(|e| panic!("write {file}: {e}"));
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "{file} differs from the code that it documents; regenerate it: \
         RATEKEEPER_REGENERATE=1 cargo test --lib {filter}"
    );
}
