//! Every file ork writes besides its packs — a `--trace`, `bench stream --plot`'s SVG, the board
//! clock's `ORK_BOARD_EVENTS` dump — goes through one rule (`docs/cli.md`, "One rule for every
//! path ork opens"), the outputs' side of the rule that packs (`ork_store::resolve_target`) and text
//! inputs ([`crate::input`]) follow:
//!
//! - a path that does not exist yet is created in its (existing) directory;
//! - an existing regular file is replaced atomically (a temp file beside it, synced, renamed),
//!   never in place, so a failed or interrupted write leaves the old file whole; a symlink is
//!   written through, a dangling one is refused;
//! - a file that is one of the command's inputs (the model, the pack: same device and inode,
//!   whatever the spelling or link), or that starts with a GGUF or `.orkpack` magic, is refused:
//!   an output never replaces a model or a pack;
//! - a directory, a block device or a socket is refused, naming what it is;
//! - a character device (a terminal, `/dev/stderr`, `/dev/null`) or a pipe is written as a
//!   stream, so `--trace /dev/stderr` works; a FIFO with no reader is refused at once instead of
//!   waiting for one forever.
//!
//! A file that lives in a directory ork owns (the prefix cache, `--prefix-cache-dir`) follows a
//! stricter rule, [`write_in_dir`]: nothing outside that directory is written, so a link there is
//! refused instead of written through, and only a regular file is replaced.
//!
//! [`check_output`] applies the rule without writing anything, so that a command can refuse a bad
//! path before minutes of work; [`write_output`] applies it again when writing.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why an output was refused or could not be written. `ork_store::OutputError` converts it
/// variant by variant (same messages).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// An operating-system call on the file or its directory failed (stat, open, write, sync,
    /// rename).
    #[error("{path}: {op}: {source}")]
    Io {
        /// The output as given (the temporary file sits beside it).
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// OS error.
        source: std::io::Error,
    },
    /// The path names a directory, a block device or a socket (or, in a directory ork owns,
    /// anything but a regular file).
    #[error("{path}: is {kind}, not a regular file")]
    NotRegularFile {
        /// The path as given.
        path: PathBuf,
        /// What it is ("a directory", …).
        kind: &'static str,
    },
    /// The path exists and may not be replaced (an input, a model, a pack, a link in a
    /// directory ork owns, a FIFO with no reader, …); nothing was written.
    #[error("{path}: refusing to replace it: {reason}")]
    RefuseOverwrite {
        /// The path as given.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl OutputError {
    /// [`OutputError::Io`] naming `path` and the operation.
    pub fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        OutputError::Io {
            path: path.into(),
            op,
            source,
        }
    }
}

/// Magics of the files an output never replaces: GGUF models and `.orkpack`s (any version).
const PROTECTED_MAGICS: [(&[u8], &str); 2] = [(b"GGUF", "a GGUF model"), (b"ORKPK", "an .orkpack")];

/// Where an output goes, once the rule has been applied.
#[derive(Debug)]
enum Destination {
    /// A regular file (the resolved path; it may not exist yet), replaced atomically.
    File(PathBuf),
    /// A terminal, a device that accepts writes, or a pipe with a reader: written in order.
    Stream(std::fs::File),
}

/// Apply the output rule to `path` without writing anything: `Ok` if [`write_output`] may write
/// there now. `inputs` are the files the command reads (the model, the pack); an output that is
/// one of them is refused.
///
/// # Errors
/// [`OutputError::RefuseOverwrite`] for an input, a model or pack, a dangling symlink, a FIFO
/// with no reader or a path with no file name; [`OutputError::NotRegularFile`] for a directory,
/// a block device or a socket; [`OutputError::Io`] when the directory or the file cannot be read.
pub fn check_output(path: &Path, inputs: &[&Path]) -> Result<(), OutputError> {
    destination(path, inputs).map(drop)
}

/// The name prefix of the temporary file an atomic write creates beside its destination (what
/// a write cut by a crash leaves behind).
pub const TEMP_PREFIX: &str = ".ork-output-";

/// Write `bytes` to `path` under the output rule (module docs).
///
/// # Errors
/// As [`check_output`], and [`OutputError::Io`] when writing, syncing or renaming fails (the old
/// file, if any, is then left as it was).
pub fn write_output(path: &Path, bytes: &[u8], inputs: &[&Path]) -> Result<(), OutputError> {
    let io = |op, e| OutputError::io(path, op, e);
    match destination(path, inputs)? {
        Destination::Stream(mut f) => f.write_all(bytes).map_err(|e| io("write", e)),
        Destination::File(real) => {
            let dir = real.parent().unwrap_or(Path::new("."));
            replace_atomically(path, dir, &real, TEMP_PREFIX, bytes)
        }
    }
}

/// A temporary file named `temp_prefix…` in `dir`, holding `bytes`, synced and renamed to
/// `dest` (in `dir`), then `dir` synced. Errors name `shown`.
fn replace_atomically(
    shown: &Path,
    dir: &Path,
    dest: &Path,
    temp_prefix: &str,
    bytes: &[u8],
) -> Result<(), OutputError> {
    let io = |op, e| OutputError::io(shown, op, e);
    let mut tmp = tempfile::Builder::new()
        .prefix(temp_prefix)
        .tempfile_in(dir)
        .map_err(|e| io("create a temporary file", e))?;
    tmp.write_all(bytes).map_err(|e| io("write", e))?;
    tmp.as_file().sync_all().map_err(|e| io("sync", e))?;
    // rename(2) replaces the directory entry `dest` whatever it is now (a link raced in is
    // replaced itself, never followed).
    tmp.persist(dest).map_err(|e| io("rename", e.error))?;
    // The rename is durable once the directory is synced.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("sync the directory", e))
}

/// Write `bytes` to `path` atomically, without the output rule's checks (for files a caller
/// makes for itself, such as test fixtures): a temporary file named [`TEMP_PREFIX`]… in the
/// directory of `path`, synced, renamed over `path`, then the directory synced.
///
/// # Errors
/// [`OutputError::Io`] when creating, writing, syncing or renaming fails (the old file, if any,
/// is then left as it was).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    replace_atomically(path, dir, path, TEMP_PREFIX, bytes)
}

/// The name prefix of the temporary files [`write_in_dir`] creates for `name` (what a cut
/// write of that file leaves behind; only its writer makes them).
pub fn temp_prefix_for(name: &str) -> String {
    format!("{TEMP_PREFIX}{name}.")
}

/// Write `bytes` to the file `name` in `dir`, under the stricter rule of a file that lives in
/// a directory ork owns (the prefix cache): nothing outside `dir` is ever written or created.
///
/// - `name` is one plain file name (no `/`, not `.` or `..`);
/// - no file yet, or a regular file: replaced atomically by a temporary file created in `dir`
///   (named [`temp_prefix_for`]`(name)`), synced and renamed;
/// - a symbolic link (dangling or not) is refused, never written through: its target may be
///   anywhere, and ork writes only inside `dir`;
/// - anything else (a directory, a device such as `/dev/null`, a FIFO, a socket) is refused,
///   naming what it is; one of `inputs`, a GGUF model or an `.orkpack` too, as for every output.
///
/// # Errors
/// [`OutputError::RefuseOverwrite`] for a link, an input, a model or a pack or a bad name;
/// [`OutputError::NotRegularFile`] for another kind of file; [`OutputError::Io`] when writing,
/// syncing or renaming fails (the old file, if any, is then left as it was).
pub fn write_in_dir(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    inputs: &[&Path],
) -> Result<(), OutputError> {
    let path = dir.join(name);
    check_in_dir(dir, name, inputs)?;
    replace_atomically(&path, dir, &path, &temp_prefix_for(name), bytes)
}

/// The bytes a write in `dir` may still use (`statvfs`: available blocks × fragment size),
/// after checking that a temporary file can be created there (removed at once).
///
/// # Errors
/// [`OutputError::Io`] naming `dir` when it is read-only, not writable by this user, or cannot be
/// examined.
pub fn dir_room(dir: &Path) -> Result<u64, OutputError> {
    let io = |op, e| OutputError::io(dir, op, e);
    tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .tempfile_in(dir)
        .map_err(|e| io("create a file in it", e))?;
    let st = rustix::fs::statvfs(dir).map_err(|e| io("statvfs", e.into()))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Apply [`write_in_dir`]'s rule to `dir`/`name` without writing anything.
///
/// # Errors
/// As [`write_in_dir`], but for writing.
pub fn check_in_dir(dir: &Path, name: &str, inputs: &[&Path]) -> Result<(), OutputError> {
    let path = dir.join(name);
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(refuse(&path, "not a plain file name"));
    }
    let meta = match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(OutputError::io(&path, "stat", e)),
        Ok(m) => m,
    };
    let ft = meta.file_type();
    if ft.is_symlink() {
        let to = std::fs::read_link(&path)
            .map(|t| format!(" (to {})", t.display()))
            .unwrap_or_default();
        return Err(refuse(
            &path,
            format!(
                "a symbolic link{to}: this file is only ever written inside {}, never through \
                 a link; remove the link",
                dir.display()
            ),
        ));
    }
    if !ft.is_file() {
        return Err(OutputError::NotRegularFile {
            path,
            kind: crate::describe_kind(ft),
        });
    }
    // A regular file: the rule every output follows (inputs, models and packs refused).
    destination(&path, inputs).map(drop)
}

/// Remove what writes cut by a crash or a power cut left in `dir`: every temporary file of
/// `name` (for a file whose only writer is the caller, so any there now is left over, whatever
/// its age), and other temporary files of ork's atomic writes ([`TEMP_PREFIX`]) older than ten
/// minutes (a live writer's is younger). Returns each file it tried to remove, with the result.
pub fn remove_stale_temporaries(
    dir: &Path,
    name: Option<&str>,
) -> Vec<(PathBuf, std::io::Result<()>)> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return removed;
    };
    let ours = name.map(temp_prefix_for);
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(TEMP_PREFIX) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(600));
        if old || ours.as_ref().is_some_and(|p| name.starts_with(p.as_str())) {
            removed.push((e.path(), std::fs::remove_file(e.path())));
        }
    }
    removed
}

fn refuse(path: &Path, reason: impl Into<String>) -> OutputError {
    OutputError::RefuseOverwrite {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn destination(path: &Path, inputs: &[&Path]) -> Result<Destination, OutputError> {
    let io = |op, e| OutputError::io(path, op, e);
    let Some(name) = path.file_name() else {
        return Err(refuse(path, "the path has no file name"));
    };
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            let dir = std::fs::canonicalize(parent).map_err(|e| io("resolve its directory", e))?;
            if !dir.is_dir() {
                return Err(OutputError::NotRegularFile {
                    path: parent.to_path_buf(),
                    kind: "not a directory",
                });
            }
            return Ok(Destination::File(dir.join(name)));
        }
        Err(e) => return Err(io("stat", e)),
        Ok(m) => m,
    };
    let meta = if meta.file_type().is_symlink() {
        match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(refuse(
                    path,
                    "a symbolic link to a file that does not exist",
                ))
            }
            Err(e) => return Err(io("stat", e)),
        }
    } else {
        meta
    };
    for input in inputs {
        if let Ok(m) = std::fs::metadata(input) {
            if (m.dev(), m.ino()) == (meta.dev(), meta.ino()) {
                return Err(refuse(
                    path,
                    format!("it is {} itself, an input of this command", input.display()),
                ));
            }
        }
    }
    let ft = meta.file_type();
    if ft.is_file() {
        let mut head = [0u8; 8];
        let n = read_head(path, &mut head).map_err(|e| io("read", e))?;
        for (magic, what) in PROTECTED_MAGICS {
            if n >= magic.len() && &head[..magic.len()] == magic {
                return Err(refuse(
                    path,
                    format!("it is {what}; ork never writes another output over one"),
                ));
            }
        }
        let real = std::fs::canonicalize(path).map_err(|e| io("resolve path", e))?;
        return Ok(Destination::File(real));
    }
    if ft.is_char_device() || ft.is_fifo() {
        // O_NONBLOCK: opening a FIFO with no reader fails with ENXIO at once instead of
        // blocking; the flag is then cleared so that writes wait for a slow reader.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(o_nonblock())
            .open(path)
            .map_err(|e| {
                if e.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error()) {
                    refuse(path, "a FIFO with no reader")
                } else {
                    io("open", e)
                }
            })?;
        let flags = rustix::fs::fcntl_getfl(&file).map_err(|e| io("fcntl", e.into()))?;
        rustix::fs::fcntl_setfl(&file, flags - rustix::fs::OFlags::NONBLOCK)
            .map_err(|e| io("fcntl", e.into()))?;
        return Ok(Destination::Stream(file));
    }
    Err(OutputError::NotRegularFile {
        path: path.to_path_buf(),
        kind: crate::describe_kind(ft),
    })
}

fn o_nonblock() -> i32 {
    rustix::fs::OFlags::NONBLOCK.bits() as i32
}

/// The first bytes of a regular file, opened without blocking.
fn read_head(path: &Path, head: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut file = crate::open_regular(path).map_err(|e| match e {
        crate::OpenRegularError::Io(e) => e,
        crate::OpenRegularError::NotRegular(kind) => {
            std::io::Error::other(format!("is {kind}, not a regular file"))
        }
    })?;
    let mut n = 0;
    while n < head.len() {
        match file.read(&mut head[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(r: Result<(), OutputError>) -> String {
        match r {
            Err(e) => e.to_string(),
            Ok(()) => panic!("accepted"),
        }
    }

    #[test]
    fn new_and_existing_plain_files_are_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("trace.json");
        write_output(&p, b"first", &[]).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"first");
        write_output(&p, b"second", &[]).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        // Nothing else is left in the directory (the temp file was renamed).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn models_packs_and_inputs_are_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"GGUF\x03\0\0\0rest").unwrap();
        let pack = dir.path().join("m.orkpack");
        std::fs::write(&pack, b"ORKPK01\0rest").unwrap();
        let notes = dir.path().join("notes.txt");
        std::fs::write(&notes, b"mine").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&model, &link).unwrap();
        let hard = dir.path().join("hard");
        std::fs::hard_link(&notes, &hard).unwrap();

        assert!(refused(write_output(&model, b"x", &[])).contains("a GGUF model"));
        assert!(refused(write_output(&pack, b"x", &[])).contains("an .orkpack"));
        assert!(refused(write_output(&link, b"x", &[])).contains("a GGUF model"));
        // An input under another name (a hard link) is refused even without a magic.
        assert!(refused(write_output(&hard, b"x", &[&notes])).contains("an input"));
        assert_eq!(std::fs::read(&model).unwrap(), b"GGUF\x03\0\0\0rest");
        assert_eq!(std::fs::read(&notes).unwrap(), b"mine");
        // Not an input: replaced.
        write_output(&notes, b"new", &[&model]).unwrap();
        assert_eq!(std::fs::read(&notes).unwrap(), b"new");
    }

    #[test]
    fn odd_paths_are_refused_naming_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        assert!(refused(check_output(dir.path(), &[])).contains("is a directory"));
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(refused(check_output(&dangling, &[])).contains("does not exist"));
        assert!(check_output(&dir.path().join("no/such/dir/f"), &[]).is_err());
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        // No reader: refused at once, not a hang.
        assert!(refused(check_output(&fifo, &[])).contains("no reader"));
        // A character device is a stream.
        write_output(Path::new("/dev/null"), b"x", &[]).unwrap();
    }

    #[test]
    fn a_file_in_an_owned_directory_is_never_written_through_a_link() {
        let root = tempfile::tempdir().unwrap();
        let (dir, out) = (root.path().join("dir"), root.path().join("out"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        let victim = out.join("victim.txt");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("cache")).unwrap();
        let e = refused(write_in_dir(&dir, "cache", b"16 MB of cache", &[]));
        assert!(
            e.contains("symbolic link") && e.contains("victim.txt"),
            "{e}"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // No temporary file anywhere, the link left as it was.
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        // A dangling link and a link to /dev/null: refused as well (never "written").
        std::fs::remove_file(dir.join("cache")).unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.join("cache")).unwrap();
        assert!(refused(write_in_dir(&dir, "cache", b"x", &[])).contains("symbolic link"));
        std::fs::remove_file(dir.join("cache")).unwrap();
        std::os::unix::fs::symlink(out.join("nowhere"), dir.join("cache")).unwrap();
        assert!(refused(write_in_dir(&dir, "cache", b"x", &[])).contains("symbolic link"));
        assert!(!out.join("nowhere").exists());
        // A directory in its place, a path instead of a name: refused.
        std::fs::remove_file(dir.join("cache")).unwrap();
        std::fs::create_dir(dir.join("cache")).unwrap();
        assert!(refused(write_in_dir(&dir, "cache", b"x", &[])).contains("directory"));
        assert!(refused(write_in_dir(&dir, "../out/victim.txt", b"x", &[])).contains("name"));
        // A plain file: replaced, by a temporary file in the directory, nothing left over.
        std::fs::remove_dir(dir.join("cache")).unwrap();
        write_in_dir(&dir, "cache", b"one", &[]).unwrap();
        write_in_dir(&dir, "cache", b"two", &[]).unwrap();
        assert_eq!(std::fs::read(dir.join("cache")).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        // A model is never replaced.
        std::fs::write(dir.join("m"), b"GGUF\x03\0\0\0").unwrap();
        assert!(refused(write_in_dir(&dir, "m", b"x", &[])).contains("GGUF"));
    }

    #[test]
    fn stale_temporaries_are_those_of_the_name_or_older_than_ten_minutes() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join(format!("{}cut1", temp_prefix_for("cache")));
        let old = dir.path().join(format!("{TEMP_PREFIX}old"));
        let live = dir.path().join(format!("{TEMP_PREFIX}live"));
        let other = dir.path().join("cache");
        for p in [&ours, &old, &live, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        std::fs::File::options()
            .write(true)
            .open(&other)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        let mut removed: Vec<PathBuf> = remove_stale_temporaries(dir.path(), Some("cache"))
            .into_iter()
            .map(|(p, r)| {
                r.unwrap();
                p
            })
            .collect();
        removed.sort();
        let mut expected = vec![ours.clone(), old.clone()];
        expected.sort();
        assert_eq!(removed, expected);
        assert!(live.exists() && other.exists());
    }
}
