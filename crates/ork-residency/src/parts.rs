//! A resident weight as the chip-sized parts it is computed in (see `docs/chip.md`, "Splitting a
//! weight into chip-sized parts").
//!
//! The cache stores a weight's blob in its **split order** ([`ork_device::split::part_offsets`]):
//! the parts' own native blobs one after another. For N-chunks of an unsplit K that is the
//! native blob unchanged; a weight with K-segments is rearranged once, when it is filled. Every
//! part is then a contiguous view of the weight's one buffer, and no task is ever submitted
//! beyond the chip's limits.

use std::borrow::Cow;

use ork_device::split::{part_offsets, part_scales, Part};
use ork_device::{BufferView, DeviceError, DeviceWeight, WeightRef};
use ork_pack::{ScaleGroup, TiledLayout};

/// One part of a resident weight, ready to be a task operand.
#[derive(Debug)]
pub(crate) struct PartOperand<'a> {
    /// The part's layout.
    pub layout: TiledLayout,
    /// Its bytes: a view of the weight's buffer.
    pub bytes: BufferView<'a>,
    /// Its scales (borrowed per channel, gathered for a K-segment of a grouped weight).
    pub scales: Cow<'a, [f32]>,
    /// The weight's scale group.
    pub group: ScaleGroup,
}

impl PartOperand<'_> {
    /// As a task operand.
    pub fn weight(&self) -> WeightRef<'_> {
        WeightRef {
            layout: self.layout,
            bytes: self.bytes,
            scales: &self.scales,
            group: self.group,
        }
    }
}

/// The operands of `weight` (stored in the split order of `parts`), in `parts`' order.
///
/// # Errors
/// [`DeviceError`] if the parts do not fit the weight's buffer or scales.
pub(crate) fn operands<'a>(
    weight: &'a DeviceWeight,
    parts: &[Part],
) -> Result<Vec<PartOperand<'a>>, DeviceError> {
    parts
        .iter()
        .zip(part_offsets(parts))
        .map(|(p, offset)| {
            Ok(PartOperand {
                layout: p.layout,
                bytes: weight
                    .buffer
                    .view(offset as u64, p.layout.blob_bytes() as u64)?,
                scales: part_scales(&weight.layout, &weight.scales, weight.group, p)?,
                group: weight.group,
            })
        })
        .collect()
}
