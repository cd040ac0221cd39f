//! The pack kernel: rows → scales → quantized codes → native tiles, in parallel over N-tiles.

use crate::dispatch;
use crate::{PackDtype, PackError, PackedWeight, RowSource, TiledLayout};
use rayon::prelude::*;
use std::cell::RefCell;

/// Pack a weight read through `src` into `dtype`'s RK3588 native layout, on the current rayon
/// pool (the global one unless called inside [`rayon::ThreadPool::install`]; see [`pack_in`]).
///
/// - `I8`: per output channel `scale = absmax / 127`, `q = round(w · 127/absmax)` in `-127..=127`.
/// - `I4`: per output channel `scale = absmax / 7`, `q` in `-7..=7` (the symmetric range: `-8` is
///   never produced), two codes per byte in the order of [`crate::INT4_EVEN_K_IN_LOW_NIBBLE`].
/// - `F16`: values rounded to fp16 (nearest-even), scales all 1.0.
///
/// Rounding is half-to-even; an all-zero row gets scale 0 and zero codes. K is padded to 32 and
/// N to the dtype's tile height with zeros.
///
/// Memory: besides the output, each worker thread keeps one tile's rows as f32 (`tn × K`, e.g.
/// 72 KiB for int8 at K = 576) in a thread-local buffer that is reused by later tiles and packs.
///
/// # Errors
/// [`PackError::Shape`] for an empty or oversized shape, [`PackError::NonFinite`] if a row holds
/// NaN or ±Inf (one of the offending rows is named), [`PackError::F16Overflow`] if an fp16 row
/// holds a value beyond fp16's range, and whatever the source reports.
pub fn pack(src: &dyn RowSource, dtype: PackDtype) -> Result<PackedWeight, PackError> {
    let layout = layout_of(src, dtype)?;
    let mut data = vec![0u8; layout.blob_bytes()];
    let mut scales = vec![0f32; layout.n];
    pack_into(src, dtype, &mut data, &mut scales)?;
    Ok(PackedWeight {
        layout,
        data,
        scales,
        group: crate::ScaleGroup::PerChannel,
    })
}

/// [`pack`] on the given thread pool.
///
/// # Errors
/// As [`pack`].
pub fn pack_in(
    pool: &rayon::ThreadPool,
    src: &dyn RowSource,
    dtype: PackDtype,
) -> Result<PackedWeight, PackError> {
    pool.install(|| pack(src, dtype))
}

/// [`pack`] into caller-provided buffers (e.g. a device buffer or a mapped cache file), which
/// must be exactly `layout.blob_bytes()` and `layout.n` long. Every byte of `data` is written,
/// padding included, so the buffers need not be zeroed.
///
/// # Errors
/// [`PackError::Length`] if a buffer has the wrong length, otherwise as [`pack`]. On error the
/// buffers hold partial output.
pub fn pack_into(
    src: &dyn RowSource,
    dtype: PackDtype,
    data: &mut [u8],
    scales: &mut [f32],
) -> Result<TiledLayout, PackError> {
    let layout = layout_of(src, dtype)?;
    expect_len("packed blob", layout.blob_bytes(), data.len())?;
    expect_len("scales", layout.n, scales.len())?;
    let tn = dtype.n_tile();
    data.par_chunks_mut(layout.n_tile_bytes())
        .zip(scales.par_chunks_mut(tn))
        .enumerate()
        .try_for_each(|(tile, (out, tile_scales))| {
            pack_tile(src, &layout, tile * tn, out, tile_scales)
        })?;
    Ok(layout)
}

/// The layout `src` packs into, with the shape checks every entry point needs.
pub(crate) fn layout_of(src: &dyn RowSource, dtype: PackDtype) -> Result<TiledLayout, PackError> {
    let (k, n) = (src.k(), src.n());
    let layout = TiledLayout::new(dtype, k, n);
    if k == 0 || n == 0 {
        return Err(PackError::Shape {
            k,
            n,
            reason: "empty weight",
        });
    }
    // Also bounds k·tn (one tile's scratch) since a tile is part of the blob.
    if layout.checked_blob_bytes().is_none() {
        return Err(PackError::Shape {
            k,
            n,
            reason: "packed size overflows usize",
        });
    }
    Ok(layout)
}

pub(crate) fn expect_len(what: &'static str, expected: usize, got: usize) -> Result<(), PackError> {
    if expected == got {
        Ok(())
    } else {
        Err(PackError::Length {
            what,
            expected,
            got,
        })
    }
}

thread_local! {
    /// Per-thread decode buffer of one tile's rows (`tn × K` f32), kept between tiles and packs.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Pack output channels `first .. first + scales.len()` into the N-tile `out`.
fn pack_tile(
    src: &dyn RowSource,
    layout: &TiledLayout,
    first: usize,
    out: &mut [u8],
    scales: &mut [f32],
) -> Result<(), PackError> {
    let mut run = |scratch: &mut Vec<f32>| {
        let need = scales.len() * layout.k;
        if scratch.len() < need {
            scratch.resize(need, 0.0);
        }
        let rows = &mut scratch[..need];
        src.read_rows(first, rows)?;
        dispatch::encode_tile(layout, first, rows, out, scales)
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => run(&mut scratch),
        // The thread's buffer is in use further up this stack: a source that runs rayon work
        // inside `read_rows` let this thread steal another tile. Use a buffer of its own.
        Err(_) => run(&mut Vec::new()),
    })
}
