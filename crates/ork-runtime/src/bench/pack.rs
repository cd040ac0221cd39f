//! `ork bench pack`: pack throughput, verified load against memcpy, reload against pack and the
//! peak RSS of a convert with and without source eviction, each against its goal, each ratio
//! measured in the same run.

use std::path::{Path, PathBuf};

use ork_gguf::{GgmlType, GgufFile, TensorInfo};
use ork_pack::{GgufRows, PackDtype, PackedWeight, RowSource};
use ork_store::{fingerprint, matmul_weights, Orkpack, OrkpackWriter, SourceInfo};
use serde::Serialize;

use super::{best_of, BenchError, FrontEndError};

/// Goal of the pack benchmark: int8 output per core, bytes per second.
const GOAL_OUT_PER_CORE: f64 = 1e9;
/// Goal: verified load at least this fraction of memcpy.
const GOAL_LOAD_RATIO: f64 = 0.8;
/// Goal: reload at least this many times faster than packing.
const GOAL_RELOAD_RATIO: f64 = 20.0;
/// Slack of the eviction goal above `largest tensor × threads`.
pub const EVICT_SLACK: u64 = 64 << 20;

/// (a) Packing one tensor to int8.
#[derive(Clone, Debug, Serialize)]
pub struct PackCase {
    /// The tensor (`NAME (model)`) or `synthetic KxN`.
    pub source: String,
    /// Its ggml block type.
    pub ggml_type: String,
    /// Row length.
    pub k: usize,
    /// Rows.
    pub n: usize,
    /// Pack threads.
    pub threads: usize,
    /// Timed iterations.
    pub iters: usize,
    /// Source bytes.
    pub src_bytes: u64,
    /// Packed int8 bytes.
    pub out_bytes: usize,
    /// The best iteration's time.
    pub best_seconds: f64,
    /// Source MB/s per thread.
    pub src_mb_s_per_thread: f64,
    /// Output GB/s per thread.
    pub out_gb_s_per_thread: f64,
    /// Output per thread at least 1 GB/s.
    pub meets_goal: bool,
}

/// (b) Verified load of one packed tensor against memcpy.
#[derive(Clone, Debug, Serialize)]
pub struct LoadCase {
    /// The tensor.
    pub tensor: String,
    /// Its blob bytes.
    pub bytes: u64,
    /// memcpy of the same bytes.
    pub memcpy_gb_s: f64,
    /// Load with checksum verification.
    pub load_verified_gb_s: f64,
    /// Load without it.
    pub load_unverified_gb_s: f64,
    /// The checksum alone.
    pub hash_gb_s: f64,
    /// Verified load / memcpy.
    pub ratio: f64,
    /// `ratio` at least 0.8.
    pub meets_goal: bool,
}

/// (c) Reloading one packed tensor against packing it.
#[derive(Clone, Debug, Serialize)]
pub struct ReloadCase {
    /// The tensor.
    pub tensor: String,
    /// Its packed blob bytes.
    pub blob_bytes: usize,
    /// Best pack time.
    pub pack_seconds: f64,
    /// Verified load into a freshly allocated buffer (its page faults included) plus scales.
    pub reload_seconds: f64,
    /// Verified load into a reused, already faulted-in buffer plus scales.
    pub reload_warm_seconds: f64,
    /// `pack_seconds / reload_seconds` (the goal's figure).
    pub ratio: f64,
    /// `pack_seconds / reload_warm_seconds`.
    pub ratio_warm: f64,
    /// `ratio` at least 20.
    pub meets_goal: bool,
}

/// (d) One `ork convert` run, as its front end reports it.
#[derive(Clone, Debug, Serialize)]
pub struct EvictRun {
    /// With `--evict-src`.
    pub evict_src: bool,
    /// Wall time.
    pub seconds: f64,
    /// RSS before converting.
    pub baseline_rss_bytes: u64,
    /// Peak RSS.
    pub peak_rss_bytes: u64,
    /// Peak above baseline.
    pub peak_above_baseline_bytes: u64,
    /// Anonymous RSS before converting.
    pub baseline_rss_anon_bytes: u64,
    /// Peak anonymous RSS.
    pub peak_rss_anon_bytes: u64,
}

/// (d) Convert's peak RSS with and without source eviction.
#[derive(Clone, Debug, Serialize)]
pub struct EvictCase {
    /// Convert threads.
    pub threads: usize,
    /// The largest matmul weight (packed or source, whichever is larger).
    pub largest_tensor: String,
    /// Its bytes.
    pub largest_tensor_bytes: u64,
    /// The goal: `largest × threads + 64 MiB` above baseline.
    pub bound_bytes: u64,
    /// Without `--evict-src`.
    pub without: EvictRun,
    /// With `--evict-src`.
    pub with: EvictRun,
    /// Peak with / peak without.
    pub peak_ratio: f64,
    /// With eviction, the peak above baseline is within the bound.
    pub meets_goal: bool,
}

/// The report of `ork bench pack`.
#[derive(Clone, Debug, Serialize)]
pub struct PackBenchReport {
    /// The GGUF model.
    pub model: PathBuf,
    /// Threads.
    pub threads: usize,
    /// (a)
    pub pack: Vec<PackCase>,
    /// (b)
    pub load: Vec<LoadCase>,
    /// (c)
    pub reload_vs_pack: Vec<ReloadCase>,
    /// (d)
    pub evict: EvictCase,
}

/// One `ork convert` the driver needs run in a fresh process (its peak RSS is the figure), by
/// the front end that knows how to start one.
#[derive(Clone, Copy, Debug)]
pub struct ConvertRequest<'a> {
    /// The GGUF model.
    pub model: &'a Path,
    /// The `.orkpack` to write.
    pub out: &'a Path,
    /// Convert threads.
    pub threads: usize,
    /// With `--evict-src`.
    pub evict_src: bool,
}

/// The front end's part of `ork bench pack`: progress notes, and the convert child processes.
pub struct PackBenchFrontEnd<'a> {
    /// A note as each part starts.
    pub note: &'a dyn Fn(&str),
    /// Run one convert in a child process and report its figures.
    pub convert: &'a dyn Fn(&ConvertRequest<'_>) -> Result<EvictRun, FrontEndError>,
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

fn pack_error(what: String) -> impl FnOnce(ork_pack::PackError) -> BenchError {
    move |source| BenchError::Pack {
        what,
        source: Box::new(source),
    }
}

/// Time packing `src` to int8: one calibration run, then enough iterations for ~0.3 s.
fn pack_case(
    label: String,
    ty: GgmlType,
    src: &dyn RowSource,
    src_bytes: u64,
    threads: usize,
) -> Result<PackCase, BenchError> {
    let probe = ork_pack::bench_pack(src, PackDtype::I8, threads, 1)
        .map_err(pack_error(format!("packing {label}")))?;
    let iters = ((0.3 / probe.best_seconds.max(1e-6)).ceil() as usize).clamp(3, 500);
    let r = ork_pack::bench_pack(src, PackDtype::I8, threads, iters)
        .map_err(pack_error(format!("packing {label}")))?;
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

/// Measures packing, loading and converting `model` with `threads` threads (at least 1):
/// (a) pack throughput of the model's largest Q4_1 and Q8_0 weights and of synthetic Q4_K and
/// F16 tensors, (b) + (c) verified load against memcpy and reload against pack of the model's
/// weights written to a temp `.orkpack`, (d) peak RSS of two converts run by the front end.
///
/// # Errors
/// The model does not open or lacks a Q4_1 or Q8_0 matmul weight, packing or the temp pack
/// fails, a weight reads back differently, or a convert the front end runs fails.
pub fn bench_pack(
    model_path: &Path,
    threads: usize,
    front: &PackBenchFrontEnd<'_>,
) -> Result<PackBenchReport, BenchError> {
    let threads = threads.max(1);
    let model = GgufFile::open(model_path)?;
    let weights = matmul_weights(&model)?;
    (front.note)("pack throughput");
    let (mut pack, real) = pack_model_weights(&model, model_path, &weights, threads)?;
    pack.extend(pack_synthetic(threads)?);
    (front.note)("load vs memcpy, reload vs pack");
    let dir = tempfile::Builder::new()
        .prefix("ork-bench-pack.")
        .tempdir()
        .map_err(|source| BenchError::Io {
            what: "creating a temp directory".into(),
            source,
        })?;
    let (load, reload_vs_pack) = load_and_reload(&model, &real, threads, dir.path())?;
    (front.note)("convert peak RSS with and without --evict-src (two child processes)");
    let evict = evict_case(model_path, &weights, threads, dir.path(), front)?;
    Ok(PackBenchReport {
        model: model_path.to_path_buf(),
        threads,
        pack,
        load,
        reload_vs_pack,
        evict,
    })
}

/// (a) on the model: its largest Q4_1 and Q8_0 matmul weights, which (b) and (c) then use.
fn pack_model_weights<'m>(
    model: &GgufFile,
    model_path: &Path,
    weights: &'m [TensorInfo],
    threads: usize,
) -> Result<(Vec<PackCase>, Vec<&'m TensorInfo>), BenchError> {
    let largest_of = |ty: GgmlType| weights.iter().filter(|t| t.ty == ty).max_by_key(|t| t.size);
    let mut pack = Vec::new();
    let mut real: Vec<&TensorInfo> = Vec::new();
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let t = largest_of(ty).ok_or_else(|| BenchError::Model {
            what: format!("{}: no {ty} matmul weight to measure", model_path.display()),
        })?;
        let rows = GgufRows::new(model, t).map_err(pack_error(format!("tensor '{}'", t.name)))?;
        pack.push(pack_case(
            format!("{} (model)", t.name),
            ty,
            &rows,
            t.size,
            threads,
        )?);
        real.push(t);
    }
    Ok((pack, real))
}

/// (a) on synthetic data: a Llama-1B-class FFN projection (K 2048, N 8192) in Q4_K and F16.
fn pack_synthetic(threads: usize) -> Result<Vec<PackCase>, BenchError> {
    let (sk, sn) = (2048usize, 8192usize);
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut pack = Vec::new();
    for (ty, bytes) in [
        (GgmlType::Q4_K, synth_q4_k(sk, sn, &mut rng)),
        (GgmlType::F16, synth_f16(sk, sn, &mut rng)),
    ] {
        let dims = [sk as u64, sn as u64];
        let rows = GgufRows::from_blocks("synthetic", ty, &dims, &bytes)
            .map_err(pack_error(format!("synthetic {ty}")))?;
        pack.push(pack_case(
            format!("synthetic {sk}x{sn}"),
            ty,
            &rows,
            bytes.len() as u64,
            threads,
        )?);
    }
    Ok(pack)
}

/// (b) + (c): pack the measured weights (best of 5), write them to a pack in `dir`, then load
/// and reload them from it.
fn load_and_reload(
    model: &GgufFile,
    real: &[&TensorInfo],
    threads: usize,
    dir: &Path,
) -> Result<(Vec<LoadCase>, Vec<ReloadCase>), BenchError> {
    let pack_path = dir.join("bench.orkpack");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| BenchError::Io {
            what: "building the pack thread pool".into(),
            source: std::io::Error::other(e),
        })?;
    let mut packed: Vec<(&TensorInfo, f64, PackedWeight)> = Vec::new();
    for &t in real {
        let rows = GgufRows::new(model, t).map_err(pack_error(format!("tensor '{}'", t.name)))?;
        let (secs, pw) = best_of(5, || {
            ork_pack::pack_in(&pool, &rows, PackDtype::I8)
                .map_err(pack_error(format!("packing tensor '{}'", t.name)))
        })?;
        packed.push((t, secs, pw));
    }
    let mut w = OrkpackWriter::create(&pack_path)?;
    for (t, _, pw) in &packed {
        let src = SourceInfo {
            fingerprint: fingerprint(model, t),
            ggml_type: t.ty.id(),
        };
        w.add(&t.name, pw, src)?;
    }
    w.finish()?;
    let opened = Orkpack::open(&pack_path)?;
    let mut load = Vec::new();
    let mut reload = Vec::new();
    for (t, pack_secs, pw) in &packed {
        let (l, r) = load_and_reload_one(&opened, &pack_path, t, *pack_secs, pw)?;
        load.push(l);
        reload.push(r);
    }
    Ok((load, reload))
}

/// (b) and (c) for one weight `t` of `opened`, packed in `pack_secs` to `pw`.
fn load_and_reload_one(
    opened: &Orkpack,
    pack_path: &Path,
    t: &TensorInfo,
    pack_secs: f64,
    pw: &PackedWeight,
) -> Result<(LoadCase, ReloadCase), BenchError> {
    let e = opened.entry(&t.name).ok_or_else(|| BenchError::Model {
        what: format!("{}: entry '{}' missing", pack_path.display(), t.name),
    })?;
    let b = ork_store::bench_load(opened, e, 20)?;
    let load = LoadCase {
        tensor: t.name.clone(),
        bytes: b.bytes,
        memcpy_gb_s: b.memcpy_gb_s,
        load_verified_gb_s: b.load_verified_gb_s,
        load_unverified_gb_s: b.load_unverified_gb_s,
        hash_gb_s: b.hash_gb_s,
        ratio: b.verified_ratio(),
        meets_goal: b.verified_ratio() >= GOAL_LOAD_RATIO,
    };
    let (reload_secs, got) = best_of(10, || opened.load(&t.name, true))?;
    if got != *pw {
        return Err(BenchError::Mismatch {
            path: pack_path.to_path_buf(),
            tensor: t.name.clone(),
        });
    }
    // Into a reused (already faulted-in) buffer, as a weight-cache slot would be.
    let mut slot = vec![0u8; e.blob_range().1 as usize];
    let (warm_secs, ()) = best_of(10, || {
        opened.load_into(e, &mut slot, true)?;
        opened.scales(e)?;
        Ok::<(), ork_store::StoreError>(())
    })?;
    let ratio = pack_secs / reload_secs;
    let reload = ReloadCase {
        tensor: t.name.clone(),
        blob_bytes: pw.data.len(),
        pack_seconds: pack_secs,
        reload_seconds: reload_secs,
        reload_warm_seconds: warm_secs,
        ratio,
        ratio_warm: pack_secs / warm_secs,
        meets_goal: ratio >= GOAL_RELOAD_RATIO,
    };
    Ok((load, reload))
}

/// (d): two converts of the model into `dir`, without and with `--evict-src`, against the bound
/// `largest weight × threads + 64 MiB`.
fn evict_case(
    model_path: &Path,
    weights: &[TensorInfo],
    threads: usize,
    dir: &Path,
    front: &PackBenchFrontEnd<'_>,
) -> Result<EvictCase, BenchError> {
    let convert = |name: &str, evict_src: bool| {
        let out = dir.join(name);
        let request = ConvertRequest {
            model: model_path,
            out: &out,
            threads,
            evict_src,
        };
        (front.convert)(&request).map_err(|source| BenchError::FrontEnd {
            what: format!("ork convert {}", model_path.display()),
            source,
        })
    };
    let without = convert("a.orkpack", false)?;
    let with = convert("b.orkpack", true)?;
    let (largest, largest_bytes) = weights
        .iter()
        .map(|t| {
            let (k, n) = (t.dims[0] as usize, t.dims[1] as usize);
            let l = ork_pack::TiledLayout::new(PackDtype::I8, k, n);
            let packed = (l.blob_bytes() + 4 * n) as u64;
            (t.name.clone(), packed.max(t.size))
        })
        .max_by_key(|(_, b)| *b)
        .ok_or_else(|| BenchError::Model {
            what: "the model has no matmul weights".into(),
        })?;
    let bound = largest_bytes * threads as u64 + EVICT_SLACK;
    Ok(EvictCase {
        threads,
        largest_tensor: largest,
        largest_tensor_bytes: largest_bytes,
        bound_bytes: bound,
        peak_ratio: with.peak_rss_bytes as f64 / without.peak_rss_bytes.max(1) as f64,
        meets_goal: with.peak_above_baseline_bytes <= bound,
        without,
        with,
    })
}
