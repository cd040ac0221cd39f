//! `ork convert`, `ork inspect`, `ork verify` and `ork bench pack`: the pack-once, load-forever
//! verbs over `ork-gguf` → `ork-pack` → `ork-store`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ork_gguf::{GgmlType, GgufFile, TensorInfo};
use ork_pack::{GgufRows, PackDtype, PackedWeight, RowSource};
use ork_store::{
    check_entry, fingerprint, matmul_weights, ConvertOptions, EntryStatus, Orkpack, OrkpackWriter,
    SourceInfo, StoreError,
};
use serde::{Deserialize, Serialize};

use crate::cli::{ConvertArgs, InspectArgs, VerifyArgs};
use crate::rss;

const MIB: f64 = (1u64 << 20) as f64;

/// Whether an on/off environment variable is set to something other than empty or `0`.
fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0")
}

fn print_json<T: Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn ggml_name(id: u32) -> String {
    let ty = GgmlType::from_id(id);
    ty.name()
        .map_or_else(|| format!("type {id}"), str::to_string)
}

// ---------------------------------------------------------------------------------------------
// Memory sampling.

/// Samples the process's RssAnon on a background thread: VmHWM covers the peak of all resident
/// pages (including the GGUF map's file pages), RssAnon's peak is not kept by the kernel.
struct AnonPeak {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AnonPeak {
    /// Start sampling every `every`.
    fn start(every: Duration) -> AnonPeak {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(rss::snapshot().rss_anon_bytes));
        let thread = {
            let (stop, peak) = (stop.clone(), peak.clone());
            std::thread::Builder::new()
                .name("ork-rss-sampler".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        peak.fetch_max(rss::snapshot().rss_anon_bytes, Ordering::Relaxed);
                        std::thread::sleep(every);
                    }
                })
                .ok()
        };
        AnonPeak { stop, peak, thread }
    }

    /// Stop sampling; the highest RssAnon seen (including a final sample).
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak
            .fetch_max(rss::snapshot().rss_anon_bytes, Ordering::Relaxed)
            .max(rss::snapshot().rss_anon_bytes)
    }
}

// ---------------------------------------------------------------------------------------------
// ork convert

/// The `--json` object of `ork convert` (also read back by `ork bench pack`).
#[derive(Debug, Serialize, Deserialize)]
struct ConvertJson {
    model: PathBuf,
    output: PathBuf,
    dtype: String,
    evict_src: bool,
    threads: Option<usize>,
    tensors_packed: usize,
    bytes_in: u64,
    bytes_out: u64,
    file_bytes: u64,
    seconds: f64,
    /// VmRSS when the command started, before the model was opened.
    baseline_rss_bytes: u64,
    /// VmHWM at the end (peak resident set, file pages of the GGUF map included).
    peak_rss_bytes: u64,
    /// RssAnon when the command started.
    baseline_rss_anon_bytes: u64,
    /// Highest RssAnon seen, sampled every 5 ms.
    peak_rss_anon_bytes: u64,
}

/// `ork convert MODEL.gguf [-o OUT] [--dtype] [--evict-src] [--threads N] [--json]`.
///
/// SIGINT / SIGTERM: `OrkpackWriter::create` installs ork-store's listener, which deletes the
/// temp file and re-raises the signal; before the writer exists nothing is on disk yet, and the
/// target is only ever replaced by an atomic rename of a complete file.
pub fn convert(args: &ConvertArgs) -> Result<ExitCode> {
    let baseline = rss::snapshot();
    let anon = AnonPeak::start(Duration::from_millis(5));
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| args.model.with_extension("orkpack"));
    // Which files may be replaced (never the model, under any spelling or link; only an
    // .orkpack) is decided by ork-store when the pack is written.
    let evict_src = args.evict_src || env_flag("ORK_EVICT_SRC");
    let mut config = ork_runtime::EngineConfig::new(&args.model);
    config.soc = args.soc.into();
    config.dtype = args.dtype.into();
    if let Some(q) = args.quant {
        config.set_quant(q);
    }
    config.smooth = args.calib.as_ref().map(|calib| ork_runtime::Smoothing {
        alpha: args.smooth,
        calib: calib.clone(),
        targets: args.smooth_targets,
    });
    let dtype: PackDtype = config.dtype;
    // The smoothed weights (docs/chip.md), folded in memory before packing; the factors come
    // from the output pack when it holds them for the same parameters, else from calibration.
    config.pack = ork_runtime::PackChoice::Path(output.clone());
    // Pack only what `run` can run: the validation `run` makes (model, tokenizer, manifest,
    // every chip rule for every weight, with what to use instead) before anything is written.
    let loaded = ork_runtime::Engine::load(config.clone())
        .context("not a model ork can run with these settings, nothing converted")?;
    let model = std::sync::Arc::clone(loaded.gguf());
    let manifest = loaded.manifest();
    ork_store::resolve_target(&output, Some(&args.model))?;

    let bar = crate::progress::ConvertBar::new(&model, args.json)?;
    let progress = |p: &ork_store::Progress<'_>| bar.tensor_done(p);
    let opts = ConvertOptions {
        dtype,
        verify: true,
        evict_src,
        threads: args.threads,
        progress: Some(&progress),
        manifest: Some(manifest),
        group: config.group,
        target: Some(config.soc.name()),
        smoothing: loaded.smoothing(),
    };
    let result = ork_store::convert(&model, &output, &opts);
    bar.finish();
    let (pack, report) = result.with_context(|| {
        format!(
            "converting {} into {}",
            args.model.display(),
            output.display()
        )
    })?;
    drop(pack);
    let file_bytes = std::fs::metadata(&output)
        .with_context(|| format!("{}: stat", output.display()))?
        .len();
    let peak_anon = anon.finish();
    let end = rss::snapshot();
    let out = ConvertJson {
        model: args.model.clone(),
        output: output.clone(),
        dtype: dtype.name().to_string(),
        evict_src,
        threads: args.threads,
        tensors_packed: report.packed,
        bytes_in: report.bytes_in,
        bytes_out: report.bytes_out,
        file_bytes,
        seconds: report.seconds,
        baseline_rss_bytes: baseline.rss_bytes,
        peak_rss_bytes: end.peak_rss_bytes,
        baseline_rss_anon_bytes: baseline.rss_anon_bytes,
        peak_rss_anon_bytes: peak_anon,
    };
    if args.json {
        print_json(&out)?;
    } else {
        println!("{} -> {}", out.model.display(), out.output.display());
        println!("  tensors    {} packed ({})", out.tensors_packed, out.dtype);
        println!(
            "  source     {:.1} MiB read, {:.1} MiB stored ({:.1} MiB file)",
            out.bytes_in as f64 / MIB,
            out.bytes_out as f64 / MIB,
            out.file_bytes as f64 / MIB
        );
        println!(
            "  time       {:.2} s ({:.0} MiB/s of source)",
            out.seconds,
            out.bytes_in as f64 / MIB / out.seconds.max(1e-9)
        );
        println!(
            "  peak RSS   {:.1} MiB ({:.1} MiB above start; anon peak {:.1} MiB; evict-src {})",
            out.peak_rss_bytes as f64 / MIB,
            out.peak_rss_bytes.saturating_sub(out.baseline_rss_bytes) as f64 / MIB,
            out.peak_rss_anon_bytes as f64 / MIB,
            if evict_src { "on" } else { "off" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// ork inspect

#[derive(Serialize)]
struct IdentityJson {
    model_file_bytes: u64,
    model_fingerprint: String,
}

/// One line of `ork inspect`: a pack entry, or every expert slice (`TENSOR#E`) of one 3-D
/// expert tensor with the same shape and sizes, grouped (docs/moe.md, "Pack and store").
#[derive(Serialize)]
struct EntryJson {
    /// The entry's name; for a group, the 3-D tensor's name (no `#E`).
    name: String,
    k: usize,
    n: usize,
    dtype: &'static str,
    layout: String,
    /// The first byte of the entry's blob; for a group, the lowest of its slices.
    blob_offset: u64,
    /// Blob bytes; for a group, the sum over its slices.
    blob_bytes: u64,
    /// Scale bytes; for a group, the sum over its slices.
    scale_bytes: u64,
    source_type: String,
    /// The source bytes' fingerprint; `None` for a group (each slice has its own).
    source_fingerprint: Option<String>,
    /// For a group: how many expert slices it holds, and each one's blob and scale bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    experts: Option<ExpertGroupJson>,
}

#[derive(Serialize)]
struct ExpertGroupJson {
    count: usize,
    /// The lowest and highest expert index in the group.
    first: u64,
    last: u64,
    blob_bytes_per_expert: u64,
    scale_bytes_per_expert: u64,
}

/// Folds the expert slices `TENSOR#E` of `entries` into one entry per tensor (and shape, dtype,
/// layout, source type and sizes, so that a group's per-expert figures hold for every slice),
/// placed where the tensor's first slice was. Other entries pass through unchanged.
fn group_experts(entries: Vec<EntryJson>) -> Vec<EntryJson> {
    let mut out: Vec<EntryJson> = Vec::with_capacity(entries.len());
    let mut groups: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for e in entries {
        let Some((tensor, expert)) = e
            .name
            .rsplit_once('#')
            .and_then(|(t, x)| Some((t.to_owned(), x.parse::<u64>().ok()?)))
        else {
            out.push(e);
            continue;
        };
        let key = format!(
            "{tensor}\0{}\0{}\0{}\0{}\0{}\0{}\0{}",
            e.k, e.n, e.dtype, e.layout, e.source_type, e.blob_bytes, e.scale_bytes
        );
        match groups.get(&key) {
            Some(&i) => {
                let g = &mut out[i];
                let x = g
                    .experts
                    .as_mut()
                    .expect("a group entry has its expert figures");
                x.count += 1;
                x.first = x.first.min(expert);
                x.last = x.last.max(expert);
                g.blob_offset = g.blob_offset.min(e.blob_offset);
                g.blob_bytes += e.blob_bytes;
                g.scale_bytes += e.scale_bytes;
            }
            None => {
                groups.insert(key, out.len());
                out.push(EntryJson {
                    name: tensor,
                    source_fingerprint: None,
                    experts: Some(ExpertGroupJson {
                        count: 1,
                        first: expert,
                        last: expert,
                        blob_bytes_per_expert: e.blob_bytes,
                        scale_bytes_per_expert: e.scale_bytes,
                    }),
                    ..e
                });
            }
        }
    }
    out
}

#[derive(Serialize)]
struct InspectJson {
    file: PathBuf,
    file_bytes: u64,
    format_version: u32,
    model: Option<IdentityJson>,
    /// One per pack entry, except that expert slices are grouped (see [`EntryJson`]).
    entries: Vec<EntryJson>,
    /// Pack entries, each expert slice counted.
    total_entries: usize,
    total_blob_bytes: u64,
    total_scale_bytes: u64,
}

/// `ork inspect FILE.orkpack [--json]`.
pub fn inspect(args: &InspectArgs) -> Result<ExitCode> {
    let pack = Orkpack::open(&args.file)?;
    let file_bytes = std::fs::metadata(&args.file)
        .with_context(|| format!("{}: stat", args.file.display()))?
        .len();
    let entries: Vec<EntryJson> = pack
        .entries()
        .iter()
        .map(|e| {
            let l = e.layout();
            EntryJson {
                name: e.name().to_string(),
                k: l.k,
                n: l.n,
                dtype: l.dtype.name(),
                layout: format!("{:?}", e.layout_id()),
                blob_offset: e.blob_range().0,
                blob_bytes: e.blob_range().1,
                scale_bytes: e.scale_range().1,
                source_type: ggml_name(e.source().ggml_type),
                source_fingerprint: Some(format!("{:016x}", e.source().fingerprint)),
                experts: None,
            }
        })
        .collect();
    let pack_entries = entries.len();
    let total_blob_bytes = entries.iter().map(|e| e.blob_bytes).sum();
    let total_scale_bytes = entries.iter().map(|e| e.scale_bytes).sum();
    let entries = group_experts(entries);
    let out = InspectJson {
        file: args.file.clone(),
        file_bytes,
        format_version: ork_store::format::VERSION,
        model: pack.model_identity().map(|m| IdentityJson {
            model_file_bytes: m.file_len,
            model_fingerprint: format!("{:016x}", m.fingerprint),
        }),
        total_entries: pack_entries,
        total_blob_bytes,
        total_scale_bytes,
        entries,
    };
    if args.json {
        print_json(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}", out.file.display());
    println!(
        "  format     .orkpack v{}, {} bytes",
        out.format_version, out.file_bytes
    );
    match &out.model {
        Some(m) => println!(
            "  model      {} bytes, fingerprint {}",
            m.model_file_bytes, m.model_fingerprint
        ),
        None => println!("  model      (no identity recorded)"),
    }
    let w = out
        .entries
        .iter()
        .map(|e| e.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!();
    println!(
        "{:<w$}  {:>6}  {:>6}  {:<5}  {:<13}  {:>12}  {:>8}  {:<6}  fingerprint or experts",
        "name", "K", "N", "dtype", "layout", "blob bytes", "scales", "source"
    );
    for e in &out.entries {
        let last = match (&e.experts, &e.source_fingerprint) {
            (Some(x), _) => format!(
                "{} experts ({}..={}) x {} blob + {} scale bytes",
                x.count, x.first, x.last, x.blob_bytes_per_expert, x.scale_bytes_per_expert
            ),
            (None, Some(f)) => f.clone(),
            (None, None) => String::new(),
        };
        println!(
            "{:<w$}  {:>6}  {:>6}  {:<5}  {:<13}  {:>12}  {:>8}  {:<6}  {}",
            e.name, e.k, e.n, e.dtype, e.layout, e.blob_bytes, e.scale_bytes, e.source_type, last
        );
    }
    println!();
    println!(
        "{} entries ({} lines, expert slices grouped), {} blob bytes ({:.1} MiB), {} scale bytes",
        out.total_entries,
        out.entries.len(),
        out.total_blob_bytes,
        out.total_blob_bytes as f64 / MIB,
        out.total_scale_bytes
    );
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------------
// ork verify

/// Verdict on one tensor, as printed by `ork verify`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    /// Matches the model (and, with `--deep`, a fresh repack byte for byte).
    Valid,
    /// Packed from another source or with other settings.
    Stale,
    /// Blob or scales fail their checksums.
    Corrupt,
    /// A matmul weight of the model has no entry.
    Missing,
    /// The pack holds a tensor that is not a matmul weight of the model.
    Extra,
    /// Checksums hold, but a repack from the source gives other bytes (`--deep`).
    Differs,
}

#[derive(Serialize)]
struct Problem {
    tensor: String,
    status: Verdict,
    reason: String,
}

#[derive(Serialize)]
struct VerifyJson {
    file: PathBuf,
    model: PathBuf,
    deep: bool,
    checked: usize,
    valid: usize,
    ok: bool,
    /// Why the file as a whole cannot be used (bad magic, truncated, corrupt index, other
    /// version); then no entry was checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    unusable: Option<String>,
    problems: Vec<Problem>,
}

/// Repack `t` from the model and compare with the stored entry; `Some(reason)` if they differ.
fn deep_compare(
    pack: &Orkpack,
    model: &GgufFile,
    t: &TensorInfo,
    dtype: PackDtype,
) -> Result<Option<String>> {
    let rows = GgufRows::new(model, t).with_context(|| format!("tensor '{}'", t.name))?;
    let fresh = ork_pack::pack(&rows, dtype)
        .with_context(|| format!("repacking tensor '{}' from the model", t.name))?;
    let stored = pack.load(&t.name, true)?;
    if stored.layout != fresh.layout {
        return Ok(Some(format!(
            "stored layout {:?}, repack gives {:?}",
            stored.layout, fresh.layout
        )));
    }
    if let Some(i) = stored
        .data
        .iter()
        .zip(&fresh.data)
        .position(|(a, b)| a != b)
    {
        return Ok(Some(format!(
            "blob differs from a fresh repack at byte {i}"
        )));
    }
    if let Some(i) = stored
        .scales
        .iter()
        .zip(&fresh.scales)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        return Ok(Some(format!(
            "scale of output channel {i} is {}, a fresh repack gives {}",
            stored.scales[i], fresh.scales[i]
        )));
    }
    Ok(None)
}

/// `ork verify FILE.orkpack --model MODEL.gguf [--deep] [--dtype] [--json]`.
pub fn verify(args: &VerifyArgs) -> Result<ExitCode> {
    let model = GgufFile::open(&args.model)?;
    let weights = matmul_weights(&model)?;
    let pack = match Orkpack::open(&args.file) {
        Ok(p) => p,
        // A damaged or foreign file is a verdict (exit 1), not an error: it was read, it is
        // not a valid cache. I/O errors (missing file, FIFO, directory) stay errors (exit 2).
        Err(
            e @ (StoreError::BadMagic { .. }
            | StoreError::Truncated { .. }
            | StoreError::CorruptIndex { .. }
            | StoreError::UnsupportedVersion { .. }
            | StoreError::UnsupportedFlags { .. }),
        ) => {
            let out = VerifyJson {
                file: args.file.clone(),
                model: args.model.clone(),
                deep: args.deep,
                checked: 0,
                valid: 0,
                ok: false,
                unusable: Some(e.to_string()),
                problems: Vec::new(),
            };
            if args.json {
                print_json(&out)?;
            } else {
                println!("UNUSABLE {e}");
            }
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e.into()),
    };
    let mut problems = Vec::new();
    let mut valid = 0usize;
    for t in &weights {
        let Some(e) = pack.entry(&t.name) else {
            problems.push(Problem {
                tensor: t.name.clone(),
                status: Verdict::Missing,
                reason: "matmul weight of the model has no entry".into(),
            });
            continue;
        };
        let dtype = args.dtype.map_or(e.layout().dtype, Into::into);
        let (status, reason) = match check_entry(&pack, e, &model, t, dtype) {
            EntryStatus::Valid if args.deep => match deep_compare(&pack, &model, t, dtype)? {
                None => (Verdict::Valid, String::new()),
                Some(reason) => (Verdict::Differs, reason),
            },
            EntryStatus::Valid => (Verdict::Valid, String::new()),
            EntryStatus::Stale { reason } => (Verdict::Stale, reason),
            EntryStatus::Corrupt { reason } => (Verdict::Corrupt, reason),
        };
        if status == Verdict::Valid {
            valid += 1;
        } else {
            problems.push(Problem {
                tensor: t.name.clone(),
                status,
                reason,
            });
        }
    }
    let known: HashSet<&str> = weights.iter().map(|t| t.name.as_str()).collect();
    for e in pack.entries() {
        if !known.contains(e.name()) {
            problems.push(Problem {
                tensor: e.name().to_string(),
                status: Verdict::Extra,
                reason: "no matmul weight of this name in the model".into(),
            });
        }
    }
    let out = VerifyJson {
        file: args.file.clone(),
        model: args.model.clone(),
        deep: args.deep,
        checked: weights.len(),
        valid,
        ok: problems.is_empty(),
        unusable: None,
        problems,
    };
    if args.json {
        print_json(&out)?;
    } else {
        for p in &out.problems {
            let status = serde_json::to_value(p.status)?;
            let status = status.as_str().unwrap_or("invalid").to_uppercase();
            println!("{status:<8} {}: {}", p.tensor, p.reason);
        }
        println!(
            "{}: {} of {} weights valid{}{}",
            out.file.display(),
            out.valid,
            out.checked,
            if out.deep {
                " (deep: repacked and compared)"
            } else {
                ""
            },
            if out.ok {
                String::new()
            } else {
                format!("; {} problem(s)", out.problems.len())
            }
        );
    }
    Ok(if out.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

// ---------------------------------------------------------------------------------------------
// ork bench pack

/// Goal of the pack benchmark: int8 output per core, bytes per second.
const GOAL_OUT_PER_CORE: f64 = 1e9;
/// Goal: verified load at least this fraction of memcpy.
const GOAL_LOAD_RATIO: f64 = 0.8;
/// Goal: reload at least this many times faster than packing.
const GOAL_RELOAD_RATIO: f64 = 20.0;
/// Slack of the eviction goal above `largest tensor × threads`.
const EVICT_SLACK: u64 = 64 << 20;

#[derive(Serialize)]
struct PackCase {
    source: String,
    ggml_type: String,
    k: usize,
    n: usize,
    threads: usize,
    iters: usize,
    src_bytes: u64,
    out_bytes: usize,
    best_seconds: f64,
    src_mb_s_per_thread: f64,
    out_gb_s_per_thread: f64,
    meets_goal: bool,
}

#[derive(Serialize)]
struct LoadCase {
    tensor: String,
    bytes: u64,
    memcpy_gb_s: f64,
    load_verified_gb_s: f64,
    load_unverified_gb_s: f64,
    hash_gb_s: f64,
    ratio: f64,
    meets_goal: bool,
}

#[derive(Serialize)]
struct ReloadCase {
    tensor: String,
    blob_bytes: usize,
    pack_seconds: f64,
    /// Verified load into a freshly allocated buffer (its page faults included) plus scales.
    reload_seconds: f64,
    /// Verified load into a reused, already faulted-in buffer plus scales.
    reload_warm_seconds: f64,
    /// `pack_seconds / reload_seconds` (the goal's figure).
    ratio: f64,
    /// `pack_seconds / reload_warm_seconds`.
    ratio_warm: f64,
    meets_goal: bool,
}

#[derive(Serialize)]
struct EvictRun {
    evict_src: bool,
    seconds: f64,
    baseline_rss_bytes: u64,
    peak_rss_bytes: u64,
    peak_above_baseline_bytes: u64,
    baseline_rss_anon_bytes: u64,
    peak_rss_anon_bytes: u64,
}

#[derive(Serialize)]
struct EvictCase {
    threads: usize,
    largest_tensor: String,
    largest_tensor_bytes: u64,
    bound_bytes: u64,
    without: EvictRun,
    with: EvictRun,
    peak_ratio: f64,
    meets_goal: bool,
}

#[derive(Serialize)]
struct BenchPackJson {
    model: PathBuf,
    threads: usize,
    pack: Vec<PackCase>,
    load: Vec<LoadCase>,
    reload_vs_pack: Vec<ReloadCase>,
    evict: EvictCase,
}

/// Deterministic xorshift64 for synthetic data.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random but valid Q4_K blocks for a `k × n` tensor: finite positive f16 `d` / `dmin` in
/// [2^-8, 2^-4), random 6-bit scales/mins and 4-bit quants.
fn synth_q4_k(k: usize, n: usize, rng: &mut XorShift) -> Vec<u8> {
    const BLOCK: usize = 2 + 2 + 12 + 128;
    let blocks = k / 256 * n;
    let mut out = Vec::with_capacity(blocks * BLOCK);
    for _ in 0..blocks {
        for _ in 0..2 {
            // Exponent field 7..=10 (2^-8 .. 2^-5 ·1.x), random mantissa: always finite.
            let bits = ((7 + rng.next() % 4) << 10 | (rng.next() & 0x3ff)) as u16;
            out.extend_from_slice(&bits.to_le_bytes());
        }
        out.extend((0..140).map(|_| rng.next() as u8));
    }
    out
}

/// Random finite f16 values of either sign with magnitudes in [2^-10, 2).
fn synth_f16(k: usize, n: usize, rng: &mut XorShift) -> Vec<u8> {
    let mut out = Vec::with_capacity(k * n * 2);
    for _ in 0..k * n {
        let r = rng.next();
        let bits = ((r & 1) << 15 | (5 + (r >> 1) % 11) << 10 | (r >> 8) & 0x3ff) as u16;
        out.extend_from_slice(&bits.to_le_bytes());
    }
    out
}

/// Time packing `src` to int8: one calibration run, then enough iterations for ~0.3 s.
fn pack_case(
    label: String,
    ty: GgmlType,
    src: &dyn RowSource,
    src_bytes: u64,
    threads: usize,
) -> Result<PackCase> {
    let probe = ork_pack::bench_pack(src, PackDtype::I8, threads, 1)
        .with_context(|| format!("packing {label}"))?;
    let iters = ((0.3 / probe.best_seconds.max(1e-6)).ceil() as usize).clamp(3, 500);
    let r = ork_pack::bench_pack(src, PackDtype::I8, threads, iters)
        .with_context(|| format!("packing {label}"))?;
    let per_thread = r.out_bytes_per_sec_per_thread();
    Ok(PackCase {
        source: label,
        ggml_type: ty.to_string(),
        k: r.k,
        n: r.n,
        threads: r.threads,
        iters: r.iters,
        src_bytes,
        out_bytes: r.out_bytes,
        best_seconds: r.best_seconds,
        src_mb_s_per_thread: src_bytes as f64 / r.best_seconds / r.threads as f64 / 1e6,
        out_gb_s_per_thread: per_thread / 1e9,
        meets_goal: per_thread >= GOAL_OUT_PER_CORE,
    })
}

/// Best of `reps` timings of `f`.
fn best_of<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<(f64, T)> {
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let v = f()?;
        best = best.min(t.elapsed().as_secs_f64());
        last = Some(v);
    }
    Ok((best, last.expect("at least one repetition")))
}

/// Run this binary's `convert --json` on `model` and parse its report.
fn convert_child(model: &Path, out: &Path, threads: usize, evict: bool) -> Result<EvictRun> {
    let exe = std::env::current_exe().context("locating the ork binary")?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("convert")
        .arg(model)
        .arg("-o")
        .arg(out)
        .args(["--json", "--threads", &threads.to_string()])
        .env_remove("ORK_EVICT_SRC");
    if evict {
        cmd.arg("--evict-src");
    }
    let o = cmd
        .output()
        .with_context(|| format!("running {} convert", exe.display()))?;
    if !o.status.success() {
        bail!(
            "{} convert {} failed ({}): {}",
            exe.display(),
            model.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let j: ConvertJson =
        serde_json::from_slice(&o.stdout).context("parsing the JSON of ork convert")?;
    Ok(EvictRun {
        evict_src: j.evict_src,
        seconds: j.seconds,
        baseline_rss_bytes: j.baseline_rss_bytes,
        peak_rss_bytes: j.peak_rss_bytes,
        peak_above_baseline_bytes: j.peak_rss_bytes.saturating_sub(j.baseline_rss_bytes),
        baseline_rss_anon_bytes: j.baseline_rss_anon_bytes,
        peak_rss_anon_bytes: j.peak_rss_anon_bytes,
    })
}

/// `ork bench pack --model MODEL.gguf [--threads N] [--json]`.
pub fn bench_pack(model_path: &Path, threads: usize, json: bool) -> Result<ExitCode> {
    let threads = threads.max(1);
    let model = GgufFile::open(model_path)?;
    let weights = matmul_weights(&model)?;
    let note = |s: &str| {
        if !json {
            eprintln!("bench pack: {s}");
        }
    };

    // (a) Pack throughput per source type.
    note("pack throughput");
    let largest_of = |ty: GgmlType| weights.iter().filter(|t| t.ty == ty).max_by_key(|t| t.size);
    let mut pack = Vec::new();
    let mut real: Vec<&TensorInfo> = Vec::new();
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let t = largest_of(ty).with_context(|| {
            format!("{}: no {ty} matmul weight to measure", model_path.display())
        })?;
        let rows = GgufRows::new(&model, t).with_context(|| format!("tensor '{}'", t.name))?;
        pack.push(pack_case(
            format!("{} (model)", t.name),
            ty,
            &rows,
            t.size,
            threads,
        )?);
        real.push(t);
    }
    // Synthetic: a Llama-1B-class FFN projection (K 2048, N 8192).
    let (sk, sn) = (2048usize, 8192usize);
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    for (ty, bytes) in [
        (GgmlType::Q4_K, synth_q4_k(sk, sn, &mut rng)),
        (GgmlType::F16, synth_f16(sk, sn, &mut rng)),
    ] {
        let dims = [sk as u64, sn as u64];
        let rows = GgufRows::from_blocks("synthetic", ty, &dims, &bytes)?;
        pack.push(pack_case(
            format!("synthetic {sk}x{sn}"),
            ty,
            &rows,
            bytes.len() as u64,
            threads,
        )?);
    }

    // (b) + (c): write the measured model weights to a pack, then load / reload them.
    note("load vs memcpy, reload vs pack");
    let dir = tempfile::Builder::new()
        .prefix("ork-bench-pack.")
        .tempdir()
        .context("creating a temp directory")?;
    let pack_path = dir.path().join("bench.orkpack");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("building the pack thread pool")?;
    let mut packed: Vec<(&TensorInfo, f64, PackedWeight)> = Vec::new();
    for &t in &real {
        let rows = GgufRows::new(&model, t).with_context(|| format!("tensor '{}'", t.name))?;
        let (secs, pw) = best_of(5, || {
            ork_pack::pack_in(&pool, &rows, PackDtype::I8)
                .with_context(|| format!("packing tensor '{}'", t.name))
        })?;
        packed.push((t, secs, pw));
    }
    {
        let mut w = OrkpackWriter::create(&pack_path)?;
        for (t, _, pw) in &packed {
            let src = SourceInfo {
                fingerprint: fingerprint(&model, t),
                ggml_type: t.ty.id(),
            };
            w.add(&t.name, pw, src)?;
        }
        w.finish()?;
    }
    let opened = Orkpack::open(&pack_path)?;
    let mut load = Vec::new();
    let mut reload = Vec::new();
    for (t, pack_secs, pw) in &packed {
        let e = opened
            .entry(&t.name)
            .with_context(|| format!("{}: entry '{}' missing", pack_path.display(), t.name))?;
        let b = ork_store::bench_load(&opened, e, 20)?;
        load.push(LoadCase {
            tensor: t.name.clone(),
            bytes: b.bytes,
            memcpy_gb_s: b.memcpy_gb_s,
            load_verified_gb_s: b.load_verified_gb_s,
            load_unverified_gb_s: b.load_unverified_gb_s,
            hash_gb_s: b.hash_gb_s,
            ratio: b.verified_ratio(),
            meets_goal: b.verified_ratio() >= GOAL_LOAD_RATIO,
        });
        let (reload_secs, got) = best_of(10, || Ok(opened.load(&t.name, true)?))?;
        if got != *pw {
            bail!(
                "{}: tensor '{}' reloaded differently from what was packed",
                pack_path.display(),
                t.name
            );
        }
        // Into a reused (already faulted-in) buffer, as a weight-cache slot would be.
        let mut slot = vec![0u8; e.blob_range().1 as usize];
        let (warm_secs, ()) = best_of(10, || {
            opened.load_into(e, &mut slot, true)?;
            opened.scales(e)?;
            Ok(())
        })?;
        let ratio = pack_secs / reload_secs;
        reload.push(ReloadCase {
            tensor: t.name.clone(),
            blob_bytes: pw.data.len(),
            pack_seconds: *pack_secs,
            reload_seconds: reload_secs,
            reload_warm_seconds: warm_secs,
            ratio,
            ratio_warm: pack_secs / warm_secs,
            meets_goal: ratio >= GOAL_RELOAD_RATIO,
        });
    }
    drop(opened);
    drop(packed);

    // (d) Peak RSS of `ork convert` with and without source eviction, in child processes.
    note("convert peak RSS with and without --evict-src (two child processes)");
    let without = convert_child(model_path, &dir.path().join("a.orkpack"), threads, false)?;
    let with = convert_child(model_path, &dir.path().join("b.orkpack"), threads, true)?;
    let (largest, largest_bytes) = weights
        .iter()
        .map(|t| {
            let (k, n) = (t.dims[0] as usize, t.dims[1] as usize);
            let l = ork_pack::TiledLayout::new(PackDtype::I8, k, n);
            let packed = (l.blob_bytes() + 4 * n) as u64;
            (t.name.clone(), packed.max(t.size))
        })
        .max_by_key(|(_, b)| *b)
        .context("the model has no matmul weights")?;
    let bound = largest_bytes * threads as u64 + EVICT_SLACK;
    let evict = EvictCase {
        threads,
        largest_tensor: largest,
        largest_tensor_bytes: largest_bytes,
        bound_bytes: bound,
        peak_ratio: with.peak_rss_bytes as f64 / without.peak_rss_bytes.max(1) as f64,
        meets_goal: with.peak_above_baseline_bytes <= bound,
        without,
        with,
    };

    let out = BenchPackJson {
        model: model_path.to_path_buf(),
        threads,
        pack,
        load,
        reload_vs_pack: reload,
        evict,
    };
    if json {
        print_json(&out)?;
    } else {
        print_bench_pack(&out);
    }
    Ok(ExitCode::SUCCESS)
}

fn goal(met: bool) -> &'static str {
    if met {
        "yes"
    } else {
        "NO"
    }
}

fn print_bench_pack(b: &BenchPackJson) {
    let mib = |x: u64| x as f64 / MIB;
    println!(
        "ork bench pack: {} (threads {})",
        b.model.display(),
        b.threads
    );
    println!();
    println!("(a) pack to int8, per thread (goal >= 1 GB/s of int8 output per core)");
    println!(
        "  {:<6} {:<34} {:>6} {:>6} {:>10} {:>13} {:>12}  goal",
        "type", "tensor", "K", "N", "best ms", "src MB/s/thr", "out GB/s/thr"
    );
    for c in &b.pack {
        println!(
            "  {:<6} {:<34} {:>6} {:>6} {:>10.3} {:>13.0} {:>12.2}  {}",
            c.ggml_type,
            c.source,
            c.k,
            c.n,
            c.best_seconds * 1e3,
            c.src_mb_s_per_thread,
            c.out_gb_s_per_thread,
            goal(c.meets_goal)
        );
    }
    println!();
    println!("(b) verified load into a fresh page-aligned buffer vs memcpy (goal >= 0.8)");
    println!(
        "  {:<24} {:>9} {:>11} {:>11} {:>11} {:>9} {:>6}  goal",
        "tensor", "MiB", "memcpy GB/s", "load GB/s", "no-verify", "hash GB/s", "ratio"
    );
    for c in &b.load {
        println!(
            "  {:<24} {:>9.1} {:>11.2} {:>11.2} {:>11.2} {:>9.2} {:>6.2}  {}",
            c.tensor,
            mib(c.bytes),
            c.memcpy_gb_s,
            c.load_verified_gb_s,
            c.load_unverified_gb_s,
            c.hash_gb_s,
            c.ratio,
            goal(c.meets_goal)
        );
    }
    println!();
    println!("(c) verified reload vs pack of the same weight (goal >= 20x; fresh buffer)");
    println!(
        "  {:<24} {:>9} {:>10} {:>10} {:>7} {:>13} {:>10}  goal",
        "tensor", "MiB", "pack ms", "reload ms", "ratio", "reused-buf ms", "ratio"
    );
    for c in &b.reload_vs_pack {
        println!(
            "  {:<24} {:>9.1} {:>10.2} {:>10.2} {:>6.1}x {:>13.2} {:>9.1}x  {}",
            c.tensor,
            mib(c.blob_bytes as u64),
            c.pack_seconds * 1e3,
            c.reload_seconds * 1e3,
            c.ratio,
            c.reload_warm_seconds * 1e3,
            c.ratio_warm,
            goal(c.meets_goal)
        );
    }
    let e = &b.evict;
    println!();
    println!(
        "(d) ork convert peak RSS, threads {} (goal: with --evict-src, peak above baseline <= \
         largest tensor x threads + 64 MiB = {:.1} MiB; largest: {} {:.1} MiB)",
        e.threads,
        mib(e.bound_bytes),
        e.largest_tensor,
        mib(e.largest_tensor_bytes)
    );
    println!(
        "  {:<14} {:>8} {:>13} {:>13} {:>15} {:>14}",
        "", "seconds", "baseline MiB", "peak MiB", "above base MiB", "anon peak MiB"
    );
    for r in [&e.without, &e.with] {
        println!(
            "  {:<14} {:>8.2} {:>13.1} {:>13.1} {:>15.1} {:>14.1}",
            if r.evict_src {
                "--evict-src"
            } else {
                "no eviction"
            },
            r.seconds,
            mib(r.baseline_rss_bytes),
            mib(r.peak_rss_bytes),
            mib(r.peak_above_baseline_bytes),
            mib(r.peak_rss_anon_bytes)
        );
    }
    println!(
        "  peak with / without: {:.2}; goal met: {}",
        e.peak_ratio,
        goal(e.meets_goal)
    );
}
