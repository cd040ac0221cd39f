//! The emulator's matmul driver: splits a task into (N-tile, row-block) jobs over worker threads
//! and feeds the tiled weight bytes to the kernels in [`crate::kernel`].
//!
//! Two partitions: for small M (decode) every job is one N-tile for all rows, results land in a
//! small `[tile][m][tn]` buffer and are scattered into the row-major output; for larger M (prefill)
//! every job is a block of [`ROW_BLOCK`] rows that walks all N-tiles, writing its own rows of the
//! output directly, so each weight tile is reused across the block's rows while it is in cache.

use half::{f16, slice::HalfFloatSliceExt};
use ork_pack::{PackDtype, TiledLayout};
use rayon::prelude::*;

use crate::kernel::group::{
    apply_group_offsets, apply_group_scales, float_group_partials, group_partials, GroupedA,
    GroupedF32,
};
use crate::kernel::{self, Isa, PreparedA, WeightTile};
use crate::task::ActValues;

/// Rows per job in the prefill partition (a multiple of the kernels' 4-row step).
const ROW_BLOCK: usize = 32;
/// Largest M that uses the per-tile partition.
const SMALL_M: usize = 16;

/// One tile of a weight as i8 values in tile order (int4 unpacked into `scratch`).
fn tile_i8<'s>(l: &TiledLayout, w: &'s [u8], t: usize, scratch: &'s mut Vec<i8>) -> &'s [i8] {
    let tile_elems = l.n_tile_elems();
    match l.dtype {
        PackDtype::I4 => {
            let src = &w[t * tile_elems / 2..(t + 1) * tile_elems / 2];
            scratch.resize(tile_elems, 0);
            kernel::unpack_i4_tile(src, scratch);
            scratch
        }
        _ => {
            use zerocopy::FromBytes;
            let bytes = &w[t * tile_elems..(t + 1) * tile_elems];
            <[i8]>::ref_from_bytes(bytes).unwrap_or(&[])
        }
    }
}

/// Run `tile_fn(scratch, t, m0, m1, acc)` over all tiles and rows, and write the row-major
/// `m × n` output through `conv(acc, m, n0, out)`, which converts the accumulators of row `m`,
/// columns `n0..n0 + out.len()` (`acc.len() == out.len()`), one run of a tile at a time, so that
/// the conversion loop vectorizes.
#[allow(clippy::too_many_arguments)]
fn drive<Acc, T, S>(
    m: usize,
    n: usize,
    tn: usize,
    tiles: usize,
    out: &mut [T],
    tile_fn: impl Fn(&mut S, usize, usize, usize, &mut [Acc]) + Sync,
    conv: impl Fn(&[Acc], usize, usize, &mut [T]) + Sync,
) where
    Acc: Copy + Default + Send + Sync,
    T: Send,
    S: Default,
{
    if m == 0 {
        return;
    }
    debug_assert_eq!(tiles, n.div_ceil(tn));
    if m == 1 {
        // Decode: output column j of tile t is out[t·tn + j], so every job converts its tile
        // straight into its own slice of the output (no shared buffer, no scatter pass).
        out.par_chunks_mut(tn).enumerate().for_each_init(
            || (S::default(), vec![Acc::default(); tn]),
            |(s, acc), (t, o)| {
                tile_fn(s, t, 0, 1, acc);
                conv(&acc[..o.len()], 0, t * tn, o);
            },
        );
    } else if m <= SMALL_M {
        let mut acc = vec![Acc::default(); tiles * m * tn];
        acc.par_chunks_mut(m * tn)
            .enumerate()
            .for_each_init(S::default, |s, (t, chunk)| tile_fn(s, t, 0, m, chunk));
        out.par_chunks_mut(n).enumerate().for_each(|(r, row)| {
            for (t, o) in row.chunks_mut(tn).enumerate() {
                let a = &acc[(t * m + r) * tn..][..o.len()];
                conv(a, r, t * tn, o);
            }
        });
    } else {
        out.par_chunks_mut(ROW_BLOCK * n).enumerate().for_each_init(
            || (S::default(), vec![Acc::default(); ROW_BLOCK * tn]),
            |(s, blk), (b, rows_out)| {
                let m0 = b * ROW_BLOCK;
                let rows = rows_out.len() / n;
                for t in 0..tiles {
                    tile_fn(s, t, m0, m0 + rows, blk);
                    let cols = tn.min(n - t * tn);
                    for r in 0..rows {
                        let dst = &mut rows_out[r * n + t * tn..r * n + t * tn + cols];
                        conv(&blk[r * tn..r * tn + cols], m0 + r, t * tn, dst);
                    }
                }
            },
        );
    }
}

/// Integer weights (int8, int4): exact i32 accumulators, converted a run at a time by
/// `conv(acc, m, n0, out)` (see [`drive`]).
pub(crate) fn gemm_int<T: Send>(
    isa: Isa,
    l: &TiledLayout,
    w: &[u8],
    a: &[i8],
    m: usize,
    out: &mut [T],
    conv: impl Fn(&[i32], usize, usize, &mut [T]) + Sync,
) {
    let tn = l.dtype.n_tile();
    let tiles = l.n_pad() / tn;
    let pa = PreparedA::new(isa, m, l.k, l.k_pad(), a);
    drive(
        m,
        l.n,
        tn,
        tiles,
        out,
        |scratch: &mut Vec<i8>, t, m0, m1, acc: &mut [i32]| {
            let wt = tile_i8(l, w, t, scratch);
            kernel::tile_dot(&pa, m0, m1, wt, tn, acc);
        },
        conv,
    );
}

/// One single-row int8 matmul of a batch ([`gemm_int_row_batch`]): integer weight `l` / `w`,
/// activations `a` (`l.k` values) with scale `sa`, per-channel weight scales `sw`, output `out`
/// (`l.n` values).
pub(crate) struct RowTask<'a> {
    pub(crate) l: TiledLayout,
    pub(crate) w: &'a [u8],
    pub(crate) a: &'a [i8],
    pub(crate) sa: f32,
    pub(crate) sw: &'a [f32],
    pub(crate) out: &'a mut [f32],
}

/// Several single-row (M = 1) int8 matmuls on integer weights with per-channel scales, as one
/// parallel pass over the N-tiles of all of them: one fork/join for the batch instead of one per
/// task. Each tile is computed and converted exactly as [`gemm_int`] does at M = 1
/// (`acc as f32 · sa · sw[n]`), so the results are bit-identical to running the tasks one by one.
pub(crate) fn gemm_int_row_batch(isa: Isa, tasks: Vec<RowTask<'_>>) {
    // The activations in the kernel's form, once per task (q/k/v share theirs, but preparing a
    // row of K ≤ 10240 values is a copy, far below the weights' cost).
    let prepared: Vec<PreparedA> = tasks
        .iter()
        .map(|t| PreparedA::new(isa, 1, t.l.k, t.l.k_pad(), t.a))
        .collect();
    let mut jobs = Vec::new();
    let mut max_tn = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        let tn = t.l.dtype.n_tile();
        max_tn = max_tn.max(tn);
        let (l, w, sa, sw) = (t.l, t.w, t.sa, t.sw);
        for (ti, o) in t.out.chunks_mut(tn).enumerate() {
            jobs.push((i, l, w, sa, sw, ti, o));
        }
    }
    jobs.into_par_iter().for_each_init(
        || (Vec::<i8>::new(), vec![0i32; max_tn]),
        |(scratch, acc), (i, l, w, sa, sw, t, o)| {
            let tn = l.dtype.n_tile();
            let wt = tile_i8(&l, w, t, scratch);
            kernel::tile_dot(&prepared[i], 0, 1, wt, tn, &mut acc[..tn]);
            let n0 = t * tn;
            let sw = &sw[n0..n0 + o.len()];
            for ((o, &acc), &w) in o.iter_mut().zip(&acc[..tn]).zip(sw) {
                *o = acc as f32 * sa * w;
            }
        },
    );
}

/// Entry `[ch][j]` of a per-group array (`v`: `[N][groups]`); 0 for the padding channels at or
/// past `n`, which have no entries (their codes are zero and their outputs are dropped).
fn per_group(v: &[f32], groups: usize, n: usize, ch: usize, j: usize) -> f32 {
    if ch < n {
        v[ch * groups + j]
    } else {
        0.0
    }
}

/// Integer weights with per-group scales (`scales`: `[N][K/group]`) and int8 activations: exact
/// i32 partial sums per group, folded in f32 as `kernel::group` documents, converted by
/// `conv(accs, m, n0, out)` for one run of a row (which applies the activation scale).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_grouped(
    isa: Isa,
    l: &TiledLayout,
    w: &[u8],
    a: &[i8],
    m: usize,
    group: usize,
    scales: &[f32],
    out: &mut [f32],
    conv: impl Fn(&[f32], usize, usize, &mut [f32]) + Sync,
) {
    let tn = l.dtype.n_tile();
    let tiles = l.n_pad() / tn;
    let ga = GroupedA::new(isa, m, l.k, group, a);
    let groups = ga.groups();
    let n = l.n;
    drive(
        m,
        n,
        tn,
        tiles,
        out,
        |s: &mut (Vec<i8>, Vec<i32>), t, m0, m1, acc: &mut [f32]| {
            let (scratch, partials) = s;
            let wt = tile_i8(l, w, t, scratch);
            partials.resize(groups * (m1 - m0) * tn, 0);
            group_partials(&ga, m0, m1, wt, tn, partials);
            let scale = |c: usize, j: usize| per_group(scales, groups, n, t * tn + c, j);
            apply_group_scales(partials, groups, m1 - m0, tn, scale, acc);
        },
        conv,
    );
}

/// Integer weights with per-group scales (`scales`: `[N][K/group]`) and f32 activation rows
/// (fp16 activations, `m × k`; `group` divides `k`, so `k` needs no padding): float partial sums
/// per group, folded in f32 as `kernel::group` documents, converted by `conv(accs, m, n0, out)`
/// for one run of a row. With `affine` = `Some((sums, offsets))` (affine groups: `sums` the
/// activations' fp16 group sums, `m × K/group` from `group_sums_f16`; `offsets` `[N][K/group]`)
/// the offsets matmul is added to each folded block as `kernel::group` documents.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_grouped_float(
    isa: Isa,
    l: &TiledLayout,
    w: &[u8],
    af: &[f32],
    m: usize,
    group: usize,
    scales: &[f32],
    affine: Option<(&[f32], &[f32])>,
    out: &mut [f32],
    conv: impl Fn(&[f32], usize, usize, &mut [f32]) + Sync,
) {
    let tn = l.dtype.n_tile();
    let tiles = l.n_pad() / tn;
    let ga = GroupedF32::new(m, l.k, group, af);
    let groups = ga.groups();
    let n = l.n;
    drive(
        m,
        n,
        tn,
        tiles,
        out,
        |s: &mut (Vec<i8>, Vec<f32>), t, m0, m1, acc: &mut [f32]| {
            let (scratch, partials) = s;
            let wt = tile_i8(l, w, t, scratch);
            partials.resize(groups * (m1 - m0) * tn, 0.0);
            float_group_partials(isa, &ga, m0, m1, wt, tn, partials);
            let of = |v: &[f32], c: usize, j: usize| per_group(v, groups, n, t * tn + c, j);
            apply_group_scales(partials, groups, m1 - m0, tn, |c, j| of(scales, c, j), acc);
            if let Some((sums, offsets)) = affine {
                let block = &sums[m0 * groups..m1 * groups];
                apply_group_offsets(block, groups, m1 - m0, tn, |c, j| of(offsets, c, j), acc);
            }
        },
        conv,
    );
}

/// Activation rows as f32, each padded with zeros to `kpad` (the float kernels' A operand),
/// converted once per task, in parallel over rows. fp16 and int8 values are exact in f32.
pub(crate) fn f32_rows(a: &ActValues<'_>, m: usize, k: usize, kpad: usize) -> Vec<f32> {
    let mut af = vec![0f32; m * kpad];
    match a {
        ActValues::Int8(a) => {
            af.par_chunks_mut(kpad)
                .zip(a.par_chunks(k))
                .for_each(|(dst, src)| {
                    dst.iter_mut()
                        .zip(src)
                        .for_each(|(d, &s)| *d = f32::from(s))
                })
        }
        ActValues::F16(a) => af
            .par_chunks_mut(kpad)
            .zip(a.par_chunks(k))
            .for_each(|(dst, src)| src.convert_to_f32_slice(&mut dst[..k])),
    }
    af
}

/// Per-job scratch of the float path: an int4 tile unpacked, or an fp16 tile realigned.
#[derive(Default)]
struct FloatScratch {
    i8s: Vec<i8>,
    f16s: Vec<f16>,
}

/// f32 activation rows (`m × kpad`, from [`f32_rows`]) against any weight: f32 accumulation in
/// the order [`kernel::float_tile_dot`] documents, converted a run at a time by
/// `conv(acc, m, n0, out)` (see [`drive`]).
pub(crate) fn gemm_float(
    isa: Isa,
    l: &TiledLayout,
    w: &[u8],
    af: &[f32],
    m: usize,
    out: &mut [f32],
    conv: impl Fn(&[f32], usize, usize, &mut [f32]) + Sync,
) {
    let tn = l.dtype.n_tile();
    let tiles = l.n_pad() / tn;
    let kpad = l.k_pad();
    debug_assert_eq!(af.len(), m * kpad);
    let tile_elems = l.n_tile_elems();
    drive(
        m,
        l.n,
        tn,
        tiles,
        out,
        |s: &mut FloatScratch, t, m0, m1, acc: &mut [f32]| {
            let a = &af[m0 * kpad..m1 * kpad];
            match l.dtype {
                PackDtype::F16 => {
                    use zerocopy::FromBytes;
                    let src = &w[t * tile_elems * 2..(t + 1) * tile_elems * 2];
                    // Device buffers are page-aligned and tiles even-sized, so the cast succeeds
                    // unless a view starts at an odd offset; then decode into scratch.
                    let wt = match <[f16]>::ref_from_bytes(src) {
                        Ok(wt) => wt,
                        Err(_) => {
                            s.f16s.clear();
                            s.f16s.extend(
                                src.chunks_exact(2)
                                    .map(|b| f16::from_le_bytes([b[0], b[1]])),
                            );
                            &s.f16s
                        }
                    };
                    kernel::float_tile_dot(isa, a, kpad, WeightTile::F16(wt), tn, acc);
                }
                _ => {
                    let wt = tile_i8(l, w, t, &mut s.i8s);
                    kernel::float_tile_dot(isa, a, kpad, WeightTile::I8(wt), tn, acc);
                }
            }
        },
        conv,
    );
}
