//! Attention's inner loops, as ork-exec's `ops::attention` runs them: the scores of a group of
//! query heads over cached key rows, the softmax's exponentials and sums, and the weighted sums
//! of the value rows.
//!
//! Every dot product and every weighted sum is a chain of fused multiply-adds in a fixed order:
//! a dot product keeps [`LANES`] independent accumulators (lane `l` adds the products of
//! elements `l`, `l + LANES`, … in turn) summed in lane order, then the tail; a weighted sum adds
//! one row after another. The blocking below (four keys share the loads of a query, 64 values of
//! an output stay in registers) interleaves independent chains and never reorders one, so a
//! head's result is the same bits whichever keys or heads it is computed beside, and in every
//! build: `f32::mul_add` is one rounding everywhere (an `fmla` on aarch64, a `vfmadd` in
//! [`crate::wide`]'s AVX2+FMA copy on x86, libm's exact `fmaf` in a baseline x86 build).
//!
//! On aarch64 [`scores`], [`weighted_sums`], [`row_max`], [`exp_shifted`] and [`sum_f64`] stay
//! out of line, so that `scripts/kernel_cycles.py` finds their loops by name and puts them
//! through llvm-mca (the board clock's attention cost for ork's CPU engine, docs/kernels.md);
//! elsewhere they are inlined into their caller, where `wide` compiles them for AVX2 and FMA.

/// Independent accumulators of one dot product.
pub const LANES: usize = 8;

/// Keys one pass of [`scores`] takes at a time (each query row's loads serve all of them).
const KEYS: usize = 4;

/// Output values a [`weighted_sums`] pass keeps in registers.
const SPAN: usize = 64;

/// `Σ a[i]·b[i]`: [`LANES`] fused chains summed in lane order, then the tail fused in order.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let b = &b[..a.len()];
    let body = a.len() - a.len() % LANES;
    let mut acc = [0.0f32; LANES];
    for (x, y) in a[..body]
        .chunks_exact(LANES)
        .zip(b[..body].chunks_exact(LANES))
    {
        fma_lanes(&mut acc, x, y);
    }
    tail(lane_sum(&acc), &a[body..], &b[body..])
}

/// [`dot`] run through [`crate::wide`]: compiled for AVX2 and FMA where the CPU has them, the
/// same bits. For callers outside such a copy (a closure, a baseline-x86-64 function), where
/// `dot`'s fused multiply-adds become calls to libm's `fmaf`: ~70 % of ork-exec's f32 reference
/// matmul's time until it called this (`perf record` of the Gemma 3 perplexity test,
/// 2026-12-07).
pub fn dot_wide(a: &[f32], b: &[f32]) -> f32 {
    crate::wide::wide(Dot(a, b))
}

/// [`dot`] as a [`crate::wide::Kernel`].
struct Dot<'a>(&'a [f32], &'a [f32]);

impl crate::wide::Kernel for Dot<'_> {
    type Out = f32;
    #[inline(always)]
    fn run(self) -> f32 {
        dot(self.0, self.1)
    }
}

/// [`dot`] of each query row `q[h]` with each of four key rows (every row as long as the
/// query's), interleaved: the same bits as separate calls.
#[inline(always)]
fn dots<const H: usize>(q: [&[f32]; H], k: [&[f32]; KEYS]) -> [[f32; KEYS]; H] {
    let n = q[0].len();
    let body = n - n % LANES;
    let k = k.map(|k| &k[..n]);
    let mut out = sums(q, k, body);
    // Plain loops, not `array::map`: a closure compiles out of `wide`'s AVX2+FMA copy, where
    // `mul_add` became a call to libm's `fmaf` (half of x86 decode's time, measured).
    for (o, q) in out.iter_mut().zip(q) {
        for (r, o) in o.iter_mut().enumerate() {
            *o = tail(*o, &q[body..n], &k[r][body..]);
        }
    }
    out
}

/// [`dots`]' lane chains over `q[h][..body]`, each key's lanes summed in order, portably (one
/// query row after the other).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
#[inline(always)]
fn sums_portable<const H: usize>(
    q: [&[f32]; H],
    k: [&[f32]; KEYS],
    body: usize,
) -> [[f32; KEYS]; H] {
    let mut out = [[0.0f32; KEYS]; H];
    for (o, q) in out.iter_mut().zip(q) {
        *o = sums4_portable(q, k, body);
    }
    out
}

/// One query row's four lane-chain sums, portably.
#[inline(always)]
fn sums4_portable(q: &[f32], k: [&[f32]; KEYS], body: usize) -> [f32; KEYS] {
    let [k0, k1, k2, k3] = k;
    let mut acc = [[0.0f32; LANES]; KEYS];
    fn chunks(k: &[f32], body: usize) -> std::slice::ChunksExact<'_, f32> {
        k[..body].chunks_exact(LANES)
    }
    for ((((x, y0), y1), y2), y3) in chunks(q, body)
        .zip(chunks(k0, body))
        .zip(chunks(k1, body))
        .zip(chunks(k2, body))
        .zip(chunks(k3, body))
    {
        fma_lanes(&mut acc[0], x, y0);
        fma_lanes(&mut acc[1], x, y1);
        fma_lanes(&mut acc[2], x, y2);
        fma_lanes(&mut acc[3], x, y3);
    }
    let mut out = [0.0f32; KEYS];
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = lane_sum(a);
    }
    out
}

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
use neon::sums;
#[cfg(not(target_arch = "aarch64"))]
use sums_portable as sums;

/// `acc[l] = x[l]·y[l] + acc[l]`, fused, for each lane.
#[inline(always)]
fn fma_lanes(acc: &mut [f32; LANES], x: &[f32], y: &[f32]) {
    let (x, y) = (&x[..LANES], &y[..LANES]);
    for l in 0..LANES {
        acc[l] = x[l].mul_add(y[l], acc[l]);
    }
}

/// The lanes of a dot product summed in order, from `0.0`.
#[inline(always)]
fn lane_sum(acc: &[f32; LANES]) -> f32 {
    let mut s = 0.0f32;
    for &v in acc {
        s += v;
    }
    s
}

/// A dot product's tail: its products fused into `s` in order.
#[inline(always)]
fn tail(mut s: f32, x: &[f32], y: &[f32]) -> f32 {
    for (x, y) in x.iter().zip(y) {
        s = x.mul_add(*y, s);
    }
    s
}

/// The scores of the query heads `q` (heads of `d` values, one after another) over the key
/// rows `rows` of `keys` (row `r` at `keys[r·d..]`): `out[h·n + j] = dot(q_h, key rows[j]) ·
/// scale`, `n = rows.len()`. Four keys at a time, two heads at a time over them.
#[cfg_attr(target_arch = "aarch64", inline(never))]
#[cfg_attr(not(target_arch = "aarch64"), inline(always))]
pub fn scores(q: &[f32], d: usize, keys: &[f32], rows: &[usize], scale: f32, out: &mut [f32]) {
    let n = rows.len();
    let heads = q.len() / d.max(1);
    assert_eq!(out.len(), heads * n, "attend::scores: out is heads × rows");
    let key = |j: usize| &keys[rows[j] * d..][..d];
    let block = n - n % KEYS;
    for j in (0..block).step_by(KEYS) {
        let k = [key(j), key(j + 1), key(j + 2), key(j + 3)];
        let mut heads = q.chunks_exact(d).enumerate();
        // Two heads at a time (they share the key loads), then the odd one.
        while let Some((h, qh)) = heads.next() {
            let pair = heads.next();
            let s: &[[f32; KEYS]] = match pair {
                Some((_, q1)) => &dots([qh, q1], k),
                None => &dots([qh], k),
            };
            for (i, s) in s.iter().enumerate() {
                for (t, s) in s.iter().enumerate() {
                    out[(h + i) * n + j + t] = s * scale;
                }
            }
        }
    }
    for j in block..n {
        for (h, qh) in q.chunks_exact(d).enumerate() {
            out[h * n + j] = dot(qh, key(j)) * scale;
        }
    }
}

/// The largest of `s` (`f32::max`: NaN ignored; −∞ for none).
#[cfg_attr(target_arch = "aarch64", inline(never))]
#[cfg_attr(not(target_arch = "aarch64"), inline(always))]
pub fn row_max(s: &[f32]) -> f32 {
    s.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// `dst[j] = exp(src[j] − max)`, with [`exp`] (`dst` as long as `src`). Into a second buffer:
/// in place, LLVM stores each result through the pointer the next load steps, and llvm-mca
/// then chains every pass's load behind the previous pass's whole polynomial (docs/kernels.md).
#[cfg_attr(target_arch = "aarch64", inline(never))]
#[cfg_attr(not(target_arch = "aarch64"), inline(always))]
pub fn exp_shifted(src: &[f32], max: f32, dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = exp(s - max);
    }
}

/// `Σ s[j]` in f64, in order.
#[cfg_attr(target_arch = "aarch64", inline(never))]
#[cfg_attr(not(target_arch = "aarch64"), inline(always))]
pub fn sum_f64(s: &[f32]) -> f64 {
    let mut sum = 0.0f64;
    for &e in s {
        sum += f64::from(e);
    }
    sum
}

/// The weighted sums of the value rows `rows` of `values` (row `r` at `values[r·d..]`), one
/// per head: `out[h·d + l] = Σ_j (weights[h·n + j] · inv[h]) · value rows[j][l]`, fused, rows
/// in order, `n = rows.len()`. With `d` a multiple of 64, 64 values of a head at a time, their
/// sums in registers (the same bits as one value at a time); on aarch64 two heads at a time, 32
/// values each, sharing the loads of each value row.
#[cfg_attr(target_arch = "aarch64", inline(never))]
#[cfg_attr(not(target_arch = "aarch64"), inline(always))]
pub fn weighted_sums(
    weights: &[f32],
    inv: &[f32],
    d: usize,
    values: &[f32],
    rows: &[usize],
    out: &mut [f32],
) {
    let n = rows.len();
    assert_eq!(
        out.len(),
        inv.len() * d,
        "attend::weighted_sums: out is heads × d"
    );
    assert_eq!(
        weights.len(),
        inv.len() * n,
        "attend::weighted_sums: weights are heads × rows"
    );
    #[cfg(target_arch = "aarch64")]
    let paired = weighted_pairs(weights, inv, d, values, rows, out);
    #[cfg(not(target_arch = "aarch64"))]
    let paired = 0;
    for (h, oh) in out.chunks_exact_mut(d.max(1)).enumerate().skip(paired) {
        weighted_head(&weights[h * n..][..n], inv[h], d, values, rows, oh);
    }
}

/// [`weighted_sums`] of the heads two at a time with [`neon::weighted2`] where `d` is a multiple
/// of its span; the heads done (an even count: an odd last one is left to the caller).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn weighted_pairs(
    weights: &[f32],
    inv: &[f32],
    d: usize,
    values: &[f32],
    rows: &[usize],
    out: &mut [f32],
) -> usize {
    let n = rows.len();
    if !d.is_multiple_of(neon::SPAN2) {
        return 0;
    }
    let pairs = inv.len() / 2;
    for h in (0..2 * pairs).step_by(2) {
        let w = [&weights[h * n..][..n], &weights[(h + 1) * n..][..n]];
        for off in (0..d).step_by(neon::SPAN2) {
            let s = neon::weighted2(w, [inv[h], inv[h + 1]], values, d, off, rows);
            for (i, s) in s.iter().enumerate() {
                out[(h + i) * d + off..][..neon::SPAN2].copy_from_slice(s);
            }
        }
    }
    2 * pairs
}

/// One head's weighted sum for [`weighted_sums`]: 64 values at a time where `d` allows.
#[inline(always)]
fn weighted_head(w: &[f32], inv: f32, d: usize, values: &[f32], rows: &[usize], oh: &mut [f32]) {
    if d.is_multiple_of(SPAN) {
        for (c, oc) in oh.chunks_exact_mut(SPAN).enumerate() {
            let mut acc = [0.0f32; SPAN];
            for (&w, &r) in w.iter().zip(rows) {
                let w = w * inv;
                let v = &values[r * d + SPAN * c..][..SPAN];
                for l in 0..SPAN {
                    acc[l] = w.mul_add(v[l], acc[l]);
                }
            }
            oc.copy_from_slice(&acc);
        }
    } else {
        oh.fill(0.0);
        for (&w, &r) in w.iter().zip(rows) {
            let w = w * inv;
            for (o, &v) in oh.iter_mut().zip(&values[r * d..][..d]) {
                *o = w.mul_add(v, *o);
            }
        }
    }
}

/// `e^x` for f32 without a branch or a library call, so that a loop of it vectorizes (libm's
/// `expf` is called one value at a time): Cephes' `expf` — `x = n·ln 2 + r` with `n` rounded to
/// nearest and |r| ≤ ln 2 / 2, a degree-6 polynomial for `e^r`, `2^n` put into the exponent
/// bits. Within 2 ulp of the true value for normal results (ork-exec's tests check it against
/// `f64`'s `exp` over the whole range); `x` is clamped to [-87.34, 88.38], so a result below
/// `2^-126` is ~`1.2e-38` rather than subnormal or 0, and one above ~`2.4e38` is that rather
/// than infinity; NaN stays NaN. Plain multiplies and adds (no fused ones): the same bits in
/// every build.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two, the first with few mantissa bits, so `n · LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 · 2^23 rounds to the nearest integer (ties to even).
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.336_55, 88.376_26);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // n ∈ [-126, 127] after the clamp: a normal power of two (NaN casts to 0, y stays NaN).
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dot product's plain definition: the lanes' chains one after another, then the tail.
    fn dot_plain(a: &[f32], b: &[f32]) -> f32 {
        let body = a.len() - a.len() % LANES;
        let mut s = 0.0f32;
        for l in 0..LANES {
            let mut acc = 0.0f32;
            for i in (l..body).step_by(LANES) {
                acc = a[i].mul_add(b[i], acc);
            }
            s += acc;
        }
        for i in body..a.len() {
            s = a[i].mul_add(b[i], s);
        }
        s
    }

    fn val(i: usize, salt: f32) -> f32 {
        (i as f32 * 0.37 + salt).sin() * 1.5
    }

    /// Random-ish values with a few extremes among them.
    fn values(n: usize, salt: f32) -> Vec<f32> {
        (0..n)
            .map(|i| match i % 97 {
                3 => 3.0e4,
                50 => -2.5e-6,
                _ => val(i, salt),
            })
            .collect()
    }

    #[test]
    fn dot_and_scores_are_the_plain_chains_bit_for_bit() {
        for d in [1, 7, 8, 24, 64, 100, 128] {
            for n in [0, 1, 3, 4, 5, 9, 130] {
                let heads = 3;
                let q = values(heads * d, 0.3);
                let keys = values(2 * n * d + d, 1.1);
                // Every other row, backwards: rows need not be in order.
                let rows: Vec<usize> = (0..n).map(|j| 2 * (n - j)).collect();
                let mut out = vec![f32::NAN; heads * n];
                scores(&q, d, &keys, &rows, 0.125, &mut out);
                for h in 0..heads {
                    for (j, &r) in rows.iter().enumerate() {
                        let (qh, k) = (&q[h * d..][..d], &keys[r * d..][..d]);
                        let want = dot_plain(qh, k) * 0.125;
                        assert_eq!(dot(qh, k).to_bits(), (want / 0.125).to_bits());
                        assert_eq!(out[h * n + j].to_bits(), want.to_bits(), "d {d} n {n}");
                    }
                }
            }
        }
    }

    /// The aarch64 `fmla` chains and their transposed lane sums, one head or two at a time, are
    /// the portable loop's, bit for bit (on x86 the two are one).
    #[test]
    fn the_four_key_sums_equal_the_portable_loop() {
        for d in [0, 8, 64, 128, 256] {
            let (q0, q1) = (values(d + 3, 0.1), values(d + 1, 4.2));
            let k: Vec<Vec<f32>> = (0..KEYS).map(|r| values(d + 5, r as f32)).collect();
            let k = [&k[0][..], &k[1][..], &k[2][..], &k[3][..]];
            let two = sums([&q0[..], &q1[..]], k, d);
            let one = sums([&q1[..]], k, d);
            let want = sums_portable([&q0[..], &q1[..]], k, d);
            for r in 0..KEYS {
                assert_eq!(two[0][r].to_bits(), want[0][r].to_bits(), "d {d} key {r}");
                assert_eq!(two[1][r].to_bits(), want[1][r].to_bits(), "d {d} key {r}");
                assert_eq!(one[0][r].to_bits(), want[1][r].to_bits(), "d {d} key {r}");
            }
        }
    }

    #[test]
    fn weighted_sums_are_the_plain_chains_bit_for_bit() {
        for d in [1, 32, 40, 64, 128, 256] {
            for n in [0, 1, 5, 129] {
                // Three heads: a pair (two at a time on aarch64) and one alone.
                let heads = 3;
                let w = values(heads * n, 0.7);
                let inv = [0.5, 1.0 / 3.0, 0.2];
                let v = values((n + 3) * d, 2.3);
                let rows: Vec<usize> = (0..n).map(|j| (j * 7) % (n + 3)).collect();
                let mut out = vec![f32::NAN; heads * d];
                weighted_sums(&w, &inv, d, &v, &rows, &mut out);
                for h in 0..heads {
                    for l in 0..d {
                        let mut want = 0.0f32;
                        for (j, &r) in rows.iter().enumerate() {
                            want = (w[h * n + j] * inv[h]).mul_add(v[r * d + l], want);
                        }
                        assert_eq!(out[h * d + l].to_bits(), want.to_bits(), "d {d} n {n}");
                    }
                }
            }
        }
    }

    #[test]
    fn softmax_pieces() {
        let x = vec![1.0f32, -2.0, 3.5, f32::NEG_INFINITY];
        let max = row_max(&x);
        assert_eq!(max, 3.5);
        let mut s = vec![0.0; 4];
        exp_shifted(&x, max, &mut s);
        assert_eq!(s[2], 1.0);
        assert!(s[3] > 0.0 && s[3] < 1.2e-38);
        let want: f64 = s.iter().map(|&e| f64::from(e)).sum();
        assert_eq!(sum_f64(&s), want);
        assert_eq!(row_max(&[]), f32::NEG_INFINITY);
    }
}
