//! `ork convert`, `ork inspect` and `ork verify`: the pack-once, load-forever verbs over
//! `ork-gguf` → `ork-pack` → `ork-store` (`ork bench pack` is in `cmd_bench_pack.rs`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ork_gguf::{GgmlType, GgufFile, TensorInfo};
use ork_pack::{GgufRows, PackDtype};
use ork_store::{check_entry, matmul_weights, ConvertOptions, EntryStatus, Orkpack, StoreError};
use serde::{Deserialize, Serialize};

use crate::cli::{ConvertArgs, InspectArgs, VerifyArgs};
use crate::rss;

pub(crate) const MIB: f64 = (1u64 << 20) as f64;

/// Whether an on/off environment variable is set to something other than empty or `0`.
fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0")
}

pub(crate) fn print_json<T: Serialize>(v: &T) -> Result<()> {
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
pub(crate) struct ConvertJson {
    pub(crate) model: PathBuf,
    pub(crate) output: PathBuf,
    pub(crate) dtype: String,
    pub(crate) evict_src: bool,
    pub(crate) threads: Option<usize>,
    pub(crate) tensors_packed: usize,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) file_bytes: u64,
    pub(crate) seconds: f64,
    /// VmRSS when the command started, before the model was opened.
    pub(crate) baseline_rss_bytes: u64,
    /// VmHWM at the end (peak resident set, file pages of the GGUF map included).
    pub(crate) peak_rss_bytes: u64,
    /// RssAnon when the command started.
    pub(crate) baseline_rss_anon_bytes: u64,
    /// Highest RssAnon seen, sampled every 5 ms.
    pub(crate) peak_rss_anon_bytes: u64,
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
    let config = convert_config(args, &output);
    let dtype: PackDtype = config.dtype;
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
        print_convert(&out);
    }
    Ok(ExitCode::SUCCESS)
}

/// The engine configuration `ork convert` validates and packs with: `args`' chip, dtype, quant
/// and smoothing, the pack at `output`. The smoothed weights (docs/chip.md) are folded in
/// memory before packing; the factors come from the output pack when it holds them for the same
/// parameters, else from calibration.
fn convert_config(args: &ConvertArgs, output: &std::path::Path) -> ork_runtime::EngineConfig {
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
    config.pack = ork_runtime::PackChoice::Path(output.to_path_buf());
    config
}

/// `ork convert`'s text report.
fn print_convert(out: &ConvertJson) {
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
        if out.evict_src { "on" } else { "off" }
    );
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
    let (valid, problems) = check_entries(args, &model, &weights, &pack)?;
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

/// Check every matmul weight's entry in `pack` (with `--deep`, repacked and compared), and
/// name the entries that are no weight of the model; (valid entries, problems).
fn check_entries(
    args: &VerifyArgs,
    model: &GgufFile,
    weights: &[ork_gguf::TensorInfo],
    pack: &Orkpack,
) -> Result<(usize, Vec<Problem>)> {
    let mut problems = Vec::new();
    let mut valid = 0usize;
    for t in weights {
        let Some(e) = pack.entry(&t.name) else {
            problems.push(Problem {
                tensor: t.name.clone(),
                status: Verdict::Missing,
                reason: "matmul weight of the model has no entry".into(),
            });
            continue;
        };
        let dtype = args.dtype.map_or(e.layout().dtype, Into::into);
        let (status, reason) = match check_entry(pack, e, model, t, dtype) {
            EntryStatus::Valid if args.deep => match deep_compare(pack, model, t, dtype)? {
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
    Ok((valid, problems))
}
