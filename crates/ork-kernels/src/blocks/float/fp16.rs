//! F16 weights against f16 activations, summed the way ggml's `ggml_vec_dot_f16` does on a
//! core with fp16 vector arithmetic (`__ARM_FEATURE_FP16_VECTOR_ARITHMETIC`: the RK3588's
//! Cortex-A76 and A55), so that ork's F16 results on such a core are llama.cpp's bits
//! (`ggml/src/ggml-cpu/vec.cpp`, `ggml_vec_dot_f16`, and `ggml/src/ggml-cpu/simd-mappings.h`,
//! the NEON `GGML_F16x8_*` macros, in llama-cpp-python 0.3.36's sources; `docs/kernels.md`):
//!
//! - elements `0 .. k − k mod 32` go into four accumulators of eight fp16 lanes, all +0: element
//!   `32s + 8j + l` is added by one fused multiply-add rounded to binary16
//!   (`acc[j][l] = fma(w, a, acc[j][l])`, `vfmaq_f16`);
//! - the accumulators fold in fp16, `(acc0 + acc2) + (acc1 + acc3)` lane by lane (`vaddq_f16`);
//!   the eight lanes widen to f32 and fold as `t_l = lane_l + lane_{l+4}`, then
//!   `(t0 + t1) + (t2 + t3)` (`vaddq_f32`, `vaddvq_f32`: two `faddp`);
//! - that f32 widens to f64 (`ggml_float`), and each leftover element's f32 product (exact: an
//!   f16 × f16 product has 22 significant bits) is added to it in f64, in order;
//! - the f64 sum rounds to f32.
//!
//! [`rows_scalar`] is that order written plainly, with the fp16 fused multiply-add emulated
//! exactly ([`fma`]); the aarch64 kernel (`neon/fp16.rs`) runs it with `fmla .8h`. A sum past
//! ±65504 is ±inf from there on, as in ggml. A NaN's payload is not specified (this twin writes
//! the default NaN).

/// The binary16 +1.0.
const ONE: u16 = 0x3c00;
/// The default binary16 NaN.
const NAN: u16 = 0x7e00;
/// Binary16 +inf (with the sign bit: −inf).
const INF: u16 = 0x7c00;

/// Whether the binary16 `h` is a NaN.
fn is_nan(h: u16) -> bool {
    h & 0x7fff > INF
}

/// Whether the binary16 `h` is ±inf.
fn is_inf(h: u16) -> bool {
    h & 0x7fff == INF
}

/// A finite binary16 `h` as `(negative, m, e)` with `|h| = m · 2^e` exactly: `m < 2¹¹` and
/// `e = −24` for subnormals and zeros, `m = 2¹⁰ + fraction` and `e = E − 25` for a biased
/// exponent `E` in 1..=30.
fn unpack(h: u16) -> (bool, u64, i32) {
    let (e, f) = (i32::from(h >> 10 & 0x1f), u64::from(h & 0x3ff));
    let neg = h & 0x8000 != 0;
    if e == 0 {
        (neg, f, -24)
    } else {
        (neg, f | 0x400, e - 25)
    }
}

/// `±mag · 2^e` rounded once to binary16, to nearest with ties to even (IEEE 754's default):
/// subnormal results are kept (no flush to zero, as Armv8's FPCR.FZ16 = 0, Linux's default),
/// values from 65520 up become ±inf, and a result that rounds to zero keeps the sign `neg`.
pub(super) fn round(neg: bool, mag: u128, e: i32) -> u16 {
    let sign = if neg { 0x8000 } else { 0 };
    if mag == 0 {
        return sign;
    }
    let len = (128 - mag.leading_zeros()) as i32;
    // The exponent of the kept significand's last bit: eleven bits kept, but never below
    // 2⁻²⁴, the subnormals' spacing.
    let mut q = (e + len - 11).max(-24);
    let shift = q - e;
    let mut keep = if shift > 0 {
        // shift ≤ 127: len ≤ 128, and the clamp only lowers `shift`.
        let kept = mag >> shift;
        let rem = mag - (kept << shift);
        let half = 1u128 << (shift - 1);
        kept + u128::from(rem > half || (rem == half && kept & 1 == 1))
    } else {
        // The value has at most eleven significant bits: exact.
        mag << -shift
    };
    if keep == 2048 {
        // Rounded up to the next power of two.
        keep = 1024;
        q += 1;
    }
    if keep < 1024 {
        // A subnormal (q = −24 here: an unclamped q keeps exactly eleven bits).
        return sign | keep as u16;
    }
    let biased = q + 25;
    if biased >= 31 {
        return sign | INF;
    }
    sign | (biased as u16) << 10 | (keep - 1024) as u16
}

/// `a · b + c` rounded once to binary16 (IEEE 754 `fusedMultiplyAdd`, as Armv8's `fmla` on
/// `.8h` lanes computes it): the product is exact in integers (`m_a · m_b < 2²²`), the sum is
/// exact in an i128 with the two terms aligned to the smaller exponent (`2⁻⁴⁸` at the least, the
/// larger term below `2⁸¹` there), and [`round`] rounds it once. Special cases as IEEE 754 says:
/// a NaN operand, `0 · ∞`, or `∞ − ∞` give NaN; an exact zero sum is +0 unless both terms are −0.
pub(super) fn fma(a: u16, b: u16, c: u16) -> u16 {
    if is_nan(a) || is_nan(b) || is_nan(c) {
        return NAN;
    }
    let neg_p = (a ^ b) & 0x8000 != 0;
    if is_inf(a) || is_inf(b) {
        let zero = |h: u16| h & 0x7fff == 0;
        if zero(a) || zero(b) || (is_inf(c) && (c & 0x8000 != 0) != neg_p) {
            return NAN;
        }
        return if neg_p { 0x8000 | INF } else { INF };
    }
    if is_inf(c) {
        return c;
    }
    let ((_, ma, ea), (_, mb, eb), (neg_c, mc, ec)) = (unpack(a), unpack(b), unpack(c));
    let (mp, ep) = (ma * mb, ea + eb);
    if mp == 0 && mc == 0 {
        return if neg_p && neg_c { 0x8000 } else { 0 };
    }
    let e = ep.min(ec);
    let signed = |neg: bool, m: u64, shift: i32| {
        let v = i128::from(m) << shift;
        if neg {
            -v
        } else {
            v
        }
    };
    let sum = signed(neg_p, mp, ep - e) + signed(neg_c, mc, ec - e);
    if sum == 0 {
        // Exact cancellation of nonzero terms: +0 when rounding to nearest.
        return 0;
    }
    round(sum < 0, sum.unsigned_abs(), e)
}

/// `a + b` in binary16, rounded once: `a · 1 + b` ([`fma`]; the product is `a` exactly, with
/// its sign, so `−0 + −0 = −0` and `x + (−x) = +0` as IEEE 754's addition gives).
pub(super) fn add(a: u16, b: u16) -> u16 {
    fma(a, ONE, b)
}

/// The binary16 `h` as f32 (exact).
fn widen(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// The f16 at element `i` of a little-endian row.
fn get(row: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([row[2 * i], row[2 * i + 1]])
}

/// The reduction of the four fp16 accumulators (`acc[j][l]`, bits) to one f32 (module docs).
pub(super) fn reduce(acc: &[[u16; 8]; 4]) -> f32 {
    let lane = |l: usize| add(add(acc[0][l], acc[2][l]), add(acc[1][l], acc[3][l]));
    let t: [f32; 4] = std::array::from_fn(|l| widen(lane(l)) + widen(lane(l + 4)));
    (t[0] + t[1]) + (t[2] + t[3])
}

/// ggml's leftovers: `red` (the reduced accumulators) plus the f32 products of elements
/// `from..k` of rows `w` and `a`, summed in f64 in order, rounded to f32. Shared by the kernel.
#[inline]
pub(super) fn tail(red: f32, w: &[u8], a: &[u8], from: usize) -> f32 {
    let mut sum = f64::from(red);
    for i in from..w.len() / 2 {
        sum += f64::from(widen(get(w, i)) * widen(get(a, i)));
    }
    sum as f32
}

/// The elements the fp16 accumulators take: `k` rounded down to ggml's step of 32.
pub(super) const fn whole(k: usize) -> usize {
    k & !31
}

/// One weight row against one activation row (module docs).
pub(super) fn dot(w: &[u8], a: &[u8]) -> f32 {
    let np = whole(w.len() / 2);
    let mut acc = [[0u16; 8]; 4];
    for s in (0..np).step_by(32) {
        for (j, acc) in acc.iter_mut().enumerate() {
            for (l, v) in acc.iter_mut().enumerate() {
                let i = s + 8 * j + l;
                *v = fma(get(w, i), get(a, i), *v);
            }
        }
    }
    tail(reduce(&acc), w, a, np)
}

/// The scalar twin of the aarch64 fp16 kernel (a `RowsFn` for F16).
pub(super) fn rows_scalar(k: usize, w: &[u8], rows: usize, acts: &[u8], m: usize, out: &mut [f32]) {
    let rb = 2 * k;
    for r in 0..rows {
        for i in 0..m {
            out[r * m + i] = dot(&w[r * rb..][..rb], &acts[i * rb..][..rb]);
        }
    }
}

#[cfg(test)]
mod tests;
