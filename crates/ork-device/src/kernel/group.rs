//! Per-group int8 matmul (the chip's int8 × int8 → fp32 per-group mode; see `docs/chip.md`):
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
//! the partial sums bit for bit like the scalar reference [`scalar_group_partials`].

use super::{tile_dot, Isa, PreparedA};

/// Largest group size the grouped kernel accepts: `127 · 128 · g` stays below 2²⁴, so every
/// partial sum converts to f32 exactly.
pub const MAX_GROUP: usize = 1024;

/// Activation rows split into their groups of columns, each prepared for the kernel of `isa`.
#[derive(Debug)]
pub(crate) struct GroupedA {
    group: usize,
    parts: Vec<PreparedA>,
}

impl GroupedA {
    /// Split `rows × k` int8 activations into `k / group` operands of `rows × group`
    /// (`group` a multiple of 32 dividing `k`).
    pub(crate) fn new(isa: Isa, rows: usize, k: usize, group: usize, a: &[i8]) -> Self {
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
    pub(crate) fn groups(&self) -> usize {
        self.parts.len()
    }
}

/// Integer partial sums of rows `m0..m1` against one weight tile (`w`: `tn × k` i8 in tile
/// order): `out[(j · (m1 - m0) + r) · tn + c] = P[m0 + r, c, j]`.
pub(crate) fn group_partials(
    a: &GroupedA,
    m0: usize,
    m1: usize,
    w: &[i8],
    tn: usize,
    out: &mut [i32],
) {
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
pub(crate) fn scalar_group_partials(
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

/// Fold partial sums (`[group][row][tn]`, from [`group_partials`]) into `acc[r · tn + c] =
/// Σ_j f32(P) · scale(c, j)` in ascending `j` (see the module docs for the rounding).
pub(crate) fn apply_group_scales(
    partials: &[i32],
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
                acc[r * tn + c] += partials[(j * rows + r) * tn + c] as f32 * scale(c, j);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Tile an untiled `tn × k` i8 matrix (one tile).
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
