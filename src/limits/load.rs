//! Reading limits files from disk: one file, or every `*.yaml` / `*.yml` file directly in
//! a directory.
//!
//! Invariants:
//! - The only IO of the `limits` module lives here, and it only reads.
//! - A directory is read flat (not recursively), in file-name order, following symlinks and
//!   skipping names that start with `.`: a Kubernetes ConfigMap mount (`name.yaml ->
//!   ..data/name.yaml`, `..data -> ..2024_...`) loads exactly its visible files.
//! - No file is read past [`MAX_FILE_BYTES`] (plus one byte to notice it is larger), even
//!   if it grows between the size check and the read.
//! - Every unreadable file is reported, each error naming its path.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::Source;
use super::error::ConfigError;
use super::schema::MAX_FILE_BYTES;

/// The sources at `path`, and the problems reading them.
pub(crate) fn read(path: &Path) -> (Vec<Source>, Vec<ConfigError>) {
    let mut sources = Vec::new();
    let mut errors = Vec::new();
    let metadata = match fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) => {
            errors.push(io_error(path, "cannot read", &error));
            return (sources, errors);
        }
    };
    if !metadata.is_dir() {
        if !metadata.is_file() {
            errors.push(ConfigError::whole_file(
                path.display().to_string(),
                "not a regular file or a directory",
            ));
            return (sources, errors);
        }
        match read_file(path) {
            Ok(source) => sources.push(source),
            Err(error) => errors.push(error),
        }
        return (sources, errors);
    }

    let files = match yaml_files(path) {
        Ok(files) => files,
        Err(error) => {
            errors.push(error);
            return (sources, errors);
        }
    };
    if files.is_empty() {
        tracing::warn!(
            directory = %path.display(),
            "no *.yaml or *.yml files in the limits directory; no limits are configured"
        );
    }
    for file in files {
        match read_file(&file) {
            Ok(source) => sources.push(source),
            Err(error) => errors.push(error),
        }
    }
    (sources, errors)
}

/// The YAML files directly in `directory`, sorted by name.
fn yaml_files(directory: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = fs::read_dir(directory)
        .map_err(|error| io_error(directory, "cannot list directory", &error))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| io_error(directory, "cannot list directory", &error))?;
        let name = entry.file_name();
        let bytes = name.as_encoded_bytes();
        let yaml = bytes.ends_with(b".yaml") || bytes.ends_with(b".yml");
        if bytes.starts_with(b".") || !yaml {
            continue;
        }
        let path = entry.path();
        // `fs::metadata` follows symlinks. Directories, sockets and pipes are skipped; a
        // dangling symlink is kept so that reading it reports the error.
        match fs::metadata(&path) {
            Ok(metadata) if !metadata.is_file() => {}
            _ => files.push(path),
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

fn read_file(path: &Path) -> Result<Source, ConfigError> {
    let name = path.display().to_string();
    let file = fs::File::open(path).map_err(|error| io_error(path, "cannot read", &error))?;
    let too_large = || {
        ConfigError::whole_file(
            &name,
            format!("file is larger than {MAX_FILE_BYTES} bytes (4 MiB)"),
        )
    };
    let length = file
        .metadata()
        .map_err(|error| io_error(path, "cannot read", &error))?
        .len();
    if length > MAX_FILE_BYTES as u64 {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| io_error(path, "cannot read", &error))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let text = String::from_utf8(bytes).map_err(|error| {
        ConfigError::whole_file(
            &name,
            format!("file is not utf-8 text: {}", error.utf8_error()),
        )
    })?;
    Ok(Source { name, text })
}

/// `path: cannot read: no such file or directory (os error 2)`.
fn io_error(path: &Path, action: &str, error: &std::io::Error) -> ConfigError {
    let message = error.to_string();
    let mut chars = message.chars();
    let message = match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => message,
    };
    ConfigError::whole_file(path.display().to_string(), format!("{action}: {message}"))
}
