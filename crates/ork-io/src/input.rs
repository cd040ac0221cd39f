//! Small files ork reads whole (a prompt, a calibration text, a perplexity text) and files it
//! hands to the system loader (`ORK_RKNN_LIB`): one rule for every such path, the rule models
//! and packs already follow ([`open_regular`]). Only a regular file is read, opened without
//! blocking (a FIFO is refused at once instead of waiting for a writer forever), and one larger
//! than the caller's limit is refused before anything is allocated (its size is checked, then at
//! most `limit + 1` bytes are read, so a file that grows while read is refused too). The limits
//! are listed in `docs/cli.md`.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::regular::{describe_kind, open_regular, OpenRegularError};

/// The largest text file (prompt, calibration text, perplexity text) ork reads: 8 MiB, about
/// two million tokens — far beyond any context window, and small enough that tokenizing it
/// stays within a board's memory (see `docs/cli.md`).
pub const TEXT_INPUT_LIMIT: u64 = 8 << 20;

/// Why [`read_input`] or [`check_regular`] refused a path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// Opening, `stat` or reading failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The path names a directory, FIFO, device or socket.
    #[error("{}: is {kind}, not a regular file", path.display())]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is ("a FIFO", …).
        kind: &'static str,
    },
    /// The file is larger than the limit.
    #[error("{}: {size} bytes or more, above the limit of {limit} bytes (docs/cli.md)", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size (at least this many bytes).
        size: u64,
        /// The limit.
        limit: u64,
    },
}

/// Read all of `path`, a regular file of at most `limit` bytes.
///
/// # Errors
/// [`InputError::NotRegular`] for a FIFO, device, directory or socket (without blocking),
/// [`InputError::TooLarge`] above `limit` (before allocating), [`InputError::Io`] otherwise.
pub fn read_input(path: &Path, limit: u64) -> Result<Vec<u8>, InputError> {
    let io = |source| InputError::Io {
        path: path.to_path_buf(),
        source,
    };
    let too_large = |size| InputError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit,
    };
    let file = open_regular(path).map_err(|e| match e {
        OpenRegularError::Io(e) => io(e),
        OpenRegularError::NotRegular(kind) => InputError::NotRegular {
            path: path.to_path_buf(),
            kind,
        },
    })?;
    let size = file.metadata().map_err(io)?.len();
    if size > limit {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Check, without opening it, that `path` names a regular file (symlinks followed): for a path
/// handed to another component that opens it itself and would block on a FIFO (`dlopen`).
///
/// # Errors
/// [`InputError::NotRegular`] or [`InputError::Io`] (missing, unreadable directory …).
pub fn check_regular(path: &Path) -> Result<(), InputError> {
    let meta = std::fs::metadata(path).map_err(|source| InputError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.file_type().is_file() {
        Ok(())
    } else {
        Err(InputError::NotRegular {
            path: path.to_path_buf(),
            kind: describe_kind(meta.file_type()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_at_the_limit_is_read_and_one_byte_more_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.txt");
        std::fs::write(&p, b"12345").unwrap();
        assert_eq!(read_input(&p, 5).unwrap(), b"12345");
        let e = read_input(&p, 4).unwrap_err();
        assert!(
            matches!(
                e,
                InputError::TooLarge {
                    size: 5,
                    limit: 4,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn a_sparse_file_beyond_the_limit_is_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.txt");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(1 << 40).unwrap();
        let e = read_input(&p, TEXT_INPUT_LIMIT).unwrap_err();
        assert!(
            matches!(e, InputError::TooLarge { size, .. } if size == 1 << 40),
            "{e:?}"
        );
    }

    #[test]
    fn devices_and_directories_are_refused() {
        for (p, kind) in [("/dev/zero", "a character device"), ("/", "a directory")] {
            let e = read_input(Path::new(p), TEXT_INPUT_LIMIT).unwrap_err();
            assert!(
                matches!(e, InputError::NotRegular { kind: k, .. } if k == kind),
                "{p}: {e:?}"
            );
            let e = check_regular(Path::new(p)).unwrap_err();
            assert!(matches!(e, InputError::NotRegular { .. }), "{p}: {e:?}");
        }
    }
}
