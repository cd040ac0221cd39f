//! Recording the board clock's events (`ork_board::Event`, see `docs/board-model.md`): the
//! matmuls [`crate::DeviceMatmul`] submits and the loads [`crate::WeightCache`] makes, as they
//! happen, into an [`ork_board::Recorder`].

use std::sync::Arc;

use ork_board::{Event, Loader, Model, ModelWeight, Recorder, WeightType};
use ork_manifest::WeightId;
use ork_pack::{PackDtype, TiledLayout};

use crate::cache::Requester;

/// Where one model's device work is recorded: the run's recorder, and which of the run's models
/// the weights (the manifest's ids) are of.
#[derive(Clone, Debug)]
pub(crate) struct Recording {
    pub(crate) rec: Arc<Recorder>,
    pub(crate) model: Model,
}

impl Recording {
    fn weight(&self, id: WeightId) -> ModelWeight {
        ModelWeight {
            model: self.model,
            id,
        }
    }
}

/// The board clock's name of a weight's type.
pub(crate) fn weight_type(d: PackDtype) -> WeightType {
    match d {
        PackDtype::I8 => WeightType::Int8,
        PackDtype::I4 => WeightType::Int4,
        PackDtype::F16 => WeightType::Fp16,
    }
}

/// Record a matmul of weight `id` (`layout`) with `m` rows in `domain`, as `calls` device calls;
/// `quantized` when it quantized its own activations.
pub(crate) fn matmul(
    rec: &Recording,
    id: WeightId,
    layout: &TiledLayout,
    m: usize,
    domain: u32,
    calls: usize,
    quantized: bool,
) {
    rec.rec.push(Event::Matmul {
        weight: rec.weight(id),
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

/// Record a finished load of weight `id` that began after `after` matmuls.
pub(crate) fn load(
    rec: &Recording,
    id: WeightId,
    layout: &TiledLayout,
    domain: u32,
    created: bool,
    by: Requester,
    after: u64,
) {
    rec.rec.push(Event::Load {
        weight: rec.weight(id),
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
