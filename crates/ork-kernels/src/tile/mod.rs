//! Matmul kernels that read the weight straight from the RK3588 tiled bytes.
//!
//! A weight N-tile is `tn` rows of `Kpad` values stored as `(Kpad/32, tn, 32)`: for output channel
//! `j` of the tile, k-tile `kt` is the 32-byte run at `kt·tn·32 + j·32`. Every kernel computes, for
//! a block of activation rows and one tile,
//! `out[r·tn + j] = Σ_k a[r, k] · w[j, k]` exactly in i32.
//!
//! Kernels: a portable scalar one (the twin every SIMD kernel is checked against), AVX2 (both
//! operands sign-extended to i16, `vpmaddwd`: products and pair sums are exact in i32, unlike
//! `vpmaddubsw`, which saturates at i16), AVX-VNNI and AVX-512 VNNI (`vpdpbusd` on ymm / zmm with
//! the weights biased to u8 and a per-row correction `128 · Σ_k a`; the wrap-around i32
//! arithmetic makes the result exact whenever the true dot product fits in i32, which [`MAX_K`]
//! guarantees; see `avx512_vnni.rs`), and on aarch64 NEON (`smull` + `sadalp`) and NEON dotprod
//! (`sdot`) (tested under qemu-aarch64 only, never on a board; `docs/kernels.md`). All five SIMD
//! kernels run one generic loop body (`tile/body.rs`) over a small vector trait each ISA
//! implements. The ISA is detected once at run time, the best available first: AVX-512 VNNI,
//! AVX-VNNI, AVX2, scalar on x86-64; NEON dotprod, NEON, scalar on aarch64.
//!
//! Float kernels (`float_tile_dot`) serve fp16 activations (w8a16 / w4a16 / fp16×fp16) and
//! int8 activations against fp16 weights: the activation rows arrive as f32 (converted once per
//! task), the weight tile is read in its stored type. Kernels: the portable scalar twin and
//! AVX2+FMA+F16C (x86-64; needs all three, detected once). On aarch64 the scalar twin runs (no
//! NEON float kernel yet).

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_f32;
#[cfg(target_arch = "x86_64")]
mod avx512_vnni;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod body;
pub mod group;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(target_arch = "x86_64")]
mod vnni;

/// Largest K (padded) a task may have: `|Σ a·w| ≤ 128·128·K` must fit in an i32.
pub const MAX_K: usize = 65536;

/// Which instruction set a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Isa {
    /// Portable Rust.
    Scalar,
    /// x86-64 AVX2 (`vpmovsxbw` + `vpmaddwd`).
    Avx2,
    /// x86-64 AVX-VNNI (`vpdpbusd`, 256-bit).
    AvxVnni,
    /// x86-64 AVX-512 VNNI (`vpdpbusd`, 512-bit; needs AVX-512 F as well).
    Avx512Vnni,
    /// aarch64 NEON (`smull` + `sadalp`), the aarch64 baseline.
    Neon,
    /// aarch64 NEON with FEAT_DotProd (`sdot`; Cortex-A76 / A55).
    NeonDot,
}

impl Isa {
    /// Short name for reports.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Neon => "neon",
            Isa::NeonDot => "neon-dotprod",
        }
    }

    /// Every ISA this CPU can run, scalar first, the fastest last.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Isa::Avx2);
                if std::arch::is_x86_feature_detected!("avxvnni") {
                    v.push(Isa::AvxVnni);
                }
            }
            // zmm `vpdpbusd` does twice the multiply-adds per instruction of AVX-VNNI's ymm form
            // (same or better throughput per multiply-add on every CPU that has both).
            if avx512_vnni::available() {
                v.push(Isa::Avx512Vnni);
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                v.push(Isa::Neon);
                if neon::has_dotprod() {
                    v.push(Isa::NeonDot);
                }
            }
        }
        v
    }

    /// Every ISA of every architecture, in [`Isa::name`] order of the docs: what `ORK_KERNEL` may
    /// name (this CPU runs those in [`Isa::available`]).
    pub const ALL: [Isa; 6] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512Vnni,
        Isa::Neon,
        Isa::NeonDot,
    ];

    /// The ISA called `name`, if this CPU can run it.
    ///
    /// # Errors
    /// [`KernelChoiceError::Unknown`] if no kernel has that name,
    /// [`KernelChoiceError::Unavailable`] if this CPU lacks its instructions; both list the
    /// kernels this CPU has.
    pub fn named(name: &str) -> Result<Isa, KernelChoiceError> {
        let available = Isa::available();
        let names = || available.iter().map(|i| i.name()).collect();
        match Isa::ALL.iter().find(|i| i.name() == name) {
            None => Err(KernelChoiceError::Unknown {
                name: name.to_owned(),
                available: names(),
            }),
            Some(isa) if !available.contains(isa) => Err(KernelChoiceError::Unavailable {
                name: name.to_owned(),
                available: names(),
            }),
            Some(&isa) => Ok(isa),
        }
    }

    /// The ISA `ORK_KERNEL` names, `None` when it is unset (or empty).
    ///
    /// # Errors
    /// As [`Isa::named`]; front ends refuse to start on such an error (the CLI exits 2).
    pub fn from_env() -> Result<Option<Isa>, KernelChoiceError> {
        match std::env::var("ORK_KERNEL") {
            Ok(name) if !name.is_empty() => Isa::named(&name).map(Some),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(raw)) => Err(KernelChoiceError::Unknown {
                name: raw.to_string_lossy().into_owned(),
                available: Isa::available().iter().map(|i| i.name()).collect(),
            }),
        }
    }

    /// The ISA to run, detected once: the one `ORK_KERNEL` names (for comparisons; see
    /// [`Isa::ALL`] for the names), else the fastest available. An `ORK_KERNEL` this CPU cannot
    /// run is refused by [`Isa::from_env`], which the CLI and ork-device's `EmuDevice::with_config`
    /// call first; this infallible form then falls back to the fastest.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| match Isa::from_env() {
            Ok(Some(isa)) => isa,
            _ => *Isa::available().last().unwrap_or(&Isa::Scalar),
        })
    }
}

/// An `ORK_KERNEL` value that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelChoiceError {
    /// No kernel has this name.
    #[error("ORK_KERNEL={name:?} names no kernel; this CPU has: {}", available.join(", "))]
    Unknown {
        /// The value given.
        name: String,
        /// The kernels this CPU can run.
        available: Vec<&'static str>,
    },
    /// The kernel exists but this CPU lacks its instructions.
    #[error("ORK_KERNEL={name:?}: this CPU cannot run that kernel; it has: {}", available.join(", "))]
    Unavailable {
        /// The value given.
        name: String,
        /// The kernels this CPU can run.
        available: Vec<&'static str>,
    },
}

/// Activation rows padded to `kpad` in the form the chosen kernel wants.
#[derive(Debug)]
pub struct PreparedA {
    isa: Isa,
    kpad: usize,
    /// `rows × kpad` i8, zero padded (scalar, NEON, AVX-VNNI, AVX-512 VNNI).
    i8s: Vec<i8>,
    /// `128 · Σ_k a[r, k]` per row (the VNNI kernels' correction for their biased weights).
    row_corr: Vec<i32>,
    /// `rows × kpad` i16 (AVX2).
    i16s: Vec<i16>,
}

impl PreparedA {
    /// Pad `rows` rows of `k` values (`row(r)` returns row r) to `kpad`.
    pub fn new(isa: Isa, rows: usize, k: usize, kpad: usize, a: &[i8]) -> Self {
        debug_assert!(a.len() == rows * k && kpad.is_multiple_of(32) && kpad >= k);
        let mut p = PreparedA {
            isa,
            kpad,
            i8s: Vec::new(),
            row_corr: Vec::new(),
            i16s: Vec::new(),
        };
        match isa {
            Isa::Avx2 => {
                p.i16s = vec![0; rows * kpad];
                for (dst, src) in p.i16s.chunks_exact_mut(kpad).zip(a.chunks_exact(k.max(1))) {
                    dst.iter_mut()
                        .zip(src)
                        .for_each(|(d, &s)| *d = i16::from(s));
                }
            }
            Isa::Scalar | Isa::Neon | Isa::NeonDot | Isa::AvxVnni | Isa::Avx512Vnni => {
                p.i8s = vec![0; rows * kpad];
                for (dst, src) in p.i8s.chunks_exact_mut(kpad).zip(a.chunks_exact(k.max(1))) {
                    dst[..k].copy_from_slice(src);
                }
                if matches!(isa, Isa::AvxVnni | Isa::Avx512Vnni) {
                    // |Σ a| ≤ 128 · MAX_K = 2^23, so 128 · Σ a fits in an i32.
                    p.row_corr = a
                        .chunks_exact(k.max(1))
                        .take(rows)
                        .map(|row| 128 * row.iter().map(|&x| i32::from(x)).sum::<i32>())
                        .collect();
                    p.row_corr.resize(rows, 0);
                }
            }
        }
        p
    }
}

/// `out[(r - m0)·tn + j] = Σ_k a[r, k] · w[j, k]` for rows `m0..m1` and all `tn` channels of one
/// tile (`w.len() == tn · kpad`, `out.len() ≥ (m1 - m0) · tn`, `tn` a multiple of 8: ork-pack's
/// integer tiles are 32 and 64 wide).
pub fn tile_dot(a: &PreparedA, m0: usize, m1: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    assert!(tn.is_multiple_of(8));
    tile_dot_any_width(a, m0, m1, w, tn, out);
}

/// [`tile_dot`] for any width the chosen kernel accepts (even; a multiple of 8 for AVX-512 VNNI,
/// whose entry asserts it), for the tests that reach every kernel's remainder paths.
fn tile_dot_any_width(a: &PreparedA, m0: usize, m1: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let kpad = a.kpad;
    assert!(w.len() == tn * kpad && out.len() >= (m1 - m0) * tn);
    match a.isa {
        Isa::Scalar => scalar_tile_dot(&a.i8s[m0 * kpad..m1 * kpad], kpad, w, tn, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::tile_dot(&a.i16s[m0 * kpad..m1 * kpad], kpad, w, tn, out),
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => vnni::tile_dot(
            &a.i8s[m0 * kpad..m1 * kpad],
            &a.row_corr[m0..m1],
            kpad,
            w,
            tn,
            out,
        ),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => avx512_vnni::tile_dot(
            &a.i8s[m0 * kpad..m1 * kpad],
            &a.row_corr[m0..m1],
            kpad,
            w,
            tn,
            out,
        ),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::tile_dot(&a.i8s[m0 * kpad..m1 * kpad], kpad, w, tn, out),
        #[cfg(target_arch = "aarch64")]
        Isa::NeonDot => neon::tile_dot_dotprod(&a.i8s[m0 * kpad..m1 * kpad], kpad, w, tn, out),
        // An ISA of another architecture is never detected here; `Isa::available` is the only
        // constructor path used by the device.
        #[allow(unreachable_patterns)]
        _ => scalar_tile_dot(&a.i8s[m0 * kpad..m1 * kpad], kpad, w, tn, out),
    }
}

/// The portable kernel and the scalar twin of every SIMD kernel.
pub fn scalar_tile_dot(a: &[i8], kpad: usize, w: &[i8], tn: usize, out: &mut [i32]) {
    let rows = a.len() / kpad;
    for r in 0..rows {
        let arow = &a[r * kpad..(r + 1) * kpad];
        for j in 0..tn {
            let mut acc = 0i32;
            for (kt, ak) in arow.chunks_exact(32).enumerate() {
                let run = &w[kt * tn * 32 + j * 32..kt * tn * 32 + j * 32 + 32];
                acc += ak
                    .iter()
                    .zip(run)
                    .map(|(&x, &y)| i32::from(x) * i32::from(y))
                    .sum::<i32>();
            }
            out[r * tn + j] = acc;
        }
    }
}

/// Decode one int4 tile (`tn · kpad / 2` bytes) into i8 values in the same tile order.
/// Values are two's-complement nibbles; element `2i` sits in the low nibble of byte `i` when
/// [`crate::INT4_EVEN_K_IN_LOW_NIBBLE`] holds.
pub fn unpack_i4_tile(src: &[u8], dst: &mut [i8]) {
    debug_assert_eq!(dst.len(), src.len() * 2);
    for (pair, &b) in dst.chunks_exact_mut(2).zip(src) {
        let lo = ((b << 4) as i8) >> 4;
        let hi = (b as i8) >> 4;
        if crate::INT4_EVEN_K_IN_LOW_NIBBLE {
            pair[0] = lo;
            pair[1] = hi;
        } else {
            pair[0] = hi;
            pair[1] = lo;
        }
    }
}

/// A weight tile as the float kernels read it: `tn × kpad` values in tile order.
#[derive(Clone, Copy, Debug)]
pub enum WeightTile<'a> {
    /// int8 values (an int4 tile arrives unpacked to int8).
    I8(&'a [i8]),
    /// fp16 values.
    F16(&'a [half::f16]),
}

/// Name of the float kernel [`float_tile_dot`] runs for `isa`.
pub fn float_kernel_name(isa: Isa) -> &'static str {
    if float_simd(isa) {
        "f32-avx2-fma"
    } else {
        "f32-scalar"
    }
}

/// Whether the float path uses SIMD under `isa`: on x86-64 whenever an AVX2-class ISA is chosen
/// and the CPU also has FMA and F16C; the scalar ISA (and NEON, for now) run the scalar twin.
fn float_simd(isa: Isa) -> bool {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni => avx2_f32::available(),
        _ => false,
    }
}

/// Float tile dot for f32 activation rows (fp16 activations, or int8 ones against an fp16 weight,
/// both exact in f32): `out[r·tn + j] = Σ_k a[r, k] · w[j, k]` for all rows of `a`
/// (`rows × kpad`, zero padded) and the `tn` channels of one tile.
///
/// Accumulation order (every kernel, bit for bit): lane `l ∈ 0..8` sums the products of
/// `k ≡ l (mod 8)` in ascending k, starting from 0; the result is `((l0 + l1) + l2) + … + l7`.
/// Each product of an fp16 (11-bit significand) or int8 activation with an int8 or fp16 weight has
/// at most 22 significant bits and stays in f32's normal range, so it is exact: a fused
/// multiply-add and a multiply-then-add round identically, and only the additions round. The NPU
/// also accumulates in fp32, in its own (undocumented) order.
pub fn float_tile_dot(
    isa: Isa,
    a: &[f32],
    kpad: usize,
    w: WeightTile<'_>,
    tn: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if float_simd(isa) {
        match w {
            WeightTile::I8(w) => avx2_f32::tile_dot_i8(a, kpad, w, tn, out),
            WeightTile::F16(w) => avx2_f32::tile_dot_f16(a, kpad, w, tn, out),
        }
        return;
    }
    let _ = isa;
    match w {
        WeightTile::I8(w) => scalar_float_tile_dot(a, kpad, w, tn, out),
        WeightTile::F16(w) => scalar_float_tile_dot(a, kpad, w, tn, out),
    }
}

/// The portable float kernel and the scalar twin of `avx2_f32` (same accumulation order; see
/// [`float_tile_dot`]).
pub fn scalar_float_tile_dot<W: Copy + Into<f32>>(
    a: &[f32],
    kpad: usize,
    w: &[W],
    tn: usize,
    out: &mut [f32],
) {
    assert!(kpad.is_multiple_of(32) && w.len() == tn * kpad);
    let rows = a.len() / kpad;
    assert!(a.len() == rows * kpad && out.len() >= rows * tn);
    for r in 0..rows {
        let arow = &a[r * kpad..(r + 1) * kpad];
        for j in 0..tn {
            let mut lanes = [0f32; 8];
            for (kt, ak) in arow.chunks_exact(32).enumerate() {
                let run = &w[kt * tn * 32 + j * 32..kt * tn * 32 + j * 32 + 32];
                for (x8, y8) in ak.chunks_exact(8).zip(run.chunks_exact(8)) {
                    for ((l, &x), &y) in lanes.iter_mut().zip(x8).zip(y8) {
                        *l += x * y.into();
                    }
                }
            }
            out[r * tn + j] = lanes[1..].iter().fold(lanes[0], |s, &x| s + x);
        }
    }
}

/// Run the ISA's peak multiply-add loop on one thread for about `iters` iterations; returns the
/// multiply-adds performed and a checksum (to keep the work observable).
pub fn peak_loop(isa: Isa, iters: u64) -> (u64, i32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => (iters * vnni::PEAK_MACS_PER_ITER, vnni::peak(iters)),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => (iters * avx2::PEAK_MACS_PER_ITER, avx2::peak(iters)),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => (
            iters * avx512_vnni::PEAK_MACS_PER_ITER,
            avx512_vnni::peak(iters),
        ),
        // Scalar / NEON: the kernel itself on an L1-resident 4 × 32 tile of 256-wide K.
        _ => {
            let a = vec![3i8; 4 * 256];
            let w = vec![-5i8; 32 * 256];
            let p = PreparedA::new(isa, 4, 256, 256, &a);
            let mut out = [0i32; 4 * 32];
            let reps = (iters / 64).max(1);
            let mut sum = 0i32;
            for _ in 0..reps {
                tile_dot(&p, 0, 4, std::hint::black_box(&w), 32, &mut out);
                sum = sum.wrapping_add(out[0]);
            }
            (reps * 4 * 32 * 256, sum)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Tile an untiled `n × k` int8 matrix into `tn`-row tiles, zero padded.
    fn tile(w: &[i8], n: usize, k: usize, tn: usize) -> (Vec<i8>, usize, usize) {
        let kpad = k.div_ceil(32) * 32;
        let npad = n.div_ceil(tn) * tn;
        let mut t = vec![0i8; npad * kpad];
        for nn in 0..n {
            for kk in 0..k {
                t[(nn / tn) * tn * kpad + (kk / 32) * tn * 32 + (nn % tn) * 32 + kk % 32] =
                    w[nn * k + kk];
            }
        }
        (t, kpad, npad)
    }

    fn naive(a: &[i8], w: &[i8], m: usize, n: usize, k: usize) -> Vec<i32> {
        let mut o = vec![0i32; m * n];
        for i in 0..m {
            for j in 0..n {
                o[i * n + j] = (0..k)
                    .map(|kk| i32::from(a[i * k + kk]) * i32::from(w[j * k + kk]))
                    .sum();
            }
        }
        o
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        isa: Isa,
        a: &[i8],
        m: usize,
        k: usize,
        wt: &[i8],
        kpad: usize,
        npad: usize,
        tn: usize,
    ) -> Vec<i32> {
        let p = PreparedA::new(isa, m, k, kpad, a);
        let mut full = vec![0i32; m * npad];
        let mut blk = vec![0i32; m * tn];
        for t in 0..npad / tn {
            tile_dot(
                &p,
                0,
                m,
                &wt[t * tn * kpad..(t + 1) * tn * kpad],
                tn,
                &mut blk,
            );
            for r in 0..m {
                full[r * npad + t * tn..r * npad + t * tn + tn]
                    .copy_from_slice(&blk[r * tn..r * tn + tn]);
            }
        }
        full
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Every available kernel equals the naive untiled reference bit-exactly, over odd shapes
        /// (K and N not multiples of the tile, so padding is exercised) and the full i8 range.
        #[test]
        fn every_isa_matches_naive(m in 1usize..11, k in 1usize..200, n in 1usize..80, tn_i in 0usize..2, seed in any::<u64>()) {
            let tn = [32, 64][tn_i];
            let mut s = seed | 1;
            let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s as i8 };
            let a: Vec<i8> = (0..m * k).map(|_| next()).collect();
            let w: Vec<i8> = (0..n * k).map(|_| next()).collect();
            let want = naive(&a, &w, m, n, k);
            let (wt, kpad, npad) = tile(&w, n, k, tn);
            for isa in Isa::available() {
                let got = run(isa, &a, m, k, &wt, kpad, npad, tn);
                for r in 0..m {
                    prop_assert_eq!(&got[r * npad..r * npad + n], &want[r * n..r * n + n], "{:?}", isa);
                }
            }
        }
    }

    /// Activations (`rows × kpad`), a tile (`tn × kpad`) and the scalar twin's result, the values
    /// drawn mostly from the i8 extremes (and -1, 0).
    fn twin_case(rows: usize, kpad: usize, tn: usize, seed: u64) -> (Vec<i8>, Vec<i8>, Vec<i32>) {
        let mut s = seed | 1;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match s % 8 {
                0 => -128,
                1 => 127,
                2 => -1,
                3 => 0,
                _ => (s >> 8) as i8,
            }
        };
        let a: Vec<i8> = (0..rows * kpad).map(|_| next()).collect();
        let w: Vec<i8> = (0..tn * kpad).map(|_| next()).collect();
        let mut want = vec![0i32; rows * tn];
        scalar_tile_dot(&a, kpad, &w, tn, &mut want);
        (a, w, want)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// Every SIMD kernel equals its scalar twin bit for bit on one tile: row counts that mix
        /// 4-row blocks with leftover rows, every tile width the kernels accept (multiples of 8,
        /// so AVX-512 VNNI's 8-channel remainder path runs too), and values drawn mostly from the
        /// i8 extremes, where biasing (`w ^ 0x80`) and i32 wrap-around matter.
        #[test]
        fn every_isa_matches_scalar_twin(rows in 1usize..14, kt_n in 1usize..12, tn8 in 1usize..9, seed in any::<u64>()) {
            let (tn, kpad) = (8 * tn8, 32 * kt_n);
            let (a, w, want) = twin_case(rows, kpad, tn, seed);
            for isa in Isa::available() {
                let p = PreparedA::new(isa, rows, kpad, kpad, &a);
                // A sub-range of rows as the drivers pass it (m0 > 0), and the whole block.
                let m0 = rows / 3;
                let mut got = vec![i32::MIN; rows * tn];
                tile_dot(&p, m0, rows, &w, tn, &mut got);
                prop_assert_eq!(&got[..(rows - m0) * tn], &want[m0 * tn..], "{:?} rows {}..{}", isa, m0, rows);
                tile_dot(&p, 0, rows, &w, tn, &mut got);
                prop_assert_eq!(&got, &want, "{:?}", isa);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Every SIMD kernel equals the scalar twin at every even tile width up to 160 that it
        /// accepts (AVX-512 VNNI: multiples of 8), not only the multiples of 8 `tile_dot` takes:
        /// the M = 1 memory-order pass's 64-channel chunks and their remainders, the register
        /// passes' remainders, the 4-row blocks and the leftover rows, values mostly at the i8
        /// extremes.
        #[test]
        fn every_isa_matches_the_scalar_twin_at_every_even_width(rows in 1usize..7, kt_n in 1usize..5, pairs in 1usize..81, seed in any::<u64>()) {
            let (tn, kpad) = (2 * pairs, 32 * kt_n);
            let (a, w, want) = twin_case(rows, kpad, tn, seed);
            for isa in Isa::available() {
                if isa == Isa::Avx512Vnni && !tn.is_multiple_of(8) {
                    continue;
                }
                let p = PreparedA::new(isa, rows, kpad, kpad, &a);
                let mut got = vec![i32::MIN; rows * tn];
                tile_dot_any_width(&p, 0, rows, &w, tn, &mut got);
                prop_assert_eq!(&got, &want, "{:?} tn {}", isa, tn);
            }
        }
    }

    /// The kernels offered are the ones the CPU's features allow, and `ORK_EXPECT_KERNELS` (a
    /// comma-separated list, set by the qemu runs that pick a CPU model) pins them, so a run meant
    /// to exercise `sdot` fails if the emulated CPU lacks it instead of testing less.
    #[test]
    fn available_kernels_follow_the_cpu() {
        let avail = Isa::available();
        assert_eq!(avail[0], Isa::Scalar);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            avail.contains(&Isa::Avx2),
            std::arch::is_x86_feature_detected!("avx2")
        );
        #[cfg(target_arch = "aarch64")]
        assert_eq!(
            avail.contains(&Isa::NeonDot),
            std::arch::is_aarch64_feature_detected!("dotprod")
        );
        let names: Vec<&str> = avail.iter().map(|i| i.name()).collect();
        if let Ok(want) = std::env::var("ORK_EXPECT_KERNELS") {
            assert_eq!(names.join(","), want, "kernels this CPU offers");
        }
        for isa in Isa::ALL {
            assert_eq!(
                Isa::named(isa.name()).is_ok(),
                avail.contains(&isa),
                "{isa:?}"
            );
        }
    }

    #[test]
    fn a_kernel_choice_the_cpu_cannot_run_is_refused_with_the_list() {
        let have: Vec<&str> = Isa::available().iter().map(|i| i.name()).collect();
        match Isa::named("sse9") {
            Err(KernelChoiceError::Unknown { name, available }) => {
                assert_eq!((name.as_str(), &available), ("sse9", &have));
            }
            other => panic!("{other:?}"),
        }
        // An ISA of the other architecture is never available here.
        let foreign = if cfg!(target_arch = "aarch64") {
            "avx2"
        } else {
            "neon"
        };
        match Isa::named(foreign) {
            Err(e @ KernelChoiceError::Unavailable { .. }) => {
                assert!(e.to_string().contains(&have.join(", ")), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(Isa::named("scalar"), Ok(Isa::Scalar));
    }

    #[test]
    fn extremes_are_exact_at_max_k() {
        // All -128 × -128 over a long K is the worst case for i16 saturation and i32 range.
        let (m, k, n) = (5, 4096, 64);
        let a = vec![-128i8; m * k];
        let w = vec![-128i8; n * k];
        let (wt, kpad, npad) = tile(&w, n, k, 32);
        for isa in Isa::available() {
            let got = run(isa, &a, m, k, &wt, kpad, npad, 32);
            assert!(got.iter().all(|&x| x == 128 * 128 * 4096), "{isa:?}");
        }
    }

    #[test]
    fn largest_sums_are_exact_at_the_k_limit() {
        // K = MAX_K: a = -128 everywhere against channels of all -128 (+2^30), all 127
        // (-127·2^23) and alternating signs; 5 rows run a 4-row block and a single row.
        let (m, k, n) = (5, MAX_K, 32);
        let a = vec![-128i8; m * k];
        let w: Vec<i8> = (0..n * k)
            .map(|i| match (i / k) % 3 {
                0 => -128,
                1 => 127,
                _ if i % 2 == 0 => 127,
                _ => -128,
            })
            .collect();
        let want: Vec<i32> = (0..n)
            .map(|j| match j % 3 {
                0 => 1 << 30,
                1 => -127 << 23,
                _ => (-128 * 127 + 128 * 128) * (MAX_K as i32 / 2),
            })
            .collect();
        let (wt, kpad, npad) = tile(&w, n, k, 32);
        for isa in Isa::available() {
            let got = run(isa, &a, m, k, &wt, kpad, npad, 32);
            for r in 0..m {
                assert_eq!(&got[r * npad..r * npad + n], &want[..], "{isa:?} row {r}");
            }
        }
    }

    #[test]
    fn int4_unpack_sign_and_order() {
        let mut d = [0i8; 4];
        unpack_i4_tile(&[0x8F, 0x17], &mut d);
        if crate::INT4_EVEN_K_IN_LOW_NIBBLE {
            assert_eq!(d, [-1, -8, 7, 1]);
        } else {
            assert_eq!(d, [-8, -1, 1, 7]);
        }
    }

    /// Tile an untiled `n × k` matrix of any element type, zero padded.
    fn tile_any<T: Copy + Default>(
        w: &[T],
        n: usize,
        k: usize,
        tn: usize,
    ) -> (Vec<T>, usize, usize) {
        let kpad = k.div_ceil(32) * 32;
        let npad = n.div_ceil(tn) * tn;
        let mut t = vec![T::default(); npad * kpad];
        for nn in 0..n {
            for kk in 0..k {
                t[(nn / tn) * tn * kpad + (kk / 32) * tn * 32 + (nn % tn) * 32 + kk % 32] =
                    w[nn * k + kk];
            }
        }
        (t, kpad, npad)
    }

    /// Run the float kernel of `isa` over every tile: `m × npad` row-major.
    fn run_float(
        isa: Isa,
        af: &[f32],
        m: usize,
        kpad: usize,
        w: WeightTile<'_>,
        npad: usize,
        tn: usize,
    ) -> Vec<f32> {
        let mut full = vec![0f32; m * npad];
        let mut blk = vec![0f32; m * tn];
        for t in 0..npad / tn {
            let wt = match w {
                WeightTile::I8(w) => WeightTile::I8(&w[t * tn * kpad..(t + 1) * tn * kpad]),
                WeightTile::F16(w) => WeightTile::F16(&w[t * tn * kpad..(t + 1) * tn * kpad]),
            };
            float_tile_dot(isa, af, kpad, wt, tn, &mut blk);
            for r in 0..m {
                full[r * npad + t * tn..r * npad + t * tn + tn]
                    .copy_from_slice(&blk[r * tn..r * tn + tn]);
            }
        }
        full
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The float kernels (fp16 activations with outlier channels × int8 / fp16 weights) agree
        /// bit for bit with the scalar twin (same accumulation order, exact products), and all of
        /// them with an f64 reference within the f32 summation bound `kpad · 2⁻²⁴ · Σ|a·w|`.
        #[test]
        fn float_kernels_match_twin_and_f64(m in 1usize..11, k in 1usize..200, n in 1usize..80, f16w in any::<bool>(), seed in any::<u64>()) {
            use half::f16;
            let tn = if f16w { 16 } else { 32 };
            let mut s = seed | 1;
            let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
            // Activations: mostly |x| < 4, every 7th channel an outlier up to ±2000.
            let a: Vec<f16> = (0..m * k).map(|i| {
                let u = (next() % 20001) as f32 / 10000.0 - 1.0;
                f16::from_f32(if (i % k) % 7 == 3 { u * 2000.0 } else { u * 4.0 })
            }).collect();
            let wq: Vec<i8> = (0..n * k).map(|_| next() as i8).collect();
            let wh: Vec<f16> = (0..n * k).map(|_| f16::from_f32((next() % 2001) as f32 / 1000.0 - 1.0)).collect();
            let kpad = k.div_ceil(32) * 32;
            let mut af = vec![0f32; m * kpad];
            for (d, src) in af.chunks_exact_mut(kpad).zip(a.chunks_exact(k)) {
                for (x, &y) in d.iter_mut().zip(src) { *x = y.to_f32(); }
            }
            let (ti8, _, npad8) = tile_any(&wq, n, k, tn);
            let (tf16, _, npad16) = tile_any(&wh, n, k, tn);
            let (w, npad) = if f16w { (WeightTile::F16(&tf16), npad16) } else { (WeightTile::I8(&ti8), npad8) };
            let wv = |j: usize, kk: usize| if f16w { f64::from(wh[j * k + kk].to_f32()) } else { f64::from(wq[j * k + kk]) };
            let twin = run_float(Isa::Scalar, &af, m, kpad, w, npad, tn);
            for isa in Isa::available() {
                let got = run_float(isa, &af, m, kpad, w, npad, tn);
                prop_assert!(got.iter().zip(&twin).all(|(x, y)| x.to_bits() == y.to_bits()), "{:?} differs from the twin", isa);
            }
            for r in 0..m {
                for j in 0..n {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for kk in 0..k {
                        let p = f64::from(a[r * k + kk].to_f32()) * wv(j, kk);
                        exact += p;
                        mag += p.abs();
                    }
                    let got = f64::from(twin[r * npad + j]);
                    let bound = 1.01 * kpad as f64 * f64::from(f32::EPSILON) / 2.0 * mag;
                    prop_assert!((got - exact).abs() <= bound, "[{},{}] {} vs {} (bound {})", r, j, got, exact, bound);
                }
            }
        }
    }
}
