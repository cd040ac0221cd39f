//! The draft kept on the device beside the model for speculative decoding
//! (`docs/speculative.md`): the model's own first blocks, or a second, smaller model. Its
//! resident bytes are reserved from the budget before the model is planned.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use ork_device::Device;
use ork_exec::{ExecError, KvType, Linear, Model, Session, Tokenizer};
use ork_gguf::GgufFile;
use ork_manifest::{Manifest, WeightId};
use ork_residency::{DeviceBudget, DeviceMatmul, WeightCache};

use crate::cache::budgeted_cache;
use crate::pack::gguf_source;
use crate::plan::weight_bytes;
#[cfg(doc)]
use crate::Engine;
use crate::{EngineConfig, EngineLinear, RuntimeError};

/// A draft that lives on the device beside the model (speculative decoding,
/// `docs/speculative.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraftSource {
    /// The model's own first blocks and its output projection (an early exit), pinned in the
    /// model's weight cache, which the model's passes use too; `None` chooses the number of
    /// blocks: as many as fit beside the model's streaming working set, at most a quarter of
    /// them.
    SelfLayers(Option<usize>),
    /// A second, smaller GGUF with the model's vocabulary, packed at open into a cache of its
    /// own on the same device and budget, every weight pinned.
    Model(PathBuf),
}

/// Where the draft tokens of speculative decoding come from (`docs/speculative.md`): prompt
/// lookup, which needs nothing on the device, or a [`DraftSource`] the engine keeps beside its
/// model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraftKind {
    /// Prompt lookup: n-grams of the prompt and output so far, no model.
    Lookup,
    /// The model's own first N blocks and output projection (`None`: N chosen to fit).
    SelfLayers(Option<usize>),
    /// A second GGUF with the same vocabulary.
    Model(PathBuf),
}

impl DraftKind {
    /// What the engine keeps on the device for this draft ([`EngineConfig::draft`]).
    pub fn engine_source(&self) -> Option<DraftSource> {
        match self {
            DraftKind::Lookup => None,
            DraftKind::SelfLayers(n) => Some(DraftSource::SelfLayers(*n)),
            DraftKind::Model(p) => Some(DraftSource::Model(p.clone())),
        }
    }

    /// A short name for tables: `lookup`, `self`, `self:N`, or the file name.
    pub fn label(&self) -> String {
        match self {
            DraftKind::Lookup => "lookup".to_owned(),
            DraftKind::SelfLayers(None) => "self".to_owned(),
            DraftKind::SelfLayers(Some(n)) => format!("self:{n}"),
            DraftKind::Model(p) => p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
        }
    }

    /// The drafter of this kind over `engine`, whose configuration asked for its
    /// [`engine_source`](Self::engine_source); a draft model samples with `sampler` and stops
    /// drafting below probability `p_min`.
    ///
    /// # Errors
    /// [`RuntimeError::NoDraft`]: the engine was opened without the draft this kind needs.
    pub fn drafter(
        &self,
        engine: &crate::Engine,
        sampler: ork_exec::Sampler,
        p_min: f32,
    ) -> Result<Box<dyn ork_exec::Draft>, RuntimeError> {
        Ok(match self {
            DraftKind::Lookup => Box::new(ork_exec::LookupDraft::default()),
            DraftKind::SelfLayers(_) | DraftKind::Model(_) => {
                let d = engine.draft().ok_or_else(|| RuntimeError::NoDraft {
                    draft: self.label(),
                })?;
                Box::new(ork_exec::ModelDraft::new(d.session(), sampler, p_min))
            }
        })
    }
}

/// Weight bytes copied into device buffers so far by `engine`'s caches: the model's and a draft
/// model's.
pub fn bytes_moved(engine: &crate::Engine) -> u64 {
    engine.cache_stats().bytes_moved
        + engine
            .draft()
            .and_then(|d| d.cache())
            .map_or(0, |c| c.stats().bytes_moved)
}

/// The draft an engine keeps beside its model ([`EngineConfig::draft`]).
pub struct EngineDraft {
    source: DraftSource,
    label: String,
    model: Arc<Model>,
    linear: Arc<dyn Linear>,
    cache: Option<Arc<WeightCache>>,
    bytes: u64,
    kv_cache: KvType,
}

impl std::fmt::Debug for EngineDraft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineDraft")
            .field("draft", &self.label)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl EngineDraft {
    /// What the draft is: `self:N` (the model's first N blocks and output projection) or the
    /// draft model's file.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The source it was opened from (with the number of blocks chosen, for a self draft).
    pub fn source(&self) -> &DraftSource {
        &self.source
    }

    /// The draft's model (for a self draft, the truncated model).
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Device bytes the draft keeps resident, taken from the budget.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The draft model's own cache (`None` for a self draft, whose weights are pinned in the
    /// model's cache).
    pub fn cache(&self) -> Option<&Arc<WeightCache>> {
        self.cache.as_ref()
    }

    /// A new session of the draft (owned, as [`Engine::session`]).
    pub fn session(&self) -> Session {
        Session::new(Arc::clone(&self.model), Arc::clone(&self.linear)).with_kv_type(self.kv_cache)
    }
}

/// A draft model read and checked, before the plan.
struct LoadedDraft {
    path: PathBuf,
    gguf: Arc<GgufFile>,
    model: Arc<Model>,
    /// Its weights (ids of its own manifest) and their device bytes.
    weights: Vec<(WeightId, u64)>,
}

fn load_draft_model(
    path: &std::path::Path,
    config: &EngineConfig,
    tokenizer: &Tokenizer,
) -> Result<LoadedDraft, RuntimeError> {
    let err = |source: ExecError| RuntimeError::DraftModel {
        draft: path.to_path_buf(),
        source,
    };
    let gguf = Arc::new(GgufFile::open(path).map_err(|e| err(e.into()))?);
    let model = Arc::new(Model::load(&gguf).map_err(err)?);
    let draft_tokenizer = Tokenizer::from_gguf(&gguf).map_err(err)?;
    ork_exec::check_draft_vocabulary(tokenizer, &draft_tokenizer, &path.display().to_string())
        .map_err(err)?;
    let manifest = model.manifest();
    crate::check_weights(config, manifest)?;
    let weights = weight_bytes(manifest, config.dtype, config.group)?;
    Ok(LoadedDraft {
        path: path.to_path_buf(),
        gguf,
        model,
        weights,
    })
}

/// The draft's share of the budget, chosen before the model is planned: the draft model read
/// and checked, or the number of the model's own blocks a self draft keeps.
pub(crate) struct DraftReservation {
    model: Option<LoadedDraft>,
    self_layers: Option<usize>,
    /// The model's weights a self draft pins (empty otherwise).
    pub(crate) weights: HashSet<WeightId>,
    /// The model's manifest, whose ids `weights` are.
    manifest: Arc<Manifest>,
    /// Device bytes the draft keeps resident.
    pub(crate) bytes: u64,
}

impl DraftReservation {
    /// Reserve the config's draft: read and check a draft model, or choose the blocks of a self
    /// draft among the model's weights `all` (ids, device bytes; execution order) for `capacity`
    /// bytes (the budget or the window, the smaller) and `slots` prefetch slots.
    pub(crate) fn reserve(
        config: &EngineConfig,
        model: &Model,
        tokenizer: &Tokenizer,
        all: &[(WeightId, u64)],
        capacity: u64,
        slots: usize,
    ) -> Result<DraftReservation, RuntimeError> {
        let mut reservation = DraftReservation {
            model: None,
            self_layers: None,
            weights: HashSet::new(),
            manifest: Arc::clone(model.manifest()),
            bytes: 0,
        };
        match &config.draft {
            None => {}
            Some(DraftSource::Model(path)) => {
                let d = load_draft_model(path, config, tokenizer)?;
                reservation.bytes = d.weights.iter().map(|w| w.1).sum();
                reservation.model = Some(d);
            }
            Some(DraftSource::SelfLayers(n)) => {
                let n = match n {
                    Some(n) => *n,
                    None => self_draft_layers(config, model, all, capacity, slots)?,
                };
                reservation.weights = self_draft_weights(config, model, n)?;
                reservation.bytes = bytes_of(all, &reservation.weights);
                reservation.self_layers = Some(n);
            }
        }
        Ok(reservation)
    }

    /// Whether the self draft pins the model's weight `id`.
    pub(crate) fn holds(&self, id: WeightId) -> bool {
        self.weights.contains(&id)
    }

    /// The model's manifest (the name table of the ids the reservation holds).
    pub(crate) fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Which draft (`self:N` or the draft's file), as errors name it.
    pub(crate) fn label(&self) -> String {
        match (&self.model, self.self_layers) {
            (Some(d), _) => d.path.display().to_string(),
            (None, n) => format!("self:{}", n.unwrap_or(0)),
        }
    }

    /// Put the reserved draft on `device`: a draft model in a cache of its own booked in
    /// `device_budget`, every weight pinned and packed now; a self draft served by the model's
    /// `linear`, its weights already pinned in the model's cache.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open(
        self,
        config: &EngineConfig,
        device: &Arc<dyn Device>,
        device_budget: &Arc<DeviceBudget>,
        budget: u64,
        domains: u32,
        model: &Model,
        linear: &Arc<EngineLinear>,
    ) -> Result<Option<EngineDraft>, RuntimeError> {
        let draft_bytes = self.bytes;
        match (self.model, self.self_layers) {
            (Some(d), _) => {
                let dcache = budgeted_cache(
                    device,
                    gguf_source(&d.gguf, d.model.manifest(), config),
                    budget,
                    domains,
                    device_budget,
                )?;
                for &(id, _) in &d.weights {
                    dcache.pin(id)?;
                }
                let dcache = Arc::new(dcache);
                device_budget.register(&dcache);
                // Pack every draft weight now: no pass waits for one later.
                for &(id, _) in &d.weights {
                    drop(dcache.get(id)?);
                }
                let dm = DeviceMatmul::new(Arc::clone(&dcache), None)
                    .with_activations(config.activations);
                let linear = EngineLinear::new(dm, d.model.manifest());
                Ok(Some(EngineDraft {
                    label: d.path.display().to_string(),
                    source: DraftSource::Model(d.path),
                    model: d.model,
                    linear: Arc::new(linear),
                    cache: Some(dcache),
                    bytes: draft_bytes,
                    kv_cache: config.kv_cache,
                }))
            }
            (None, Some(n)) => Ok(Some(EngineDraft {
                source: DraftSource::SelfLayers(Some(n)),
                label: format!("self:{n}"),
                model: Arc::new(model.truncated(n).map_err(|e| model_error(config, e))?),
                linear: Arc::clone(linear) as Arc<dyn Linear>,
                cache: None,
                bytes: draft_bytes,
                kv_cache: config.kv_cache,
            })),
            (None, None) => Ok(None),
        }
    }
}

/// The executor's error about the config's model.
fn model_error(config: &EngineConfig, source: ExecError) -> RuntimeError {
    RuntimeError::Model {
        model: config.model.clone(),
        source,
    }
}

/// The matmul weights of the model's first `n` blocks and its output projection.
fn self_draft_weights(
    config: &EngineConfig,
    model: &Model,
    n: usize,
) -> Result<HashSet<WeightId>, RuntimeError> {
    Ok(model
        .truncated(n)
        .map_err(|e| model_error(config, e))?
        .matmul_weights()
        .iter()
        .map(|w| w.id)
        .collect())
}

/// Device bytes of the weights of `all` in `set`.
fn bytes_of(all: &[(WeightId, u64)], set: &HashSet<WeightId>) -> u64 {
    all.iter().filter(|w| set.contains(&w.0)).map(|w| w.1).sum()
}

/// Blocks of a self draft when the config does not say: as many as fit beside the model's
/// streaming working set (the planner's `slots + 1` largest remaining weights), at most a
/// quarter.
fn self_draft_layers(
    config: &EngineConfig,
    model: &Model,
    all: &[(WeightId, u64)],
    capacity: u64,
    slots: usize,
) -> Result<usize, RuntimeError> {
    let mut best = 1;
    for cand in 1..=(model.config().n_layer / 4).max(1) {
        let set = self_draft_weights(config, model, cand)?;
        let mut rest: Vec<u64> = all
            .iter()
            .filter(|w| !set.contains(&w.0))
            .map(|w| w.1)
            .collect();
        rest.sort_unstable_by(|a, b| b.cmp(a));
        let reserve: u64 = rest.iter().take(slots + 1).sum();
        if bytes_of(all, &set) + reserve > capacity {
            break;
        }
        best = cand;
    }
    Ok(best)
}
