//! [`Orkpack`]: a validated, memory-mapped `.orkpack` file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::checksum::{xxh3, Xxh3Stream};
use ork_pack::{LayoutId, PackDtype, PackedWeight, ScaleGroup, TiledLayout};
use zerocopy::FromBytes;

use crate::format::{
    align_up, Cursor, EntryRecord, FileHeader, Footer, FOOTER_LEN, GROUP_AFFINE, GROUP_SYMMETRIC,
    HEADER_LEN, KNOWN_REQUIRED_FLAGS, MAGIC, MAX_DIM, MAX_ENTRIES, MAX_GROUP, MAX_NAME_LEN, PAGE,
    RECORD_LEN, VERSION,
};
use crate::map::ReadMap;
use crate::StoreError;
use ork_io::GuardedMap;

/// Where an entry's weight came from: the staleness key stored beside every blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SourceInfo {
    /// [`crate::fingerprint`] of the source tensor.
    pub fingerprint: u64,
    /// ggml type id of the source tensor (`GgmlType::id`).
    pub ggml_type: u32,
}

/// Identity of the model file a pack was built from. Informational: staleness is decided per
/// entry, never from this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelIdentity {
    /// Byte length of the model file.
    pub file_len: u64,
    /// A fingerprint of the model file (see [`crate::model_identity`]).
    pub fingerprint: u64,
}

/// One tensor's entry in an open [`Orkpack`]. Obtained from [`Orkpack::entry`] or
/// [`Orkpack::entries`]; only valid with the pack it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    name: String,
    layout: TiledLayout,
    layout_id: LayoutId,
    source: SourceInfo,
    blob_offset: u64,
    blob_size: u64,
    scale_offset: u64,
    scale_size: u64,
    blob_checksum: u64,
    scale_checksum: u64,
    group: ScaleGroup,
    pack_id: u64,
    index: usize,
}

impl Entry {
    /// Tensor name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Geometry and dtype of the packed weight.
    pub fn layout(&self) -> TiledLayout {
        self.layout
    }
    /// Tiled layout of the blob.
    pub fn layout_id(&self) -> LayoutId {
        self.layout_id
    }
    /// The source tensor's staleness key.
    pub fn source(&self) -> SourceInfo {
        self.source
    }
    /// Absolute offset and byte length of the blob (offset a multiple of 4096).
    pub fn blob_range(&self) -> (u64, u64) {
        (self.blob_offset, self.blob_size)
    }
    /// Absolute offset and byte length of the scales.
    pub fn scale_range(&self) -> (u64, u64) {
        (self.scale_offset, self.scale_size)
    }
    /// xxh3-64 of the blob.
    pub fn blob_checksum(&self) -> u64 {
        self.blob_checksum
    }
    /// xxh3-64 of the scale bytes.
    pub fn scale_checksum(&self) -> u64 {
        self.scale_checksum
    }
    /// How the scales cover K: per output channel, or per group of `g` consecutive k
    /// (`N · K/g` scales, order `[N][K/g]`).
    pub fn group(&self) -> ScaleGroup {
        self.group
    }
}

/// An open `.orkpack` file: mapped, with footer, index and every entry's geometry validated.
/// Blob contents are verified against their checksums when loaded (see [`Orkpack::load_into`]).
pub struct Orkpack {
    path: PathBuf,
    /// The bytes; a mapping reports (`intact`) whether the file was cut short under it, so a
    /// file cut short in place while open gives an error naming the tensor instead of SIGBUS.
    map: ReadMap,
    identity: Option<ModelIdentity>,
    target: Option<String>,
    smoothing: Option<crate::PackSmoothing>,
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
    /// Per entry: its blob matched its checksum in a load made while the file was unchanged
    /// since it was mapped (see [`Orkpack::load_into`]).
    verified: Box<[AtomicBool]>,
    id: u64,
}

impl std::fmt::Debug for Orkpack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orkpack")
            .field("path", &self.path)
            .field("len", &self.map.bytes().len())
            .field("entries", &self.entries.len())
            .field("identity", &self.identity)
            .finish()
    }
}

/// Source of the per-open identity that ties an [`Entry`] to its [`Orkpack`].
static NEXT_PACK_ID: AtomicU64 = AtomicU64::new(1);

/// Copy-and-hash granularity: the chunk just copied is hashed while it is still in L1, so the
/// source is read from memory once and the hash overlaps the copy's memory stalls. Measured on
/// a 28 MB blob (x86-64, AVX2 hash, busy 2-core host): 4 KiB chunks reach 0.86–0.94 of
/// memcpy, 16 KiB 0.7–0.9, 256 KiB ~0.7.
const CHUNK: usize = 4 * 1024;

impl Orkpack {
    /// Map and validate an `.orkpack` file: magic, version, flags, header/footer/index checksums,
    /// and every entry's bounds, alignment and sizes (against `TiledLayout::blob_bytes`).
    ///
    /// Only a regular file is opened: a FIFO, device or directory is refused with
    /// [`StoreError::NotRegularFile`] without blocking.
    pub fn open(path: &Path) -> Result<Orkpack, StoreError> {
        let file = ork_io::open_regular(path).map_err(|e| match e {
            ork_io::OpenRegularError::NotRegular(kind) => StoreError::NotRegularFile {
                path: path.to_path_buf(),
                kind,
            },
            ork_io::OpenRegularError::Io(e) => StoreError::io(path, "open", e),
            _ => StoreError::io(path, "open", std::io::Error::other("cannot open")),
        })?;
        let map = GuardedMap::new(file).map_err(|e| StoreError::io(path, "mmap", e))?;
        let pack = Orkpack::from_map(path.to_path_buf(), ReadMap::Mapped(map))?;
        // Cut short while being validated: the zeros read would have failed a checksum; say so.
        pack.map
            .intact()
            .map_err(|e| StoreError::io(path, "read", e))?;
        Ok(pack)
    }

    /// Validate an `.orkpack` image held in memory (fixtures, fuzzing), with the same checks as
    /// [`Orkpack::open`]. `label` stands in for the path in errors and in [`Orkpack::path`].
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Orkpack, StoreError> {
        Orkpack::from_map(label.into(), ReadMap::Owned(bytes))
    }

    fn from_map(path: PathBuf, map: ReadMap) -> Result<Orkpack, StoreError> {
        let parsed = parse(&path, map.bytes())?;
        let id = NEXT_PACK_ID.fetch_add(1, Ordering::Relaxed);
        let mut entries = parsed.entries;
        let mut by_name = HashMap::with_capacity(entries.len());
        for (i, e) in entries.iter_mut().enumerate() {
            e.pack_id = id;
            e.index = i;
            by_name.insert(e.name.clone(), i);
        }
        let verified = entries.iter().map(|_| AtomicBool::new(false)).collect();
        Ok(Orkpack {
            path,
            map,
            identity: parsed.identity,
            target: parsed.target,
            smoothing: parsed.smoothing,
            entries,
            by_name,
            verified,
            id,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The model identity recorded by the writer, if any.
    pub fn model_identity(&self) -> Option<ModelIdentity> {
        self.identity
    }

    /// The chip the pack was made for, as the writer recorded it (`None`: not recorded).
    pub fn target(&self) -> Option<&str> {
        self.target.as_deref()
    }

    /// What the entries were smoothed with, from the smoothing section (`None`: no section).
    pub fn smoothing(&self) -> Option<&crate::PackSmoothing> {
        self.smoothing.as_ref()
    }

    /// All entries in file order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// An entry by tensor name, O(1).
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.by_name.get(name).map(|&i| &self.entries[i])
    }

    /// The validated copy of `e` held by this pack.
    ///
    /// # Panics
    /// If `e` came from another [`Orkpack`] (a programming error, like indexing with a key of
    /// another map).
    fn own(&self, e: &Entry) -> &Entry {
        assert_eq!(
            e.pack_id,
            self.id,
            "entry '{}' belongs to another Orkpack than {}",
            e.name,
            self.path.display()
        );
        &self.entries[e.index]
    }

    /// The blob's bytes, borrowed from the map (page-aligned in the file; not verified — use
    /// [`Orkpack::verify`] or [`Orkpack::load_into`]).
    ///
    /// # Panics
    /// If `e` came from another [`Orkpack`].
    pub fn blob(&self, e: &Entry) -> &[u8] {
        let e = self.own(e);
        // Bounds were validated on open.
        &self.map.bytes()[e.blob_offset as usize..(e.blob_offset + e.blob_size) as usize]
    }

    /// The raw little-endian scale bytes (not verified).
    fn scale_bytes(&self, e: &Entry) -> &[u8] {
        let e = self.own(e);
        &self.map.bytes()[e.scale_offset as usize..(e.scale_offset + e.scale_size) as usize]
    }

    /// Copy the blob into `dst` (exactly `blob_size` bytes). With `verify` (the normal case) the
    /// bytes are hashed while being copied, in cache-sized chunks, and a mismatch is refused with
    /// [`StoreError::CorruptBlob`] naming file and tensor (`dst` then holds unverified bytes).
    ///
    /// A blob is hashed only until it has once matched its checksum: a later load of the same
    /// entry is a plain copy as long as the file has neither been cut short nor written to
    /// (its modification time, one `fstat` before and one after the copy) since it was mapped.
    /// A file written to in place is hashed on every load from then on. Streaming reloads the
    /// same weights every token, and the hash was about a third of a load.
    pub fn load_into(&self, e: &Entry, dst: &mut [u8], verify: bool) -> Result<(), StoreError> {
        let e = self.own(e);
        if dst.len() as u64 != e.blob_size {
            return Err(StoreError::BufferSize {
                path: self.path.clone(),
                tensor: e.name.clone(),
                expected: e.blob_size,
                actual: dst.len() as u64,
            });
        }
        let verified = &self.verified[e.index];
        let trusted = verify && verified.load(Ordering::Acquire);
        let (got, unchanged) =
            self.read_range(e, "blob", e.blob_offset, dst, verify && !trusted)?;
        if !verify {
            return Ok(());
        }
        if trusted {
            // Copied unhashed: good if the file did not change around the copy, else check now.
            if unchanged || xxh3(dst) == e.blob_checksum {
                return Ok(());
            }
            return Err(self.corrupt(e, "blob checksum"));
        }
        if got != e.blob_checksum {
            return Err(self.corrupt(e, "blob checksum"));
        }
        if unchanged {
            verified.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Copy `dst.len()` bytes at `offset` of entry `e` out of the map, hashing them chunk by
    /// chunk as they land when `hash` is set (the hash is 0 otherwise). A file that no longer
    /// covers the range is refused with [`StoreError::BlobUnreadable`]; the `bool` says whether
    /// the file was unchanged since it was mapped (`GuardedMap::unchanged`) before and after the
    /// copy.
    fn read_range(
        &self,
        e: &Entry,
        what: &'static str,
        offset: u64,
        dst: &mut [u8],
        hash: bool,
    ) -> Result<(u64, bool), StoreError> {
        let end = offset + dst.len() as u64;
        // A file cut short in place by another program does not fault here: vanished pages
        // read as zeros (`GuardedMap`), and `intact` — checked before, so nothing is copied in
        // vain, and after, so nothing read during the cut is trusted — reports it.
        let check = || {
            self.map
                .unchanged()
                .map_err(|source| self.unreadable(e, what, source))
        };
        let before = check()?;
        let src = &self.map.bytes()[offset as usize..end as usize];
        let h = if hash {
            copy_and_hash(src, dst)
        } else {
            dst.copy_from_slice(src);
            0
        };
        let after = check()?;
        Ok((h, before && after))
    }

    /// `Ok` if every byte read from the file so far was the file's (it was not cut short while
    /// open); otherwise [`StoreError::BlobUnreadable`] for `e`.
    pub(crate) fn check_intact(&self, e: &Entry, what: &'static str) -> Result<(), StoreError> {
        self.map
            .intact()
            .map_err(|source| self.unreadable(e, what, source))
    }

    fn unreadable(&self, e: &Entry, what: &'static str, source: std::io::Error) -> StoreError {
        StoreError::BlobUnreadable {
            path: self.path.clone(),
            tensor: e.name.clone(),
            what,
            source,
        }
    }

    /// Check an entry's blob and scales against their checksums without copying.
    ///
    /// Also checks that the scales are finite and within ±[`ork_pack::MAX_SCALE`]: a NaN,
    /// infinite or huge scale with a valid checksum (a file written by another tool, or damaged
    /// before it was checksummed) is refused as [`StoreError::CorruptBlob`] naming the tensor.
    pub fn verify(&self, e: &Entry) -> Result<(), StoreError> {
        let e = self.own(e);
        let blob_ok = xxh3(self.blob(e)) == e.blob_checksum;
        self.map
            .intact()
            .map_err(|source| self.unreadable(e, "blob", source))?;
        if !blob_ok {
            return Err(self.corrupt(e, "blob checksum"));
        }
        let scales = self.scale_bytes(e);
        let scales_ok = xxh3(scales) == e.scale_checksum;
        self.map
            .intact()
            .map_err(|source| self.unreadable(e, "scales", source))?;
        if !scales_ok {
            return Err(self.corrupt(e, "scale checksum"));
        }
        let values: Vec<f32> = scales
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        self.check_scale_values(e, &values)
    }

    /// The entry's scales (per output channel, or `[N][K/g]` per group; [`Entry::group`]), verified against their checksum.
    pub fn scales(&self, e: &Entry) -> Result<Vec<f32>, StoreError> {
        let e = self.own(e);
        let mut bytes = vec![0u8; e.scale_size as usize];
        if self
            .read_range(e, "scales", e.scale_offset, &mut bytes, true)?
            .0
            != e.scale_checksum
        {
            return Err(self.corrupt(e, "scale checksum"));
        }
        let scales: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        self.check_scale_values(e, &scales)?;
        Ok(scales)
    }

    /// Refuse scales no packer writes: not finite, or beyond ±[`ork_pack::MAX_SCALE`] (a scale
    /// of 3e38 with a recomputed checksum makes every activation infinite). Cheap: one pass
    /// over the scales, which are 1/32 of the blob or less.
    fn check_scale_values(&self, e: &Entry, scales: &[f32]) -> Result<(), StoreError> {
        match ork_pack::bad_scale(scales) {
            None => Ok(()),
            Some((i, s)) => Err(self.corrupt(
                e,
                &format!(
                    "scale {i} is {s:e} (not finite or beyond ±{}, which no packer writes)",
                    ork_pack::MAX_SCALE
                ),
            )),
        }
    }

    /// Load a whole packed weight by name (blob verified when `verify`, scales always).
    pub fn load(&self, name: &str, verify: bool) -> Result<PackedWeight, StoreError> {
        let e = self.entry(name).ok_or_else(|| StoreError::MissingEntry {
            path: self.path.clone(),
            tensor: name.to_string(),
        })?;
        let mut data = vec![0u8; e.blob_size as usize];
        self.load_into(e, &mut data, verify)?;
        let scales = self.scales(e)?;
        Ok(PackedWeight {
            layout: e.layout,
            data,
            scales,
            group: e.group,
        })
    }

    fn corrupt(&self, e: &Entry, what: &str) -> StoreError {
        StoreError::CorruptBlob {
            path: self.path.clone(),
            tensor: e.name.clone(),
            what: what.to_string(),
        }
    }
}

/// Copy `src` into `dst` (same length) chunk by chunk, hashing each chunk right after copying
/// it, while it is still in cache. Returns the xxh3-64 of all of `src`.
pub(crate) fn copy_and_hash(src: &[u8], dst: &mut [u8]) -> u64 {
    let mut h = Xxh3Stream::new();
    for (s, d) in src.chunks(CHUNK).zip(dst.chunks_mut(CHUNK)) {
        d.copy_from_slice(s);
        h.update(d);
    }
    h.digest()
}

/// What [`parse`] extracts from a file.
struct Parsed {
    identity: Option<ModelIdentity>,
    target: Option<String>,
    smoothing: Option<crate::PackSmoothing>,
    entries: Vec<Entry>,
}

fn corrupt_index(path: &Path, offset: u64, what: impl Into<String>) -> StoreError {
    StoreError::CorruptIndex {
        path: path.to_path_buf(),
        offset,
        what: what.into(),
    }
}

/// Validate the whole structure of a mapped file.
fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed, StoreError> {
    let header = read_header(path, bytes)?;
    let identity =
        (header.model_fingerprint.get() != 0 || header.model_len.get() != 0).then(|| {
            ModelIdentity {
                file_len: header.model_len.get(),
                fingerprint: header.model_fingerprint.get(),
            }
        });
    let target = target_name(&header.target)
        .map_err(|what| corrupt_index(path, 48, format!("target chip: {what}")))?;
    let (footer, footer_at) = read_footer(path, bytes, &header)?;
    let index_offset = footer.index_offset.get();
    let index = &bytes[index_offset as usize..footer_at as usize];
    let entries = read_entries(path, index, index_offset, footer.entry_count.get())?;
    check_no_overlap(path, &entries)?;
    let smoothing = read_smoothing(path, bytes, &header, &footer, footer_at, &entries)?;
    Ok(Parsed {
        identity,
        target,
        smoothing,
        entries,
    })
}

/// Read and check the header: magic, then version, then checksum, then flags — in that order, so
/// a file of another version is reported as such even though its checksum scheme may differ —
/// then the page size and the file length it records against the file's.
fn read_header(path: &Path, bytes: &[u8]) -> Result<FileHeader, StoreError> {
    let actual = bytes.len() as u64;
    let Some(head) = bytes.get(..HEADER_LEN) else {
        let n = bytes.len().min(MAGIC.len());
        if bytes[..n] != MAGIC[..n] {
            let mut found = [0u8; 8];
            found[..n].copy_from_slice(&bytes[..n]);
            return Err(StoreError::BadMagic {
                path: path.to_path_buf(),
                found,
            });
        }
        return Err(StoreError::Truncated {
            path: path.to_path_buf(),
            expected: PAGE + FOOTER_LEN as u64,
            actual,
        });
    };
    let header = FileHeader::read_from_bytes(head).expect("slice has the header's exact length");
    if header.magic != MAGIC {
        return Err(StoreError::BadMagic {
            path: path.to_path_buf(),
            found: header.magic,
        });
    }
    if header.version.get() != VERSION {
        return Err(StoreError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: header.version.get(),
            supported: VERSION,
        });
    }
    if xxh3(header.checksum_input()) != header.checksum.get() {
        return Err(corrupt_index(path, 56, "header checksum mismatch"));
    }
    let unknown = header.required_flags.get() & !KNOWN_REQUIRED_FLAGS;
    if unknown != 0 {
        return Err(StoreError::UnsupportedFlags {
            path: path.to_path_buf(),
            flags: unknown,
        });
    }
    if u64::from(header.page_size.get()) != PAGE {
        return Err(corrupt_index(
            path,
            20,
            format!("page size {} (expected {PAGE})", header.page_size.get()),
        ));
    }
    check_file_len(path, header.file_len.get(), actual)?;
    Ok(header)
}

/// The header's file length must be the file's, and leave room for the header page and footer.
fn check_file_len(path: &Path, file_len: u64, actual: u64) -> Result<(), StoreError> {
    if actual < file_len {
        return Err(StoreError::Truncated {
            path: path.to_path_buf(),
            expected: file_len,
            actual,
        });
    }
    if actual > file_len {
        return Err(corrupt_index(
            path,
            file_len,
            format!("{} trailing bytes after the footer", actual - file_len),
        ));
    }
    if file_len < PAGE + FOOTER_LEN as u64 {
        return Err(corrupt_index(
            path,
            24,
            format!("file length {file_len} smaller than header page + footer"),
        ));
    }
    Ok(())
}

/// Read and check the footer against the header, and the index it points at: placed right before
/// the footer, its checksum matching, its entry count capped. Returns the footer and its offset.
fn read_footer(
    path: &Path,
    bytes: &[u8],
    header: &FileHeader,
) -> Result<(Footer, u64), StoreError> {
    let file_len = header.file_len.get();
    let footer_at = file_len - FOOTER_LEN as u64;
    let footer = Footer::read_from_bytes(&bytes[footer_at as usize..])
        .expect("footer slice has the footer's exact length");
    if footer.magic != MAGIC {
        return Err(corrupt_index(path, file_len - 8, "footer magic missing"));
    }
    if xxh3(footer.checksum_input()) != footer.checksum.get() {
        return Err(corrupt_index(path, footer_at, "footer checksum mismatch"));
    }
    if footer.version.get() != VERSION || footer.required_flags.get() != header.required_flags.get()
    {
        return Err(corrupt_index(
            path,
            footer_at,
            "footer version/flags differ from the header",
        ));
    }
    let index_offset = footer.index_offset.get();
    let index_size = footer.index_size.get();
    if index_offset < PAGE
        || index_offset % 8 != 0
        || index_offset.checked_add(index_size) != Some(footer_at)
    {
        return Err(corrupt_index(
            path,
            footer_at,
            format!("index at {index_offset}+{index_size} does not end at the footer"),
        ));
    }
    let index = &bytes[index_offset as usize..footer_at as usize];
    if xxh3(index) != footer.index_checksum.get() {
        return Err(corrupt_index(path, index_offset, "index checksum mismatch"));
    }
    let count = footer.entry_count.get();
    // Every record takes at least RECORD_LEN + 8 bytes (a name pads to 8), so the index size
    // bounds the count before anything is allocated for it.
    let fits = index_size / (RECORD_LEN as u64 + 8);
    if count > MAX_ENTRIES || u64::from(count) > fits {
        return Err(corrupt_index(
            path,
            footer_at,
            format!("{count} entries (cap {MAX_ENTRIES}, index holds at most {fits})"),
        ));
    }
    Ok((footer, footer_at))
}

/// Read the `count` index entries from `index` (which starts at `index_offset` in the file); each
/// name appears once and the entries fill the index exactly.
fn read_entries(
    path: &Path,
    index: &[u8],
    index_offset: u64,
    count: u32,
) -> Result<Vec<Entry>, StoreError> {
    let mut cur = Cursor::new(index, index_offset);
    let mut entries: Vec<Entry> = Vec::with_capacity(count as usize);
    let mut names = std::collections::HashSet::with_capacity(count as usize);
    let cerr = |e: crate::format::CursorError| corrupt_index(path, e.offset, e.what);
    for i in 0..count {
        let at = cur.offset();
        let rec: &EntryRecord = cur.record(&format!("entry {i}")).map_err(cerr)?;
        let name_len = usize::from(rec.name_len.get());
        if name_len == 0 || name_len > MAX_NAME_LEN {
            return Err(corrupt_index(
                path,
                at,
                format!("entry {i}: name length {name_len}"),
            ));
        }
        let name_bytes = cur
            .take(name_len, &format!("entry {i} name"))
            .map_err(cerr)?;
        let name = std::str::from_utf8(name_bytes)
            .map_err(|_| corrupt_index(path, at, format!("entry {i}: name is not UTF-8")))?
            .to_string();
        let padded = align_up(name_len as u64, 8).expect("name length is small") as usize;
        cur.take(padded - name_len, &format!("entry {i} padding"))
            .map_err(cerr)?;
        let entry = validate_entry(path, at, rec, name, index_offset)?;
        if !names.insert(entry.name.clone()) {
            return Err(corrupt_index(
                path,
                at,
                format!("duplicate entry '{}'", entry.name),
            ));
        }
        entries.push(entry);
    }
    if cur.remaining() != 0 {
        return Err(corrupt_index(
            path,
            cur.offset(),
            format!("{} unparsed bytes at the end of the index", cur.remaining()),
        ));
    }
    Ok(entries)
}

/// The smoothing section, when the header's flag says there is one: after every entry's blob and
/// scales, before the index. Without the flag the footer must not point at one.
fn read_smoothing(
    path: &Path,
    bytes: &[u8],
    header: &FileHeader,
    footer: &Footer,
    footer_at: u64,
    entries: &[Entry],
) -> Result<Option<crate::PackSmoothing>, StoreError> {
    let smoothing_offset = footer.smoothing_offset.get();
    if header.optional_flags.get() & crate::OPT_SMOOTHING == 0 {
        if smoothing_offset != 0 {
            return Err(corrupt_index(
                path,
                footer_at,
                "a smoothing offset without the smoothing flag",
            ));
        }
        return Ok(None);
    }
    let after = entries
        .iter()
        .map(|e| e.scale_range().0 + e.scale_range().1)
        .max()
        .unwrap_or(PAGE)
        .max(PAGE);
    if smoothing_offset < after {
        return Err(corrupt_index(
            path,
            footer_at,
            format!("smoothing section at {smoothing_offset} overlaps the entries (end {after})"),
        ));
    }
    let index_offset = footer.index_offset.get();
    Ok(Some(crate::PackSmoothing::decode(
        path,
        bytes,
        smoothing_offset,
        index_offset,
    )?))
}

/// The header's target chip name: lower-case ASCII letters and digits, zero-padded; all zeros
/// is none.
fn target_name(bytes: &[u8; 8]) -> Result<Option<String>, String> {
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(8);
    if bytes[len..].iter().any(|&b| b != 0) {
        return Err("bytes after the terminating zero".to_string());
    }
    let name = &bytes[..len];
    if !name
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(format!("{name:?} is not a chip name"));
    }
    Ok((len > 0).then(|| String::from_utf8_lossy(name).into_owned()))
}

/// Turn a record into an [`Entry`], checking every field against the file's structure.
fn validate_entry(
    path: &Path,
    at: u64,
    rec: &EntryRecord,
    name: String,
    data_end: u64,
) -> Result<Entry, StoreError> {
    let bad = |what: String| corrupt_index(path, at, format!("entry '{name}': {what}"));
    let dtype = PackDtype::from_u8(rec.dtype).ok_or_else(|| bad(format!("dtype {}", rec.dtype)))?;
    let layout_id =
        LayoutId::from_u8(rec.layout).ok_or_else(|| bad(format!("layout {}", rec.layout)))?;
    let (k, n) = (rec.k.get(), rec.n.get());
    if k == 0 || n == 0 || k > MAX_DIM || n > MAX_DIM {
        return Err(bad(format!("shape k={k} n={n} (each 1..={MAX_DIM})")));
    }
    // k, n <= 2^24: padded sizes and blob bytes fit in u64 and (on 64-bit) usize.
    let layout = TiledLayout::new(dtype, k as usize, n as usize);
    let expected_blob = layout.blob_bytes() as u64;
    let (bo, bs) = (rec.blob_offset.get(), rec.blob_size.get());
    let (so, ss) = (rec.scale_offset.get(), rec.scale_size.get());
    if bs != expected_blob {
        return Err(bad(format!("blob size {bs}, layout needs {expected_blob}")));
    }
    let group = match (rec.group.get(), rec.group_kind) {
        (_, kind) if kind != GROUP_SYMMETRIC && kind != GROUP_AFFINE => {
            return Err(bad(format!("scale group kind {kind}")))
        }
        (0, GROUP_SYMMETRIC) => ScaleGroup::PerChannel,
        (0, _) => return Err(bad("affine scales without a group".to_string())),
        (g, _) if g as usize > MAX_GROUP => {
            return Err(bad(format!("scale group {g} > {MAX_GROUP}")))
        }
        (g, GROUP_AFFINE) => ScaleGroup::Affine(g as usize),
        (g, _) => ScaleGroup::Group(g as usize),
    };
    if dtype == PackDtype::F16 && group != ScaleGroup::PerChannel {
        return Err(bad("fp16 entry with grouped scales".to_string()));
    }
    if group.is_affine() && dtype != PackDtype::I4 {
        return Err(bad(format!("affine scale groups on {}", dtype.name())));
    }
    // k ≤ 2^24 and n ≤ 2^24: the scale count fits in u64.
    let scales = group
        .scales_len(k as usize, n as usize)
        .map_err(|e| bad(e.to_string()))? as u64;
    if ss != 4 * scales {
        return Err(bad(format!("scale size {ss}, expected {}", 4 * scales)));
    }
    if bo < PAGE || bo % PAGE != 0 {
        return Err(bad(format!(
            "blob offset {bo} not a page multiple after the header"
        )));
    }
    if so < PAGE || so % 4 != 0 {
        return Err(bad(format!("scale offset {so} misaligned")));
    }
    let in_data = |o: u64, s: u64| o.checked_add(s).is_some_and(|end| end <= data_end);
    if !in_data(bo, bs) || !in_data(so, ss) {
        return Err(bad(format!(
            "blob {bo}+{bs} or scales {so}+{ss} outside the data region (ends at {data_end})"
        )));
    }
    Ok(Entry {
        name,
        layout,
        layout_id,
        source: SourceInfo {
            fingerprint: rec.source_fingerprint.get(),
            ggml_type: rec.source_type.get(),
        },
        blob_offset: bo,
        blob_size: bs,
        scale_offset: so,
        scale_size: ss,
        blob_checksum: rec.blob_checksum.get(),
        scale_checksum: rec.scale_checksum.get(),
        group,
        pack_id: 0,
        index: 0,
    })
}

/// Refuse an index whose blobs or scale arrays overlap each other.
fn check_no_overlap(path: &Path, entries: &[Entry]) -> Result<(), StoreError> {
    let mut ranges: Vec<(u64, u64, &str)> = Vec::with_capacity(entries.len() * 2);
    for e in entries {
        ranges.push((e.blob_offset, e.blob_offset + e.blob_size, &e.name));
        ranges.push((e.scale_offset, e.scale_offset + e.scale_size, &e.name));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(corrupt_index(
                path,
                w[1].0,
                format!("data of '{}' overlaps data of '{}'", w[1].2, w[0].2),
            ));
        }
    }
    Ok(())
}
