//! AVX2 + FMA + F16C kernel for f32 activation rows (fp16 activations, converted once per task)
//! against int8 or fp16 weight tiles read straight from the tiled bytes: each 8-value weight run
//! is widened in registers (`vpmovsxbd` + `vcvtdq2ps`, or `vcvtph2ps`) and multiplied into 4 rows
//! with `vfmadd231ps`. Lane `l` of an accumulator sums `k ≡ l (mod 8)` in ascending k; the eight
//! lanes are then added in lane order — exactly the order of the scalar twin
//! [`super::scalar_float_tile_dot`], and since every product is exact in f32 (see
//! [`super`]) a fused multiply-add rounds like the twin's multiply-then-add: the two agree bit
//! for bit.

use std::arch::x86_64::*;

/// Whether the CPU has what this kernel needs (detected once).
pub(super) fn available() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    })
}

/// Safe entry for an int8 weight tile (`w` is `tn × kpad` i8 in tile order).
pub(super) fn tile_dot_i8(a: &[f32], kpad: usize, w: &[i8], tn: usize, out: &mut [f32]) {
    check(a, kpad, w.len(), tn, out);
    // SAFETY: `check` verified the CPU features and every shape `tile_dot_x86` relies on; `w`
    // holds `tn · kpad` one-byte elements.
    unsafe { tile_dot_x86::<false>(a, kpad, w.as_ptr().cast(), tn, out) }
}

/// Safe entry for an fp16 weight tile (`w` is `tn × kpad` f16 in tile order).
pub(super) fn tile_dot_f16(a: &[f32], kpad: usize, w: &[half::f16], tn: usize, out: &mut [f32]) {
    check(a, kpad, w.len(), tn, out);
    // SAFETY: as above; `w` holds `tn · kpad` two-byte elements (unaligned loads are used).
    unsafe { tile_dot_x86::<true>(a, kpad, w.as_ptr().cast(), tn, out) }
}

fn check(a: &[f32], kpad: usize, w_len: usize, tn: usize, out: &[f32]) {
    let rows = a.len() / kpad.max(1);
    assert!(
        kpad > 0
            && kpad.is_multiple_of(32)
            && a.len() == rows * kpad
            && w_len == tn * kpad
            && tn.is_multiple_of(2)
            && out.len() >= rows * tn
    );
    assert!(available());
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C; `a` is `rows × kpad` f32, `w` points at `tn × kpad`
/// weight elements in tile order (i8 when `F16` is false, f16 when true), `kpad % 32 == 0`, `tn`
/// even, `out.len() ≥ rows · tn`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_dot_x86<const F16: bool>(
    a: &[f32],
    kpad: usize,
    w: *const u8,
    tn: usize,
    out: &mut [f32],
) {
    let rows = a.len() / kpad;
    let mut r = 0;
    // SAFETY (all calls below): rows r..r+R lie inside `a`, channel pairs j, j+1 < tn inside the
    // tile, and `out[r·tn..(r+R)·tn]` inside `out` — the caller's contract.
    // Blocks of R rows × C channels keep 8 accumulators in flight (FMA latency × ports) where
    // the rows allow it; C must divide every tile width (16, 32, 64).
    while r + 4 <= rows {
        for j in (0..tn).step_by(2) {
            unsafe { block::<F16, 4, 2>(a, r, kpad, w, tn, j, out) };
        }
        r += 4;
    }
    match rows - r {
        3 => (0..tn)
            .step_by(2)
            .for_each(|j| unsafe { block::<F16, 3, 2>(a, r, kpad, w, tn, j, out) }),
        2 => (0..tn)
            .step_by(4)
            .for_each(|j| unsafe { block::<F16, 2, 4>(a, r, kpad, w, tn, j, out) }),
        1 => (0..tn)
            .step_by(8)
            .for_each(|j| unsafe { block::<F16, 1, 8>(a, r, kpad, w, tn, j, out) }),
        _ => {}
    }
}

/// Eight weights of one 32-value run, as f32.
///
/// # Safety
/// `w` + `elem` (in elements of the weight type) + 8 elements must be readable; the CPU must have
/// AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<const F16: bool>(w: *const u8, elem: usize) -> __m256 {
    // SAFETY: the caller guarantees 8 readable elements at `elem`; the loads are unaligned.
    unsafe {
        if F16 {
            _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * elem).cast()))
        } else {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(w.add(elem).cast())))
        }
    }
}

/// `out[(r0+i)·tn + j + c] = Σ_k a[r0+i, k] · w[j+c, k]` for `i < R`, `c < C`.
///
/// # Safety
/// See [`tile_dot_x86`]; additionally `r0 + R ≤ rows` and `j + C ≤ tn`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const F16: bool, const R: usize, const C: usize>(
    a: &[f32],
    r0: usize,
    kpad: usize,
    w: *const u8,
    tn: usize,
    j: usize,
    out: &mut [f32],
) {
    let ap = a.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for kt in 0..kpad / 32 {
        for g in 0..4 {
            let e = kt * tn * 32 + j * 32 + g * 8;
            // SAFETY: kt < kpad/32, j + C ≤ tn and g < 4 keep every 8-element run inside the
            // `tn × kpad` tile; rows r0..r0+R and k = kt·32 + g·8 .. +8 lie inside `a`.
            unsafe {
                let mut wv = [_mm256_setzero_ps(); C];
                for (c, wv) in wv.iter_mut().enumerate() {
                    *wv = load8::<F16>(w, e + 32 * c);
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let av = _mm256_loadu_ps(ap.add((r0 + i) * kpad + kt * 32 + g * 8));
                    for (acc, &wv) in acc.iter_mut().zip(&wv) {
                        *acc = _mm256_fmadd_ps(av, wv, *acc);
                    }
                }
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (c, &v) in acc.iter().enumerate() {
            out[(r0 + i) * tn + j + c] = lane_sum(v);
        }
    }
}

/// `((l0 + l1) + l2) + … + l7`, the twin's order.
#[inline]
#[target_feature(enable = "avx2")]
fn lane_sum(v: __m256) -> f32 {
    let mut l = [0f32; 8];
    // SAFETY: `l` is 8 writable f32 (32 bytes); the store is unaligned.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
    l[1..].iter().fold(l[0], |s, &x| s + x)
}
