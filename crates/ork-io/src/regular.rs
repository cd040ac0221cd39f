//! The input rule's first step, shared by every file ork opens to read (models, packs, text
//! inputs, saved prefix caches): [`open_regular`] opens only a regular file, never blocking on a
//! FIFO; [`describe_kind`] names what a path is when it is not one, for error messages.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Why [`open_regular`] refused a path.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenRegularError {
    /// `open` or `fstat` failed.
    Io(std::io::Error),
    /// The path names something other than a regular file (the kind: "a directory", "a FIFO",
    /// "a character device", "a block device", "a socket").
    NotRegular(&'static str),
}

/// Open `path` read-only if it is a regular file (symlinks followed). The open never blocks:
/// it uses `O_NONBLOCK` (a FIFO would otherwise wait for a writer forever), then `fstat`s the
/// opened file, so what is checked is what was opened.
pub fn open_regular(path: &Path) -> Result<File, OpenRegularError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(OpenRegularError::Io)?;
    let ft = file.metadata().map_err(OpenRegularError::Io)?.file_type();
    if ft.is_file() {
        return Ok(file);
    }
    Err(OpenRegularError::NotRegular(describe_kind(ft)))
}

/// "a directory", "a FIFO", … for a file type that is not a regular file.
pub fn describe_kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}
