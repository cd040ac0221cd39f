//! The non-matmul operators of the forward pass, in f32 on the CPU.
//!
//! Numerics follow ggml's CPU reference operators (`ggml-cpu/ops.cpp`): RMSNorm accumulates the
//! sum of squares in double, attention uses a max-subtracted softmax, RoPE angles are
//! `pos · freq_scale · base^(-2i/n_rot)`.
use crate::config::RopeStyle;
use rayon::prelude::*;

/// RMSNorm of each row of `x` (row width = `weight.len()`), scaled by `weight`, in place.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let width = weight.len();
    debug_assert!(width > 0 && x.len().is_multiple_of(width));
    for row in x.chunks_exact_mut(width) {
        rms_norm_row(row, weight, eps);
    }
}

fn rms_norm_row(row: &mut [f32], weight: &[f32], eps: f32) {
    let sum: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (sum / row.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (v, w) in row.iter_mut().zip(weight) {
        *v = *v * scale * w;
    }
}

/// Rotary position embedding for one model: the inverse frequencies of each rotated pair.
#[derive(Clone, Debug)]
pub struct Rope {
    style: RopeStyle,
    n_rot: usize,
    /// `freq_scale · base^(-2i/n_rot)` for `i < n_rot/2`.
    inv_freq: Vec<f64>,
}

impl Rope {
    /// A rope rotating the first `n_rot` (even) values of each head.
    pub fn new(style: RopeStyle, n_rot: usize, base: f32, freq_scale: f32) -> Rope {
        let inv_freq = (0..n_rot / 2)
            .map(|i| f64::from(freq_scale) * f64::from(base).powf(-2.0 * i as f64 / n_rot as f64))
            .collect();
        Rope {
            style,
            n_rot,
            inv_freq,
        }
    }

    /// The (cos, sin) of each pair's angle at `pos`.
    pub fn angles(&self, pos: usize) -> Vec<(f32, f32)> {
        self.inv_freq
            .iter()
            .map(|f| {
                let theta = pos as f64 * f;
                (theta.cos() as f32, theta.sin() as f32)
            })
            .collect()
    }

    /// Rotate every head (width `head_dim`) of `x` by the angles from [`Rope::angles`].
    pub fn apply(&self, x: &mut [f32], head_dim: usize, angles: &[(f32, f32)]) {
        debug_assert!(self.n_rot <= head_dim && x.len().is_multiple_of(head_dim));
        let half = self.n_rot / 2;
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(cos, sin)) in angles.iter().enumerate().take(half) {
                let (a, b) = match self.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

/// SiLU(gate) · up, element-wise into `gate`, eight lanes wide where the CPU allows
/// (`ork_exec::wide`; the same bits either way).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    crate::wide::wide(Swiglu { gate, up });
}

struct Swiglu<'a> {
    gate: &'a mut [f32],
    up: &'a [f32],
}

impl crate::wide::Kernel for Swiglu<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        for (g, u) in self.gate.iter_mut().zip(self.up) {
            *g = *g / (1.0 + exp(-*g)) * u;
        }
    }
}

/// `e^x` for f32 without a branch or a library call, so that a loop of it vectorizes (libm's
/// `expf` is called one value at a time): Cephes' `expf` — `x = n·ln 2 + r` with `n` rounded to
/// nearest and |r| ≤ ln 2 / 2, a degree-6 polynomial for `e^r`, `2^n` put into the exponent
/// bits. Within 2 ulp of the true value for normal results (a test checks it against `f64`'s
/// `exp` over the whole range); `x` is clamped to [-87.34, 88.38], so a result below `2^-126`
/// is ~`1.2e-38` rather than subnormal or 0, and one above ~`2.4e38` is that rather than
/// infinity; NaN stays NaN. Plain multiplies and adds (no fused ones): the same bits in every
/// build.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two, the first with few mantissa bits, so `n · LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 · 2^23 rounds to the nearest integer (ties to even).
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.336_55, 88.376_26);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // n ∈ [-126, 127] after the clamp: a normal power of two (NaN casts to 0, y stays NaN).
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Shape of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Size of a q/k head.
    pub head_dim_k: usize,
    /// Size of a v head.
    pub head_dim_v: usize,
}

/// A value a KV cache stores: `f32`, or [`half::f16`] (the session's cache, as llama.cpp keeps
/// its own by default: half the bytes to hold and to read at every token).
pub trait KvValue: Copy + Send + Sync + 'static {
    /// `dst[i] = src[i]` as f32, exactly (`src.len() == dst.len()`).
    fn widen(src: &[Self], dst: &mut [f32]);

    /// `src` itself when it is f32 already.
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
}

impl KvValue for f32 {
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    fn as_f32(src: &[f32]) -> Option<&[f32]> {
        Some(src)
    }
}

impl KvValue for half::f16 {
    /// Eight at a time with F16C where the CPU has it.
    fn widen(src: &[half::f16], dst: &mut [f32]) {
        crate::widen::f16_to_f32(src, dst);
    }

    fn as_f32(_: &[half::f16]) -> Option<&[f32]> {
        None
    }
}

/// Causal grouped-query attention for `m` query rows.
///
/// `q` is `m × (n_head·head_dim_k)`; `keys[g]` / `values[g]` hold key/value head `g` at every
/// cached position (`t × head_dim`, position after position), the queries being the last `m`
/// positions: query row `i` sits at position `t - m + i` and attends to positions
/// `0..=t - m + i`. `out` is `m × (n_head·head_dim_v)`.
///
/// Per head: scores `q·k / √d` by [`dot`], a max-subtracted softmax with [`exp`] summed in f64,
/// the value rows added in position order. The cached values are widened to f32 exactly before
/// use, so an f16 cache gives the bits of an f32 cache holding the same (rounded) values. A row
/// over more than [`ATTENTION_PIECE`] positions is computed in pieces of that many, in parallel
/// (so that one decoded row spreads over every core), each keeping its maximum `max_c`, its sum
/// of exponentials `sum_c` and its unnormalised weighted values `acc_c`; with `M` the largest
/// `max_c` and `S = Σ_c sum_c · e^(max_c − M)` (f64), the output is
/// `Σ_c (acc_c · e^(max_c − M)) · (1 / S)`, pieces in order. Measured with
/// `examples/attn_bench` (README "End to end").
pub fn attention<T: KvValue>(
    shape: AttentionShape,
    q: &[f32],
    keys: &[&[T]],
    values: &[&[T]],
    m: usize,
    out: &mut [f32],
) {
    let AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
    } = shape;
    debug_assert_eq!(keys.len(), n_head_kv);
    debug_assert_eq!(values.len(), n_head_kv);
    let t = keys.first().map_or(0, |k| k.len() / dk);
    debug_assert!(keys.iter().all(|k| k.len() == t * dk));
    debug_assert!(values.iter().all(|v| v.len() == t * dv));
    debug_assert!(m <= t);
    debug_assert_eq!(q.len(), m * n_head * dk);
    debug_assert_eq!(out.len(), m * n_head * dv);
    let first_pos = t - m;
    Geometry::new(shape).attend_rows(q, keys, values, out, |i| 0..first_pos + i + 1);
}

/// Tree attention for `m` query rows that are the nodes of a tree of drafted tokens (tree
/// verification in speculative decoding, `docs/speculative.md`).
///
/// `keys` / `values` are laid out as for [`attention`], the last `m` positions being the tree's
/// nodes in `parents` order; node `i` attends to the `t - m` positions before the tree and then
/// to its ancestors from the root down and itself (`parents[i]` is its parent node, `None` for a
/// node that follows the cached positions directly; a parent comes before its child). The keys a
/// node sees, and their order, are those of the same tokens decoded one by one along its branch,
/// so its output is bit for bit the causal [`attention`]'s output for that branch.
pub fn attention_tree<T: KvValue>(
    shape: AttentionShape,
    q: &[f32],
    keys: &[&[T]],
    values: &[&[T]],
    parents: &[Option<usize>],
    out: &mut [f32],
) {
    let AttentionShape {
        n_head,
        head_dim_k: dk,
        head_dim_v: dv,
        ..
    } = shape;
    let m = parents.len();
    let t = keys.first().map_or(0, |k| k.len() / dk);
    debug_assert!(m <= t);
    debug_assert_eq!(q.len(), m * n_head * dk);
    debug_assert_eq!(out.len(), m * n_head * dv);
    let first_pos = t - m;
    // Each node's key positions: the cached prefix, then its branch from the root down.
    let branches: Vec<Vec<usize>> = (0..m)
        .map(|i| {
            let mut b = vec![first_pos + i];
            let mut at = parents[i];
            while let Some(p) = at {
                debug_assert!(p < i);
                b.push(first_pos + p);
                at = parents[p];
            }
            b.reverse();
            b
        })
        .collect();
    Geometry::new(shape).attend_rows(q, keys, values, out, |i| {
        (0..first_pos).chain(branches[i].iter().copied())
    });
}

/// Key/value positions per piece of one attention row: a row over more positions is computed in
/// pieces of this many, in parallel, and their softmaxes merged (see [`attention`]).
/// The split depends on the number of positions alone, never on the batch or the threads, so a
/// row's result is the same bits in every call that gives it the same positions in the same
/// order.
pub const ATTENTION_PIECE: usize = 128;

/// One piece of attention as a [`crate::wide::Kernel`], so that its loops run as wide as the
/// CPU allows.
struct Attend<'a, T> {
    geometry: &'a Geometry,
    qg: &'a [f32],
    keys: Rows<'a, T>,
    values: Rows<'a, T>,
    positions: &'a [usize],
    whole: bool,
}

/// One key/value head's cached rows as a unit of attention finds them.
#[derive(Clone, Copy)]
enum Rows<'a, T> {
    /// f32 already (an f32 cache, or a head widened for a whole batch): read in place.
    Wide(&'a [f32]),
    /// To widen, the unit's positions only.
    Narrow(&'a [T]),
}

impl<'a, T: KvValue> Rows<'a, T> {
    /// The rows of `d` values at `positions` as f32, and whether row `j` is at `j` (widened
    /// into `scratch`) rather than at its position (read in place).
    #[inline(always)]
    fn as_f32<'b>(
        self,
        d: usize,
        positions: &[usize],
        scratch: &'b mut Vec<f32>,
    ) -> (&'b [f32], bool)
    where
        'a: 'b,
    {
        match self {
            Rows::Wide(w) => (w, false),
            Rows::Narrow(h) => {
                scratch.resize(positions.len() * d, 0.0);
                widen_rows(h, d, positions, scratch);
                (scratch, true)
            }
        }
    }
}

impl<T: KvValue> crate::wide::Kernel for Attend<'_, T> {
    type Out = Piece;
    #[inline(always)]
    fn run(self) -> Piece {
        self.geometry
            .attend(self.qg, self.keys, self.values, self.positions, self.whole)
    }
}

/// The result of attending over some positions for the query heads of one key/value head.
enum Piece {
    /// All of the row's positions: the normalised output, `group` heads of `dv` values.
    Whole(Vec<f32>),
    /// A piece of them: per head the largest score, the sum of `e^(score - max)` (f64) and the
    /// value rows weighted by those exponentials, not normalised.
    Part {
        max: Vec<f32>,
        sum: Vec<f64>,
        acc: Vec<f32>,
    },
}

/// Sizes of one attention call, shared by [`attention`] and [`attention_tree`].
struct Geometry {
    n_head: usize,
    group: usize,
    dk: usize,
    dv: usize,
    scale: f32,
}

impl Geometry {
    fn new(s: AttentionShape) -> Geometry {
        Geometry {
            n_head: s.n_head,
            group: s.n_head / s.n_head_kv,
            dk: s.head_dim_k,
            dv: s.head_dim_v,
            scale: 1.0 / (s.head_dim_k as f32).sqrt(),
        }
    }

    /// Every query row `i` of `q` (`n_head` heads of `dk` values each) over its key/value
    /// positions `rows_of(i)`, into its row of `out`, in parallel over units of one query row,
    /// one key/value head (whose query heads read each cached row once) and one piece of at most
    /// [`ATTENTION_PIECE`] positions, so that a single decoded row still spreads over every core.
    ///
    /// A row over at most [`ATTENTION_PIECE`] positions is one piece, normalised as it is summed.
    /// A row over more is merged from its pieces `c` in order: with `M` the largest of their
    /// maxima, `S = Σ_c sum_c · e^(max_c − M)` (f64) and the output
    /// `Σ_c (acc_c · e^(max_c − M)) · (1 / S)`.
    fn attend_rows<'s, T: KvValue, R: Iterator<Item = usize>>(
        &self,
        q: &[f32],
        keys: &[&'s [T]],
        values: &[&'s [T]],
        out: &mut [f32],
        rows_of: impl Fn(usize) -> R + Sync,
    ) {
        let n_kv = self.n_head / self.group;
        let (gq, gv) = (self.group * self.dk, self.group * self.dv);
        let m = out.len() / (n_kv * gv).max(1);
        let positions: Vec<Vec<usize>> = (0..m).map(|i| rows_of(i).collect()).collect();
        // Each head's rows: an f32 cache in place. A narrower one is widened by each unit over
        // its own positions when one row reads them (decode: every position once, in parallel
        // pieces), and once per head here, in parallel, when a batch's rows all read them.
        let widened: Vec<Vec<f32>> =
            if m > 1 && T::as_f32(keys.first().map_or(&[], |k| k)).is_none() {
                keys.iter()
                    .chain(values)
                    .collect::<Vec<_>>()
                    .par_iter()
                    .map(|h| {
                        let mut w = vec![0.0f32; h.len()];
                        T::widen(h, &mut w);
                        w
                    })
                    .collect()
            } else {
                Vec::new()
            };
        let rows = |heads: &[&'s [T]], at: usize| -> Vec<Rows<'_, T>> {
            heads
                .iter()
                .enumerate()
                .map(|(g, h)| match (T::as_f32(h), widened.get(at + g)) {
                    (Some(w), _) => Rows::Wide(w),
                    (None, Some(w)) => Rows::Wide(w),
                    (None, None) => Rows::Narrow(h),
                })
                .collect()
        };
        let (krows, vrows) = (rows(keys, 0), rows(values, n_kv));
        // Units in (row, key/value head, piece) order; `starts[u]` is the first of output unit
        // u = (row, key/value head).
        let mut units = Vec::new();
        let mut starts = Vec::with_capacity(m * n_kv + 1);
        for (i, pos) in positions.iter().enumerate() {
            let pieces = pos.len().div_ceil(ATTENTION_PIECE).max(1);
            for g in 0..n_kv {
                starts.push(units.len());
                for c in 0..pieces {
                    let end = ((c + 1) * ATTENTION_PIECE).min(pos.len());
                    units.push((i, g, &pos[(c * ATTENTION_PIECE).min(end)..end], pieces == 1));
                }
            }
        }
        starts.push(units.len());
        let pieces: Vec<Piece> = units
            .par_iter()
            .map(|&(i, g, positions, whole)| {
                crate::wide::wide(Attend {
                    geometry: self,
                    qg: &q[i * self.n_head * self.dk + g * gq..][..gq],
                    keys: krows[g],
                    values: vrows[g],
                    positions,
                    whole,
                })
            })
            .collect();
        // A merge is a few hundred additions: a decoded row's few run here, a batch's in parallel.
        let merge = |(u, o): (usize, &mut [f32])| self.merge(&pieces[starts[u]..starts[u + 1]], o);
        if m < 4 {
            out.chunks_mut(gv).enumerate().for_each(merge);
        } else {
            out.par_chunks_mut(gv).enumerate().for_each(merge);
        }
    }

    /// The output of one (row, key/value head) from its pieces (see [`Geometry::attend_rows`]).
    fn merge(&self, pieces: &[Piece], o: &mut [f32]) {
        if let [Piece::Whole(w)] = pieces {
            o.copy_from_slice(w);
            return;
        }
        o.fill(0.0);
        let dv = self.dv;
        for hh in 0..self.group {
            let parts = pieces.iter().filter_map(|p| match p {
                Piece::Part { max, sum, acc } => Some((max[hh], sum[hh], &acc[hh * dv..][..dv])),
                Piece::Whole(_) => None,
            });
            let top = parts
                .clone()
                .fold(f32::NEG_INFINITY, |a, (max, _, _)| a.max(max));
            let total: f64 = parts
                .clone()
                .map(|(max, sum, _)| sum * f64::from(exp(max - top)))
                .sum();
            let inv = (1.0 / total) as f32;
            let oh = &mut o[hh * dv..][..dv];
            for (max, _, acc) in parts {
                let w = exp(max - top);
                for (o, &a) in oh.iter_mut().zip(acc) {
                    *o += a * w;
                }
            }
            for o in oh.iter_mut() {
                *o *= inv;
            }
        }
    }

    /// The query heads `qg` of one key/value head (`group` heads of `dk` values, one after
    /// another) over the `positions` of that head's cached `keys` and `values`, in that order,
    /// with a max-subtracted softmax. `whole`: these are all of the row's positions, and the
    /// result is normalised ([`Piece::Whole`]); else a [`Piece::Part`] to merge. The rows are
    /// widened to f32 once, a run of consecutive positions at a time (a causal row is one run),
    /// and read from there by all the heads that share them. A head's result depends only on its
    /// query and the positions and their order, never on the other heads: the same positions in
    /// the same order give the same bits, whichever call they come from.
    #[inline(always)]
    fn attend<T: KvValue>(
        &self,
        qg: &[f32],
        keys: Rows<'_, T>,
        values: Rows<'_, T>,
        positions: &[usize],
        whole: bool,
    ) -> Piece {
        let (dk, dv, heads) = (self.dk, self.dv, self.group);
        let n = positions.len();
        // Row j of the unit: in place at its position, or at j once widened here.
        let mut scratch = Vec::new();
        let (ks, k_local) = keys.as_f32(dk, positions, &mut scratch);
        // scores[hh * n + j]: head hh at position j.
        let mut scores = vec![0.0f32; heads * n];
        for (j, &p) in positions.iter().enumerate() {
            let krow = &ks[if k_local { j } else { p } * dk..][..dk];
            for (hh, qh) in qg.chunks_exact(dk).enumerate() {
                scores[hh * n + j] = dot(qh, krow) * self.scale;
            }
        }
        // Each head's largest score and sum of exponentials.
        let mut max = vec![0.0f32; heads];
        let mut sum = vec![0.0f64; heads];
        for ((s, max), sum) in scores
            .chunks_exact_mut(n.max(1))
            .zip(max.iter_mut())
            .zip(sum.iter_mut())
        {
            *max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            // Two loops: the exponentials vectorize; the f64 sum adds in position order.
            for s in s.iter_mut() {
                *s = exp(*s - *max);
            }
            *sum = s.iter().map(|&e| f64::from(e)).sum();
        }
        // The keys' scratch is reused for the values.
        let (vs, v_local) = values.as_f32(dv, positions, &mut scratch);
        // The weighted sum of the value rows, one head at a time: a head of 64 values (the usual
        // size) sums in registers, a fixed-size array the compiler keeps there, instead of
        // loading and storing `o` at every position. A whole row scales each weight by the
        // softmax's normaliser as it goes; a piece leaves that to the merge.
        let value = |j: usize| &vs[if v_local { j } else { positions[j] } * dv..][..dv];
        let mut o = vec![0.0f32; heads * dv];
        for (hh, oh) in o.chunks_exact_mut(dv).enumerate() {
            let weights = &scores[hh * n..][..n];
            let inv = if whole { (1.0 / sum[hh]) as f32 } else { 1.0 };
            if dv == 64 {
                let mut acc = [0.0f32; 64];
                weighted_sum(&mut acc, weights, inv, value);
                oh.copy_from_slice(&acc);
            } else {
                weighted_sum(oh, weights, inv, value);
            }
        }
        if whole {
            Piece::Whole(o)
        } else {
            Piece::Part { max, sum, acc: o }
        }
    }
}

/// `dst[j] = src[positions[j]]` for rows of `d` values, widened to f32: one [`KvValue::widen`]
/// per run of consecutive positions.
#[inline(always)]
fn widen_rows<T: KvValue>(src: &[T], d: usize, positions: &[usize], dst: &mut [f32]) {
    let mut j = 0;
    while j < positions.len() {
        let p = positions[j];
        let mut run = 1;
        while positions.get(j + run) == Some(&(p + run)) {
            run += 1;
        }
        T::widen(&src[p * d..(p + run) * d], &mut dst[j * d..(j + run) * d]);
        j += run;
    }
}

/// `acc += Σ_j (weights[j] · inv) · value(j)`, one position at a time in order. Given a
/// fixed-size array (a head of 64), the compiler keeps `acc` in registers: its length is a
/// constant there once this is inlined.
#[inline(always)]
fn weighted_sum<'v>(
    acc: &mut [f32],
    weights: &[f32],
    inv: f32,
    value: impl Fn(usize) -> &'v [f32],
) {
    let d = acc.len();
    for (j, &w) in weights.iter().enumerate() {
        let w = w * inv;
        let v = &value(j)[..d];
        for l in 0..d {
            acc[l] += w * v[l];
        }
    }
}

/// Dot product with 8 independent accumulators so the compiler can vectorise it.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    const LANES: usize = 8;
    let mut acc = [0.0f32; LANES];
    let (ac, ar) = a.split_at(a.len() - a.len() % LANES);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(LANES).zip(bc.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// Index of the largest value (the first one on ties); `None` for an empty slice or NaN-only.
pub fn argmax(v: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in v.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if x <= b => {}
            _ => best = Some((i, x)),
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    /// Position-major rows (`t × (n_kv·d)`) split into one `t × d` run per key/value head, the
    /// layout [`attention`] takes.
    fn by_head<T: Copy>(rows: &[T], n_kv: usize, d: usize) -> Vec<Vec<T>> {
        let t = rows.len() / (n_kv * d).max(1);
        (0..n_kv)
            .map(|g| {
                (0..t)
                    .flat_map(|p| rows[p * n_kv * d + g * d..][..d].iter().copied())
                    .collect()
            })
            .collect()
    }

    fn slices<T>(v: &[Vec<T>]) -> Vec<&[T]> {
        v.iter().map(Vec::as_slice).collect()
    }

    /// [`attention`] on position-major keys and values.
    fn attention_pm(
        shape: AttentionShape,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        m: usize,
        out: &mut [f32],
    ) {
        let k = by_head(keys, shape.n_head_kv, shape.head_dim_k);
        let v = by_head(values, shape.n_head_kv, shape.head_dim_v);
        attention(shape, q, &slices(&k), &slices(&v), m, out);
    }

    /// [`attention_tree`] on position-major keys and values.
    fn attention_tree_pm(
        shape: AttentionShape,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        parents: &[Option<usize>],
        out: &mut [f32],
    ) {
        let k = by_head(keys, shape.n_head_kv, shape.head_dim_k);
        let v = by_head(values, shape.n_head_kv, shape.head_dim_v);
        attention_tree(shape, q, &slices(&k), &slices(&v), parents, out);
    }

    /// An f16 cache gives the bits of an f32 cache holding the same rounded values, causal and
    /// tree, over one piece and several.
    #[test]
    fn an_f16_cache_is_the_f32_cache_of_its_values() {
        use half::f16;
        let shape = AttentionShape {
            n_head: 6,
            n_head_kv: 2,
            head_dim_k: 64,
            head_dim_v: 64,
        };
        let val = |i: usize, salt: f32| (i as f32 * 0.37 + salt).sin() * 1.5;
        for (t, m) in [(40, 1), (ATTENTION_PIECE * 2 + 5, 3)] {
            let n = t * 64;
            let k16: Vec<Vec<f16>> = (0..2)
                .map(|g| (0..n).map(|i| f16::from_f32(val(i + g * n, 0.2))).collect())
                .collect();
            let v16: Vec<Vec<f16>> = (0..2)
                .map(|g| (0..n).map(|i| f16::from_f32(val(i + g * n, 0.9))).collect())
                .collect();
            let k32: Vec<Vec<f32>> = k16
                .iter()
                .map(|h| h.iter().map(|x| x.to_f32()).collect())
                .collect();
            let v32: Vec<Vec<f32>> = v16
                .iter()
                .map(|h| h.iter().map(|x| x.to_f32()).collect())
                .collect();
            let q: Vec<f32> = (0..m * 6 * 64).map(|i| val(i, 1.7)).collect();
            let (mut a, mut b) = (vec![0.0; m * 6 * 64], vec![0.0; m * 6 * 64]);
            attention(shape, &q, &slices(&k16), &slices(&v16), m, &mut a);
            attention(shape, &q, &slices(&k32), &slices(&v32), m, &mut b);
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "causal, t {t}"
            );
            let parents: Vec<Option<usize>> = (0..m).map(|i| i.checked_sub(1)).collect();
            attention_tree(shape, &q, &slices(&k16), &slices(&v16), &parents, &mut a);
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "tree, t {t}"
            );
        }
    }

    /// [`super::exp`] within 2 ulp of the correctly rounded `e^x` over its whole normal range,
    /// on a dense sweep, and the edges as documented.
    #[test]
    fn exp_is_within_two_ulp_of_the_true_value() {
        let mut worst = 0u32;
        let mut x = -87.3f32;
        while x < 88.3 {
            let got = super::exp(x);
            let want = (f64::from(x)).exp() as f32;
            let ulps = got.to_bits().abs_diff(want.to_bits());
            assert!(ulps <= 2, "exp({x}) = {got}, want {want} ({ulps} ulp)");
            worst = worst.max(ulps);
            x += 0.000_37;
        }
        assert_eq!(super::exp(0.0), 1.0);
        assert!(super::exp(f32::NAN).is_nan());
        assert!(super::exp(-1000.0) < 1.2e-38 && super::exp(-1000.0) > 0.0);
        assert!(super::exp(f32::NEG_INFINITY) < 1.2e-38);
        assert!(super::exp(1000.0).is_finite() && super::exp(1000.0) > 1e38);
        // The wide copy gives the same bits.
        struct Sweep;
        impl crate::wide::Kernel for Sweep {
            type Out = Vec<u32>;
            #[inline(always)]
            fn run(self) -> Vec<u32> {
                (0..20_000)
                    .map(|i| super::exp(i as f32 * 0.009 - 90.0).to_bits())
                    .collect()
            }
        }
        let narrow: Vec<u32> = (0..20_000)
            .map(|i| super::exp(i as f32 * 0.009 - 90.0).to_bits())
            .collect();
        assert_eq!(crate::wide::wide(Sweep), narrow);
    }

    use super::*;

    #[test]
    fn rms_norm_unit_rms() {
        let mut x = vec![3.0f32, -4.0, 0.0, 0.0];
        rms_norm(&mut x, &[1.0, 1.0, 2.0, 1.0], 0.0);
        // rms = sqrt(25/4) = 2.5
        assert!((x[0] - 1.2).abs() < 1e-6 && (x[1] + 1.6).abs() < 1e-6);
        assert_eq!(x[2], 0.0);
    }

    #[test]
    fn rope_pairs_differ_by_style_and_preserve_norm() {
        let head: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let rope = Rope::new(style, 8, 10_000.0, 1.0);
            let mut x = head.clone();
            rope.apply(&mut x, 8, &rope.angles(0));
            assert_eq!(x, head, "position 0 is the identity");
            let mut x = head.clone();
            rope.apply(&mut x, 8, &rope.angles(5));
            let n0: f32 = head.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3);
        }
        // Pair 0 rotates by angle pos·1: interleaved rotates (x0, x1), neox (x0, x4).
        let pos = 1;
        let (c, s) = (1.0f32.cos(), 1.0f32.sin());
        let mut x = head.clone();
        Rope::new(RopeStyle::Interleaved, 8, 10_000.0, 1.0).apply(
            &mut x,
            8,
            &Rope::new(RopeStyle::Interleaved, 8, 10_000.0, 1.0).angles(pos),
        );
        assert!((x[0] - (1.0 * c - 2.0 * s)).abs() < 1e-6);
        assert!((x[1] - (1.0 * s + 2.0 * c)).abs() < 1e-6);
        let neox = Rope::new(RopeStyle::Neox, 8, 10_000.0, 1.0);
        let mut y = head.clone();
        neox.apply(&mut y, 8, &neox.angles(pos));
        assert!((y[0] - (1.0 * c - 5.0 * s)).abs() < 1e-6);
        assert!((y[4] - (1.0 * s + 5.0 * c)).abs() < 1e-6);
    }

    #[test]
    fn rope_leaves_unrotated_tail() {
        let rope = Rope::new(RopeStyle::Neox, 4, 10_000.0, 1.0);
        let mut x: Vec<f32> = (0..6).map(|i| i as f32).collect();
        rope.apply(&mut x, 6, &rope.angles(3));
        assert_eq!(&x[4..], &[4.0, 5.0]);
    }

    #[test]
    fn attention_single_key_returns_its_value() {
        let shape = AttentionShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 3,
        };
        let q = [0.3, -0.2, 1.0, 2.0];
        let k = [0.5, 0.5];
        let v = [1.0, 2.0, 3.0];
        let mut out = [0.0; 6];
        attention_pm(shape, &q, &k, &v, 1, &mut out);
        assert_eq!(out, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn attention_is_causal() {
        // Two positions; the first query must ignore the second key/value.
        let shape = AttentionShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 1,
            head_dim_v: 1,
        };
        let q = [1.0, 1.0];
        let k = [0.0, 0.0];
        let v = [10.0, 20.0];
        let mut out = [0.0; 2];
        attention_pm(shape, &q, &k, &v, 2, &mut out);
        assert_eq!(out[0], 10.0);
        assert!(
            (out[1] - 15.0).abs() < 1e-5,
            "equal scores average the values"
        );
    }

    /// Over a cache of one piece, and over one where the branches cross into a second piece
    /// ([`ATTENTION_PIECE`]).
    #[test]
    fn tree_attention_is_causal_attention_along_each_branch() {
        for cached in [5, ATTENTION_PIECE - 2] {
            tree_attention_along_each_branch(cached);
        }
    }

    fn tree_attention_along_each_branch(cached: usize) {
        let shape = AttentionShape {
            n_head: 4,
            n_head_kv: 2,
            head_dim_k: 8,
            head_dim_v: 6,
        };
        let (kd, vd, qd) = (16, 12, 32);
        let val = |i: usize, salt: f32| (i as f32 * 0.73 + salt).sin() * 2.0;
        let m = 6;
        // Tree: 0 ← 1 ← 2, 0 ← 3 ← 4, and 5 after the cache on its own.
        let parents = [None, Some(0), Some(1), Some(0), Some(3), None];
        let t = cached + m;
        let keys: Vec<f32> = (0..t * kd).map(|i| val(i, 0.1)).collect();
        let values: Vec<f32> = (0..t * vd).map(|i| val(i, 0.7)).collect();
        let q: Vec<f32> = (0..m * qd).map(|i| val(i, 1.3)).collect();
        let mut out = vec![0.0; m * n_out(shape)];
        attention_tree_pm(shape, &q, &keys, &values, &parents, &mut out);
        for (node, branch) in [
            (0, vec![0]),
            (1, vec![0, 1]),
            (2, vec![0, 1, 2]),
            (3, vec![0, 3]),
            (4, vec![0, 3, 4]),
            (5, vec![5]),
        ] {
            // The same node decoded causally after the cache and its branch.
            let rows: Vec<usize> = (0..cached)
                .chain(branch.iter().map(|b| cached + b))
                .collect();
            let k: Vec<f32> = rows
                .iter()
                .flat_map(|&r| keys[r * kd..][..kd].to_vec())
                .collect();
            let v: Vec<f32> = rows
                .iter()
                .flat_map(|&r| values[r * vd..][..vd].to_vec())
                .collect();
            let mut one = vec![0.0; n_out(shape)];
            attention_pm(shape, &q[node * qd..][..qd], &k, &v, 1, &mut one);
            let got = &out[node * n_out(shape)..][..n_out(shape)];
            assert!(
                one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "node {node}, {cached} cached"
            );
        }
    }

    /// Grouped-query attention gives, bit for bit, a plain per-head reference (scores by [`dot`],
    /// a max-subtracted softmax summed in f64, the value rows added in position order; over more
    /// than [`ATTENTION_PIECE`] positions, pieces of that many merged as `attend_rows`
    /// documents), for heads of 64 values (summed in registers) and of other sizes, for rows over
    /// one piece and over several (a partial last piece included), and for every row of a batch
    /// as for that row alone.
    #[test]
    fn attention_is_the_plain_per_head_computation_bit_for_bit() {
        for (dk, dv) in [(64, 64), (64, 48), (32, 64), (24, 40)] {
            let shape = AttentionShape {
                n_head: 6,
                n_head_kv: 2,
                head_dim_k: dk,
                head_dim_v: dv,
            };
            let (kd, vd, qd) = (2 * dk, 2 * dv, 6 * dk);
            let val = |i: usize, salt: f32| (i as f32 * 0.37 + salt).sin() * 1.5;
            for (t, m) in [
                (29, 3),
                (2 * ATTENTION_PIECE + 1, 3),
                (ATTENTION_PIECE + 2, 4),
            ] {
                let keys: Vec<f32> = (0..t * kd).map(|i| val(i, 0.2)).collect();
                let values: Vec<f32> = (0..t * vd).map(|i| val(i, 0.9)).collect();
                let q: Vec<f32> = (0..m * qd).map(|i| val(i, 1.7)).collect();
                let mut batch = vec![0.0; m * n_out(shape)];
                attention_pm(shape, &q, &keys, &values, m, &mut batch);
                for i in 0..m {
                    let seen = t - m + i + 1;
                    let mut want = vec![0.0f32; n_out(shape)];
                    for h in 0..6 {
                        let g = h / 3;
                        let qh = &q[i * qd + h * dk..][..dk];
                        let scale = 1.0 / (dk as f32).sqrt();
                        let o = &mut want[h * dv..][..dv];
                        // (max, sum of exponentials, unnormalised weighted values) per piece.
                        let mut pieces = Vec::new();
                        let whole = seen <= ATTENTION_PIECE;
                        for start in (0..seen).step_by(ATTENTION_PIECE) {
                            let end = (start + ATTENTION_PIECE).min(seen);
                            let mut sc: Vec<f32> = (start..end)
                                .map(|p| dot(qh, &keys[p * kd + g * dk..][..dk]) * scale)
                                .collect();
                            let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                            let mut sum = 0.0f64;
                            for s in sc.iter_mut() {
                                *s = exp(*s - max);
                                sum += f64::from(*s);
                            }
                            let inv = if whole { (1.0 / sum) as f32 } else { 1.0 };
                            let mut acc = vec![0.0f32; dv];
                            for (p, &w) in (start..end).zip(&sc) {
                                for (a, &v) in acc.iter_mut().zip(&values[p * vd + g * dv..][..dv])
                                {
                                    *a += w * inv * v;
                                }
                            }
                            pieces.push((max, sum, acc));
                        }
                        if whole {
                            o.copy_from_slice(&pieces[0].2);
                        } else {
                            let top = pieces.iter().fold(f32::NEG_INFINITY, |a, p| a.max(p.0));
                            let total: f64 =
                                pieces.iter().map(|p| p.1 * f64::from(exp(p.0 - top))).sum();
                            for (max, _, acc) in &pieces {
                                let w = exp(max - top);
                                for (o, &a) in o.iter_mut().zip(acc) {
                                    *o += a * w;
                                }
                            }
                            let inv = (1.0 / total) as f32;
                            o.iter_mut().for_each(|o| *o *= inv);
                        }
                    }
                    let got = &batch[i * n_out(shape)..][..n_out(shape)];
                    assert!(
                        want.iter()
                            .zip(got)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "dk {dk} dv {dv} t {t} row {i} of the batch"
                    );
                    let mut alone = vec![0.0; n_out(shape)];
                    let (k1, v1) = (&keys[..seen * kd], &values[..seen * vd]);
                    attention_pm(shape, &q[i * qd..][..qd], k1, v1, 1, &mut alone);
                    assert!(
                        want.iter()
                            .zip(&alone)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "dk {dk} dv {dv} t {t} row {i} alone"
                    );
                }
            }
        }
    }

    fn n_out(s: AttentionShape) -> usize {
        s.n_head * s.head_dim_v
    }

    #[test]
    fn dot_matches_naive() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-5);
    }

    #[test]
    fn argmax_first_max_and_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, 0.5]), Some(1));
        assert_eq!(argmax(&[]), None);
    }
}
