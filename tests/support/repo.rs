//! The package's own files, for the tests of what ships in `deploy/` and `examples/`: paths
//! relative to the package root, their contents, and their YAML documents as JSON values.
//!
//! Every reader panics naming the file, so a missing or invalid file fails with its name.

use std::fs;
use std::path::{Path, PathBuf};

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
