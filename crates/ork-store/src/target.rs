//! May this file be replaced? The rules every write of an `.orkpack` goes through
//! (`docs/orkpack.md`, "Which files ork replaces"):
//!
//! - identity is decided by device and inode, never by comparing path strings: a target that is
//!   the model — under any spelling, through a symlink or a hard link — is refused;
//! - only a regular file that starts with the `.orkpack` magic, an empty file, or no file at all
//!   may be replaced; anything else (a model, notes, a device node, a FIFO, a directory) is
//!   refused with an error naming it;
//! - a symlink is written through: the file it points to is replaced, the link stays a link; a
//!   dangling symlink is refused;
//! - where the target does not exist yet, it is named by its canonical parent directory plus
//!   its file name, so the temp file and the rename land in the directory that will hold it.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::format::MAGIC;
use crate::StoreError;

/// Where a pack will be written, after the rules above.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackTarget {
    /// The file to write (symlinks resolved, parent canonical): the writer's temp file and
    /// rename go to this path's directory.
    pub path: PathBuf,
    /// Whether a file exists there now (it then carries the `.orkpack` magic or is empty).
    pub exists: bool,
}

/// Resolve `target` for writing an `.orkpack`, refusing it if the rules in the module docs
/// forbid replacing what is there. `model`, when given, is the file the pack is built from; a
/// `target` that is the same file (device and inode) is refused with
/// [`StoreError::WouldOverwriteModel`].
pub fn resolve_target(target: &Path, model: Option<&Path>) -> Result<PackTarget, StoreError> {
    let io = |op, e| StoreError::io(target, op, e);
    if target.file_name().is_none() {
        return Err(StoreError::RefuseOverwrite {
            path: target.to_path_buf(),
            reason: "the path has no file name".into(),
        });
    }
    let (path, meta) = match std::fs::symlink_metadata(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Nothing there: canonical parent + file name.
            let parent = match target.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            let dir = std::fs::canonicalize(parent).map_err(|e| io("resolve directory", e))?;
            if !dir.is_dir() {
                return Err(StoreError::NotRegularFile {
                    path: parent.to_path_buf(),
                    kind: "not a directory",
                });
            }
            let name = target.file_name().expect("checked above");
            return Ok(PackTarget {
                path: dir.join(name),
                exists: false,
            });
        }
        Err(e) => return Err(io("stat", e)),
        Ok(m) if m.file_type().is_symlink() => {
            // Write through: the file the link points to is the one replaced.
            match std::fs::canonicalize(target) {
                Ok(real) => {
                    let meta = std::fs::metadata(&real).map_err(|e| io("stat", e))?;
                    (real, meta)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(StoreError::RefuseOverwrite {
                        path: target.to_path_buf(),
                        reason: "a symbolic link to a file that does not exist".into(),
                    })
                }
                Err(e) => return Err(io("resolve symbolic link", e)),
            }
        }
        Ok(m) => (
            std::fs::canonicalize(target).map_err(|e| io("resolve path", e))?,
            m,
        ),
    };
    if !meta.file_type().is_file() {
        return Err(StoreError::NotRegularFile {
            path: target.to_path_buf(),
            kind: ork_io::describe_kind(meta.file_type()),
        });
    }
    if let Some(model) = model {
        if let Ok(m) = std::fs::metadata(model) {
            if (m.dev(), m.ino()) == (meta.dev(), meta.ino()) {
                return Err(StoreError::WouldOverwriteModel {
                    path: target.to_path_buf(),
                    model: model.to_path_buf(),
                });
            }
        }
    }
    if meta.len() > 0 {
        let mut head = [0u8; 8];
        let n = ork_io::open_regular(&path)
            .map_err(|e| match e {
                ork_io::OpenRegularError::Io(e) => io("open", e),
                ork_io::OpenRegularError::NotRegular(kind) => StoreError::NotRegularFile {
                    path: target.to_path_buf(),
                    kind,
                },
                _ => io("open", std::io::Error::other("cannot open")),
            })?
            .take(8)
            .read(&mut head)
            .map_err(|e| io("read", e))?;
        if head[..n] != MAGIC[..n.min(MAGIC.len())] || n < MAGIC.len() {
            return Err(StoreError::RefuseOverwrite {
                path: target.to_path_buf(),
                reason: "it is not an .orkpack file (no .orkpack magic); ork replaces only its own files".into(),
            });
        }
    }
    Ok(PackTarget { path, exists: true })
}
