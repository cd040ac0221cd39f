//! The k-quants on x86-64 AVX2: the shared driver ([`super::drive`]) compiled with AVX2, the
//! decode of each type and the integer dot in intrinsics.
//!
//! Decode: the bit fields of 32 stored bytes at a time are isolated with 16-bit shifts and byte
//! masks (a 16-bit shift moves bits across the byte boundary only into positions the mask then
//! clears), producing the same [`Super`] as the scalar decode; the scales are unpacked as the
//! scalar code does.
//!
//! Dot: per 32 values, `vpmaddubsw` of the unsigned quants (`u ≤ 63`) with the signed
//! activations gives 16 i16 pair sums, exact (`|2·63·128| = 16128 < 2¹⁵`, even for `a = −128`);
//! `vpmaddwd` with the two groups' scales (each lane's pair sum times a scale `|sc| ≤ 128`, pairs
//! added) gives exact i32 lanes; lanes and chunks add in i32 (wrapping, as the scalar twin), and
//! the mins term is one `vpmaddwd` of the 16 `mn_g` with the 16 `bsum_g`. Integer sums are exact
//! in any order, and the float step is the shared [`super::combine`], so the result equals the
//! scalar twin bit for bit.

use std::arch::x86_64::*;

use super::{
    f16_at, iq4xs_scales, k4_words, q3_words, Engine, KType, Super, IQ4_VALUES, Q8K_BSUMS,
    Q8K_BYTES, QK_K,
};
use crate::blocks::x86::{Avx2 as Avx2Dot, Avx512Vnni, AvxVnni};
use crate::blocks::{Isa, RowsFn};

mod panel;

/// The rows kernel of `t` on `isa` (an x86 ISA: all of them run this module's AVX2 decode and
/// M = 1 dot; M > 1 runs the panel kernel with the ISA's int8 dot), `None` where this CPU lacks
/// a feature the kernel is compiled for.
pub(super) fn rows(t: KType, isa: Isa) -> Option<RowsFn> {
    use std::arch::is_x86_feature_detected as has;
    let base = has!("avx2");
    Some(match isa {
        Isa::Avx2 if base => by_type!(t, safe_avx2),
        Isa::AvxVnni if base && has!("avxvnni") => by_type!(t, safe_vnni),
        Isa::Avx512Vnni if base && has!("avx512f") && has!("avx512vl") && has!("avx512vnni") => {
            by_type!(t, safe_512)
        }
        _ => return None,
    })
}

/// The panel kernel compiled for one ISA, and the safe entry that runs it on whole groups of
/// eight weight rows at M > 1 and [`rows_ty`] (AVX2) on everything else.
macro_rules! panel_entry {
    ($safe:ident, $inner:ident, $dot:ty, $features:literal, $check:expr) => {
        /// # Safety
        /// The CPU has the features; the lengths are those `Kernel::rows` checks.
        #[target_feature(enable = $features)]
        unsafe fn $inner<const T: u8>(
            k: usize,
            w: &[u8],
            n: usize,
            a: &[u8],
            m: usize,
            o: &mut [f32],
        ) -> usize {
            // SAFETY: forwarded.
            unsafe { panel::rows::<$dot, T>(k, w, n, a, m, o) }
        }

        /// Safe entry: asserts the features, then as the macro's doc says.
        fn $safe<const T: u8>(k: usize, w: &[u8], n: usize, a: &[u8], m: usize, o: &mut [f32]) {
            assert!($check, concat!("this k-quant kernel needs ", $features));
            let t = super::ktype(T);
            let done = if m >= panel::MIN_M && panel::fits(t) {
                // SAFETY: the features (asserted) and the lengths (the caller's).
                unsafe { $inner::<T>(k, w, n, a, m, o) }
            } else {
                0
            };
            let wrb = k / QK_K * t.bytes();
            rows_ty::<T>(k, &w[done * wrb..], n - done, a, m, &mut o[done * m..]);
        }
    };
}
panel_entry!(
    safe_avx2,
    panel_avx2,
    Avx2Dot,
    "avx2",
    is_x86_feature_detected!("avx2")
);
panel_entry!(
    safe_vnni,
    panel_vnni,
    AvxVnni,
    "avx2,avxvnni",
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("avxvnni")
);
panel_entry!(
    safe_512,
    panel_512,
    Avx512Vnni,
    "avx2,avx512f,avx512vl,avx512vnni",
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
);

isa_rows!(
    rows_ty,
    rows_avx2,
    "avx2",
    Avx2,
    is_x86_feature_detected!("avx2")
);

/// The AVX2 engine. Private: only [`rows_avx2`] (reached after the AVX2 check) uses it.
struct Avx2;

impl Engine for Avx2 {
    #[inline(always)]
    fn decode(ty: KType, blk: &[u8], s: &mut Super) {
        assert!(blk.len() >= ty.bytes());
        // SAFETY: `blk` holds a whole super-block of `ty` (asserted); this engine only runs
        // inside `rows_avx2`, whose caller checked that the CPU has AVX2.
        unsafe {
            match ty {
                KType::Q2 => decode_q2(blk, s),
                KType::Q3 => decode_q3(blk, s),
                KType::Q4 => decode_k4::<false>(blk, s),
                KType::Q5 => decode_k4::<true>(blk, s),
                KType::Q6 => decode_q6(blk, s),
                KType::Iq4Xs => decode_iq4xs(blk, s),
            }
        }
    }

    #[inline(always)]
    fn dot(s: &Super, a: &[u8]) -> (i32, i32) {
        assert!(a.len() >= Q8K_BYTES);
        // SAFETY: `a` holds a whole Q8_K block (asserted); this engine only runs inside
        // `rows_avx2`, whose caller checked that the CPU has AVX2.
        unsafe { dot(s, a) }
    }

    #[inline(always)]
    fn decode_dot(ty: KType, blk: &[u8], a: &[u8], s: &mut Super) -> (i32, i32) {
        if ty == KType::Q4 {
            assert!(blk.len() >= ty.bytes() && a.len() >= Q8K_BYTES);
            // SAFETY: whole blocks (asserted); AVX2 as for `dot`.
            unsafe { decode_dot_q4(blk, a, s) }
        } else {
            Self::decode(ty, blk, s);
            Self::dot(s, a)
        }
    }

    #[inline(always)]
    fn prefetch(p: *const u8, bytes: usize) {
        let mut line = 0;
        while line < bytes {
            // SAFETY: a prefetch is a hint that never faults, whatever the address; SSE is part
            // of x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line).cast()) };
            line += 64;
        }
    }

    #[inline(always)]
    fn dot4(s: &Super, a: [&[u8]; 4]) -> [(i32, i32); 4] {
        assert!(a.iter().all(|a| a.len() >= Q8K_BYTES));
        // SAFETY: as in `dot`, for each of the four blocks.
        unsafe { dot4(s, a) }
    }
}

/// Per 128-bit lane: bytes 0,1 (the first scale of a pair) eight times, then 2,3 eight times.
#[target_feature(enable = "avx2")]
#[inline]
fn scale_pick() -> __m256i {
    _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
        2, 3,
    )
}

/// The scales of groups `2c` and `2c + 1`, each in the eight i16 lanes of its 16 values.
#[target_feature(enable = "avx2")]
#[inline]
fn scales_of(s: &Super, c: usize, pick: __m256i) -> __m256i {
    let pair = u32::from(s.sc[2 * c] as u16) | (u32::from(s.sc[2 * c + 1] as u16) << 16);
    _mm256_shuffle_epi8(_mm256_set1_epi32(pair as i32), pick)
}

/// The mins term of one block: `Σ_g mn_g·bsum_g`.
///
/// # Safety
/// The CPU must have AVX2; `a` must hold at least [`Q8K_BYTES`] bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn mins(s: &Super, a: &[u8]) -> i32 {
    // SAFETY: `s.mn` has 16 i16 (32 bytes); the block's bsums are its last 32 bytes.
    unsafe {
        let mn = _mm256_loadu_si256(s.mn.as_ptr().cast());
        let bs = _mm256_loadu_si256(a.as_ptr().add(Q8K_BSUMS).cast());
        hsum(_mm256_madd_epi16(mn, bs))
    }
}

/// [`dot`] against four blocks, each 32 quants and their scales loaded once for the four.
///
/// # Safety
/// The CPU must have AVX2; each block must hold at least [`Q8K_BYTES`] bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot4(s: &Super, a: [&[u8]; 4]) -> [(i32, i32); 4] {
    if s.signed {
        // SAFETY: forwarded from the caller.
        return a.map(|a| unsafe { dot_signed(s, a) });
    }
    let pick = scale_pick();
    let mut acc = [_mm256_setzero_si256(); 4];
    for c in 0..QK_K / 32 {
        // SAFETY: `s.u` has 256 bytes, so the load at `32c` (c < 8) is in bounds.
        let u = unsafe { load(s.u.as_ptr().add(32 * c)) };
        let sc = scales_of(s, c, pick);
        for (acc, a) in acc.iter_mut().zip(&a) {
            // SAFETY: each block holds 256 quants from byte 4.
            let x = unsafe { load(a.as_ptr().add(4 + 32 * c)) };
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), sc);
            *acc = _mm256_add_epi32(*acc, p);
        }
    }
    // SAFETY: forwarded from the caller.
    std::array::from_fn(|j| (hsum(acc[j]), unsafe { mins(s, a[j]) }))
}

/// # Safety
/// The CPU must have AVX2; `a` must hold at least [`Q8K_BYTES`] bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot(s: &Super, a: &[u8]) -> (i32, i32) {
    if s.signed {
        // SAFETY: forwarded from the caller.
        return unsafe { dot_signed(s, a) };
    }
    let pick = scale_pick();
    let mut acc0 = _mm256_setzero_si256();
    let mut acc1 = _mm256_setzero_si256();
    for c in (0..QK_K / 32).step_by(2) {
        // SAFETY: `s.u` and the block's quants (from byte 4) have 256 bytes, so the 32-byte
        // loads at `32c` and `32c + 32` (c ≤ 6) are in bounds.
        let (u0, u1, x0, x1) = unsafe {
            let q = a.as_ptr().add(4);
            let u = s.u.as_ptr();
            (
                load(u.add(32 * c)),
                load(u.add(32 * c + 32)),
                load(q.add(32 * c)),
                load(q.add(32 * c + 32)),
            )
        };
        let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(u0, x0), scales_of(s, c, pick));
        let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(u1, x1), scales_of(s, c + 1, pick));
        acc0 = _mm256_add_epi32(acc0, p0);
        acc1 = _mm256_add_epi32(acc1, p1);
    }
    // SAFETY: forwarded from the caller.
    (hsum(_mm256_add_epi32(acc0, acc1)), unsafe { mins(s, a) })
}

/// Wrapping sum of the eight i32 lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn hsum(v: __m256i) -> i32 {
    let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b01_00_11_10));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b10_11_00_01));
    _mm_cvtsi128_si32(x)
}

/// `v` shifted right by `N` bits in each 16-bit lane (`N` a literal).
macro_rules! srli {
    ($v:expr, $n:literal) => {
        _mm256_srli_epi16::<$n>($v)
    };
}

/// Load 32 bytes at `p`.
///
/// # Safety
/// `p` must be valid for 32 bytes of reads; the CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: forwarded from the caller.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// Store 32 quants at `s.u[at..at + 32]`.
#[target_feature(enable = "avx2")]
#[inline]
fn put(s: &mut Super, at: usize, v: __m256i) {
    let dst = &mut s.u[at..at + 32];
    // SAFETY: `dst` is 32 bytes.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) }
}

/// Store the 16 group scales and 16 `mn` values (whole-vector stores, so that the dot's loads
/// of them are forwarded from the store buffer).
#[target_feature(enable = "avx2")]
#[inline]
fn put_scales(s: &mut Super, sc: __m256i, mn: __m256i) {
    // SAFETY: `s.sc` and `s.mn` are 16 i16 (32 bytes) each.
    unsafe {
        _mm256_storeu_si256(s.sc.as_mut_ptr().cast(), sc);
        _mm256_storeu_si256(s.mn.as_mut_ptr().cast(), mn);
    }
}

/// 8 bytes (one per 32-value sub-block) as 16 i16, each twice (one per 16-value group).
#[target_feature(enable = "avx2")]
#[inline]
fn spread(w: u64) -> __m256i {
    let v = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(w as i64));
    _mm256_set_m128i(_mm_unpackhi_epi16(v, v), _mm_unpacklo_epi16(v, v))
}

/// Q2_K (see [`super::decode`] for the layout).
///
/// # Safety
/// `b` must hold 84 bytes; the CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn decode_q2(b: &[u8], s: &mut Super) {
    s.signed = false;
    let three = _mm256_set1_epi8(3);
    for n in 0..2 {
        // SAFETY: bytes 16 + 32n .. 48 + 32n ≤ 80 of the block.
        let mut q = unsafe { load(b.as_ptr().add(16 + 32 * n)) };
        for j in 0..4 {
            put(s, 128 * n + 32 * j, _mm256_and_si256(q, three));
            q = srli!(q, 2);
        }
    }
    // SAFETY: the 16 scale bytes are bytes 0..16.
    let v = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(b.as_ptr().cast()) });
    let low = _mm256_and_si256(v, _mm256_set1_epi16(0xF));
    put_scales(s, low, _mm256_srli_epi16::<4>(v));
    s.d = f16_at(&b[80..]);
    s.dmin = f16_at(&b[82..]);
}

/// Q3_K.
///
/// # Safety
/// `b` must hold 110 bytes; the CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn decode_q3(b: &[u8], s: &mut Super) {
    s.signed = false;
    let (one, three) = (_mm256_set1_epi8(1), _mm256_set1_epi8(3));
    // SAFETY: hmask is bytes 0..32.
    let mut hm = unsafe { load(b.as_ptr()) };
    for n in 0..2 {
        // SAFETY: bytes 32 + 32n .. 64 + 32n ≤ 96 of the block.
        let mut q = unsafe { load(b.as_ptr().add(32 + 32 * n)) };
        for j in 0..4 {
            let hi = _mm256_slli_epi16::<2>(_mm256_and_si256(hm, one));
            put(
                s,
                128 * n + 32 * j,
                _mm256_or_si256(_mm256_and_si256(q, three), hi),
            );
            q = srli!(q, 2);
            hm = srli!(hm, 1);
        }
    }
    let [w0, w1, w2, w3] = q3_words(&b[96..108]);
    let bytes = _mm_setr_epi32(w0 as i32, w1 as i32, w2 as i32, w3 as i32);
    let sc = _mm256_sub_epi16(_mm256_cvtepu8_epi16(bytes), _mm256_set1_epi16(32));
    put_scales(s, sc, _mm256_slli_epi16::<2>(sc));
    s.d = f16_at(&b[108..]);
    s.dmin = 0.0;
}

/// Q4_K (`FIVE = false`) and Q5_K (`FIVE`: the fifth bits from `qh` on top).
///
/// # Safety
/// `b` must hold 144 bytes (Q4_K) or 176 (Q5_K); the CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn decode_k4<const FIVE: bool>(b: &[u8], s: &mut Super) {
    s.signed = false;
    let (m4, b4) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x10));
    // SAFETY: qh is bytes 16..48 of Q5_K (unused for Q4_K, whose block is longer than 48).
    let mut h = unsafe { load(b.as_ptr().add(16)) };
    let qs = if FIVE { 48 } else { 16 };
    for c in 0..4 {
        // SAFETY: bytes qs + 32c .. qs + 32c + 32 lie within the block.
        let q = unsafe { load(b.as_ptr().add(qs + 32 * c)) };
        let (mut lo, mut hi) = (_mm256_and_si256(q, m4), _mm256_and_si256(srli!(q, 4), m4));
        if FIVE {
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(h), b4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(h), b4));
            h = srli!(h, 2);
        }
        put(s, 64 * c, lo);
        put(s, 64 * c + 32, hi);
    }
    let (sc, mn) = k4_words(&b[4..16]);
    put_scales(s, spread(sc), spread(mn));
    s.d = f16_at(&b[0..]);
    s.dmin = f16_at(&b[2..]);
}

/// Q6_K.
///
/// # Safety
/// `b` must hold 210 bytes; the CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn decode_q6(b: &[u8], s: &mut Super) {
    s.signed = false;
    let (m4, m30) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x30));
    for n in 0..2 {
        // SAFETY: ql is bytes 0..128, qh 128..192.
        let (a, c, h) = unsafe {
            let p = b.as_ptr();
            (
                load(p.add(64 * n)),
                load(p.add(64 * n + 32)),
                load(p.add(128 + 32 * n)),
            )
        };
        let h0 = _mm256_and_si256(_mm256_slli_epi16::<4>(h), m30);
        let h1 = _mm256_and_si256(_mm256_slli_epi16::<2>(h), m30);
        let h2 = _mm256_and_si256(h, m30);
        let h3 = _mm256_and_si256(srli!(h, 2), m30);
        put(s, 128 * n, _mm256_or_si256(_mm256_and_si256(a, m4), h0));
        put(
            s,
            128 * n + 32,
            _mm256_or_si256(_mm256_and_si256(c, m4), h1),
        );
        put(
            s,
            128 * n + 64,
            _mm256_or_si256(_mm256_and_si256(srli!(a, 4), m4), h2),
        );
        put(
            s,
            128 * n + 96,
            _mm256_or_si256(_mm256_and_si256(srli!(c, 4), m4), h3),
        );
    }
    // SAFETY: the 16 int8 scales are bytes 192..208.
    let sc = unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(b.as_ptr().add(192).cast())) };
    put_scales(s, sc, _mm256_slli_epi16::<5>(sc));
    s.d = f16_at(&b[208..]);
    s.dmin = 0.0;
}

/// The dot for signed quants (IQ4_XS, `|v| ≤ 127`, scales `|sc| ≤ 32`): both operands widened to
/// i16, the quants multiplied by their group's scale (`|v·sc| ≤ 4064`, exact in i16), then
/// `vpmaddwd` with the activations (pair sums `≤ 2·4064·128`, exact in i32). Exact for every
/// int8 activation, `−128` included (where `vpmaddubsw`'s sign trick would not be).
///
/// # Safety
/// The CPU must have AVX2; `a` must hold at least [`Q8K_BYTES`] bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot_signed(s: &Super, a: &[u8]) -> (i32, i32) {
    let mut acc = _mm256_setzero_si256();
    for g in 0..16 {
        // SAFETY: `s.u` and the block's quants (from byte 4) have 256 bytes; 16 at `16g`.
        let (v, x) = unsafe {
            let v = _mm_loadu_si128(s.u.as_ptr().add(16 * g).cast());
            let x = _mm_loadu_si128(a.as_ptr().add(4 + 16 * g).cast());
            (_mm256_cvtepi8_epi16(v), _mm256_cvtepi8_epi16(x))
        };
        let vs = _mm256_mullo_epi16(v, _mm256_set1_epi16(s.sc[g]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(vs, x));
    }
    // SAFETY: forwarded from the caller.
    (hsum(acc), unsafe { mins(s, a) })
}

/// IQ4_XS: each 16 index bytes looked up in ggml's table with `pshufb` (low nibbles, then high).
///
/// # Safety
/// `b` must hold 136 bytes; the CPU must have AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn decode_iq4xs(b: &[u8], s: &mut Super) {
    // SAFETY: the table is 16 bytes.
    let table = unsafe { _mm_loadu_si128(IQ4_VALUES.as_ptr().cast()) };
    let m4 = _mm_set1_epi8(0xF);
    for j in 0..8 {
        // SAFETY: bytes 8 + 16j .. 24 + 16j ≤ 136 of the block.
        let q = unsafe { _mm_loadu_si128(b.as_ptr().add(8 + 16 * j).cast()) };
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m4));
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(q), m4));
        put(s, 32 * j, _mm256_set_m128i(hi, lo));
    }
    iq4xs_scales(b, s);
}

/// Q4_K at M = 1, decode fused into the dot: the nibbles never leave registers. Each 32-value
/// sub-block has one scale, so its 16 i16 pair sums are `vpmaddwd`-ed with that scale broadcast.
/// Sets `s.d`, `s.dmin` (the float step reads them) and returns what [`dot`] would.
///
/// # Safety
/// The CPU must have AVX2; `b` must hold 144 bytes and `a` [`Q8K_BYTES`].
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn decode_dot_q4(b: &[u8], a: &[u8], s: &mut Super) -> (i32, i32) {
    let (sc, mn) = k4_words(&b[4..16]);
    let sc = sc.to_le_bytes();
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc0 = _mm256_setzero_si256();
    let mut acc1 = _mm256_setzero_si256();
    for c in 0..4 {
        // SAFETY: bytes 16 + 32c .. 48 + 32c ≤ 144 of the weight block; activation quants
        // 64c .. 64c + 64 ≤ 256 from byte 4 of the Q8_K block.
        let (q, x0, x1) = unsafe {
            let x = a.as_ptr().add(4 + 64 * c);
            (load(b.as_ptr().add(16 + 32 * c)), load(x), load(x.add(32)))
        };
        let lo = _mm256_maddubs_epi16(_mm256_and_si256(q, m4), x0);
        let hi = _mm256_maddubs_epi16(_mm256_and_si256(srli!(q, 4), m4), x1);
        let s0 = _mm256_set1_epi16(i16::from(sc[2 * c]));
        let s1 = _mm256_set1_epi16(i16::from(sc[2 * c + 1]));
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(lo, s0));
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(hi, s1));
    }
    // SAFETY: the block's bsums are its last 32 bytes.
    let bs = unsafe { load(a.as_ptr().add(Q8K_BSUMS)) };
    s.d = f16_at(&b[0..]);
    s.dmin = f16_at(&b[2..]);
    let mins = hsum(_mm256_madd_epi16(spread(mn), bs));
    (hsum(_mm256_add_epi32(acc0, acc1)), mins)
}
