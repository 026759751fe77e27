//! Reading limits files from disk: one file, or every file under a directory, recursively,
//! whatever its name ends with, as the reference service loads its runtime directory.
//!
//! Invariants:
//! - The only IO of the `limits` module lives here, and it only reads.
//! - A directory is read recursively, in path order, following symlinks and skipping names
//!   (of files and directories) that start with `.`: a Kubernetes ConfigMap mount
//!   (`name.yaml -> ..data/name.yaml`, `..data -> ..2024_...`) loads exactly its visible
//!   files, once. No file is skipped silently: every file read is a source (so one that is
//!   not a limits file fails the load, naming it), and `validate` lists them.
//! - The walk is bounded: at most [`MAX_DEPTH`] directories deep and [`MAX_FILES`] files, and
//!   a directory reached twice (a symlink loop) is read once.
//! - No file is read past [`MAX_FILE_BYTES`] (plus one byte to notice it is larger), even
//!   if it grows between the size check and the read.
//! - Only regular files (and symlinks to them) are read: a FIFO, socket or device is an
//!   error naming it, checked on the opened handle ([`crate::files`]), never a blocked read.
//!   The whole read is bounded in time too ([`MAX_READ_TIME`], checked between files).
//! - Every unreadable file is reported, each error naming its path.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::Source;
use super::error::ConfigError;
use super::schema::MAX_FILE_BYTES;

/// Directories below the limits directory, at most.
pub const MAX_DEPTH: usize = 16;
/// Files under the limits directory, at most.
pub const MAX_FILES: usize = 1000;
/// How long reading the limits may take; past it the load fails, naming the files left.
pub const MAX_READ_TIME: Duration = Duration::from_secs(10);

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
                "not a regular file or a directory (a FIFO, socket or device is never read)",
            ));
            return (sources, errors);
        }
        match read_file(path) {
            Ok(source) => sources.push(source),
            Err(error) => errors.push(error),
        }
        return (sources, errors);
    }

    let files = match config_files(path) {
        Ok(files) => files,
        Err(error) => {
            errors.push(error);
            return (sources, errors);
        }
    };
    if files.is_empty() {
        tracing::warn!(
            directory = %path.display(),
            "no files in the limits directory; no limits are configured"
        );
    }
    let started = Instant::now();
    for (index, file) in files.iter().enumerate() {
        if started.elapsed() > MAX_READ_TIME {
            errors.push(ConfigError::whole_file(
                file.display().to_string(),
                format!(
                    "not read: reading the limits took longer than {} s ({} files left)",
                    MAX_READ_TIME.as_secs(),
                    files.len() - index
                ),
            ));
            break;
        }
        match read_file(file) {
            Ok(source) => sources.push(source),
            Err(error) => errors.push(error),
        }
    }
    (sources, errors)
}

/// Every visible file under `directory`, recursively, sorted by path.
fn config_files(directory: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let mut files = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut pending = vec![(directory.to_owned(), 0usize)];
    while let Some((dir, depth)) = pending.pop() {
        // A directory reached again through a symlink is read once.
        if !seen.insert(fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone())) {
            continue;
        }
        let entries =
            fs::read_dir(&dir).map_err(|error| io_error(&dir, "cannot list directory", &error))?;
        for entry in entries {
            let entry = entry.map_err(|error| io_error(&dir, "cannot list directory", &error))?;
            if entry.file_name().as_encoded_bytes().starts_with(b".") {
                continue;
            }
            let path = entry.path();
            // `fs::metadata` follows symlinks; a dangling symlink is kept as a file so that
            // reading it reports the error. Sockets and pipes are not limits files.
            match fs::metadata(&path) {
                Ok(metadata) if metadata.is_dir() => {
                    if depth + 1 > MAX_DEPTH {
                        return Err(ConfigError::whole_file(
                            path.display().to_string(),
                            format!("more than {MAX_DEPTH} directories deep"),
                        ));
                    }
                    pending.push((path, depth + 1));
                }
                Ok(metadata) if !metadata.is_file() => {
                    return Err(ConfigError::whole_file(
                        path.display().to_string(),
                        crate::files::NOT_A_FILE,
                    ));
                }
                _ => files.push(path),
            }
            if files.len() > MAX_FILES {
                return Err(ConfigError::whole_file(
                    directory.display().to_string(),
                    format!("more than {MAX_FILES} files"),
                ));
            }
        }
    }
    files.sort();
    Ok(files)
}

fn read_file(path: &Path) -> Result<Source, ConfigError> {
    let name = path.display().to_string();
    let bytes = crate::files::read_regular(path, MAX_FILE_BYTES as u64).map_err(|error| {
        let problem = match error {
            crate::files::ReadError::Io(error) => return io_error(path, "cannot read", &error),
            crate::files::ReadError::TooLarge { .. } => {
                format!("file is larger than {MAX_FILE_BYTES} bytes (4 MiB)")
            }
            crate::files::ReadError::NotAFile => crate::files::NOT_A_FILE.to_owned(),
        };
        ConfigError::whole_file(&name, problem)
    })?;
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
