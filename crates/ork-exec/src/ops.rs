//! The non-matmul operators of the forward pass, in f32 on the CPU.
//!
//! Numerics follow ggml's CPU reference operators (`ggml-cpu/ops.cpp`): RMSNorm accumulates the
//! sum of squares in double, attention uses a max-subtracted softmax, RoPE angles are
//! `pos · freq_scale · base^(-2i/n_rot)`.
use crate::config::RopeStyle;

mod attention;
pub use attention::{
    attention, attention_tree, attention_tree_window, attention_window, AttentionShape, KvValue,
    ATTENTION_PIECE,
};

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
///
/// As ggml's `ggml_rope_ext` (`ggml-cpu/ops.cpp`, `rope_yarn` with `ext_factor = 0`): pair `i`
/// turns by `pos · freq_scale · base^(-2i/n_rot) / factor[i]` where `factor` is the model's
/// frequency factors when it has some (Llama 3.x's `rope_freqs`, LongRoPE's long or short set),
/// and both its cos and sin are multiplied by the attention factor (`rope.scaling.attn_factor`,
/// 1 by default). docs/models.md, "RoPE frequency factors".
#[derive(Clone, Debug)]
pub struct Rope {
    style: RopeStyle,
    n_rot: usize,
    /// `freq_scale · base^(-2i/n_rot)` for `i < n_rot/2`, without factors.
    unfactored: Vec<f64>,
    /// `freq_scale · base^(-2i/n_rot) / factor[i]` for `i < n_rot/2` (the short factors of a
    /// LongRoPE model).
    inv_freq: Vec<f64>,
    /// LongRoPE: the inverse frequencies with the long factors, used by sessions whose context
    /// exceeds the original context length (the second value).
    long: Option<(Vec<f64>, usize)>,
    /// Multiplies every cos and sin (`attn_factor`).
    mscale: f32,
}

impl Rope {
    /// A rope rotating the first `n_rot` (even) values of each head.
    pub fn new(style: RopeStyle, n_rot: usize, base: f32, freq_scale: f32) -> Rope {
        let inv_freq: Vec<f64> = (0..n_rot / 2)
            .map(|i| f64::from(freq_scale) * f64::from(base).powf(-2.0 * i as f64 / n_rot as f64))
            .collect();
        Rope {
            style,
            n_rot,
            unfactored: inv_freq.clone(),
            inv_freq,
            long: None,
            mscale: 1.0,
        }
    }

    /// Divide each pair's frequency by its factor (`factors.len() == n_rot / 2`, each finite
    /// and positive; the loader checks).
    pub fn with_factors(mut self, factors: &[f32]) -> Rope {
        debug_assert_eq!(factors.len(), self.inv_freq.len());
        self.inv_freq = divided(&self.unfactored, factors);
        self
    }

    /// LongRoPE: sessions whose context exceeds `original_context` use `long` factors instead
    /// of the ones set by [`Rope::with_factors`] (llama.cpp's `get_rope_factors`).
    pub fn with_long_factors(mut self, long: Option<&[f32]>, original_context: usize) -> Rope {
        let inv = match long {
            Some(f) => divided(&self.unfactored, f),
            None => self.unfactored.clone(),
        };
        self.long = Some((inv, original_context));
        self
    }

    /// Multiply every cos and sin by `attn_factor`.
    pub fn with_attn_factor(mut self, attn_factor: f32) -> Rope {
        self.mscale = attn_factor;
        self
    }

    /// Whether a session of `context` positions uses LongRoPE's long factors (its context
    /// exceeds the original one).
    pub fn uses_long_factors(&self, context: usize) -> bool {
        self.long
            .as_ref()
            .is_some_and(|(_, original)| context > *original)
    }

    /// The (cos, sin) of each pair's angle at `pos`, in a session of `context` positions
    /// (which picks LongRoPE's long or short factors).
    pub fn angles(&self, pos: usize, context: usize) -> Vec<(f32, f32)> {
        let inv_freq = match &self.long {
            Some((long, _)) if self.uses_long_factors(context) => long,
            _ => &self.inv_freq,
        };
        inv_freq
            .iter()
            .map(|f| {
                let theta = pos as f64 * f;
                (
                    theta.cos() as f32 * self.mscale,
                    theta.sin() as f32 * self.mscale,
                )
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

/// Each frequency divided by its factor.
fn divided(inv_freq: &[f64], factors: &[f32]) -> Vec<f64> {
    inv_freq
        .iter()
        .zip(factors)
        .map(|(f, &d)| f / f64::from(d))
        .collect()
}

/// SiLU(gate) · up, element-wise into `gate`, eight lanes wide where the CPU allows
/// (`ork_exec::wide`; the same bits either way).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    crate::wide::wide(Gated {
        gate,
        up,
        act: silu,
    });
}

/// GeLU(gate) · up, element-wise into `gate`, with GeLU's tanh form
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (Gemma's `gelu_pytorch_tanh`, ggml's
/// `ggml_gelu`), computed as the equal `x / (1 + e^(−2y))`, `y = √(2/π)·x·(1 + 0.044715·x²)`,
/// so that it vectorizes like [`swiglu`]. ggml's CPU looks the GeLU up in a table of f16 inputs
/// and outputs instead (docs/models.md, "gemma3"); this is the exact function.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    crate::wide::wide(Gated {
        gate,
        up,
        act: gelu_tanh,
    });
}

/// `act(gate) · up` element-wise into `gate`: the gated FFN's activation, one kernel for every
/// activation (a function item, so each use compiles to its own vectorized loop).
struct Gated<'a, F: Fn(f32) -> f32> {
    gate: &'a mut [f32],
    up: &'a [f32],
    act: F,
}

impl<F: Fn(f32) -> f32> crate::wide::Kernel for Gated<'_, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        for (g, u) in self.gate.iter_mut().zip(self.up) {
            *g = (self.act)(*g) * u;
        }
    }
}

/// SiLU, `x / (1 + e^(−x))` (see [`swiglu`]).
#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// GeLU, tanh form (see [`geglu`]).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    let y = SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x);
    x / (1.0 + exp(-2.0 * y))
}

/// `e^x` for f32, vectorizable, within 2 ulp ([`ork_kernels::attend::exp`]), and the dot
/// product of attention's scores: fused chains in a fixed order, the same bits in every build
/// ([`ork_kernels::attend::dot`]). One definition each, beside the attention loops that must give
/// their bits.
pub use ork_kernels::attend::{dot, dot_wide, exp};

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

    /// [`geglu`] against GeLU's tanh form in f64, times `up`, over the range where it bends and
    /// far beyond it (where it is 0 or x).
    #[test]
    fn geglu_is_the_tanh_gelu_times_up() {
        let xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 * 0.005).collect();
        let up: Vec<f32> = xs.iter().map(|x| 1.0 + 0.1 * x.sin()).collect();
        let mut g = xs.clone();
        super::geglu(&mut g, &up);
        for ((&x, &u), &got) in xs.iter().zip(&up).zip(&g) {
            let x64 = f64::from(x);
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64.powi(3));
            let want = 0.5 * x64 * (1.0 + inner.tanh()) * f64::from(u);
            assert!(
                (f64::from(got) - want).abs() <= 1e-6 + 1e-5 * want.abs(),
                "x {x}: {got} vs {want}"
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
            rope.apply(&mut x, 8, &rope.angles(0, 16));
            assert_eq!(x, head, "position 0 is the identity");
            let mut x = head.clone();
            rope.apply(&mut x, 8, &rope.angles(5, 16));
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
            &Rope::new(RopeStyle::Interleaved, 8, 10_000.0, 1.0).angles(pos, 16),
        );
        assert!((x[0] - (1.0 * c - 2.0 * s)).abs() < 1e-6);
        assert!((x[1] - (1.0 * s + 2.0 * c)).abs() < 1e-6);
        let neox = Rope::new(RopeStyle::Neox, 8, 10_000.0, 1.0);
        let mut y = head.clone();
        neox.apply(&mut y, 8, &neox.angles(pos, 16));
        assert!((y[0] - (1.0 * c - 5.0 * s)).abs() < 1e-6);
        assert!((y[4] - (1.0 * s + 5.0 * c)).abs() < 1e-6);
    }

    #[test]
    fn rope_factors_divide_each_pairs_angle_and_attn_factor_scales_cos_and_sin() {
        let plain = Rope::new(RopeStyle::Neox, 8, 100.0, 0.5);
        let factors = [1.0, 2.0, 0.5, 8.0];
        let scaled = plain.clone().with_factors(&factors).with_attn_factor(1.5);
        let pos = 7;
        let got = scaled.angles(pos, 16);
        assert_eq!(plain.angles(pos, 16).len(), got.len());
        for (i, (s, f)) in got.iter().zip(factors).enumerate() {
            // The angle of pair i: pos · 0.5 · 100^(-2i/8) / f_i, as ggml's theta / ff.
            let theta = pos as f64 * 0.5 * 100f64.powf(-2.0 * i as f64 / 8.0) / f64::from(f);
            let (c, sn) = (theta.cos() as f32 * 1.5, theta.sin() as f32 * 1.5);
            assert!(
                (s.0 - c).abs() < 1e-5 && (s.1 - sn).abs() < 1e-5,
                "pair {i}"
            );
        }
    }

    #[test]
    fn longrope_picks_the_long_factors_only_beyond_the_original_context() {
        let base = Rope::new(RopeStyle::Neox, 4, 10_000.0, 1.0);
        let rope = base
            .clone()
            .with_factors(&[1.0, 2.0])
            .with_long_factors(Some(&[4.0, 8.0]), 512);
        let short = base.clone().with_factors(&[1.0, 2.0]);
        let long = base.with_factors(&[4.0, 8.0]);
        assert_eq!(rope.angles(9, 512), short.angles(9, 512));
        assert_eq!(rope.angles(9, 513), long.angles(9, 513));
        assert_ne!(rope.angles(9, 512), rope.angles(9, 513));
        assert!(!rope.uses_long_factors(512) && rope.uses_long_factors(513));
    }

    #[test]
    fn rope_leaves_unrotated_tail() {
        let rope = Rope::new(RopeStyle::Neox, 4, 10_000.0, 1.0);
        let mut x: Vec<f32> = (0..6).map(|i| i as f32).collect();
        rope.apply(&mut x, 6, &rope.angles(3, 16));
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
    /// a max-subtracted softmax summed in f64, the value rows added in position order by fused
    /// multiply-adds; over more
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
                                    *a = (w * inv).mul_add(v, *a);
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
