//! [`GgufLinear`]: the executor's matmuls computed on the CPU from the GGUF's mapped blocks.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use ork_exec::{ExecError, Linear, WeightSpec};
use ork_gguf::{GgmlType, GgufFile, TensorInfo};
use ork_kernels::blocks::{ActType, Kernel, WeightType};
use ork_manifest::WeightId;

use crate::readahead::ExpertReads;
use crate::{CpuError, CpuPool, ExpertReadOptions, ExpertReadStats};

/// The CPU engine's type for a GGUF tensor type, `None` for a type it has no kernels for
/// (ggml's numbering: IQ4_NL is 20, IQ4_XS 23; `ggml.h`).
pub fn weight_type(ty: GgmlType) -> Option<WeightType> {
    Some(match ty {
        GgmlType::F32 => WeightType::F32,
        GgmlType::F16 => WeightType::F16,
        GgmlType::BF16 => WeightType::BF16,
        GgmlType::Q4_0 => WeightType::Q4_0,
        GgmlType::Q4_1 => WeightType::Q4_1,
        GgmlType::Q5_0 => WeightType::Q5_0,
        GgmlType::Q5_1 => WeightType::Q5_1,
        GgmlType::Q8_0 => WeightType::Q8_0,
        GgmlType::Q2_K => WeightType::Q2_K,
        GgmlType::Q3_K => WeightType::Q3_K,
        GgmlType::Q4_K => WeightType::Q4_K,
        GgmlType::Q5_K => WeightType::Q5_K,
        GgmlType::Q6_K => WeightType::Q6_K,
        GgmlType::Other(20) => WeightType::IQ4_NL,
        GgmlType::Other(23) => WeightType::IQ4_XS,
        _ => return None,
    })
}

/// One weight as the engine computes it: where its rows are in the map, and its kernel.
#[derive(Debug)]
struct CpuWeight {
    /// The weight's bytes as a 2-D tensor (`name` is the weight's key: `TENSOR#EXPERT` for an
    /// expert's slice, whose offset and size are that expert's rows only).
    view: TensorInfo,
    kernel: Kernel,
    k: usize,
    n: usize,
    row_bytes: usize,
    /// An expert's slice: its index in [`ExpertReads`].
    expert: Option<usize>,
}

/// Weights of one type: how many, and their bytes in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeCount {
    /// The type.
    pub ty: WeightType,
    /// Weights (an expert's slice counts as one).
    pub weights: usize,
    /// Their bytes, read in place from the map.
    pub bytes: u64,
}

/// The executor's [`Linear`] computed on the CPU straight from the GGUF's mapped blocks, at the
/// file's own bits: no copy of a weight, no dequantized weight, no pack. Activations are
/// quantized once per call and per activation type the way ggml's CPU backend does
/// ([`WeightType::act_type`]); weight rows are shared among the [`CpuPool`]'s workers.
pub struct GgufLinear {
    gguf: Arc<GgufFile>,
    pool: Arc<CpuPool>,
    /// Indexed by [`WeightId`].
    weights: Vec<Option<CpuWeight>>,
    /// The experts' readahead, pinning and counters.
    experts: ExpertReads,
}

impl std::fmt::Debug for GgufLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufLinear")
            .field("file", &self.gguf.path())
            .field("weights", &self.weights.iter().flatten().count())
            .field("pool", &self.pool)
            .finish()
    }
}

impl GgufLinear {
    /// Serve `weights` (the model's [`ork_exec::Model::matmul_weights`]) from `gguf` on `pool`.
    /// Every weight is checked here, so that a matmul cannot fail on the file's account: it
    /// exists (an expert's slice: its tensor has that expert), its dims are `[k, n]`, its type
    /// has a kernel on this CPU, `k` is a whole number of the type's blocks and its bytes are
    /// exactly `n` rows of them.
    ///
    /// # Errors
    /// [`CpuError::MissingTensor`], [`CpuError::UnsupportedType`] or [`CpuError::BadShape`],
    /// naming the file and the tensor.
    pub fn open(
        gguf: Arc<GgufFile>,
        weights: &[WeightSpec],
        pool: Arc<CpuPool>,
    ) -> Result<GgufLinear, CpuError> {
        Self::open_with(gguf, weights, pool, ExpertReadOptions::default())
    }

    /// [`GgufLinear::open`] with the MoE experts' readahead and pin budget set.
    ///
    /// # Errors
    /// As [`GgufLinear::open`]; [`CpuError::PinAboveRam`] for a pin budget above the RAM.
    pub fn open_with(
        gguf: Arc<GgufFile>,
        weights: &[WeightSpec],
        pool: Arc<CpuPool>,
        options: ExpertReadOptions,
    ) -> Result<GgufLinear, CpuError> {
        let mut table: Vec<Option<CpuWeight>> = Vec::new();
        let mut expert_views = Vec::new();
        for spec in weights {
            let mut w = check_weight(&gguf, spec)?;
            if ork_manifest::is_expert_key(&spec.name) {
                w.expert = Some(expert_views.len());
                expert_views.push(w.view.clone());
            }
            let i = spec.id.index();
            if table.len() <= i {
                table.resize_with(i + 1, || None);
            }
            table[i] = Some(w);
        }
        let experts = ExpertReads::new(&gguf, expert_views, options)?;
        Ok(GgufLinear {
            gguf,
            pool,
            weights: table,
            experts,
        })
    }

    /// The worker pool.
    pub fn pool(&self) -> &Arc<CpuPool> {
        &self.pool
    }

    /// MoE models: the experts' counters, readahead and pinning so far, once the readahead
    /// thread has done what was asked of it before this call (so that pinning decided by the
    /// last ranking is counted).
    pub fn expert_stats(&self) -> ExpertReadStats {
        self.experts.flush();
        self.experts.stats()
    }

    /// The GGUF the weights are read from.
    pub fn gguf(&self) -> &Arc<GgufFile> {
        &self.gguf
    }

    /// A weight's type, if it is served.
    pub fn weight_type(&self, id: WeightId) -> Option<WeightType> {
        let w = self.weights.get(id.index())?.as_ref()?;
        Some(w.kernel.weight_type())
    }

    /// The weights per type, in [`WeightType::ALL`]'s order (types without weights left out).
    pub fn type_counts(&self) -> Vec<TypeCount> {
        WeightType::ALL
            .iter()
            .filter_map(|&ty| {
                let of_ty = self
                    .weights
                    .iter()
                    .flatten()
                    .filter(|w| w.kernel.weight_type() == ty);
                let (weights, bytes) = of_ty.fold((0, 0), |(n, b), w| (n + 1, b + w.view.size));
                (weights > 0).then_some(TypeCount { ty, weights, bytes })
            })
            .collect()
    }

    /// Bytes of every weight served, all read in place from the map.
    pub fn mapped_bytes(&self) -> u64 {
        self.weights.iter().flatten().map(|w| w.view.size).sum()
    }

    fn weight(&self, id: WeightId) -> Result<&CpuWeight, ExecError> {
        self.weights
            .get(id.index())
            .and_then(Option::as_ref)
            .ok_or_else(|| ExecError::UnknownWeight {
                weight: id.to_string(),
            })
    }
}

/// Check one weight (see [`GgufLinear::open`]).
fn check_weight(gguf: &GgufFile, spec: &WeightSpec) -> Result<CpuWeight, CpuError> {
    let path = gguf.path().to_path_buf();
    let bad = |what: String| CpuError::BadShape {
        path: path.clone(),
        tensor: spec.name.clone(),
        what,
    };
    let view =
        ork_manifest::weight_view(gguf, &spec.name).ok_or_else(|| CpuError::MissingTensor {
            path: path.clone(),
            tensor: spec.name.clone(),
        })?;
    if view.dims != [spec.k as u64, spec.n as u64] {
        return Err(bad(format!(
            "dims {:?}, the model expects [{}, {}]",
            view.dims, spec.k, spec.n
        )));
    }
    let unsupported = || CpuError::UnsupportedType {
        path: path.clone(),
        tensor: spec.name.clone(),
        ty: view.ty.to_string(),
        known: supported_types(),
    };
    let ty = weight_type(view.ty).ok_or_else(unsupported)?;
    let kernel = Kernel::best(ty).ok_or_else(unsupported)?;
    let (block, _) = ty.geometry();
    if spec.k == 0 || !spec.k.is_multiple_of(block) {
        return Err(bad(format!(
            "K = {} is not a whole number of {}'s {block}-value blocks",
            spec.k,
            ty.name()
        )));
    }
    let row_bytes = ty.row_bytes(spec.k);
    if (row_bytes as u64).checked_mul(spec.n as u64) != Some(view.size) {
        return Err(bad(format!(
            "{} bytes, but {} rows of {} {} values take {row_bytes} bytes each",
            view.size,
            spec.n,
            spec.k,
            ty.name()
        )));
    }
    Ok(CpuWeight {
        expert: None,
        view,
        kernel,
        k: spec.k,
        n: spec.n,
        row_bytes,
    })
}

/// The types this CPU has kernels for, for messages.
pub fn supported_types() -> String {
    let names: Vec<&str> = WeightType::ALL
        .iter()
        .filter(|&&t| Kernel::best(t).is_some())
        .map(|t| t.name())
        .collect();
    if names.is_empty() {
        return "no type in this build".to_owned();
    }
    names.join(", ")
}

/// Weight rows per task at least: below this, claiming a task costs more than its rows.
const MIN_CHUNK_ROWS: usize = 16;
/// Weight bytes per decode task at least (~2 µs of a core's kernel time): a task's fixed cost
/// (claiming it, the kernel's entry and its activation fields, ~0.3 µs) was most of the time
/// of the 24-row tasks SmolLM2's 192-row k and v projections were cut into.
const MIN_CHUNK_BYTES: usize = 32 * 1024;
/// The block kernels' M > 1 tile height: one weight row per i32 lane, sixteen for the 32-weight
/// blocks on AVX-512 VNNI, eight elsewhere on x86 (`ork_kernels::blocks`, docs/kernels.md). A
/// task of 8 mod 16 rows left the AVX-512 kernel half a panel of discarded lanes.
const PANEL_ROWS: usize = 16;
/// Tasks per worker and weight aimed at, so that a slow worker's share can be taken by others.
const CHUNKS_PER_THREAD: usize = 4;

/// One task of a round: rows `r0..r0 + rows` of weight `w`, written to `out` (`rows × m`).
/// Each on cache lines of its own: the workers lock the tasks they take, and neighbours sharing
/// a line would bounce it between their cores at every task.
#[repr(align(128))]
struct Chunk<'a> {
    w: usize,
    r0: usize,
    rows: usize,
    out: Mutex<&'a mut [f32]>,
}

impl GgufLinear {
    /// Rows per task for weight `w` against `m` activation rows: for M > 1 a multiple of
    /// [`PANEL_ROWS`], so that only a weight's last task can leave rows outside the kernels'
    /// panels; for M = 1 (decode, no panels) of eight, as before the sixteen-row panel, and
    /// at least [`MIN_CHUNK_BYTES`] of the weight.
    fn chunk_rows(&self, w: &CpuWeight, m: usize) -> usize {
        let least = if m == 1 {
            MIN_CHUNK_BYTES.div_ceil(w.row_bytes).max(MIN_CHUNK_ROWS)
        } else {
            MIN_CHUNK_ROWS
        };
        w.n.div_ceil(self.pool.threads() * CHUNKS_PER_THREAD)
            .max(least)
            .next_multiple_of(if m > 1 { PANEL_ROWS } else { 8 })
    }

    /// Quantize `x` once per activation type the weights read; returns the buffers and, per
    /// weight, the index of its buffer.
    fn quantize_acts(ws: &[&CpuWeight], x: &[f32], m: usize) -> (Vec<Vec<u8>>, Vec<usize>) {
        let mut types: Vec<ActType> = Vec::new();
        let mut bufs: Vec<Vec<u8>> = Vec::new();
        let mut of = Vec::with_capacity(ws.len());
        for w in ws {
            let act = w.kernel.act_type();
            let i = match types.iter().position(|&t| t == act) {
                Some(i) => i,
                None => {
                    let mut buf = vec![0u8; m * act.row_bytes(w.k)];
                    w.kernel.quantize(x, w.k, &mut buf);
                    types.push(act);
                    bufs.push(buf);
                    types.len() - 1
                }
            };
            of.push(i);
        }
        (bufs, of)
    }

    /// Compute rows `rows[i]` of every weight `ws[i]` against `acts` into `outs` (`outs[i]` is
    /// `rows[i].len() × m`, row by weight row) in one round of the pool.
    fn round(
        &self,
        (ws, rows): (&[&CpuWeight], &[Range<usize>]),
        acts: &[Vec<u8>],
        act_of: &[usize],
        m: usize,
        outs: Vec<&mut [f32]>,
    ) {
        let mut chunks = Vec::new();
        for (wi, ((w, out), range)) in ws.iter().zip(outs).zip(rows).enumerate() {
            let step = self.chunk_rows(w, m);
            for (c, part) in out.chunks_mut(step * m).enumerate() {
                chunks.push(Chunk {
                    w: wi,
                    r0: range.start + c * step,
                    rows: part.len() / m,
                    out: Mutex::new(part),
                });
            }
        }
        self.pool.run(chunks.len(), |t| {
            let c = &chunks[t];
            let w = ws[c.w];
            let bytes =
                &self.gguf.tensor_data(&w.view)[c.r0 * w.row_bytes..][..c.rows * w.row_bytes];
            let mut out = c.out.lock().unwrap_or_else(|p| p.into_inner());
            w.kernel
                .rows(w.k, bytes, c.rows, &acts[act_of[c.w]], m, &mut out);
        });
    }
}

/// Activation rows per task of [`GgufLinear::transpose`].
const TRANSPOSE_ROWS: usize = 16;
/// Weight rows [`GgufLinear::transpose`] moves at once.
const TRANSPOSE_COLS: usize = 8;

impl GgufLinear {
    /// `y[i·n + r] = t[r·m + i]`: the kernels' `n × m` results as the `m × n` the executor
    /// reads, shared among the workers by rows of `y` (a prefill's transposes, one thread's
    /// strided writes, took 8 % of it).
    fn transpose(&self, t: &[f32], m: usize, n: usize, y: &mut [f32]) {
        if n == 0 {
            // A row range another engine took whole (the row split): nothing to write.
            return;
        }
        let parts: Vec<Mutex<&mut [f32]>> =
            y.chunks_mut(TRANSPOSE_ROWS * n).map(Mutex::new).collect();
        self.pool.run(parts.len(), |p| {
            let mut part = parts[p].lock().unwrap_or_else(|e| e.into_inner());
            let (i0, rows) = (p * TRANSPOSE_ROWS, part.len() / n);
            // Eight weight rows at a time through a small block on the stack, so that each
            // activation row gets eight adjacent values in one copy (value by value, the
            // transposes took ~9 % of a Q4_0 prefill once the kernels were fast).
            let mut r = 0;
            while r + TRANSPOSE_COLS <= n {
                let mut blk = [[0f32; TRANSPOSE_COLS]; TRANSPOSE_ROWS];
                for j in 0..TRANSPOSE_COLS {
                    let col = &t[(r + j) * m + i0..][..rows];
                    for (b, &v) in blk.iter_mut().zip(col) {
                        b[j] = v;
                    }
                }
                for (di, b) in blk.iter().take(rows).enumerate() {
                    part[di * n + r..][..TRANSPOSE_COLS].copy_from_slice(b);
                }
                r += TRANSPOSE_COLS;
            }
            for (r, col) in t.chunks_exact(m).enumerate().skip(r) {
                for (di, &v) in col[i0..i0 + rows].iter().enumerate() {
                    part[di * n + r] = v;
                }
            }
        });
    }

    /// Rows `rows[i]` of each weight `weights[i]`, the others left to another engine (the row
    /// split of `ork_runtime`): `ys[i]` is `m × rows[i].len()`, row-major, each value what
    /// [`Linear::matmul`] computes for that row (the same activation quantization, the same
    /// kernel). Each range must lie inside its weight's `0..n`.
    ///
    /// # Errors
    /// An unknown weight, a range outside the weight, or buffers of the wrong length.
    pub fn matmul_rows(
        &self,
        weights: &[WeightId],
        rows: &[Range<usize>],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), ExecError> {
        let ws = weights
            .iter()
            .map(|&id| self.weight(id))
            .collect::<Result<Vec<_>, _>>()?;
        if rows.len() != ws.len() {
            return Err(ExecError::MatmulShape {
                weight: names(&ws),
                what: format!("{} row ranges for {} weights", rows.len(), ws.len()),
            });
        }
        for (w, r) in ws.iter().zip(rows) {
            if r.start > r.end || r.end > w.n {
                return Err(ExecError::MatmulShape {
                    weight: w.view.name.clone(),
                    what: format!("rows {r:?} outside the weight's {} rows", w.n),
                });
            }
        }
        self.compute(&ws, rows, x, m, ys)
    }

    /// The matmuls of rows `rows[i]` of each weight `ws[i]` (see [`GgufLinear::matmul_rows`]).
    fn compute(
        &self,
        ws: &[&CpuWeight],
        rows: &[Range<usize>],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), ExecError> {
        check_shapes(ws, rows, x, m, ys)?;
        if ws.is_empty() || m == 0 {
            return Ok(());
        }
        for w in ws {
            if let Some(e) = w.expert {
                self.experts.computed(e, m);
            }
        }
        let (acts, act_of) = Self::quantize_acts(ws, x, m);
        if m == 1 {
            // One activation row: `n × 1` is `y` itself.
            let outs = ys.iter_mut().map(|y| &mut **y).collect();
            self.round((ws, rows), &acts, &act_of, m, outs);
        } else {
            let mut yt: Vec<Vec<f32>> = rows.iter().map(|r| vec![0.0; r.len() * m]).collect();
            let outs = yt.iter_mut().map(Vec::as_mut_slice).collect();
            self.round((ws, rows), &acts, &act_of, m, outs);
            for ((r, t), y) in rows.iter().zip(&yt).zip(ys.iter_mut()) {
                self.transpose(t, m, r.len(), y);
            }
        }
        // A page of a file cut short while open reads as zeros: say so instead of returning
        // numbers made from them.
        self.gguf.check_intact(&ws[0].view.name)?;
        Ok(())
    }
}

impl Linear for GgufLinear {
    fn matmul(
        &self,
        weight: WeightId,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ExecError> {
        self.matmul_many(&[weight], x, m, &mut [y])
    }

    fn matmul_many(
        &self,
        weights: &[WeightId],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), ExecError> {
        let ws = weights
            .iter()
            .map(|&id| self.weight(id))
            .collect::<Result<Vec<_>, _>>()?;
        let rows: Vec<Range<usize>> = ws.iter().map(|w| 0..w.n).collect();
        self.compute(&ws, &rows, x, m, ys)
    }

    /// On a worker of the engine's pool ([`CpuPool::run_pass`]): attention's pieces and every
    /// matmul's round then share the pool's threads, and no other pool's threads wait beside
    /// them.
    fn run_pass(&self, pass: &mut (dyn FnMut() + Send)) {
        self.pool.run_pass(pass);
    }

    /// Read the announced experts' bytes ahead into the page cache, exactly each expert's
    /// slice of its tensor, from a background thread (see the expert reader, `ExpertReads`); dense weights,
    /// read every token, are left alone.
    fn upcoming(&self, weights: &[WeightId]) {
        let slices = weights
            .iter()
            .filter_map(|&id| self.weight(id).ok()?.expert)
            .collect();
        self.experts.announce(slices);
    }
}

/// The weights' names, for an error.
fn names(ws: &[&CpuWeight]) -> String {
    ws.iter()
        .map(|w| w.view.name.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// Check `x` and every `y` against the weights' shapes (they share K; `ys[i]` holds the rows
/// `rows[i]` of weight `ws[i]`).
fn check_shapes(
    ws: &[&CpuWeight],
    rows: &[Range<usize>],
    x: &[f32],
    m: usize,
    ys: &[&mut [f32]],
) -> Result<(), ExecError> {
    let bad = |what: String| ExecError::MatmulShape {
        weight: names(ws),
        what,
    };
    if ys.len() != ws.len() {
        return Err(bad(format!(
            "{} outputs for {} weights",
            ys.len(),
            ws.len()
        )));
    }
    for ((w, y), r) in ws.iter().zip(ys).zip(rows) {
        if m.checked_mul(w.k) != Some(x.len()) {
            return Err(bad(format!(
                "x has {} values, expected m·K = {m}·{}",
                x.len(),
                w.k
            )));
        }
        if m.checked_mul(r.len()) != Some(y.len()) {
            return Err(bad(format!(
                "y has {} values, expected m·N = {m}·{}",
                y.len(),
                r.len()
            )));
        }
    }
    Ok(())
}
