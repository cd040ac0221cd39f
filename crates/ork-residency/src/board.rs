//! Recording the board clock's events (`ork_board::Event`, see `docs/board-model.md`): the
//! matmuls [`crate::DeviceMatmul`] submits and the loads [`crate::WeightCache`] makes, as they
//! happen, into an [`ork_board::Recorder`].

use ork_board::{Event, Loader, Recorder, WeightType};
use ork_pack::{PackDtype, TiledLayout};

use crate::cache::Requester;

/// The board clock's name of a weight's type.
pub(crate) fn weight_type(d: PackDtype) -> WeightType {
    match d {
        PackDtype::I8 => WeightType::Int8,
        PackDtype::I4 => WeightType::Int4,
        PackDtype::F16 => WeightType::Fp16,
    }
}

/// Record a matmul of `name` (`layout`) with `m` rows in `domain`, as `calls` device calls;
/// `quantized` when it quantized its own activations.
pub(crate) fn matmul(
    rec: &Recorder,
    name: &str,
    layout: &TiledLayout,
    m: usize,
    domain: u32,
    calls: usize,
    quantized: bool,
) {
    rec.push(Event::Matmul {
        weight: name.to_owned(),
        m,
        k: layout.k,
        n: layout.n,
        ty: weight_type(layout.dtype),
        bytes: layout.blob_bytes() as u64,
        domain,
        calls: calls as u32,
        quantized,
    });
}

/// Record a finished load of `name` that began after `after` matmuls.
pub(crate) fn load(
    rec: &Recorder,
    name: &str,
    layout: &TiledLayout,
    domain: u32,
    created: bool,
    by: Requester,
    after: u64,
) {
    rec.push(Event::Load {
        weight: name.to_owned(),
        bytes: layout.blob_bytes() as u64,
        domain,
        created,
        by: match by {
            Requester::Compute => Loader::Compute,
            Requester::Prefetch => Loader::Prefetch,
        },
        after,
    });
}
