//! Attention over the KV cache: causal (optionally within a sliding window) and tree-masked, in f32 over f32 or f16 rows, rows over
//! more than [`ATTENTION_PIECE`] positions computed in pieces merged by their softmax maxima and
//! sums.

use rayon::prelude::*;

use ork_kernels::attend;

use super::exp;

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
/// Per head: scores `q·k / √d` by [`super::dot`], a max-subtracted softmax with [`exp`] summed
/// in f64, the value rows added in position order by fused multiply-adds (the loops of
/// [`ork_kernels::attend`]). The cached values are widened to f32 exactly before
/// use, so an f16 cache gives the bits of an f32 cache holding the same (rounded) values. A row
/// over more than [`ATTENTION_PIECE`] positions is computed in pieces of that many, in parallel
/// (so that one decoded row spreads over every core), each keeping its maximum `max_c`, its sum
/// of exponentials `sum_c` and its unnormalised weighted values `acc_c`; with `M` the largest
/// `max_c` and `S = Σ_c sum_c · e^(max_c − M)` (f64), the output is
/// `Σ_c (acc_c · e^(max_c − M)) · (1 / S)`, pieces in order. Measured with
/// `examples/attn_bench` (docs/benchmarks.md "End to end against llama.cpp").
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

/// [`attention`] over a sliding window: query row `i` (position `p = t - m + i`) attends to the
/// `window` positions `p + 1 - window ..= p` only (fewer near the start), as llama.cpp masks a
/// standard sliding-window layer (`is_masked_swa`: key `p0` is hidden from query `p1` when
/// `p1 - p0 >= window`). A window of at least `t` is [`attention`] itself.
pub fn attention_window<T: KvValue>(
    shape: AttentionShape,
    q: &[f32],
    keys: &[&[T]],
    values: &[&[T]],
    m: usize,
    window: usize,
    out: &mut [f32],
) {
    let dk = shape.head_dim_k;
    let t = keys.first().map_or(0, |k| k.len() / dk);
    debug_assert!(m <= t && window > 0);
    debug_assert_eq!(q.len(), m * shape.n_head * dk);
    debug_assert_eq!(out.len(), m * shape.n_head * shape.head_dim_v);
    let first_pos = t - m;
    Geometry::new(shape).attend_rows(q, keys, values, out, |i| {
        let end = first_pos + i + 1;
        end.saturating_sub(window)..end
    });
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
    attention_tree_window(shape, q, keys, values, parents, usize::MAX, out);
}

/// [`attention_tree`] over a sliding window (see [`attention_window`]): node `i` sits at
/// position `t - m + depth(i)`, and of the keys it would see, those at least `window` positions
/// before it are hidden (a cached position `j` is at `j`, a branch node at `t - m + its depth`).
pub fn attention_tree_window<T: KvValue>(
    shape: AttentionShape,
    q: &[f32],
    keys: &[&[T]],
    values: &[&[T]],
    parents: &[Option<usize>],
    window: usize,
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
        // Branch node k (root first) sits at position first_pos + k; the node itself is last.
        let depth = branches[i].len() - 1;
        let seen = (first_pos + depth + 1).saturating_sub(window);
        (seen.min(first_pos)..first_pos).chain(
            branches[i]
                .iter()
                .enumerate()
                .filter(move |&(k, _)| first_pos + k >= seen)
                .map(|(_, &p)| p),
        )
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
        // The widened rows' indices `0..n`, made only when a side was widened.
        let k_rows: Option<Vec<usize>> = k_local.then(|| (0..n).collect());
        // scores[hh * n + j]: head hh at position j.
        let mut scores = vec![0.0f32; heads * n];
        attend::scores(
            qg,
            dk,
            ks,
            k_rows.as_deref().unwrap_or(positions),
            self.scale,
            &mut scores,
        );
        // Each head's largest score and sum of exponentials.
        let mut max = vec![0.0f32; heads];
        let mut sum = vec![0.0f64; heads];
        let mut weights = vec![0.0f32; heads * n];
        for (((s, e), max), sum) in scores
            .chunks_exact(n.max(1))
            .zip(weights.chunks_exact_mut(n.max(1)))
            .zip(max.iter_mut())
            .zip(sum.iter_mut())
        {
            *max = attend::row_max(s);
            attend::exp_shifted(s, *max, e);
            *sum = attend::sum_f64(e);
        }
        // The keys' scratch is reused for the values (widened at the same rows).
        let (vs, v_local) = values.as_f32(dv, positions, &mut scratch);
        // The weighted sums of the value rows; a whole row scales each weight by the softmax's
        // normaliser as it goes, a piece leaves that to the merge.
        let inv: Vec<f32> = sum
            .iter()
            .map(|&s| if whole { (1.0 / s) as f32 } else { 1.0 })
            .collect();
        let mut o = vec![0.0f32; heads * dv];
        let v_rows = v_local.then(|| k_rows.unwrap_or_else(|| (0..n).collect()));
        let v_rows = v_rows.as_deref().unwrap_or(positions);
        attend::weighted_sums(&weights, &inv, dv, vs, v_rows, &mut o);
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
