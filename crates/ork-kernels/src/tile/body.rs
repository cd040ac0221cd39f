//! The one loop body of the SIMD int8 tile kernels, generic over a small vector trait
//! ([`TileVec`]), the way memchr writes its searchers once over its `Vector` trait: each ISA
//! implements the trait with `#[inline(always)]` methods, and its `#[target_feature]` entry point
//! calls [`body`] (itself `#[inline(always)]`), so the whole body is compiled inside that entry
//! with the ISA's instructions enabled, with no call per vector operation.
//!
//! For one tile (`tn` channels of `kpad` values, k-tile-major: see [`super`]) and a block of
//! activation rows, the body computes `out[r·tn + j] = Σ_k a[r, k] · w[j, k] − corr[r]`:
//!
//! * **4-row blocks** × `G` weight vectors: each k-run's weight vectors are loaded (and widened
//!   or biased) once for 4 activation rows, `4 · G` accumulators;
//! * **a single row** (decode, M = 1) when the ISA asks for the memory-order pass (`WIDE`): each
//!   k-run's `tn × 32` bytes read front to back, every channel into its own accumulator (up to
//!   [`WIDE_CHANNELS`] at a time; they live on the stack), so the weight streams from DRAM
//!   sequentially, with the lines [`AHEAD`] bytes on prefetched where the ISA prefetches;
//! * **other single rows** (decode without `WIDE`, and leftover rows of a block): `R` weight
//!   vectors at a time in registers, then `G` at a time for the rest of the tile.
//!
//! `corr` is the per-row correction of ISAs that bias their weights to u8 for `vpdpbusd`
//! (`128 · Σ_k a[r, k]`, see `avx512_vnni.rs`); empty for the others. Every sum is exact in i32
//! (or wraps to the exact value, see [`super::MAX_K`]), so the order in which an ISA adds its
//! products does not change the result: every kernel equals the scalar twin
//! [`super::scalar_tile_dot`] bit for bit (property tests in `super` and per ISA).

/// What one ISA supplies to [`body`]: loads, one multiply-add step and the final reduction.
///
/// # Safety
/// Every method may use the implementation's instructions: call them only from a function
/// compiled with those target features on a CPU that has them (implementations are
/// `#[inline(always)]`, so they are compiled inside that function).
pub(super) trait TileVec {
    /// An activation value as [`super::PreparedA`] holds it for this ISA (i8, or i16 for AVX2).
    type Elem: Copy;
    /// One accumulator register.
    type Acc: Copy;
    /// One 32-value k-run of an activation row, as [`TileVec::madd`] reads it.
    type A: Copy;
    /// The 32-byte k-runs of [`TileVec::CH`] neighbouring channels, as [`TileVec::madd`] reads
    /// them (widened, or biased to u8).
    type W: Copy;
    /// Channels per weight vector: 1, or 2 where a register holds two 32-byte runs (zmm).
    const CH: usize;
    /// Whether the M = 1 pass prefetches the weight bytes [`AHEAD`] of its reads.
    const PREFETCH: bool;

    /// An accumulator of zeros.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn zero() -> Self::Acc;
    /// The k-run of 32 activation values at `p`.
    ///
    /// # Safety
    /// See the trait; `p .. p + 32` must be readable.
    unsafe fn load_a(p: *const Self::Elem) -> Self::A;
    /// The `32 · CH` weight bytes at `p`.
    ///
    /// # Safety
    /// See the trait; `p .. p + 32 · CH` must be readable.
    unsafe fn load_w(p: *const i8) -> Self::W;
    /// `acc` plus the products of one activation k-run with the k-runs of the `CH` channels.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn madd(acc: Self::Acc, a: Self::A, w: Self::W) -> Self::Acc;
    /// `out[c] = (sum of channel c) − corr` for the `CH · acc.len()` channels the accumulators
    /// hold, in order.
    ///
    /// # Safety
    /// See the trait; `out .. out + CH · acc.len()` must be writable, and `acc.len()` a multiple
    /// of what the implementation documents.
    unsafe fn finish(acc: &[Self::Acc], corr: i32, out: *mut i32);
    /// [`TileVec::finish`] for a 4-row block: row `i`'s accumulators to `out + i · tn`, minus
    /// `corr[i]`. Row by row unless an ISA reduces the block at once.
    ///
    /// # Safety
    /// As [`TileVec::finish`], for each of the four rows.
    #[inline(always)]
    unsafe fn finish4<const G: usize>(
        acc: &[[Self::Acc; G]; 4],
        corr: [i32; 4],
        out: *mut i32,
        tn: usize,
    ) {
        for (i, acc) in acc.iter().enumerate() {
            // SAFETY: forwarded from the caller.
            unsafe { Self::finish(acc, corr[i], out.add(i * tn)) };
        }
    }
    /// Hint that the line at `p` is read soon (never faults, whatever `p`). Called only when
    /// [`TileVec::PREFETCH`] is set.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn prefetch(p: *const i8);
}

/// Channels the M = 1 memory-order pass accumulates at once (ork-pack's tiles are 32 and 64
/// wide; a wider tile takes several passes).
pub(super) const WIDE_CHANNELS: usize = 64;

/// How far ahead of its reads the M = 1 pass prefetches, bytes. 2 KiB against a whole tile ahead
/// (18–48 KiB, more than L1 holds): a SmolLM2-sized pass of 211 M = 1 matmuls took 3–4 % less
/// with AVX2 (medians of 100 interleaved passes, three runs; 1, 4 and 6 KiB did as well).
const AHEAD: usize = 2048;

/// The operands of one call, as raw pointers (the bounds are [`body`]'s contract).
struct Tile<'a, E> {
    ap: *const E,
    wp: *const i8,
    op: *mut i32,
    corr: &'a [i32],
    kpad: usize,
    tn: usize,
}

impl<E> Tile<'_, E> {
    /// The correction of row `r` (0 for ISAs without one).
    #[inline(always)]
    fn corr(&self, r: usize) -> i32 {
        if self.corr.is_empty() {
            0
        } else {
            self.corr[r]
        }
    }
}

/// `out[r·tn + j] = Σ_k a[r, k] · w[j, k] − corr[r]` for every row of `a` and channel of the tile.
/// `G`: weight vectors per 4-row block; `R`: weight vectors per register pass of a single row;
/// `WIDE`: whether M = 1 takes the memory-order pass instead (see the module).
///
/// # Safety
/// The CPU has `V`'s instructions and the caller enables them; `a` is `rows × kpad` values, `corr`
/// empty or `rows` long, `w` is `tn × kpad` i8 in tile order, `kpad % 32 == 0`, `tn` a multiple
/// of `G · V::CH` (and of `V::CH` when `WIDE`), `out.len() ≥ rows · tn`.
#[inline(always)]
pub(super) unsafe fn body<V: TileVec, const G: usize, const R: usize, const WIDE: bool>(
    a: &[V::Elem],
    corr: &[i32],
    kpad: usize,
    w: &[i8],
    tn: usize,
    out: &mut [i32],
) {
    let rows = a.len() / kpad;
    let t = Tile {
        ap: a.as_ptr(),
        wp: w.as_ptr(),
        op: out.as_mut_ptr(),
        corr,
        kpad,
        tn,
    };
    // SAFETY (every call below): the caller's contract covers rows r..r+4 (r + 4 ≤ rows) or row
    // r < rows, channels j..j + G·CH ≤ tn (tn a multiple of G·CH), j..j + R·CH ≤ tn (checked),
    // and the memory-order chunks c0..c0 + width ≤ tn; each helper reads and writes only those.
    let mut r = 0;
    while r + 4 <= rows {
        for j in (0..tn).step_by(G * V::CH) {
            unsafe { block4::<V, G>(&t, r, j) };
        }
        r += 4;
    }
    if WIDE && rows == 1 {
        for c0 in (0..tn).step_by(WIDE_CHANNELS) {
            unsafe { wide_row::<V>(&t, c0, (tn - c0).min(WIDE_CHANNELS)) };
        }
        return;
    }
    while r < rows {
        let mut j = 0;
        while j + R * V::CH <= tn {
            unsafe { row::<V, R>(&t, r, j) };
            j += R * V::CH;
        }
        while j < tn {
            unsafe { row::<V, G>(&t, r, j) };
            j += G * V::CH;
        }
        r += 1;
    }
}

/// Rows `r..r + 4` × the `G · CH` channels from `j`.
///
/// # Safety
/// As [`body`], for those rows and channels.
#[inline(always)]
unsafe fn block4<V: TileVec, const G: usize>(t: &Tile<'_, V::Elem>, r: usize, j: usize) {
    let (kpad, tn) = (t.kpad, t.tn);
    // SAFETY: register-only; the caller enabled V's instructions.
    let mut acc = [[unsafe { V::zero() }; G]; 4];
    for kt in 0..kpad / 32 {
        // SAFETY: kt < kpad/32 and j + G·CH ≤ tn, so the G weight vectors lie inside the tile;
        // rows r..r+4 and k-run kt lie inside `a`.
        unsafe {
            let wb = t.wp.add(kt * tn * 32 + j * 32);
            let wv: [V::W; G] = std::array::from_fn(|p| V::load_w(wb.add(p * 32 * V::CH)));
            for (i, acc) in acc.iter_mut().enumerate() {
                let av = V::load_a(t.ap.add((r + i) * kpad + kt * 32));
                for (x, &wv) in acc.iter_mut().zip(&wv) {
                    *x = V::madd(*x, av, wv);
                }
            }
        }
    }
    let corr = std::array::from_fn(|i| t.corr(r + i));
    // SAFETY: rows r..r+4 ≤ rows, channels j..j + G·CH ≤ tn lie inside `out`.
    unsafe { V::finish4(&acc, corr, t.op.add(r * tn + j), tn) };
}

/// Row `r` × the `N · CH` channels from `j`, accumulators in registers.
///
/// # Safety
/// As [`body`], for that row and those channels.
#[inline(always)]
unsafe fn row<V: TileVec, const N: usize>(t: &Tile<'_, V::Elem>, r: usize, j: usize) {
    let (kpad, tn) = (t.kpad, t.tn);
    // SAFETY: register-only; the caller enabled V's instructions.
    let mut acc = [unsafe { V::zero() }; N];
    for kt in 0..kpad / 32 {
        // SAFETY: the activation run (row r, k-run kt) lies inside `a`; the N weight vectors at
        // kt·tn·32 + j·32 (j + N·CH ≤ tn) inside the tile.
        unsafe {
            let av = V::load_a(t.ap.add(r * kpad + kt * 32));
            let wb = t.wp.add(kt * tn * 32 + j * 32);
            for (p, x) in acc.iter_mut().enumerate() {
                *x = V::madd(*x, av, V::load_w(wb.add(p * 32 * V::CH)));
            }
        }
    }
    // SAFETY: row r < rows, channels j..j + N·CH ≤ tn lie inside `out`.
    unsafe { V::finish(&acc, t.corr(r), t.op.add(r * tn + j)) };
}

/// The single row (M = 1) × channels `c0..c0 + width`, the tile read in memory order.
///
/// # Safety
/// As [`body`], with one row and `c0 + width ≤ tn`, `width ≤ WIDE_CHANNELS` a multiple of `CH`.
#[inline(always)]
unsafe fn wide_row<V: TileVec>(t: &Tile<'_, V::Elem>, c0: usize, width: usize) {
    let (kpad, tn) = (t.kpad, t.tn);
    let n = width / V::CH;
    // SAFETY: register-only; the caller enabled V's instructions.
    let mut acc = [unsafe { V::zero() }; WIDE_CHANNELS];
    for kt in 0..kpad / 32 {
        let base = kt * tn * 32 + c0 * 32;
        if V::PREFETCH {
            // Lines past the tile are usually the next tile this thread computes (a weight's
            // N-tiles are contiguous and the drivers hand each thread a run of them).
            for l in 0..(width * 32).div_ceil(64) {
                // SAFETY: a prefetch never faults; `wrapping_add` forms the address without
                // claiming it is in bounds.
                unsafe { V::prefetch(t.wp.wrapping_add(base + AHEAD + 64 * l)) };
            }
        }
        // SAFETY: k-run kt of the single row lies inside `a`; c0 + CH·(c + 1) ≤ c0 + width ≤ tn,
        // so the weight vector at `base + 32·CH·c` lies inside the tile.
        unsafe {
            let av = V::load_a(t.ap.add(kt * 32));
            for (c, x) in acc[..n].iter_mut().enumerate() {
                *x = V::madd(*x, av, V::load_w(t.wp.add(base + 32 * V::CH * c)));
            }
        }
    }
    // SAFETY: channels c0..c0 + width ≤ tn of the single row lie inside `out`.
    unsafe { V::finish(&acc[..n], t.corr(0), t.op.add(c0)) };
}
