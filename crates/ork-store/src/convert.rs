//! The self-populating cache: [`ensure`] keeps a model's `.orkpack` complete and current,
//! [`convert`] rebuilds it from scratch.
//!
//! Packing is sequential over tensors and parallel inside one (the pack kernel runs on rayon):
//! pack → write → drop, so peak memory is one packed weight plus the working set of the source
//! map; with `evict_src` the source pages of each tensor are dropped once it is handled.

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use crate::checksum::Xxh3Stream;
use ork_gguf::{GgufFile, TensorInfo};
use ork_manifest::Manifest;
use ork_pack::{GgufRows, PackDtype, ScaleGroup};

use crate::check::{check_entry_key, stale_reason};
use crate::{EntryKey, EntryStatus, ModelIdentity, Orkpack, OrkpackWriter, StoreError};

/// What [`ensure`] / [`convert`] did with one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Carried over from the existing file.
    Reused,
    /// Packed from the model.
    Packed,
}

/// Progress of a conversion, reported after each tensor.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// Tensors handled so far (1-based index of this one).
    pub done: usize,
    /// Tensors in total.
    pub total: usize,
    /// This tensor's name.
    pub tensor: &'a str,
    /// What happened to it.
    pub action: Action,
    /// Blob + scale bytes of this tensor in the cache.
    pub bytes: u64,
}

/// Settings of [`ensure`] and [`convert`].
#[derive(Clone, Copy)]
pub struct ConvertOptions<'a> {
    /// Element type to pack to.
    pub dtype: PackDtype,
    /// Hash every existing entry's blob and scales before reusing it (a corrupt entry is then
    /// repacked). Without it, existing entries are judged by their metadata and fingerprint only
    /// (blobs are still verified when copied into a rewritten file, and when loaded).
    pub verify: bool,
    /// Drop each source tensor's pages from memory (`GgufFile::evict`) once it is handled.
    pub evict_src: bool,
    /// Threads for the pack kernel (`None`: rayon's global pool).
    pub threads: Option<usize>,
    /// Called after each tensor.
    pub progress: Option<&'a (dyn Fn(&Progress<'_>) + Sync)>,
    /// The model's manifest, when the caller has derived it already (`None`: derive it).
    pub manifest: Option<&'a Manifest>,
    /// Scale groups to pack with: per channel (the default), or `Group(g)` for every weight
    /// whose K `g` divides (the others stay per channel; [`crate::effective_group`]).
    pub group: ScaleGroup,
    /// The chip the pack is made for, recorded in the header (`None`: none recorded). A pack
    /// recorded for another chip is rebuilt ([`RebuildReason::OtherTarget`]).
    pub target: Option<&'a str>,
    /// What the weights of `model` were smoothed with, recorded in the pack's smoothing section
    /// (`None`: not smoothed). A pack recorded with other parameters (or none) is rebuilt
    /// ([`RebuildReason::OtherSmoothing`]).
    pub smoothing: Option<&'a crate::PackSmoothing>,
}

impl<'a> ConvertOptions<'a> {
    /// Defaults: `verify` on, no eviction, the global pool, no progress callback.
    pub fn new(dtype: PackDtype) -> Self {
        ConvertOptions {
            dtype,
            verify: true,
            evict_src: false,
            threads: None,
            progress: None,
            manifest: None,
            group: ScaleGroup::PerChannel,
            target: None,
            smoothing: None,
        }
    }
}

impl std::fmt::Debug for ConvertOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConvertOptions")
            .field("dtype", &self.dtype)
            .field("verify", &self.verify)
            .field("evict_src", &self.evict_src)
            .field("threads", &self.threads)
            .field("group", &self.group)
            .field("target", &self.target)
            .field("smoothing", &self.smoothing.map(|s| s.describe()))
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// What [`ensure`] / [`convert`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConvertReport {
    /// Entries carried over from the existing file.
    pub reused: usize,
    /// Entries packed from the model.
    pub packed: usize,
    /// Source bytes of the packed tensors.
    pub bytes_in: u64,
    /// Blob + scale bytes of all entries of the resulting file.
    pub bytes_out: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Whether the file was (re)written; `false` = the existing file was reused untouched.
    pub rewritten: bool,
    /// Why an existing file was discarded as a whole (unreadable, other version, …).
    pub discarded: Option<String>,
    /// Entries of the existing file that were repacked, with the reason (stale / corrupt).
    pub repacked: Vec<(String, String)>,
    /// Why the file was (re)written, when it was (`None`: reused untouched) — for a line on
    /// stderr.
    pub rebuild: Option<RebuildReason>,
}

/// Why [`ensure`] (re)wrote a pack file.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum RebuildReason {
    /// There was no file.
    Missing,
    /// [`convert`] always builds from scratch.
    Requested,
    /// The file was empty.
    Empty,
    /// The file was shorter than its header says (an interrupted copy, a cut download).
    Truncated {
        /// Length the header records.
        expected: u64,
        /// Actual length.
        actual: u64,
    },
    /// The file is of another format version.
    OtherVersion {
        /// Its version.
        found: u32,
    },
    /// The header, footer or index was damaged (the store error's text).
    Corrupt {
        /// What was wrong.
        detail: String,
    },
    /// The entries hold another dtype than the one asked for.
    OtherDtype {
        /// The dtype in the file.
        found: PackDtype,
        /// The dtype asked for.
        wanted: PackDtype,
    },
    /// The pack was made for another chip (or records none).
    OtherTarget {
        /// The chip recorded in the file (`None`: none).
        found: Option<String>,
        /// The chip asked for.
        wanted: String,
    },
    /// The pack's weights were smoothed with other parameters than asked for (another α or
    /// calibration text, smoothing where none was asked for, or none where it was).
    OtherSmoothing {
        /// The parameters recorded in the file (`None`: not smoothed).
        found: Option<String>,
        /// The parameters asked for (`None`: not smoothed).
        wanted: Option<String>,
    },
    /// Entries whose scales cover K differently from what was asked for (another `--quant`).
    OtherGroup {
        /// How many.
        count: usize,
        /// The first one.
        tensor: String,
        /// What differs.
        reason: String,
    },
    /// Entries packed from a different source tensor (the model changed).
    Stale {
        /// How many.
        count: usize,
        /// The first one and why.
        tensor: String,
        /// What differs.
        reason: String,
    },
    /// Entries whose blob or scales fail their checksum.
    CorruptEntries {
        /// How many.
        count: usize,
        /// The first one.
        tensor: String,
        /// What failed.
        reason: String,
    },
    /// Weights of the model without an entry.
    MissingEntries {
        /// How many.
        count: usize,
    },
    /// Entries for tensors the model does not have.
    ExtraEntries {
        /// How many.
        count: usize,
    },
}

impl std::fmt::Display for RebuildReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RebuildReason::Missing => write!(f, "no pack file yet"),
            RebuildReason::Requested => write!(f, "converting from scratch"),
            RebuildReason::Empty => write!(f, "the pack file is empty"),
            RebuildReason::Truncated { expected, actual } => write!(
                f,
                "the pack file is truncated ({actual} bytes, expected {expected})"
            ),
            RebuildReason::OtherVersion { found } => {
                write!(f, "the pack file has format version {found}")
            }
            RebuildReason::Corrupt { detail } => write!(f, "the pack file is corrupt: {detail}"),
            RebuildReason::OtherDtype { found, wanted } => write!(
                f,
                "the pack holds dtype {}, {} was asked for",
                found.name(),
                wanted.name()
            ),
            RebuildReason::OtherTarget { found, wanted } => write!(
                f,
                "the pack was made for {}, {wanted} was asked for",
                found.as_deref().unwrap_or("no recorded chip")
            ),
            RebuildReason::OtherSmoothing { found, wanted } => write!(
                f,
                "the pack was made with {}, {} was asked for",
                found.as_deref().unwrap_or("no smoothing"),
                wanted.as_deref().unwrap_or("no smoothing")
            ),
            RebuildReason::OtherGroup {
                count,
                tensor,
                reason,
            } => write!(
                f,
                "{count} entries quantized differently (another --quant; first: '{tensor}': {reason})"
            ),
            RebuildReason::Stale {
                count,
                tensor,
                reason,
            } => write!(
                f,
                "{count} stale entries (the model changed; first: '{tensor}': {reason})"
            ),
            RebuildReason::CorruptEntries {
                count,
                tensor,
                reason,
            } => write!(f, "{count} corrupt entries (first: '{tensor}': {reason})"),
            RebuildReason::MissingEntries { count } => {
                write!(f, "{count} weights of the model have no entry")
            }
            RebuildReason::ExtraEntries { count } => {
                write!(f, "{count} entries for tensors the model does not have")
            }
        }
    }
}

/// The reason for a whole file that cannot be used.
fn unusable_reason(e: &StoreError) -> RebuildReason {
    match e {
        StoreError::Truncated { actual: 0, .. } => RebuildReason::Empty,
        StoreError::Truncated {
            expected, actual, ..
        } => RebuildReason::Truncated {
            expected: *expected,
            actual: *actual,
        },
        StoreError::UnsupportedVersion { found, .. } => {
            RebuildReason::OtherVersion { found: *found }
        }
        other => RebuildReason::Corrupt {
            detail: other.to_string(),
        },
    }
}

/// The model's matmul weights in pack order, as its [`Manifest`] lists them: `token_embd.weight`
/// first, then block by block (`attn_q`, `attn_k`, `attn_v`, `attn_output`, `ffn_gate`, `ffn_up`,
/// `ffn_down`, router, shared experts, each expert's slices, then any other 2-D tensor of the block
/// in file order), then `output.weight`, then any remaining 2-D tensors in file order. Each is a
/// 2-D view named by its `.orkpack` entry name: the tensor itself, or for a 3-D expert tensor one
/// slice per expert named `TENSOR#EXPERT` (docs/orkpack.md). For SmolLM2-135M that is 211
/// tensors; its output projection is tied to `token_embd.weight`.
///
/// # Errors
/// [`StoreError::Manifest`] when the manifest cannot be derived (bad expert shapes, …).
pub fn matmul_weights(model: &GgufFile) -> Result<Vec<TensorInfo>, StoreError> {
    Ok(weights_of(&Manifest::from_gguf(model)?))
}

/// The 2-D views of a manifest's weights, in pack order.
fn weights_of(manifest: &Manifest) -> Vec<TensorInfo> {
    manifest.weights().iter().map(|w| w.slice.clone()).collect()
}

/// The informational identity of a model: its file length and an xxh3 over the fingerprints of
/// its matmul weights.
///
/// # Errors
/// As [`matmul_weights`].
pub fn model_identity(model: &GgufFile) -> Result<ModelIdentity, StoreError> {
    let fps: Vec<u64> = matmul_weights(model)?
        .iter()
        .map(|t| crate::fingerprint(model, t))
        .collect();
    Ok(identity_of(model, &fps))
}

fn identity_of(model: &GgufFile, fingerprints: &[u64]) -> ModelIdentity {
    let mut h = Xxh3Stream::new();
    for f in fingerprints {
        h.update(&f.to_le_bytes());
    }
    ModelIdentity {
        file_len: model.file_len(),
        fingerprint: h.digest(),
    }
}

/// Make `path` a complete, current cache of `model`'s matmul weights and open it.
///
/// Opens the file if present; every weight whose entry is missing, stale or (with `verify`)
/// corrupt is repacked, valid entries are copied over, and the file is rewritten atomically.
/// If every entry is valid and the file holds nothing else, it is reused untouched. A file that
/// cannot be used at all (bad magic, other version, truncated, corrupt index) is rebuilt; an
/// I/O error other than "not found" is returned.
pub fn ensure(
    model: &GgufFile,
    path: &Path,
    opts: &ConvertOptions<'_>,
) -> Result<(Orkpack, ConvertReport), StoreError> {
    let started = Instant::now();
    let target = crate::resolve_target(path, Some(model.path()))?;
    let (existing, discarded) = if !target.exists {
        (None, None)
    } else {
        match Orkpack::open(&target.path) {
            Ok(p) => (Some(p), None),
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                (None, None)
            }
            Err(e @ StoreError::Io { .. }) => return Err(e),
            Err(e) => (None, Some(e)),
        }
    };
    let plan = Plan::new(model, opts)?;
    let mut report = ConvertReport {
        rebuild: Some(match &discarded {
            Some(e) => unusable_reason(e),
            None => RebuildReason::Missing,
        }),
        discarded: discarded.map(|e| e.to_string()),
        ..ConvertReport::default()
    };
    let mut reusable: HashSet<&str> = HashSet::new();
    if let Some(old) = &existing {
        let audit = audit_entries(old, &plan, opts, &mut report);
        report.rebuild = rebuild_reason(old, &plan, opts, &audit);
        reusable = audit.reusable;
        let all_valid = reusable.len() == plan.weights.len();
        if all_valid && old.entries().len() == plan.weights.len() && report.rebuild.is_none() {
            let old = existing.expect("checked above");
            return Ok(reuse_whole(model, old, &plan, report, started));
        }
    }
    let reuse = |name: &str| reusable.contains(name);
    write_pack(
        model,
        &target.path,
        &plan,
        existing.as_ref(),
        &reuse,
        report,
        started,
    )
}

/// What [`audit_entries`] found of an existing pack's entries against the plan.
#[derive(Default)]
struct Audit<'p> {
    /// Weights whose entry can be copied over.
    reusable: HashSet<&'p str>,
    /// Weights with no entry.
    missing: usize,
    /// (weight, why) of stale and of corrupt entries.
    stale: Vec<(String, String)>,
    corrupt: Vec<(String, String)>,
    /// An entry's dtype against the wanted one.
    other_dtype: Option<(PackDtype, PackDtype)>,
    /// (weight, why) of entries of another scale grouping.
    other_group: Vec<(String, String)>,
}

/// Check every planned weight's entry in `old` (with `opts.verify`, its checksums too); stale
/// and corrupt ones go to `report.repacked`.
fn audit_entries<'p>(
    old: &Orkpack,
    plan: &'p Plan<'_>,
    opts: &ConvertOptions<'_>,
    report: &mut ConvertReport,
) -> Audit<'p> {
    let mut audit = Audit::default();
    for (t, key) in plan.weights.iter().zip(&plan.keys) {
        let Some(e) = old.entry(&t.name) else {
            audit.missing += 1;
            continue;
        };
        if e.layout().dtype != key.layout.dtype {
            audit.other_dtype = Some((e.layout().dtype, key.layout.dtype));
        }
        if e.group() != key.group {
            audit.other_group.push((
                t.name.clone(),
                format!("{} scales, wanted {}", e.group().name(), key.group.name()),
            ));
        }
        let status = if opts.verify {
            check_entry_key(old, e, key)
        } else {
            match stale_reason(e, key) {
                Some(reason) => EntryStatus::Stale { reason },
                None => EntryStatus::Valid,
            }
        };
        match status {
            EntryStatus::Valid => {
                audit.reusable.insert(&t.name);
            }
            EntryStatus::Stale { reason } => {
                audit.stale.push((t.name.clone(), reason.clone()));
                report.repacked.push((t.name.clone(), reason));
            }
            EntryStatus::Corrupt { reason } => {
                audit.corrupt.push((t.name.clone(), reason.clone()));
                report.repacked.push((t.name.clone(), reason));
            }
        }
    }
    audit
}

/// Why `old` is rewritten, the first that applies of: other smoothing, dtype, scale grouping,
/// target; corrupt, stale, missing or extra entries. `None`: it is reused as it is.
fn rebuild_reason(
    old: &Orkpack,
    plan: &Plan<'_>,
    opts: &ConvertOptions<'_>,
    audit: &Audit<'_>,
) -> Option<RebuildReason> {
    let extra = old
        .entries()
        .len()
        .saturating_sub(plan.weights.len() - audit.missing);
    let other_target = match opts.target {
        Some(wanted) if old.target() != Some(wanted) => Some(RebuildReason::OtherTarget {
            found: old.target().map(str::to_owned),
            wanted: wanted.to_owned(),
        }),
        _ => None,
    };
    let same_smoothing = match (old.smoothing(), opts.smoothing) {
        (None, None) => true,
        (Some(a), Some(b)) => a.same_parameters(b) && a.blocks == b.blocks,
        _ => false,
    };
    if !same_smoothing {
        Some(RebuildReason::OtherSmoothing {
            found: old.smoothing().map(|s| s.describe()),
            wanted: opts.smoothing.map(|s| s.describe()),
        })
    } else if let Some((found, wanted)) = audit.other_dtype {
        Some(RebuildReason::OtherDtype { found, wanted })
    } else if let Some((tensor, reason)) = audit.other_group.first().cloned() {
        Some(RebuildReason::OtherGroup {
            count: audit.other_group.len(),
            tensor,
            reason,
        })
    } else if other_target.is_some() {
        other_target
    } else if let Some((tensor, reason)) = audit.corrupt.first().cloned() {
        Some(RebuildReason::CorruptEntries {
            count: audit.corrupt.len(),
            tensor,
            reason,
        })
    } else if let Some((tensor, reason)) = audit.stale.first().cloned() {
        Some(RebuildReason::Stale {
            count: audit.stale.len(),
            tensor,
            reason,
        })
    } else if audit.missing > 0 {
        Some(RebuildReason::MissingEntries {
            count: audit.missing,
        })
    } else if extra > 0 {
        Some(RebuildReason::ExtraEntries { count: extra })
    } else {
        None
    }
}

/// Every entry of `old` is valid and it holds nothing else: reuse it untouched.
fn reuse_whole(
    model: &GgufFile,
    old: Orkpack,
    plan: &Plan<'_>,
    mut report: ConvertReport,
    started: Instant,
) -> (Orkpack, ConvertReport) {
    report.rebuild = None;
    report.reused = plan.weights.len();
    report.bytes_out = old.entries().iter().map(entry_bytes).sum();
    for (i, t) in plan.weights.iter().enumerate() {
        if plan.opts.evict_src {
            model.evict(t);
        }
        plan.report(
            i,
            &t.name,
            Action::Reused,
            entry_bytes(old.entry(&t.name).expect("valid")),
        );
    }
    report.seconds = started.elapsed().as_secs_f64();
    (old, report)
}

/// Build `path` from scratch from `model` (every weight packed), replacing any existing file
/// atomically, and open it.
pub fn convert(
    model: &GgufFile,
    path: &Path,
    opts: &ConvertOptions<'_>,
) -> Result<(Orkpack, ConvertReport), StoreError> {
    let started = Instant::now();
    let target = crate::resolve_target(path, Some(model.path()))?;
    let plan = Plan::new(model, opts)?;
    write_pack(
        model,
        &target.path,
        &plan,
        None,
        &|_| false,
        ConvertReport {
            rebuild: Some(RebuildReason::Requested),
            ..ConvertReport::default()
        },
        started,
    )
}

/// Blob + scale bytes of an entry.
fn entry_bytes(e: &crate::Entry) -> u64 {
    e.blob_range().1 + e.scale_range().1
}

/// The weights to store, their keys, and the resources to pack them with.
struct Plan<'o> {
    weights: Vec<TensorInfo>,
    keys: Vec<EntryKey>,
    identity: ModelIdentity,
    pool: Option<rayon::ThreadPool>,
    opts: &'o ConvertOptions<'o>,
}

impl<'o> Plan<'o> {
    fn new(model: &GgufFile, opts: &'o ConvertOptions<'o>) -> Result<Self, StoreError> {
        let weights = match opts.manifest {
            Some(m) => weights_of(m),
            None => matmul_weights(model)?,
        };
        // Fingerprints read a sample of every tensor up front; with `evict_src` those pages are
        // dropped right away, or they would stay resident until their tensor's turn (on
        // SmolLM2-135M the samples are 70 of its 98 MB, and the peak RSS doubled).
        let keys = weights
            .iter()
            .map(|t| {
                let (dtype, group) = crate::weight_quant(&t.name, opts.dtype, opts.group);
                let key = EntryKey::for_tensor_grouped(model, t, dtype, group);
                if opts.evict_src {
                    model.evict(t);
                }
                key
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(t) = weights.last() {
            model
                .check_intact(&t.name)
                .map_err(|source| StoreError::Source {
                    source: Box::new(source),
                })?;
        }
        let fps: Vec<u64> = keys.iter().map(|k| k.source.fingerprint).collect();
        let identity = identity_of(model, &fps);
        let pool = match opts.threads {
            Some(n) => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .map_err(|e| StoreError::Threads {
                        reason: e.to_string(),
                    })?,
            ),
            None => None,
        };
        Ok(Plan {
            weights,
            keys,
            identity,
            pool,
            opts,
        })
    }

    fn report(&self, i: usize, tensor: &str, action: Action, bytes: u64) {
        if let Some(cb) = self.opts.progress {
            cb(&Progress {
                done: i + 1,
                total: self.weights.len(),
                tensor,
                action,
                bytes,
            });
        }
    }
}

/// Write a new file for `plan`: entries for which `reuse` holds are copied from `old`, the
/// others packed; then publish it and open it.
fn write_pack(
    model: &GgufFile,
    path: &Path,
    plan: &Plan<'_>,
    old: Option<&Orkpack>,
    reuse: &dyn Fn(&str) -> bool,
    mut report: ConvertReport,
    started: Instant,
) -> Result<(Orkpack, ConvertReport), StoreError> {
    let mut w = OrkpackWriter::create(path)?;
    w.set_model_identity(plan.identity);
    if let Some(smoothing) = plan.opts.smoothing {
        w.set_smoothing(smoothing)?;
    }
    if let Some(chip) = plan.opts.target {
        w.set_target(chip)?;
    }
    for (i, (t, key)) in plan.weights.iter().zip(&plan.keys).enumerate() {
        let copied = match old.and_then(|o| o.entry(&t.name).map(|e| (o, e))) {
            Some((o, e)) if reuse(&t.name) => match w.copy_entry(o, e) {
                Ok(()) => Some(entry_bytes(e)),
                // Damaged since it was checked (or not checked: verify off): repack it.
                Err(StoreError::CorruptBlob { what, .. }) => {
                    report
                        .repacked
                        .push((t.name.clone(), format!("corrupt {what}")));
                    None
                }
                Err(e) => return Err(e),
            },
            _ => None,
        };
        let (action, bytes) = match copied {
            Some(bytes) => {
                report.reused += 1;
                (Action::Reused, bytes)
            }
            None => {
                let pw = pack_tensor(model, t, key.layout.dtype, key.group, plan)?;
                w.add(&t.name, &pw, key.source)?;
                report.packed += 1;
                report.bytes_in += t.size;
                (Action::Packed, (pw.data.len() + 4 * pw.scales.len()) as u64)
            }
        };
        report.bytes_out += bytes;
        if plan.opts.evict_src {
            model.evict(t);
        }
        plan.report(i, &t.name, action, bytes);
    }
    w.finish()?;
    let pack = Orkpack::open(path)?;
    report.rewritten = true;
    report.seconds = started.elapsed().as_secs_f64();
    Ok((pack, report))
}

/// Pack one tensor as `dtype` with `group` on the plan's pool.
fn pack_tensor(
    model: &GgufFile,
    t: &TensorInfo,
    dtype: PackDtype,
    group: ScaleGroup,
    plan: &Plan<'_>,
) -> Result<ork_pack::PackedWeight, StoreError> {
    let wrap = |e| StoreError::Pack {
        tensor: t.name.clone(),
        source: Box::new(e),
    };
    let rows = GgufRows::new(model, t).map_err(wrap)?;
    let pack = || match group {
        ScaleGroup::PerChannel => ork_pack::pack(&rows, dtype),
        ScaleGroup::Group(g) => ork_pack::pack_grouped(&rows, dtype, g),
        // Affine groups are int4 only (`effective_group` gives them no other dtype).
        ScaleGroup::Affine(g) => ork_pack::pack_affine(&rows, g),
    };
    let packed = match &plan.pool {
        Some(pool) => pool.install(pack),
        None => pack(),
    };
    // The model cut short while being read: what was packed may be zeros, not the weight.
    model
        .check_intact(&t.name)
        .map_err(|source| StoreError::Source {
            source: Box::new(source),
        })?;
    packed.map_err(wrap)
}
