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

/// SiLU(gate) · up, element-wise into `gate`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
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

/// Causal grouped-query attention for `m` query rows.
///
/// `q` is `m × (n_head·head_dim_k)`; `keys` / `values` hold every cached position
/// (`t × (n_head_kv·head_dim)`), the queries being the last `m` of them: query row `i` sits at
/// position `t - m + i` and attends to positions `0..=t - m + i`. `out` is `m × (n_head·head_dim_v)`.
pub fn attention(
    shape: AttentionShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    m: usize,
    out: &mut [f32],
) {
    let AttentionShape {
        n_head,
        n_head_kv,
        head_dim_k: dk,
        head_dim_v: dv,
    } = shape;
    let k_dim = n_head_kv * dk;
    let v_dim = n_head_kv * dv;
    let t = keys.len() / k_dim;
    debug_assert_eq!(values.len() / v_dim, t);
    debug_assert!(m <= t);
    debug_assert_eq!(q.len(), m * n_head * dk);
    debug_assert_eq!(out.len(), m * n_head * dv);
    let first_pos = t - m;
    Geometry::new(shape).attend_rows(q, keys, values, out, |i| 0..first_pos + i + 1);
}

/// Tree attention for `m` query rows that are the nodes of a tree of drafted tokens (tree
/// verification in speculative decoding, `docs/speculative.md`).
///
/// `keys` / `values` hold every cached position, the last `m` of them being the tree's nodes in
/// `parents` order; node `i` attends to the `t - m` positions before the tree and then to its
/// ancestors from the root down and itself (`parents[i]` is its parent node, `None` for a node
/// that follows the cached positions directly; a parent comes before its child). The keys a node
/// sees, and their order, are those of the same tokens decoded one by one along its branch, so
/// its output is bit for bit the causal [`attention`]'s output for that branch.
pub fn attention_tree(
    shape: AttentionShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
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
    let t = keys.len() / (shape.n_head_kv * dk);
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

/// One [`Geometry::attend`] call as a [`crate::wide::Kernel`], so that its loops run as wide as
/// the CPU allows.
struct Attend<'a, R> {
    geometry: &'a Geometry,
    qg: &'a [f32],
    g: usize,
    keys: &'a [f32],
    values: &'a [f32],
    rows: R,
    o: &'a mut [f32],
}

impl<R: Iterator<Item = usize> + Clone> crate::wide::Kernel for Attend<'_, R> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        self.geometry
            .attend(self.qg, self.g, self.keys, self.values, self.rows, self.o);
    }
}

/// Sizes of one attention call, shared by [`attention`] and [`attention_tree`].
struct Geometry {
    n_head: usize,
    group: usize,
    dk: usize,
    dv: usize,
    k_dim: usize,
    v_dim: usize,
    scale: f32,
}

impl Geometry {
    fn new(s: AttentionShape) -> Geometry {
        Geometry {
            n_head: s.n_head,
            group: s.n_head / s.n_head_kv,
            dk: s.head_dim_k,
            dv: s.head_dim_v,
            k_dim: s.n_head_kv * s.head_dim_k,
            v_dim: s.n_head_kv * s.head_dim_v,
            scale: 1.0 / (s.head_dim_k as f32).sqrt(),
        }
    }

    /// Every query row `i` of `q` (`n_head` heads of `dk` values each) over its key/value
    /// positions `rows_of(i)`, into its row of `out`, in parallel: one unit per query row and
    /// key/value head, whose query heads read each cached row once.
    fn attend_rows<R: Iterator<Item = usize> + Clone>(
        &self,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        out: &mut [f32],
        rows_of: impl Fn(usize) -> R + Sync,
    ) {
        let n_kv = self.n_head / self.group;
        let gq = self.group * self.dk;
        out.par_chunks_mut(self.group * self.dv)
            .enumerate()
            .for_each(|(unit, o)| {
                let (i, g) = (unit / n_kv, unit % n_kv);
                crate::wide::wide(Attend {
                    geometry: self,
                    qg: &q[i * self.n_head * self.dk + g * gq..][..gq],
                    g,
                    keys,
                    values,
                    rows: rows_of(i),
                    o,
                });
            });
    }

    /// The query heads `qg` of key/value head `g` (`group` heads of `dk` values, one after
    /// another) over the key/value positions `rows`, in that order, with a max-subtracted
    /// softmax, into `o` (`group` heads of `dv` values). Each cached row is read once for all
    /// the heads that share it. A head's result depends only on its query and the positions and
    /// their order, never on the other heads: the same positions in the same order give the same
    /// bits, whichever call they come from.
    #[inline(always)]
    fn attend(
        &self,
        qg: &[f32],
        g: usize,
        keys: &[f32],
        values: &[f32],
        rows: impl Iterator<Item = usize> + Clone,
        o: &mut [f32],
    ) {
        let (dk, dv, heads) = (self.dk, self.dv, self.group);
        let positions: Vec<usize> = rows.collect();
        let n = positions.len();
        // scores[hh * n + j]: head hh at position j.
        let mut scores = vec![0.0f32; heads * n];
        // Rows are a head's slice of each cached position, `k_dim` floats apart: a stride the
        // hardware prefetcher follows late, and at decode every row comes from memory (the
        // weights streamed through the caches since the last token). Ask for the rows a few
        // positions ahead.
        let mut ahead = positions.iter().skip(PREFETCH_ROWS);
        for (j, &p) in positions.iter().enumerate() {
            if let Some(&a) = ahead.next() {
                crate::prefetch::prefetch(&keys[a * self.k_dim + g * dk..][..dk]);
            }
            let krow = &keys[p * self.k_dim + g * dk..][..dk];
            for (hh, qh) in qg.chunks_exact(dk).enumerate() {
                scores[hh * n + j] = dot(qh, krow) * self.scale;
            }
        }
        // The softmax's normaliser of each head.
        let mut inv = vec![0.0f32; heads];
        for (s, inv) in scores.chunks_exact_mut(n.max(1)).zip(inv.iter_mut()) {
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f64;
            for s in s.iter_mut() {
                *s = (*s - max).exp();
                sum += f64::from(*s);
            }
            *inv = (1.0 / sum) as f32;
        }
        // The weighted sum of the value rows, one head at a time: a head of 64 values (the usual
        // size) sums in registers, a fixed-size array the compiler keeps there, instead of
        // loading and storing `o` at every position. The first head asks for the rows ahead;
        // the others find them in the cache.
        for (hh, oh) in o.chunks_exact_mut(dv).enumerate() {
            let weights = &scores[hh * n..][..n];
            let value = |p: usize| &values[p * self.v_dim + g * dv..][..dv];
            let ahead = if hh == 0 { PREFETCH_ROWS } else { usize::MAX };
            if dv == 64 {
                let mut acc = [0.0f32; 64];
                weighted_sum(&mut acc, &positions, weights, inv[hh], ahead, value);
                oh.copy_from_slice(&acc);
            } else {
                oh.fill(0.0);
                weighted_sum(oh, &positions, weights, inv[hh], ahead, value);
            }
        }
    }
}

/// `acc += Σ_j (weights[j] · inv) · value(positions[j])`, one position at a time in order,
/// prefetching the row `ahead` positions on. Given a fixed-size array (a head of 64), the
/// compiler keeps `acc` in registers: its length is a constant there once this is inlined.
#[inline(always)]
fn weighted_sum<'v>(
    acc: &mut [f32],
    positions: &[usize],
    weights: &[f32],
    inv: f32,
    ahead: usize,
    value: impl Fn(usize) -> &'v [f32],
) {
    let d = acc.len();
    for (j, &p) in positions.iter().enumerate() {
        if let Some(&a) = positions.get(j.saturating_add(ahead)) {
            crate::prefetch::prefetch(value(a));
        }
        let w = weights[j] * inv;
        let v = &value(p)[..d];
        for l in 0..d {
            acc[l] += w * v[l];
        }
    }
}

/// How many key/value positions ahead [`Geometry::attend`] prefetches.
const PREFETCH_ROWS: usize = 4;

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
        attention(shape, &q, &k, &v, 1, &mut out);
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
        attention(shape, &q, &k, &v, 2, &mut out);
        assert_eq!(out[0], 10.0);
        assert!(
            (out[1] - 15.0).abs() < 1e-5,
            "equal scores average the values"
        );
    }

    #[test]
    fn tree_attention_is_causal_attention_along_each_branch() {
        let shape = AttentionShape {
            n_head: 4,
            n_head_kv: 2,
            head_dim_k: 8,
            head_dim_v: 6,
        };
        let (kd, vd, qd) = (16, 12, 32);
        let val = |i: usize, salt: f32| (i as f32 * 0.73 + salt).sin() * 2.0;
        let (cached, m) = (5, 6);
        // Tree: 0 ← 1 ← 2, 0 ← 3 ← 4, and 5 after the cache on its own.
        let parents = [None, Some(0), Some(1), Some(0), Some(3), None];
        let t = cached + m;
        let keys: Vec<f32> = (0..t * kd).map(|i| val(i, 0.1)).collect();
        let values: Vec<f32> = (0..t * vd).map(|i| val(i, 0.7)).collect();
        let q: Vec<f32> = (0..m * qd).map(|i| val(i, 1.3)).collect();
        let mut out = vec![0.0; m * n_out(shape)];
        attention_tree(shape, &q, &keys, &values, &parents, &mut out);
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
            attention(shape, &q[node * qd..][..qd], &k, &v, 1, &mut one);
            let got = &out[node * n_out(shape)..][..n_out(shape)];
            assert!(
                one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "node {node}"
            );
        }
    }

    /// Grouped-query attention gives, bit for bit, a plain per-head reference (scores by [`dot`],
    /// a max-subtracted softmax summed in f64, the value rows added in position order), for
    /// heads of 64 values (summed in registers) and of other sizes, and for every row of a
    /// batch as for that row alone.
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
            let (t, m) = (29, 3);
            let keys: Vec<f32> = (0..t * kd).map(|i| val(i, 0.2)).collect();
            let values: Vec<f32> = (0..t * vd).map(|i| val(i, 0.9)).collect();
            let q: Vec<f32> = (0..m * qd).map(|i| val(i, 1.7)).collect();
            let mut batch = vec![0.0; m * n_out(shape)];
            attention(shape, &q, &keys, &values, m, &mut batch);
            for i in 0..m {
                let seen = t - m + i + 1;
                let mut want = vec![0.0f32; n_out(shape)];
                for h in 0..6 {
                    let g = h / 3;
                    let qh = &q[i * qd + h * dk..][..dk];
                    let scale = 1.0 / (dk as f32).sqrt();
                    let mut sc: Vec<f32> = (0..seen)
                        .map(|p| dot(qh, &keys[p * kd + g * dk..][..dk]) * scale)
                        .collect();
                    let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0.0f64;
                    for s in sc.iter_mut() {
                        *s = (*s - max).exp();
                        sum += f64::from(*s);
                    }
                    let inv = (1.0 / sum) as f32;
                    let o = &mut want[h * dv..][..dv];
                    for (p, &w) in sc.iter().enumerate() {
                        for (acc, &v) in o.iter_mut().zip(&values[p * vd + g * dv..][..dv]) {
                            *acc += w * inv * v;
                        }
                    }
                }
                let got = &batch[i * n_out(shape)..][..n_out(shape)];
                assert!(
                    want.iter()
                        .zip(got)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "dk {dk} dv {dv} row {i} of the batch"
                );
                let mut alone = vec![0.0; n_out(shape)];
                let (k1, v1) = (&keys[..seen * kd], &values[..seen * vd]);
                attention(shape, &q[i * qd..][..qd], k1, v1, 1, &mut alone);
                assert!(
                    want.iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "dk {dk} dv {dv} row {i} alone"
                );
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
