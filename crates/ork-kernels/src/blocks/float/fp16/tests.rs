use super::{add, dot, fma, INF, NAN};

/// The binary16 nearest to `x` by definition, found by searching the finite values (not by
/// the bit arithmetic of `super::round`): the largest finite magnitude at or below `|x|` and the
/// next one up (65536 above 65504, the value an unbounded exponent would give), the closer
/// one, a tie to the even significand; the sign of `x`, zeros included. NaN and infinities
/// map to themselves.
fn nearest(x: f64) -> u16 {
    if x.is_nan() {
        return NAN;
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let v = x.abs();
    let val = |h: u16| {
        if h == INF {
            65536.0
        } else {
            f64::from(half::f16::from_bits(h))
        }
    };
    if v.is_infinite() {
        return sign | INF;
    }
    // Finite magnitudes 0..=0x7bff increase with their bits.
    let (mut lo, mut hi) = (0u16, 0x7bffu16);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if val(mid) <= v {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let up = lo + 1;
    let (dl, du) = (v - val(lo), val(up) - v);
    let pick = if dl < du || (dl == du && lo & 1 == 0) {
        lo
    } else {
        up
    };
    sign | pick
}

fn h(x: f64) -> u16 {
    let b = half::f16::from_f64(x).to_bits();
    assert_eq!(
        f64::from(half::f16::from_bits(b)),
        x,
        "{x} is not a binary16"
    );
    b
}

/// `n` random operand triples `(a, b, c)` from the seed: every class of binary16, and every
/// third `c` the nearest binary16 to `−a·b` nudged by up to two ulps (heavy cancellation).
fn triples(seed: u64, n: usize) -> impl Iterator<Item = (u16, u16, u16)> {
    let mut s = seed;
    (0..n).map(move |i| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let (a, b, r) = (s as u16, (s >> 16) as u16, (s >> 32) as u16);
        let c = if i % 3 == 0 {
            let p = half::f16::from_bits(a).to_f64() * half::f16::from_bits(b).to_f64();
            nearest(-p).wrapping_add(r % 5).wrapping_sub(2)
        } else {
            r
        };
        (a, b, c)
    })
}

/// Hand-derived cases: ties to even, subnormals, overflow, cancellation, signed zeros,
/// invalid operations.
#[test]
fn fma_edge_cases() {
    let p = |e: i32| 2f64.powi(e);
    let cases: &[(f64, f64, f64, u16)] = &[
        // 1 + 2⁻¹¹: halfway between 1 and 1 + 2⁻¹⁰, to the even 1.
        (1.0, 1.0, p(-11), h(1.0)),
        // 1 + 2⁻¹⁰ + 2⁻¹¹: halfway between an odd and an even significand, to 1 + 2⁻⁹.
        (1.0 + p(-10), 1.0, p(-11), h(1.0 + p(-9))),
        // (1 + 2⁻¹⁰)² + 2⁻¹¹ = 1 + 2⁻⁹ + 2⁻¹¹ + 2⁻²⁰: just above a halfway point, only
        // through the product's last bit, so up.
        (1.0 + p(-10), 1.0 + p(-10), p(-11), h(1.0 + 3.0 * p(-10))),
        // Fused: (1 + 2⁻¹⁰)(1 − 2⁻¹⁰) − 1 = −2⁻²⁰ exactly, where a rounded product gives 0.
        (1.0 + p(-10), 1.0 - p(-10), -1.0, h(-p(-20))),
        // Subnormal products: 2⁻¹²·2⁻¹³ = 2⁻²⁵ is half the smallest subnormal, to the even 0;
        // 3·2⁻²⁵ lies halfway between 2⁻²⁴ (odd) and 2⁻²³: up; 2⁻²⁴·2⁻²⁴ underflows to −0.
        (p(-12), p(-13), 0.0, 0),
        (3.0 * p(-12), p(-13), 0.0, h(p(-23))),
        (-p(-24), p(-24), 0.0, 0x8000),
        (p(-14) - p(-24), 1.0, p(-24), h(p(-14))), // largest subnormal + 2⁻²⁴: the smallest normal
        (p(-24), 0.5, p(-24), h(p(-23))),          // 1.5·2⁻²⁴: halfway, to the even 2⁻²³
        // Overflow: 65504 + 16 = 65520 is halfway to 65536, to inf; just below stays finite.
        (65504.0, 1.0, 16.0, INF),
        (65504.0, 1.0, 15.0, h(65504.0)),
        (-256.0, 256.0, 0.0, 0x8000 | INF),
        (65504.0, -1.0, 65504.0, 0), // exact cancellation: +0
        (-0.0, 1.0, -0.0, 0x8000),   // −0 + −0 = −0
        (0.0, -1.0, 0.0, 0),         // −0 + +0 = +0
        // A product far below c: c unchanged; a tiny c under a huge product: the product.
        (p(-24), p(-24), 1.0, h(1.0)),
        (256.0, 255.0, p(-24), h(65280.0)),
    ];
    for &(a, b, c, want) in cases {
        let got = fma(h(a), h(b), h(c));
        assert_eq!(
            got, want,
            "fma({a}, {b}, {c}) = {got:#06x}, want {want:#06x}"
        );
        assert_eq!(
            nearest(a * b + c),
            want,
            "the search disagrees on {a}·{b} + {c}"
        );
    }
    let nan = |x: u16| x & 0x7fff > INF;
    assert!(nan(fma(INF, 0, h(1.0))), "∞ · 0");
    assert!(nan(fma(INF, h(1.0), 0x8000 | INF)), "∞ − ∞");
    assert!(nan(fma(0x7c01, h(1.0), 0)), "signalling NaN in");
    assert!(nan(fma(h(1.0), h(1.0), 0xfe00)), "NaN in c");
    assert_eq!(fma(INF, h(-2.0), h(5.0)), 0x8000 | INF);
    assert_eq!(fma(h(3.0), h(2.0), 0x8000 | INF), 0x8000 | INF);
    assert_eq!(
        add(h(2048.0), h(1.0)),
        h(2048.0),
        "2049 is a tie: to even 2048"
    );
    assert_eq!(
        add(h(2048.0), h(3.0)),
        h(2052.0),
        "2051 is a tie: to even 2052"
    );
}

/// Random operands, every class of binary16 among them, and sums built to cancel: where
/// `a·b + c` is exact in f64 (the product always is; the sum when a two-sum leaves no error),
/// `fma` is the nearest binary16 to it.
#[test]
fn fma_is_the_nearest_binary16_of_the_exact_value() {
    let mut checked = 0;
    for (a, b, c) in triples(0x9e37_79b9_7f4a_7c15, 400_000) {
        let f = |x: u16| half::f16::from_bits(x).to_f64();
        let (p, cv) = (f(a) * f(b), f(c));
        let sum = p + cv;
        let bv = sum - p;
        if sum.is_finite() && (p - (sum - bv)) + (cv - bv) != 0.0 {
            continue; // not exact in f64
        }
        let (got, want) = (fma(a, b, c), nearest(sum));
        let both_nan = got & 0x7fff > INF && want & 0x7fff > INF;
        assert!(
            got == want || both_nan,
            "fma({a:#06x}, {b:#06x}, {c:#06x}) = {got:#06x}, want {want:#06x}"
        );
        checked += 1;
    }
    assert!(checked > 300_000, "only {checked} exact cases");
}

/// ggml's fp16 accumulation, by hand: 32·2049 products of 1 put 2049 ones into each of the 32
/// lanes; each lane stops at 2048 (2048 + 1 rounds to the even 2048), the fp16 fold gives
/// 8192 per lane, the f32 fold 65536 (where an f32 sum gives 65568). Four leftover products of
/// 0.5 are added in f64.
#[test]
fn the_twin_accumulates_in_fp16() {
    let k = 32 * 2049 + 4;
    let mut w: Vec<u8> = (0..k).flat_map(|_| h(1.0).to_le_bytes()).collect();
    for i in k - 4..k {
        w[2 * i..2 * i + 2].copy_from_slice(&h(0.5).to_le_bytes());
    }
    let a: Vec<u8> = (0..k).flat_map(|_| h(1.0).to_le_bytes()).collect();
    assert_eq!(dot(&w, &a), 65538.0);
    // Below 32 values only the f64 tail runs: the exact sum.
    assert_eq!(dot(&w[..62], &a[..62]), 31.0);
}

/// The twin's `fma` against the CPU's own binary16 fused multiply-add (`fmadd h`), on a core
/// with FEAT_FP16 (under qemu: `-cpu cortex-a76`): random operands of every class and
/// cancelling sums, including the inexact ones the f64 test above skips.
#[cfg(target_arch = "aarch64")]
#[test]
fn fma_equals_the_cpus_fmadd() {
    if !std::arch::is_aarch64_feature_detected!("fp16") {
        eprintln!("no FEAT_FP16: the fmadd comparison does not run here");
        return;
    }
    for (a, b, c) in triples(0x2545_f491_4f6c_dd1d, 300_000) {
        // SAFETY: FEAT_FP16 was detected above.
        let want = unsafe { super::super::neon::fmadd(a, b, c) };
        let got = fma(a, b, c);
        let both_nan = got & 0x7fff > INF && want & 0x7fff > INF;
        assert!(
            got == want || both_nan,
            "fma({a:#06x}, {b:#06x}, {c:#06x}) = {got:#06x}, the CPU {want:#06x}"
        );
    }
}
