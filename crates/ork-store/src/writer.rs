//! [`OrkpackWriter`]: streams entries into a temp file beside the target and publishes it with
//! an atomic rename.
//!
//! Crash safety:
//! - the target is only ever replaced by `rename(2)` of a complete, fsynced file, followed by an
//!   fsync of the directory; readers see the old file or the new one, never a partial one;
//! - dropping an unfinished writer deletes its temp file;
//! - SIGINT / SIGTERM: the first writer installs (once per process) a signal-hook listener thread;
//!   on either signal it deletes every live temp file of the process, then re-raises the signal
//!   with its default disposition, so the process still dies of it (exit status 130 for SIGINT
//!   in a shell). An application that handles these signals itself (a server that drains)
//!   calls [`leave_signals_to_application`] once its handlers are installed;
//! - kill -9 cannot be caught: the temp file stays, and the next writer for the same target
//!   removes temps whose owning process (the pid in the name) no longer exists.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::checksum::xxh3;
use ork_io::temp::{install_signal_cleanup, remove_stale_temps, Temp};
use ork_pack::{LayoutId, PackedWeight};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;

use crate::format::{
    align_up, EntryRecord, FileHeader, Footer, FOOTER_LEN, HEADER_LEN, MAGIC, MAX_DIM, MAX_ENTRIES,
    MAX_GROUP, MAX_NAME_LEN, PAGE, VERSION,
};
use crate::reader::{Entry, ModelIdentity, Orkpack, SourceInfo};
use crate::StoreError;

pub use ork_io::temp::leave_signals_to_application;

/// Name prefix of the writers' temp files: `.orkpack-tmp.` (then `<pid>.<random>`). Short and
/// independent of the target's name, so a target whose name is near the file-name limit (255
/// bytes) still gets a temp file in its directory.
const TEMP_PREFIX: &str = ".orkpack-tmp.";

fn temp_prefix() -> OsString {
    OsString::from(TEMP_PREFIX)
}

/// Streams packed weights into a new `.orkpack` file. Entries are written one by one as they
/// are added (no blob is held in memory); [`OrkpackWriter::finish`] writes index and footer and
/// atomically replaces the target. Dropping the writer before `finish` deletes the temp file and
/// leaves the target untouched.
pub struct OrkpackWriter {
    /// The target as given (for messages).
    target: PathBuf,
    /// The file the rename replaces ([`crate::resolve_target`]: symlinks written through).
    dest: PathBuf,
    // Field order = drop order: the buffered file is closed before its temp path is deleted.
    out: BufWriter<File>,
    temp: Temp,
    pos: u64,
    records: Vec<(EntryRecord, String)>,
    names: HashSet<String>,
    identity: Option<ModelIdentity>,
    /// The target chip's name for the header (zeros: none).
    target_chip: [u8; 8],
    /// The smoothing section's bytes, written after the entries (`None`: none).
    smoothing: Option<Vec<u8>>,
    /// Set by a failed write: the file's contents no longer match `pos`, so every later
    /// `add` / `finish` is refused.
    broken: bool,
}

impl std::fmt::Debug for OrkpackWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrkpackWriter")
            .field("target", &self.target)
            .field("temp", &self.temp.pending())
            .field("bytes", &self.pos)
            .field("entries", &self.records.len())
            .finish()
    }
}

const ZEROS: [u8; PAGE as usize] = [0; PAGE as usize];

impl OrkpackWriter {
    /// Start writing a new file that will replace `target` on [`OrkpackWriter::finish`].
    ///
    /// `target` must be allowed to be replaced ([`crate::resolve_target`]: no file, an empty
    /// file, or a regular file carrying the `.orkpack` magic; a symlink is written through);
    /// otherwise nothing is created and the error says why. The temp file
    /// `.orkpack-tmp.<pid>.<random>` is created in the directory of the file being replaced;
    /// stale temps of dead processes there are removed first.
    pub fn create(target: &Path) -> Result<OrkpackWriter, StoreError> {
        let dest = crate::resolve_target(target, None)?.path;
        let prefix = temp_prefix();
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        install_signal_cleanup().map_err(|e| {
            StoreError::io(target, "install signal cleanup", std::io::Error::other(e))
        })?;
        remove_stale_temps(&dir, &prefix);
        let mut full_prefix = prefix;
        full_prefix.push(format!("{}.", std::process::id()));
        let (file, temp) = Temp::create_in(&dir, &full_prefix)
            .map_err(|e| StoreError::io(target, "create temp file", e))?;
        let mut w = OrkpackWriter {
            target: target.to_path_buf(),
            dest,
            out: BufWriter::with_capacity(1 << 20, file),
            temp,
            pos: 0,
            records: Vec::new(),
            names: HashSet::new(),
            identity: None,
            target_chip: [0; 8],
            smoothing: None,
            broken: false,
        };
        // Header page placeholder; the real header is written by `finish`.
        w.write(&ZEROS)?;
        Ok(w)
    }

    /// The temp file being written.
    pub fn temp_path(&self) -> &Path {
        self.temp.path()
    }

    /// Record the chip the pack is made for in the header (`ensure` rebuilds a pack made for
    /// another chip). The name is lower-case ASCII letters and digits, at most 8 bytes.
    ///
    /// # Errors
    /// [`StoreError::InvalidEntry`] (naming the header) for any other name.
    pub fn set_target(&mut self, chip: &str) -> Result<(), StoreError> {
        let ok = !chip.is_empty()
            && chip.len() <= 8
            && chip
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !ok {
            return Err(self.invalid(
                "(header)",
                format!("target chip '{chip}': 1..=8 lower-case letters and digits"),
            ));
        }
        self.target_chip = [0; 8];
        self.target_chip[..chip.len()].copy_from_slice(chip.as_bytes());
        Ok(())
    }

    /// Record what the entries were smoothed with (the smoothing section, `docs/orkpack.md`).
    ///
    /// # Errors
    /// [`StoreError::InvalidEntry`] (naming the smoothing section) for an empty or ragged set
    /// of factors, or one that is not finite and positive.
    pub fn set_smoothing(&mut self, smoothing: &crate::PackSmoothing) -> Result<(), StoreError> {
        let bytes = smoothing
            .encode()
            .map_err(|what| self.invalid("(smoothing)", what))?;
        self.smoothing = Some(bytes);
        Ok(())
    }

    /// Record the identity of the source model in the header (informational).
    pub fn set_model_identity(&mut self, identity: ModelIdentity) {
        self.identity = Some(identity);
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        if self.broken {
            return Err(StoreError::io(
                &self.target,
                "write",
                std::io::Error::other("an earlier write to the temp file failed"),
            ));
        }
        if let Err(e) = self.out.write_all(bytes) {
            self.broken = true;
            return Err(StoreError::io(&self.target, "write", e));
        }
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, align: u64) -> Result<(), StoreError> {
        let to = align_up(self.pos, align).expect("file offsets are far below u64::MAX");
        while self.pos < to {
            let n = (to - self.pos).min(PAGE) as usize;
            self.write(&ZEROS[..n])?;
        }
        Ok(())
    }

    fn invalid(&self, tensor: &str, reason: impl Into<String>) -> StoreError {
        StoreError::InvalidEntry {
            path: self.target.clone(),
            tensor: tensor.to_string(),
            reason: reason.into(),
        }
    }

    /// Check an entry's name and geometry before anything is written.
    fn admit(&self, name: &str, w: &PackedWeight) -> Result<(), StoreError> {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(self.invalid(
                name,
                format!("name length {} (1..={MAX_NAME_LEN})", name.len()),
            ));
        }
        if self.names.contains(name) {
            return Err(self.invalid(name, "duplicate name"));
        }
        if self.records.len() >= MAX_ENTRIES as usize {
            return Err(self.invalid(name, format!("more than {MAX_ENTRIES} entries")));
        }
        let l = w.layout;
        if l.k == 0 || l.n == 0 || l.k as u64 > MAX_DIM || l.n as u64 > MAX_DIM {
            return Err(self.invalid(
                name,
                format!("shape k={} n={} (each 1..={MAX_DIM})", l.k, l.n),
            ));
        }
        if w.data.len() != l.blob_bytes() {
            return Err(self.invalid(
                name,
                format!(
                    "blob of {} bytes, layout needs {}",
                    w.data.len(),
                    l.blob_bytes()
                ),
            ));
        }
        if let Some(g) = w.group.size() {
            let affine_not_int4 = w.group.is_affine() && l.dtype != ork_pack::PackDtype::I4;
            if l.dtype == ork_pack::PackDtype::F16 || g > MAX_GROUP || affine_not_int4 {
                return Err(self.invalid(
                    name,
                    format!(
                        "scale group {} on {} (int8 / int4, affine int4 only, at most \
                         {MAX_GROUP})",
                        w.group.name(),
                        l.dtype.name()
                    ),
                ));
            }
        }
        let want = w
            .group
            .scales_len(l.k, l.n)
            .map_err(|e| self.invalid(name, e.to_string()))?;
        if w.scales.len() != want {
            return Err(self.invalid(
                name,
                format!(
                    "{} scales for n={} with {} scales",
                    w.scales.len(),
                    l.n,
                    w.group.name()
                ),
            ));
        }
        Ok(())
    }

    /// Append one packed weight in the RK3588 native layout, tagged with its source.
    pub fn add(
        &mut self,
        name: &str,
        w: &PackedWeight,
        source: SourceInfo,
    ) -> Result<(), StoreError> {
        self.admit(name, w)?;
        let scale_bytes: Vec<u8> = w.scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        self.append(
            name,
            w.layout,
            LayoutId::Rk3588NativeB,
            source,
            &w.data,
            xxh3(&w.data),
            &scale_bytes,
            w.group,
        )
    }

    /// Copy an entry of another pack verbatim (used when rewriting a cache: valid entries are
    /// carried over, not repacked). Blob and scales are verified against their checksums first;
    /// a mismatch is refused as [`StoreError::CorruptBlob`] and nothing is written.
    pub fn copy_entry(&mut self, from: &Orkpack, e: &Entry) -> Result<(), StoreError> {
        from.verify(e)?;
        let name = e.name();
        if self.names.contains(name) {
            return Err(self.invalid(name, "duplicate name"));
        }
        let scale_bytes: Vec<u8> = from
            .scales(e)?
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect();
        self.append(
            name,
            e.layout(),
            e.layout_id(),
            e.source(),
            from.blob(e),
            e.blob_checksum(),
            &scale_bytes,
            e.group(),
        )?;
        // Cut short while being copied: the bytes written may be zeros; refuse the entry (the
        // caller repacks it).
        if let Err(err) = from.check_intact(e, "blob") {
            self.broken = true;
            return Err(err);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn append(
        &mut self,
        name: &str,
        layout: ork_pack::TiledLayout,
        layout_id: LayoutId,
        source: SourceInfo,
        blob: &[u8],
        blob_checksum: u64,
        scale_bytes: &[u8],
        group: ork_pack::ScaleGroup,
    ) -> Result<(), StoreError> {
        self.pad_to(PAGE)?;
        let blob_offset = self.pos;
        self.write(blob)?;
        let scale_offset = self.pos; // blob sizes are multiples of 512: 4-aligned
        debug_assert_eq!(scale_offset % 4, 0);
        self.write(scale_bytes)?;
        let rec = EntryRecord {
            name_len: U16::new(name.len() as u16),
            dtype: layout.dtype as u8,
            layout: layout_id as u8,
            source_type: U32::new(source.ggml_type),
            k: U64::new(layout.k as u64),
            n: U64::new(layout.n as u64),
            blob_offset: U64::new(blob_offset),
            blob_size: U64::new(blob.len() as u64),
            scale_offset: U64::new(scale_offset),
            scale_size: U64::new(scale_bytes.len() as u64),
            blob_checksum: U64::new(blob_checksum),
            scale_checksum: U64::new(xxh3(scale_bytes)),
            source_fingerprint: U64::new(source.fingerprint),
            // Admitted groups are at most MAX_GROUP.
            group: U32::new(group.size().unwrap_or(0) as u32),
            group_kind: if group.is_affine() {
                crate::format::GROUP_AFFINE
            } else {
                crate::format::GROUP_SYMMETRIC
            },
            reserved: [0; 3],
        };
        self.names.insert(name.to_string());
        self.records.push((rec, name.to_string()));
        Ok(())
    }

    /// Number of entries added so far.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no entry was added yet.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Write index, footer and header, fsync the file, rename it over the target and fsync the
    /// directory. On an error before the rename the temp file is removed and the target is left
    /// as it was; if only the final directory fsync fails (op "fsync directory"), the new file is
    /// in place but the rename may not survive a power loss.
    pub fn finish(mut self) -> Result<(), StoreError> {
        self.pad_to(8)?;
        let smoothing_offset = match self.smoothing.take() {
            Some(bytes) => {
                let at = self.pos;
                self.write(&bytes)?;
                self.pad_to(8)?;
                at
            }
            None => 0,
        };
        let index_offset = self.pos;
        let mut index = Vec::with_capacity(self.records.len() * 128);
        for (rec, name) in &self.records {
            index.extend_from_slice(rec.as_bytes());
            index.extend_from_slice(name.as_bytes());
            index.resize(align_up(index.len() as u64, 8).expect("small") as usize, 0);
        }
        let records = std::mem::take(&mut self.records);
        self.write(&index)?;
        let mut footer = Footer {
            index_offset: U64::new(index_offset),
            index_size: U64::new(index.len() as u64),
            index_checksum: U64::new(xxh3(&index)),
            entry_count: U32::new(records.len() as u32),
            version: U32::new(VERSION),
            required_flags: U32::new(0),
            smoothing_offset: U64::new(smoothing_offset),
            reserved: [0; 4],
            checksum: U64::new(0),
            magic: MAGIC,
        };
        footer.checksum = U64::new(xxh3(footer.checksum_input()));
        self.write(footer.as_bytes())?;
        debug_assert_eq!(FOOTER_LEN, footer.as_bytes().len());
        let id = self.identity.unwrap_or(ModelIdentity {
            file_len: 0,
            fingerprint: 0,
        });
        let mut header = FileHeader {
            magic: MAGIC,
            version: U32::new(VERSION),
            required_flags: U32::new(0),
            optional_flags: U32::new(if smoothing_offset != 0 {
                crate::OPT_SMOOTHING
            } else {
                0
            }),
            page_size: U32::new(PAGE as u32),
            file_len: U64::new(self.pos),
            model_len: U64::new(id.file_len),
            model_fingerprint: U64::new(id.fingerprint),
            target: self.target_chip,
            checksum: U64::new(0),
        };
        header.checksum = U64::new(xxh3(header.checksum_input()));
        debug_assert_eq!(HEADER_LEN, header.as_bytes().len());

        let target = self.target.clone();
        let dest = self.dest.clone();
        let t = &target;
        let io = |op: &'static str| move |e| StoreError::io(t, op, e);
        self.out.flush().map_err(io("write"))?;
        let file = self.out.get_ref();
        file.write_all_at(header.as_bytes(), 0)
            .map_err(io("write header"))?;
        file.sync_all().map_err(io("fsync"))?;
        let OrkpackWriter { temp, out, .. } = self;
        drop(out);
        temp.publish(&dest)
            .map_err(io("rename temp file over target"))?;
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StoreError::io(dir, "fsync directory", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::Xxh3Stream;
    use crate::reader::copy_and_hash;

    /// Hash all of `bytes` through the streaming hasher in odd-sized pieces.
    fn streamed_hash(bytes: &[u8]) -> u64 {
        let mut h = Xxh3Stream::new();
        for c in bytes.chunks(1000) {
            h.update(c);
        }
        h.digest()
    }

    #[test]
    fn streamed_and_oneshot_checksums_agree() {
        let data: Vec<u8> = (0..1_000_003u32)
            .map(|i| i.wrapping_mul(2654435761) as u8)
            .collect();
        assert_eq!(streamed_hash(&data), xxh3(&data));
        let mut dst = vec![0u8; data.len()];
        assert_eq!(copy_and_hash(&data, &mut dst), xxh3(&data));
        assert_eq!(dst, data);
    }

    #[test]
    fn temp_names_are_short_whatever_the_target() {
        let dir = tempfile::tempdir().unwrap();
        // 250 bytes: the old `.NAME.tmp.<pid>.<random>` temp name would exceed NAME_MAX.
        let target = dir.path().join(format!("{}.orkpack", "x".repeat(242)));
        let w = OrkpackWriter::create(&target).unwrap();
        assert!(w.temp_path().file_name().unwrap().len() < 40);
        assert_eq!(
            w.temp_path().parent(),
            Some(&*std::fs::canonicalize(dir.path()).unwrap())
        );
    }
}
