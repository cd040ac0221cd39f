//! Per-group weight scales (see `docs/chip.md`): the chip's int8 × int8 → fp32 per-group mode
//! (rkllm `w8a8_gN`) and its fp16 × int4 → fp32 per-group mode (RK3576, rkllm `w4a16_gN`).
//!
//! int8 activations:
//!
//! ```text
//! P[m, n, j] = Σ_{k in group j} a[m, k] · q[n, k]                 exact i32
//! out[m, n]  = (Σ_j f32(P[m, n, j]) · s[n, j]) · act_scale[m]     f32, j ascending
//! ```
//!
//! The f32 sum starts at 0 and adds the products in ascending `j`, each product and each addition
//! rounded once (no fused multiply-add). `f32(P)` is exact: `|P| ≤ 127 · 128 · g < 2²⁴` for every
//! group size `g ≤ 1024` the pack layer accepts here (`MAX_GROUP`).
//!
//! The integer partial sums reuse the per-ISA tile kernels ([`super::tile_dot`]): a group of a
//! weight tile is itself a tile of `g / 32` k-tiles (the tile is k-tile-major), and each group's
//! columns of the activations are prepared as their own `rows × g` operand. So every ISA computes
//! the partial sums bit for bit like the scalar reference `scalar_group_partials`.
//!
//! fp16 activations (w4a16-gN; the activations arrive as f32, exact):
//!
//! ```text
//! P[m, n, j] = Σ_{k in group j} a[m, k] · q[n, k]                 f32, float_tile_dot's order
//! out[m, n]  = Σ_j P[m, n, j] · s[n, j]                            f32, j ascending
//! ```
//!
//! Each partial sum is one [`super::float_tile_dot`] over the group's k (products exact, the
//! additions in that kernel's documented lane order), so every ISA gives the scalar twin's result
//! bit for bit; the fold across groups is the same as for int8.
//!
//! Affine groups (w4a16-gN with a step `s` and an offset `b` per group, `docs/chip.md`) are two
//! matmuls of the chip's own types, added in f32:
//!
//! ```text
//! S[m, n]   = Σ_j P[m, n, j] · s[n, j]                f32, as above (fp16 × int4 per group)
//! A[m, j]   = fp16(Σ_{k in group j} a[m, k])          f32 sum in ascending k, one rounding
//! B[m, n]   = Σ_j A[m, j] · fp16(b[n, j])             f32, j ascending (fp16 × fp16 → fp32)
//! out[m, n] = S[m, n] + B[m, n]                       f32
//! ```
//!
//! The second matmul's K is the group count (padded with zeros to a multiple of 32 on the chip;
//! zeros change no sum). Its fold is scalar code shared by every ISA, so the affine result is
//! bit for bit the scalar twin's too.

use super::{float_tile_dot, tile_dot, Isa, PreparedA, WeightTile};

/// Largest group size the grouped kernel accepts: `127 · 128 · g` stays below 2²⁴, so every
/// partial sum converts to f32 exactly.
pub const MAX_GROUP: usize = 1024;

/// Activation rows split into their groups of columns, each prepared for the kernel of `isa`.
#[derive(Debug)]
pub struct GroupedA {
    group: usize,
    parts: Vec<PreparedA>,
}

impl GroupedA {
    /// Split `rows × k` int8 activations into `k / group` operands of `rows × group`
    /// (`group` a multiple of 32 dividing `k`).
    pub fn new(isa: Isa, rows: usize, k: usize, group: usize, a: &[i8]) -> Self {
        assert!(group > 0 && group.is_multiple_of(32) && k.is_multiple_of(group));
        assert_eq!(a.len(), rows * k);
        let mut cols = vec![0i8; rows * group];
        let parts = (0..k / group)
            .map(|j| {
                for (dst, src) in cols.chunks_exact_mut(group).zip(a.chunks_exact(k)) {
                    dst.copy_from_slice(&src[j * group..(j + 1) * group]);
                }
                PreparedA::new(isa, rows, group, group, &cols)
            })
            .collect();
        GroupedA { group, parts }
    }

    /// Number of groups.
    pub fn groups(&self) -> usize {
        self.parts.len()
    }
}

/// Integer partial sums of rows `m0..m1` against one weight tile (`w`: `tn × k` i8 in tile
/// order): `out[(j · (m1 - m0) + r) · tn + c] = P[m0 + r, c, j]`.
pub fn group_partials(a: &GroupedA, m0: usize, m1: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let (g, rows) = (a.group, m1 - m0);
    assert!(w.len() == tn * g * a.groups() && out.len() >= a.groups() * rows * tn);
    for (j, part) in a.parts.iter().enumerate() {
        tile_dot(
            part,
            m0,
            m1,
            &w[j * g * tn..(j + 1) * g * tn],
            tn,
            &mut out[j * rows * tn..(j + 1) * rows * tn],
        );
    }
}

/// The scalar reference of [`group_partials`], straight from the definition: `a` is `rows × k`
/// (unpadded, `k` a multiple of `group`), `w` one tile of `tn × k` in tile order.
#[cfg(test)]
pub fn scalar_group_partials(
    a: &[i8],
    k: usize,
    w: &[i8],
    tn: usize,
    group: usize,
    out: &mut [i32],
) {
    let rows = a.len() / k;
    let groups = k / group;
    for j in 0..groups {
        for r in 0..rows {
            for c in 0..tn {
                let mut acc = 0i32;
                for kk in j * group..(j + 1) * group {
                    let q = w[(kk / 32) * tn * 32 + c * 32 + kk % 32];
                    acc += i32::from(a[r * k + kk]) * i32::from(q);
                }
                out[(j * rows + r) * tn + c] = acc;
            }
        }
    }
}

/// f32 activation rows split into their groups of columns: `[group][row][g]` (fp16 activations
/// converted to f32, exact).
#[derive(Debug)]
pub struct GroupedF32 {
    group: usize,
    rows: usize,
    data: Vec<f32>,
}

impl GroupedF32 {
    /// Split `rows × k` f32 activations into `k / group` blocks of `rows × group`
    /// (`group` a multiple of 32 dividing `k`).
    pub fn new(rows: usize, k: usize, group: usize, a: &[f32]) -> Self {
        assert!(group > 0 && group.is_multiple_of(32) && k.is_multiple_of(group));
        assert_eq!(a.len(), rows * k);
        let mut data = vec![0f32; rows * k];
        for (j, block) in data.chunks_exact_mut(rows * group).enumerate() {
            for (dst, src) in block.chunks_exact_mut(group).zip(a.chunks_exact(k)) {
                dst.copy_from_slice(&src[j * group..(j + 1) * group]);
            }
        }
        GroupedF32 { group, rows, data }
    }

    /// Number of groups.
    pub fn groups(&self) -> usize {
        self.data
            .len()
            .checked_div(self.rows * self.group)
            .unwrap_or(0)
    }
}

/// Float partial sums of rows `m0..m1` against one weight tile of integer values (`w`: `tn × k`
/// i8 in tile order, an int4 tile unpacked): `out[(j · (m1 - m0) + r) · tn + c] = P[m0 + r, c, j]`.
pub fn float_group_partials(
    isa: Isa,
    a: &GroupedF32,
    m0: usize,
    m1: usize,
    w: &[i8],
    tn: usize,
    out: &mut [f32],
) {
    let (g, rows, all) = (a.group, m1 - m0, a.rows);
    let groups = a.groups();
    assert!(m1 <= all && w.len() == tn * g * groups && out.len() >= groups * rows * tn);
    for j in 0..groups {
        let block = &a.data[j * all * g..(j + 1) * all * g];
        float_tile_dot(
            isa,
            &block[m0 * g..m1 * g],
            g,
            WeightTile::I8(&w[j * g * tn..(j + 1) * g * tn]),
            tn,
            &mut out[j * rows * tn..(j + 1) * rows * tn],
        );
    }
}

/// A per-group partial sum: exact i32 (int8 activations) or f32 (fp16 activations).
pub trait Partial: Copy {
    /// The value as f32 (exact for the i32 sums of a group of at most [`MAX_GROUP`]).
    fn to_f32(self) -> f32;
}

impl Partial for i32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self as f32
    }
}

impl Partial for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

/// Fold partial sums (`[group][row][tn]`, from [`group_partials`] or [`float_group_partials`])
/// into `acc[r · tn + c] = Σ_j f32(P) · scale(c, j)` in ascending `j` (see the module docs for
/// the rounding).
pub fn apply_group_scales<P: Partial>(
    partials: &[P],
    groups: usize,
    rows: usize,
    tn: usize,
    scale: impl Fn(usize, usize) -> f32,
    acc: &mut [f32],
) {
    acc[..rows * tn].fill(0.0);
    for j in 0..groups {
        for r in 0..rows {
            for c in 0..tn {
                acc[r * tn + c] += partials[(j * rows + r) * tn + c].to_f32() * scale(c, j);
            }
        }
    }
}

/// The activations' group sums as the offsets matmul takes them (see the module docs):
/// `A[r, j] = fp16(Σ_{k in group j} a[r, k])` as f32 values, `rows × k/group`. `Err((row,
/// group))` names the first sum beyond the fp16 range (it would become ±Inf on the chip).
pub fn group_sums_f16(
    a: &[f32],
    rows: usize,
    k: usize,
    group: usize,
) -> Result<Vec<f32>, (usize, usize)> {
    assert!(group > 0 && k.is_multiple_of(group) && a.len() == rows * k);
    let groups = k / group;
    let mut out = Vec::with_capacity(rows * groups);
    for (r, row) in a.chunks_exact(k).enumerate() {
        for (j, vals) in row.chunks_exact(group).enumerate() {
            let sum = half::f16::from_f32(vals.iter().fold(0f32, |acc, &x| acc + x));
            if sum.is_infinite() {
                return Err((r, j));
            }
            out.push(sum.to_f32());
        }
    }
    Ok(out)
}

/// Add the offsets matmul to folded steps (see the module docs): for `r < rows`, `c < tn`,
/// `acc[r · tn + c] += Σ_j sums[r · groups + j] · fp16(offset(c, j))`, the sum in f32 from 0 in
/// ascending `j`, added to `acc` once. `sums` holds the group sums of the block's rows
/// ([`group_sums_f16`]).
pub fn apply_group_offsets(
    sums: &[f32],
    groups: usize,
    rows: usize,
    tn: usize,
    offset: impl Fn(usize, usize) -> f32,
    acc: &mut [f32],
) {
    for r in 0..rows {
        let row = &sums[r * groups..(r + 1) * groups];
        for c in 0..tn {
            let mut b = 0f32;
            for (j, &x) in row.iter().enumerate() {
                b += x * half::f16::from_f32(offset(c, j)).to_f32();
            }
            acc[r * tn + c] += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Tile an untiled `tn × k` i8 matrix (one tile).
    /// `rows × k` fp16-representable activations in [-3, 3], every 11th channel an outlier up
    /// to `outlier`.
    fn fp16_activations(
        next: &mut impl FnMut() -> u64,
        rows: usize,
        k: usize,
        outlier: f32,
    ) -> Vec<f32> {
        (0..rows * k)
            .map(|i| {
                let u = (next() % 20001) as f32 / 10000.0 - 1.0;
                let x = if (i % k) % 11 == 5 {
                    u * outlier
                } else {
                    u * 3.0
                };
                half::f16::from_f32(x).to_f32()
            })
            .collect()
    }

    /// `len` int4 codes, -8..=7.
    fn int4_codes(next: &mut impl FnMut() -> u64, len: usize) -> Vec<i8> {
        (0..len).map(|_| (next() % 16) as i8 - 8).collect()
    }

    fn tile(w: &[i8], k: usize, tn: usize) -> Vec<i8> {
        let mut t = vec![0i8; tn * k];
        for c in 0..tn {
            for kk in 0..k {
                t[(kk / 32) * tn * 32 + c * 32 + kk % 32] = w[c * k + kk];
            }
        }
        t
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Every ISA's per-group integer partial sums equal the scalar reference bit for bit,
        /// over random group sizes, group counts, row ranges and the full i8 range; the f32
        /// result is within the rounding bound of an f64 reference.
        #[test]
        fn partials_bit_exact_and_f32_close(
            gi in 0usize..5, groups in 1usize..5, rows in 1usize..11, m0 in 0usize..3,
            seed in any::<u64>(),
        ) {
            let group = [32, 64, 128, 256, 512][gi];
            let (k, tn) = (group * groups, 32);
            let mut s = seed | 1;
            let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
            let a: Vec<i8> = (0..rows * k).map(|_| next() as i8).collect();
            let w: Vec<i8> = (0..tn * k).map(|_| next() as i8).collect();
            let scales: Vec<f32> = (0..tn * groups).map(|_| (next() % 1000 + 1) as f32 * 1e-4).collect();
            let wt = tile(&w, k, tn);
            let mut want = vec![0i32; groups * rows * tn];
            scalar_group_partials(&a, k, &wt, tn, group, &mut want);
            let m0 = m0.min(rows - 1);
            for isa in Isa::available() {
                let ga = GroupedA::new(isa, rows, k, group, &a);
                let mut got = vec![0i32; groups * (rows - m0) * tn];
                group_partials(&ga, m0, rows, &wt, tn, &mut got);
                for j in 0..groups {
                    for r in m0..rows {
                        prop_assert_eq!(
                            &got[(j * (rows - m0) + r - m0) * tn..][..tn],
                            &want[(j * rows + r) * tn..][..tn],
                            "{:?} group {} row {}", isa, j, r
                        );
                    }
                }
            }
            let mut acc = vec![0f32; rows * tn];
            apply_group_scales(&want, groups, rows, tn, |c, j| scales[c * groups + j], &mut acc);
            for r in 0..rows {
                for c in 0..tn {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for kk in 0..k {
                        let p = f64::from(a[r * k + kk]) * f64::from(w[c * k + kk])
                            * f64::from(scales[c * groups + kk / group]);
                        exact += p;
                        mag += p.abs();
                    }
                    // One rounding per product and per addition: (groups + 1) · 2⁻²⁴ · Σ|p|.
                    let bound = 1.01 * (groups + 1) as f64 * f64::from(f32::EPSILON) / 2.0 * mag;
                    let got = f64::from(acc[r * tn + c]);
                    prop_assert!((got - exact).abs() <= bound, "[{},{}] {} vs {}", r, c, got, exact);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// fp16 activations (with outlier channels) × int4 values with per-group scales (w4a16-gN):
        /// every ISA's partial sums equal the scalar twin's bit for bit, and the folded result is
        /// within the f32 rounding bound of an f64 reference straight from the definition.
        #[test]
        fn float_partials_match_twin_and_f64(
            gi in 0usize..3, groups in 1usize..6, rows in 1usize..11, m0 in 0usize..3,
            seed in any::<u64>(),
        ) {
            let group = [32, 64, 128][gi];
            let (k, tn) = (group * groups, 64);
            let mut s = seed | 1;
            let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
            let a = fp16_activations(&mut next, rows, k, 1500.0);
            let w = int4_codes(&mut next, tn * k);
            let scales: Vec<f32> = (0..tn * groups).map(|_| (next() % 1000 + 1) as f32 * 1e-4).collect();
            let wt = tile(&w, k, tn);
            let m0 = m0.min(rows - 1);
            let ga = GroupedF32::new(rows, k, group, &a);
            prop_assert_eq!(ga.groups(), groups);
            let mut twin = vec![0f32; groups * (rows - m0) * tn];
            float_group_partials(Isa::Scalar, &ga, m0, rows, &wt, tn, &mut twin);
            for isa in Isa::available() {
                let mut got = vec![0f32; groups * (rows - m0) * tn];
                float_group_partials(isa, &ga, m0, rows, &wt, tn, &mut got);
                prop_assert!(
                    got.iter().zip(&twin).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{:?} differs from the scalar twin", isa
                );
            }
            let mut acc = vec![0f32; (rows - m0) * tn];
            apply_group_scales(&twin, groups, rows - m0, tn, |c, j| scales[c * groups + j], &mut acc);
            for r in m0..rows {
                for c in 0..tn {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for kk in 0..k {
                        let p = f64::from(a[r * k + kk]) * f64::from(w[c * k + kk])
                            * f64::from(scales[c * groups + kk / group]);
                        exact += p;
                        mag += p.abs();
                    }
                    // Inside a group: g/8 additions per lane and 7 across lanes; then one
                    // rounding for the scale product and one per group addition.
                    let steps = (group / 8 + 7 + groups + 1) as f64;
                    let bound = 1.01 * steps * f64::from(f32::EPSILON) / 2.0 * mag;
                    let got = f64::from(acc[(r - m0) * tn + c]);
                    prop_assert!((got - exact).abs() <= bound, "[{},{}] {} vs {}", r, c, got, exact);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Affine groups (w4a16-gN, step and offset): every ISA's result (steps folded, then the
        /// offsets matmul added) equals the scalar twin's bit for bit, and lies within the f32
        /// rounding bound of an f64 reference built from the definition (with the fp16 group
        /// sums and fp16 offsets the chip's second matmul takes).
        #[test]
        fn affine_matches_twin_and_f64(
            gi in 0usize..3, groups in 1usize..6, rows in 1usize..11, m0 in 0usize..3,
            seed in any::<u64>(),
        ) {
            use half::f16;
            let group = [32, 64, 128][gi];
            let (k, tn) = (group * groups, 64);
            let mut s = seed | 1;
            let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
            let a = fp16_activations(&mut next, rows, k, 300.0);
            let w = int4_codes(&mut next, tn * k);
            let steps: Vec<f32> = (0..tn * groups).map(|_| (next() % 1000 + 1) as f32 * 1e-4).collect();
            let offsets: Vec<f32> =
                (0..tn * groups).map(|_| ((next() % 2001) as f32 - 1000.0) * 7e-5).collect();
            let wt = tile(&w, k, tn);
            let m0 = m0.min(rows - 1);
            let ga = GroupedF32::new(rows, k, group, &a);
            let sums = group_sums_f16(&a[m0 * k..], rows - m0, k, group).unwrap();
            let run = |isa: Isa| {
                let mut p = vec![0f32; groups * (rows - m0) * tn];
                float_group_partials(isa, &ga, m0, rows, &wt, tn, &mut p);
                let mut acc = vec![0f32; (rows - m0) * tn];
                apply_group_scales(&p, groups, rows - m0, tn, |c, j| steps[c * groups + j], &mut acc);
                apply_group_offsets(&sums, groups, rows - m0, tn, |c, j| offsets[c * groups + j], &mut acc);
                acc
            };
            let twin = run(Isa::Scalar);
            for isa in Isa::available() {
                let got = run(isa);
                prop_assert!(
                    got.iter().zip(&twin).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{:?} differs from the scalar twin", isa
                );
            }
            for r in m0..rows {
                for c in 0..tn {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for kk in 0..k {
                        let p = f64::from(a[r * k + kk]) * f64::from(w[c * k + kk])
                            * f64::from(steps[c * groups + kk / group]);
                        exact += p;
                        mag += p.abs();
                    }
                    let (mut bx, mut bmag) = (0f64, 0f64);
                    for j in 0..groups {
                        let b16 = f64::from(f16::from_f32(offsets[c * groups + j]).to_f32());
                        let p = f64::from(sums[(r - m0) * groups + j]) * b16;
                        bx += p;
                        bmag += p.abs();
                    }
                    let steps_n = (group / 8 + 7 + groups + 1) as f64;
                    let eps = f64::from(f32::EPSILON) / 2.0;
                    let bound = 1.01 * eps * (steps_n * mag + (groups + 1) as f64 * bmag
                        + (exact + bx).abs() + mag + bmag);
                    let got = f64::from(twin[(r - m0) * tn + c]);
                    prop_assert!((got - (exact + bx)).abs() <= bound,
                        "[{},{}] {} vs {}", r, c, got, exact + bx);
                }
            }
        }
    }

    #[test]
    fn group_sums_refuse_fp16_overflow() {
        let a = vec![60000f32; 2 * 32];
        assert_eq!(group_sums_f16(&a[..32], 1, 32, 32), Err((0, 0)));
        let mut b = vec![1f32; 2 * 64];
        b[64 + 40] = 65504.0;
        b[64 + 41] = 65504.0;
        assert_eq!(group_sums_f16(&b, 2, 64, 32), Err((1, 1)));
        let ok = group_sums_f16(&b[..64], 1, 64, 32).unwrap();
        assert_eq!(ok, vec![32.0, 32.0]);
    }

    #[test]
    fn extremes_stay_exact_at_the_largest_group() {
        let (rows, k, tn) = (5, 2 * MAX_GROUP, 32);
        let a = vec![-128i8; rows * k];
        let w = vec![-127i8; tn * k];
        let wt = tile(&w, k, tn);
        for isa in Isa::available() {
            let ga = GroupedA::new(isa, rows, k, MAX_GROUP, &a);
            let mut got = vec![0i32; 2 * rows * tn];
            group_partials(&ga, 0, rows, &wt, tn, &mut got);
            assert!(
                got.iter().all(|&p| p == 128 * 127 * MAX_GROUP as i32),
                "{isa:?}"
            );
            assert_eq!(
                got[0] as f32 as i64,
                i64::from(got[0]),
                "partial not exact in f32"
            );
        }
    }
}
