//! Reading the files an operator names (limits, certificates, keys, tokens): regular files
//! only, bounded in size, and never blocking on what is not a file.
//!
//! Invariants:
//! - A file is opened without blocking (`O_NONBLOCK`: opening a FIFO for reading would
//!   otherwise wait for a writer, for ever) and checked on the opened handle, so nothing
//!   can be swapped in between the check and the read: a FIFO, socket or device is an
//!   error ([`NOT_A_FILE`]), never a read. Symlinks to regular files are followed.
//! - At most `max` bytes are read (plus one, to notice a larger file), even if the file
//!   grows while it is read.
//!
//! A leaf: it imports nothing of the crate.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The error for a path that is not a regular file (or a symlink to one).
pub const NOT_A_FILE: &str = "not a regular file (a FIFO, socket or device is never read)";

/// Why a file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// It could not be opened or read.
    Io(io::Error),
    /// It is not a regular file.
    NotAFile,
    /// It holds more than the bound.
    TooLarge { max: u64 },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(error) => {
                let message = error.to_string();
                let mut chars = message.chars();
                match chars.next() {
                    // Messages are lowercase: `no such file or directory (os error 2)`.
                    Some(first) => write!(f, "{}{}", first.to_lowercase(), chars.as_str()),
                    None => f.write_str(&message),
                }
            }
            ReadError::NotAFile => f.write_str(NOT_A_FILE),
            ReadError::TooLarge { max } => write!(f, "larger than {max} bytes"),
        }
    }
}

/// Opens `path` for reading if it is a regular file, without ever blocking on the open.
pub fn open_regular(path: &Path) -> Result<File, ReadError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(ReadError::Io)?;
    let metadata = file.metadata().map_err(ReadError::Io)?;
    if !metadata.is_file() {
        return Err(ReadError::NotAFile);
    }
    Ok(file)
}

/// The bytes of the regular file at `path`, at most `max` of them.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let file = open_regular(path)?;
    let length = file.metadata().map_err(ReadError::Io)?.len();
    if length > max {
        return Err(ReadError::TooLarge { max });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(length).unwrap_or(0));
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge { max });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo_in(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("pipe");
        let status = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("mkfifo runs");
        assert!(status.success());
        path
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ratekeeper-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temp dir");
        dir
    }

    #[test]
    fn a_fifo_is_refused_at_once_and_never_read() {
        let dir = temp_dir("fifo");
        let fifo = fifo_in(&dir);
        // Without O_NONBLOCK this open would wait for a writer for ever.
        let error = read_regular(&fifo, 10).expect_err("a FIFO is not a file");
        assert!(matches!(error, ReadError::NotAFile), "{error}");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&fifo, &link).expect("a symlink");
        assert!(matches!(read_regular(&link, 10), Err(ReadError::NotAFile)));
        std::fs::remove_dir_all(&dir).expect("cleaned up");
    }

    #[test]
    fn a_regular_file_is_read_up_to_its_bound() {
        let dir = temp_dir("bound");
        let path = dir.join("file");
        std::fs::write(&path, b"0123456789").expect("written");
        assert_eq!(read_regular(&path, 10).expect("fits"), b"0123456789");
        assert_eq!(
            read_regular(&path, 9).expect_err("too large").to_string(),
            "larger than 9 bytes"
        );
        let link = dir.join("link");
        std::os::unix::fs::symlink(&path, &link).expect("a symlink");
        assert_eq!(read_regular(&link, 10).expect("followed"), b"0123456789");
        assert!(
            read_regular(&dir.join("missing"), 10)
                .expect_err("missing")
                .to_string()
                .starts_with("no such file")
        );
        std::fs::remove_dir_all(&dir).expect("cleaned up");
    }
}
