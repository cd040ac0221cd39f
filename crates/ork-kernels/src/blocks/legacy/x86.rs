//! x86-64 kernels for the 32-weight block types: one body ([`body`]) compiled for AVX2
//! (`vpmaddubsw` + `vpmaddwd`), AVX-VNNI and AVX-512 VNNI (`vpdpbusd`, ymm form).
//!
//! A block's 32 weights decode into one ymm of int8 ([`Decode`]). Its dot with the activation's
//! 32 int8 is exact in i32 lanes: signed types use the sign trick (`|w|` as u8 times
//! `a · sign(w)`, at most 2·128·127 per i16 pair, no saturation); Q4_1/Q5_1 weights are
//! already unsigned. Eight blocks' lane vectors are folded by `vphaddd` into one vector of
//! eight block sums, and the float step (`(d_w · d_a) · isum [+ m_w · s_a]`, lane `b % 8`)
//! runs on eight blocks at once: the scalar twin's order ([`super::rows_scalar`]).
//!
//! Each weight row's groups of eight blocks are decoded once for up to four activation rows
//! (prefill); decode (M = 1) decodes straight into registers.

use super::{act_geometry, act_scales, finish, Format, Iq4Nl, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::{Isa, RowsFn, WeightType, KVALUES_IQ4NL};
use std::arch::x86_64::*;

/// A block format's AVX2 decoder.
trait Decode: Format {
    /// The 32 integer weights of the block at `p`, in `Format::weights` order.
    ///
    /// # Safety
    /// `p .. p + BYTES` must be readable; the CPU must have AVX2.
    unsafe fn decode(p: *const u8) -> __m256i;
}

/// The 32 nibbles of the 16 bytes at `p` (weight `j` low nibble of byte `j`, `j + 16` high).
///
/// # Safety
/// 16 readable bytes at `p`; AVX2.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes (unaligned load) and AVX2.
    unsafe {
        let lo = _mm_loadu_si128(p.cast());
        let both = _mm256_set_m128i(_mm_srli_epi16::<4>(lo), lo);
        _mm256_and_si256(both, _mm256_set1_epi8(15))
    }
}

/// Bit `j` of the u32 at `p`, as 0x10 in byte `j` (Q5's fifth bit).
///
/// # Safety
/// 4 readable bytes at `p`; AVX2.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes and AVX2.
    unsafe {
        let h = p.cast::<i32>().read_unaligned();
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(h),
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

impl Decode for Q4_0 {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: qs are bytes 2..18 of the block the caller vouches for; AVX2.
        unsafe { _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8)) }
    }
}

impl Decode for Q4_1 {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: qs are bytes 4..20 of the block.
        unsafe { nibbles(p.add(4)) }
    }
}

impl Decode for Q5_0 {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: qh is bytes 2..6, qs 6..22 of the block; AVX2.
        unsafe {
            let v = _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2)));
            _mm256_sub_epi8(v, _mm256_set1_epi8(16))
        }
    }
}

impl Decode for Q5_1 {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: qh is bytes 4..8, qs 8..24 of the block.
        unsafe { _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4))) }
    }
}

impl Decode for Q8_0 {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: qs are bytes 2..34 of the block.
        unsafe { _mm256_loadu_si256(p.add(2).cast()) }
    }
}

impl Decode for Iq4Nl {
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> __m256i {
        // SAFETY: the table is 16 bytes; qs are bytes 2..18 of the block; AVX2.
        unsafe {
            let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
            _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nibbles(p.add(2)))
        }
    }
}

/// The int8 dot of one block: eight i32 lanes whose sum is `Σ w_j · a_j`.
trait Dot {
    /// `u` (unsigned bytes) times `s` (signed bytes), four adjacent products per lane.
    ///
    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i;
}

/// `vpmaddubsw` then `vpmaddwd` by ones.
struct Avx2;
/// `vpdpbusd` (AVX-VNNI, VEX).
struct AvxVnni;
/// `vpdpbusd` (AVX-512 VNNI + VL, EVEX ymm).
struct Avx512Vnni;

impl Dot for Avx2 {
    #[inline(always)]
    unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 arithmetic; the caller guarantees AVX2.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)) }
    }
}

impl Dot for AvxVnni {
    #[inline(always)]
    unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: register-only; the caller guarantees AVX-VNNI.
        unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s) }
    }
}

impl Dot for Avx512Vnni {
    #[inline(always)]
    unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: register-only; the caller guarantees AVX-512 VNNI and VL.
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s) }
    }
}

/// Lanes of one block's dot: unsigned weights go straight in, signed ones by the sign trick.
///
/// # Safety
/// As [`Dot::dot_us`].
#[inline(always)]
unsafe fn block_dot<F: Format, D: Dot>(w: __m256i, a: __m256i) -> __m256i {
    // SAFETY: forwarded from the caller.
    unsafe {
        if F::MIN {
            D::dot_us(w, a)
        } else {
            D::dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
        }
    }
}

/// `[Σ p0, Σ p1, …, Σ p7]`: the lane sums of eight vectors (exact i32).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn sums8(p: &[__m256i; 8]) -> __m256i {
    // SAFETY: register-only; the caller guarantees AVX2.
    unsafe {
        let a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        let b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(a, b),
            _mm256_permute2x128_si256::<0x31>(a, b),
        )
    }
}

/// Sum of one vector's eight lanes.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn sum1(v: __m256i) -> i32 {
    // SAFETY: register-only; the caller guarantees AVX2.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// The f16 at `p + j·stride` for j in 0..8, as f32.
///
/// # Safety
/// Each of those 2-byte fields must be readable; F16C.
#[inline(always)]
unsafe fn f16x8(p: *const u8, stride: usize) -> __m256 {
    // SAFETY: the caller vouches for the eight fields and F16C.
    unsafe {
        let h = |j: usize| p.add(j * stride).cast::<i16>().read_unaligned();
        _mm256_cvtph_ps(_mm_set_epi16(
            h(7),
            h(6),
            h(5),
            h(4),
            h(3),
            h(2),
            h(1),
            h(0),
        ))
    }
}

/// One weight row against `N` activation rows. `ap[i]` is activation row `i`'s bytes,
/// `ad[i]`/`asc[i]` its block scales `d`/`s` as f32; returns the `N` dots.
///
/// # Safety
/// `wr` is one weight row of `nb` blocks, each `ap[i]` one activation row of `nb` blocks,
/// `ad[i]` (and for `F::MIN` `asc[i]`) `nb` floats; the CPU has AVX2, F16C and `D`'s
/// instructions.
#[inline(always)]
unsafe fn row<F: Decode, D: Dot, const N: usize>(
    wr: &[u8],
    ap: [&[u8]; N],
    ad: [&[f32]; N],
    asc: [&[f32]; N],
) -> [f32; N] {
    let (ab_len, qs) = act_geometry(F::MIN);
    let nb = wr.len() / F::BYTES;
    let groups = nb / 8;
    // SAFETY: register-only; the caller guarantees AVX.
    let mut acc = [unsafe { _mm256_setzero_ps() }; N];
    // SAFETY: as above.
    let mut wv = [unsafe { _mm256_setzero_si256() }; 8];
    for g in 0..groups {
        // SAFETY (whole loop body): block g·8 + j < nb of the row, activation blocks likewise,
        // scale indices g·8 .. g·8 + 8 <= nb; prefetching never faults.
        unsafe {
            let base = wr.as_ptr().add(g * 8 * F::BYTES);
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(16 * F::BYTES).cast());
            for (j, v) in wv.iter_mut().enumerate() {
                *v = F::decode(base.add(j * F::BYTES));
            }
            let dw = f16x8(base, F::BYTES);
            for i in 0..N {
                let abase = ap[i].as_ptr().add(g * 8 * ab_len + qs);
                let p: [__m256i; 8] = std::array::from_fn(|j| {
                    let a = _mm256_loadu_si256(abase.add(j * ab_len).cast());
                    block_dot::<F, D>(wv[j], a)
                });
                let da = _mm256_loadu_ps(ad[i].as_ptr().add(g * 8));
                let mut v = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(sums8(&p)));
                if F::MIN {
                    let mw = f16x8(base.add(2), F::BYTES);
                    let sa = _mm256_loadu_ps(asc[i].as_ptr().add(g * 8));
                    v = _mm256_add_ps(v, _mm256_mul_ps(mw, sa));
                }
                acc[i] = _mm256_add_ps(acc[i], v);
            }
        }
    }
    std::array::from_fn(|i| {
        let mut lanes = [0f32; 8];
        // SAFETY: 32 writable bytes; unaligned store.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i]) };
        finish::<F>(lanes, wr, ap[i], groups * 8, |b| {
            // SAFETY: block b < nb of both rows.
            unsafe {
                let w = F::decode(wr.as_ptr().add(b * F::BYTES));
                let a = _mm256_loadu_si256(ap[i].as_ptr().add(b * ab_len + qs).cast());
                sum1(block_dot::<F, D>(w, a))
            }
        })
    })
}

/// Every weight row against every activation row, four activation rows at a time.
///
/// # Safety
/// The lengths `Kernel::rows` checks; AVX2, F16C and `D`'s instructions.
#[inline(always)]
unsafe fn body<F: Decode, D: Dot>(
    k: usize,
    w: &[u8],
    rows: usize,
    acts: &[u8],
    m: usize,
    out: &mut [f32],
) {
    let nb = k / 32;
    let (ab_len, _) = act_geometry(F::MIN);
    let (wrb, arb) = (nb * F::BYTES, nb * ab_len);
    let (d, s) = act_scales(acts, nb, F::MIN);
    let arow = |i: usize| &acts[i * arb..][..arb];
    let dsc = |i: usize| &d[i * nb..][..nb];
    let ssc = |i: usize| if F::MIN { &s[i * nb..][..nb] } else { &s[..] };
    for r in 0..rows {
        let wr = &w[r * wrb..][..wrb];
        let o = &mut out[r * m..][..m];
        let mut i = 0;
        while i + 4 <= m {
            let ix: [usize; 4] = std::array::from_fn(|j| i + j);
            // SAFETY: lengths as the caller guarantees; ISA as the caller guarantees.
            let v = unsafe { row::<F, D, 4>(wr, ix.map(arow), ix.map(dsc), ix.map(ssc)) };
            o[i..i + 4].copy_from_slice(&v);
            i += 4;
        }
        for (j, o) in o.iter_mut().enumerate().skip(i) {
            // SAFETY: as above.
            *o = unsafe { row::<F, D, 1>(wr, [arow(j)], [dsc(j)], [ssc(j)]) }[0];
        }
    }
}

/// # Safety
/// As [`body`] with AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn rows_avx2<F: Decode>(k: usize, w: &[u8], n: usize, a: &[u8], m: usize, o: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { body::<F, Avx2>(k, w, n, a, m, o) }
}

/// # Safety
/// As [`body`] with AVX2, F16C and AVX-VNNI.
#[target_feature(enable = "avx2,f16c,avxvnni")]
unsafe fn rows_vnni<F: Decode>(k: usize, w: &[u8], n: usize, a: &[u8], m: usize, o: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { body::<F, AvxVnni>(k, w, n, a, m, o) }
}

/// # Safety
/// As [`body`] with AVX2, F16C, AVX-512 F, VL and VNNI.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn rows_512<F: Decode>(k: usize, w: &[u8], n: usize, a: &[u8], m: usize, o: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { body::<F, Avx512Vnni>(k, w, n, a, m, o) }
}

/// Safe entries (`RowsFn`): [`rows`] hands them out only for an ISA [`Isa::available`] lists
/// on a CPU with F16C, and `Kernel::rows` checks the lengths.
macro_rules! entries {
    ($($name:ident => $inner:ident),*) => {$(
        fn $name<F: Decode>(k: usize, w: &[u8], n: usize, a: &[u8], m: usize, o: &mut [f32]) {
            // SAFETY: see the macro's doc: the ISA is present and the lengths are checked.
            unsafe { $inner::<F>(k, w, n, a, m, o) }
        }
    )*};
}
entries!(safe_avx2 => rows_avx2, safe_vnni => rows_vnni, safe_512 => rows_512);

/// The kernel for `ty` on `isa` (an x86 ISA this CPU runs).
pub(super) fn rows(ty: WeightType, isa: Isa) -> Option<RowsFn> {
    if !std::arch::is_x86_feature_detected!("f16c") {
        return None;
    }
    macro_rules! pick {
        ($f:ident) => {
            match ty {
                WeightType::Q4_0 => $f::<Q4_0> as RowsFn,
                WeightType::Q4_1 => $f::<Q4_1>,
                WeightType::Q5_0 => $f::<Q5_0>,
                WeightType::Q5_1 => $f::<Q5_1>,
                WeightType::Q8_0 => $f::<Q8_0>,
                WeightType::IQ4_NL => $f::<Iq4Nl>,
                _ => return None,
            }
        };
    }
    Some(match isa {
        Isa::Avx2 => pick!(safe_avx2),
        Isa::AvxVnni => pick!(safe_vnni),
        Isa::Avx512Vnni => pick!(safe_512),
        _ => return None,
    })
}
