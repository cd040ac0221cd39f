//! Some of a weight's output rows on the device, the rest left to another engine (the runtime's
//! decode row split, `docs/architecture.md`, "Engines per phase").
//!
//! The native blob is N-tile-major (`ork_pack::TiledLayout::index`): the rows of whole N-tiles
//! are a contiguous byte range of each chip-sized part, and that range is the native blob of
//! those rows alone (`docs/chip.md`). A row range that starts on a tile and ends on one (or at
//! the weight's last row) is therefore computed from views of the resident weight's buffer, with
//! the rows' own scales: no copy, no repack, the same quantization and kernel as the whole
//! weight's matmul, so each row's value is the one [`DeviceMatmul::matmul`] gives it.

use std::ops::Range;
use std::time::Instant;

use ork_device::split::{part_offsets, part_scales, Part};
use ork_pack::TiledLayout;

use super::DeviceMatmul;
use crate::cache::{Entry, WeightKey};
use crate::parts::PartOperand;
use crate::trace::Lane;
use crate::ResidencyError;

/// One part's share of a row range.
struct SubPart {
    /// Rows of the whole weight (for its scales).
    whole: Part,
    /// The same rows as columns of the range's output (`n` relative to the range's start).
    out: Part,
    /// Byte offset of its blob in the weight's buffer.
    offset: usize,
}

/// The parts' shares of `rows` (which start on an N-tile of `tn` rows), in the parts' order.
fn sub_parts(parts: &[Part], rows: &Range<usize>, tn: usize) -> Vec<SubPart> {
    parts
        .iter()
        .zip(part_offsets(parts))
        .filter_map(|(p, at)| {
            let (a, b) = (p.n.start.max(rows.start), p.n.end.min(rows.end));
            (a < b).then(|| {
                let layout = TiledLayout::new(p.layout.dtype, p.layout.k, b - a);
                let skip = (a - p.n.start) / tn * p.layout.n_tile_bytes();
                let part = |n: Range<usize>| Part {
                    n,
                    k: p.k.clone(),
                    layout,
                    bytes: p.bytes.clone(),
                };
                SubPart {
                    whole: part(a..b),
                    out: part(a - rows.start..b - rows.start),
                    offset: at + skip,
                }
            })
        })
        .collect()
}

impl DeviceMatmul {
    /// `y[m, rows.len()]`: output rows (channels) `rows` of the weight's matmul, each the value
    /// [`DeviceMatmul::matmul`] computes for it. `rows` must start on an N-tile of the weight's
    /// dtype (32 rows for int8) and end on one or at the weight's last row. The board clock
    /// records a matmul of those rows only.
    ///
    /// # Errors
    /// As [`DeviceMatmul::matmul`]; [`ResidencyError::Shape`] for a range that is empty, outside
    /// the weight or not on tiles.
    pub fn matmul_rows(
        &self,
        weight: impl WeightKey,
        rows: Range<usize>,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ResidencyError> {
        let id = weight.weight_id(&self.cache)?;
        let e = self.cache.entry(id)?;
        check_rows(&e, &rows, x, m, y)?;
        if let Some(p) = &self.prefetcher {
            p.advance(id);
        }
        let (name, k) = (&*e.name, e.layout.k);
        let parts = self.cache.parts_of(&e)?;
        let sub = sub_parts(&parts, &rows, e.layout.dtype.n_tile());
        let weight = self.cache.get_entry(id, &e)?;
        let domain = weight.buffer.domain();
        if let Some(rec) = self.events.get() {
            let layout = TiledLayout::new(e.layout.dtype, k, rows.len());
            crate::board::matmul(rec, id, &layout, m, domain.0, sub.len(), true);
        }
        let segmented = sub.iter().any(|p| p.out.k.len() != k);
        let device_err = |source| ResidencyError::Device {
            name: name.to_owned(),
            source,
        };
        let t0 = Instant::now();
        self.with_quantized(name, x, m, k, domain, segmented, |buf, scales, _| {
            let ops = sub
                .iter()
                .map(|p| {
                    Ok(PartOperand {
                        layout: p.out.layout,
                        bytes: weight
                            .buffer
                            .view(p.offset as u64, p.out.layout.blob_bytes() as u64)?,
                        scales: part_scales(
                            &weight.layout,
                            &weight.scales,
                            weight.group,
                            &p.whole,
                        )?,
                        group: weight.group,
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(device_err)?;
            let out: Vec<Part> = sub.iter().map(|p| p.out.clone()).collect();
            self.matmul_parts((&out, &ops), (k, rows.len()), buf, m, scales, y)
                .map_err(device_err)
        })?;
        if let Some(tr) = &self.trace {
            tr.span(Lane::Compute, "compute", name, t0, t0.elapsed());
        }
        Ok(())
    }
}

/// Error unless `rows` is a non-empty range of whole N-tiles of weight `e` (its last tile may
/// end at the weight's last row), `x` is `m × K` and `y` is `m × rows.len()`.
fn check_rows(
    e: &Entry,
    rows: &Range<usize>,
    x: &[f32],
    m: usize,
    y: &[f32],
) -> Result<(), ResidencyError> {
    let (k, n, tn) = (e.layout.k, e.layout.n, e.layout.dtype.n_tile());
    let shape = |what: String| ResidencyError::Shape {
        name: e.name.to_string(),
        what,
    };
    if rows.start >= rows.end || rows.end > n {
        return Err(shape(format!(
            "rows {rows:?} are not a range of its {n} rows"
        )));
    }
    if !rows.start.is_multiple_of(tn) || !(rows.end == n || rows.end.is_multiple_of(tn)) {
        return Err(shape(format!(
            "rows {rows:?} do not start and end on its {tn}-row tiles"
        )));
    }
    if m == 0 || m.checked_mul(k) != Some(x.len()) {
        return Err(shape(format!(
            "x has {} values, expected m·K = {m}·{k}",
            x.len()
        )));
    }
    if m.checked_mul(rows.len()) != Some(y.len()) {
        return Err(shape(format!(
            "y has {} values, expected m·rows = {m}·{}",
            y.len(),
            rows.len()
        )));
    }
    Ok(())
}
