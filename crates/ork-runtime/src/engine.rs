//! The engine: a model read and checked ([`Engine::load`], a [`LoadedModel`]), then opened on a
//! device ([`LoadedModel::open`]) in the steps this module names, each the business of a module
//! of its own; and what an opened engine tells a front end.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ork_cpu::{CpuPool, GgufLinear};
use ork_device::{ActPrecision, Device};
use ork_exec::{ChatTemplate, Linear, Model, Phase, Tokenizer};
use ork_gguf::GgufFile;
use ork_manifest::Manifest;
use ork_residency::{CacheStats, DeviceBudget, Plan, Trace, WeightCache};
use ork_store::ConvertReport;

use crate::cache::{model_cache, model_linear};
use crate::draft::DraftReservation;
use crate::pack::open_weight_source;
use crate::phase::{npu_weights, NpuWeightSource, NpuWeights, PhaseEngine, PhaseEngines};
use crate::plan::{plan_beside_draft, weight_bytes};
use crate::smoothing::apply_smoothing;
use crate::{
    budget_bytes, open_device, ConvertObserver, DeviceWeights, EngineConfig, EngineDraft,
    EngineLinear, ExpertStats, PackChoice, PhaseLinear, RuntimeError, SmoothingOrigin,
};

/// A model opened on a device or on the CPU engine: see the crate documentation.
pub struct Engine {
    pub(crate) config: EngineConfig,
    pub(crate) gguf: Arc<GgufFile>,
    pub(crate) manifest: Arc<Manifest>,
    pub(crate) model: Arc<Model>,
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) compute: Compute,
    /// The matmul backend sessions use: the device's [`EngineLinear`] or the CPU engine's
    /// [`GgufLinear`].
    pub(crate) linear: Arc<dyn Linear>,
    pub(crate) trace: Option<Arc<Trace>>,
    pub(crate) draft: Option<EngineDraft>,
    pub(crate) smoothing_origin: Option<SmoothingOrigin>,
    /// The decode row split, with `--decode-device split`.
    pub(crate) split: Option<Arc<crate::SplitLinear>>,
    /// The prefill row split, with `--prefill-device split`.
    pub(crate) prefill_split: Option<Arc<crate::SplitLinear>>,
}

/// What computes the matmuls.
pub(crate) enum Compute {
    /// A device, through the `.orkpack` and the weight cache.
    Device(Box<DeviceParts>),
    /// The CPU engine, in place from the GGUF's map (`--device cpu`).
    Cpu(Arc<GgufLinear>),
    /// Both, one per phase ([`crate::PhaseLinear`], `--prefill-device`/`--decode-device`).
    Mixed(Box<DeviceParts>, Arc<GgufLinear>),
}

/// What a device engine holds beside the model.
pub(crate) struct DeviceParts {
    pub(crate) device: Arc<dyn Device>,
    pub(crate) plan: Plan,
    pub(crate) cache: Arc<WeightCache>,
    pub(crate) device_budget: Arc<DeviceBudget>,
    pub(crate) linear: Arc<EngineLinear>,
    pub(crate) convert: Option<ConvertReport>,
    pub(crate) pack_path: Option<PathBuf>,
    pub(crate) pack_unwritable: Option<ork_store::StoreError>,
    pub(crate) weight_source: NpuWeightSource,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Engine");
        d.field("config", &self.config);
        match &self.compute {
            Compute::Device(p) => d.field("mode", &p.plan.mode).field("cache", &p.cache),
            Compute::Cpu(l) => d.field("cpu", l),
            Compute::Mixed(p, l) => d
                .field("mode", &p.plan.mode)
                .field("cache", &p.cache)
                .field("cpu", l),
        };
        d.finish_non_exhaustive()
    }
}

impl Engine {
    /// Open the model of `config` (see the crate documentation).
    ///
    /// # Errors
    /// Any failure to open, check, plan, convert or place the model, naming the file and tensor.
    pub fn open(config: EngineConfig) -> Result<Engine, RuntimeError> {
        Self::open_observed(config, None)
    }

    /// [`Engine::open`], telling `observer` about the `.orkpack` conversion.
    pub fn open_observed(
        config: EngineConfig,
        observer: Option<&dyn ConvertObserver>,
    ) -> Result<Engine, RuntimeError> {
        Engine::load(config)?.open(observer)
    }

    /// The first half of [`Engine::open`]: read and check the model, its tokenizer and its weight
    /// manifest, without opening a device or touching the `.orkpack`, so that a front end can
    /// refuse a request (a prompt longer than the context …) before a conversion that may take
    /// minutes on a large model.
    ///
    /// # Errors
    /// The GGUF cannot be opened, or its model, tokenizer or manifest is not usable.
    pub fn load(config: EngineConfig) -> Result<LoadedModel, RuntimeError> {
        crate::phase::check_phases(&config)?;
        check_cpu_options(&config)?;
        if let Some(n) = config.threads {
            // Before anything here runs in parallel: the first use of rayon's global pool
            // (loading the model uses it) builds it with one thread per core, and
            // `build_global` is then refused. The first call wins; later engines in the same
            // process share the pool ([`Engine::threads`] says how large it is).
            let _ = rayon::ThreadPoolBuilder::new()
                .num_threads(n.max(1))
                .build_global();
        }
        let gguf = Arc::new(GgufFile::open(&config.model)?);
        let model_err = |source| RuntimeError::Model {
            model: config.model.clone(),
            source,
        };
        let model = Arc::new(Model::load(&gguf).map_err(model_err)?);
        let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).map_err(model_err)?);
        let (gguf, model, smoothing) = match &config.smooth {
            Some(smooth) => {
                let s = apply_smoothing(&config, smooth, &gguf, &model, &tokenizer)?;
                (s.gguf, s.model, Some((s.record, s.origin)))
            }
            None => (gguf, model, None),
        };
        let manifest = Arc::new(Manifest::from_gguf(&gguf)?);
        if config.uses_device() {
            crate::check_weights(&config, &manifest)?;
        }
        Ok(LoadedModel {
            config,
            gguf,
            model,
            tokenizer,
            manifest,
            smoothing,
        })
    }
}

/// A model read and checked by [`Engine::load`], not yet on a device.
pub struct LoadedModel {
    config: EngineConfig,
    gguf: Arc<GgufFile>,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    manifest: Arc<Manifest>,
    smoothing: Option<(ork_store::PackSmoothing, SmoothingOrigin)>,
}

impl LoadedModel {
    /// The model's weight manifest (checked by [`crate::check_weights`] for the config's chip).
    pub fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LoadedModel {
    /// What the weights were smoothed with (recorded in the `.orkpack`), `None` without
    /// smoothing.
    pub fn smoothing(&self) -> Option<&ork_store::PackSmoothing> {
        self.smoothing.as_ref().map(|s| &s.0)
    }

    /// Where the smoothing factors came from, `None` without smoothing.
    pub fn smoothing_origin(&self) -> Option<SmoothingOrigin> {
        self.smoothing.as_ref().map(|s| s.1)
    }

    /// The GGUF the weights come from (the smoothed in-memory copy when the config smooths).
    pub fn gguf(&self) -> &Arc<GgufFile> {
        &self.gguf
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The model's chat template, if it has one, its output bounded by what the model's
    /// trained context can hold (`ork_exec::max_text_bytes`).
    ///
    /// # Errors
    /// A template that does not parse, naming the file.
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>, RuntimeError> {
        let max = ork_exec::max_text_bytes(&self.tokenizer, self.model.config().context_length);
        ChatTemplate::from_gguf(&self.gguf, &self.tokenizer)
            .map(|t| t.map(|t| t.with_max_bytes(max)))
            .map_err(|source| RuntimeError::Model {
                model: self.config.model.clone(),
                source,
            })
    }

    /// The second half of [`Engine::open`]: the device, the plan, the `.orkpack` (converted if
    /// needed, telling `observer`), the cache and the prefetcher.
    ///
    /// # Errors
    /// Any failure to open the device, plan, convert or place the model, naming file and tensor.
    pub fn open(self, observer: Option<&dyn ConvertObserver>) -> Result<Engine, RuntimeError> {
        let LoadedModel {
            config,
            gguf,
            model,
            tokenizer,
            manifest,
            smoothing,
        } = self;
        model.set_expert_speculation(config.expert_speculation);
        let engines = config.engines();
        let cpu = match &config.cpu {
            Some(options) if engines.uses(PhaseEngine::Cpu) => {
                Some(open_cpu(&config, options, &gguf, &model)?)
            }
            _ => None,
        };
        let on_device = if engines.uses(PhaseEngine::Device) {
            let parts = (&gguf, &manifest, &model, &tokenizer);
            Some(open_on_device(
                &config,
                parts,
                smoothing.as_ref(),
                observer,
            )?)
        } else {
            None
        };
        let (mut split, mut prefill_split) = (None, None);
        let (compute, linear, trace, draft) = match (on_device, cpu) {
            (Some(d), None) => {
                let linear = Arc::clone(&d.parts.linear) as Arc<dyn Linear>;
                (Compute::Device(d.parts), linear, d.trace, d.draft)
            }
            (None, Some(cpu)) => {
                let linear = Arc::clone(&cpu) as Arc<dyn Linear>;
                (Compute::Cpu(cpu), linear, None, None)
            }
            (Some(d), Some(cpu)) => {
                let device = Arc::clone(&d.parts.linear) as Arc<dyn Linear>;
                let host = Arc::clone(&cpu) as Arc<dyn Linear>;
                let engines_of = (&d.parts.linear, &cpu);
                split = crate::split::open_split(&config, Phase::Decode, engines_of, &manifest)?;
                prefill_split =
                    crate::split::open_split(&config, Phase::Prefill, engines_of, &manifest)?;
                let pick = |e: PhaseEngine, s: &Option<Arc<crate::SplitLinear>>| match (e, s) {
                    (PhaseEngine::Device, _) => Arc::clone(&device),
                    (PhaseEngine::Cpu, _) | (PhaseEngine::Split, None) => Arc::clone(&host),
                    (PhaseEngine::Split, Some(s)) => Arc::clone(s) as Arc<dyn Linear>,
                };
                let linear = Arc::new(PhaseLinear::new(
                    pick(engines.prefill, &prefill_split),
                    pick(engines.decode, &split),
                )) as Arc<dyn Linear>;
                (Compute::Mixed(d.parts, cpu), linear, d.trace, d.draft)
            }
            (None, None) => {
                return Err(RuntimeError::Phases {
                    what: "the CPU engine computes a phase but the config gives no CPU options"
                        .to_owned(),
                })
            }
        };
        Ok(Engine {
            config,
            gguf,
            manifest,
            model,
            tokenizer,
            linear,
            compute,
            trace,
            draft,
            smoothing_origin: smoothing.map(|s| s.1),
            split,
            prefill_split,
        })
    }
}

/// What [`open_on_device`] opened.
struct OnDevice {
    parts: Box<DeviceParts>,
    trace: Option<Arc<Trace>>,
    draft: Option<EngineDraft>,
}

/// The device side of an engine: the device, the plan, the weights' source (the `.orkpack`,
/// converted if needed and telling `observer`, or stream-by-pack), the cache, the prefetcher
/// and the draft.
fn open_on_device(
    config: &EngineConfig,
    (gguf, manifest, model, tokenizer): (
        &Arc<GgufFile>,
        &Arc<Manifest>,
        &Arc<Model>,
        &Arc<Tokenizer>,
    ),
    smoothing: Option<&(ork_store::PackSmoothing, SmoothingOrigin)>,
    observer: Option<&dyn ConvertObserver>,
) -> Result<OnDevice, RuntimeError> {
    let device = open_device(config.device, config.domains, config.soc)?;
    let info = device.info();
    let budget = budget_bytes(config.budget_bytes)?;
    let slots = info.cores as usize + 1;
    check_device_weights(config, manifest)?;
    let weights = crate::plan::device_weights(
        manifest,
        weight_bytes(manifest, config.dtype, config.group)?,
        config.device_weights,
    );
    // The draft's resident weights come out of the budget before the model is planned.
    let capacity = budget.min(info.window_bytes);
    let draft = DraftReservation::reserve(config, model, tokenizer, &weights, capacity, slots)?;
    let plan = plan_beside_draft(
        config,
        &weights,
        &draft,
        budget,
        info.window_bytes,
        info.domains,
        slots,
    )?;
    let weight_source = device_weight_source(config, manifest, plan.model_bytes);
    let streamed;
    let source_config = match weight_source.source {
        NpuWeights::StreamByPack if config.pack != PackChoice::None => {
            streamed = EngineConfig {
                pack: PackChoice::None,
                ..config.clone()
            };
            &streamed
        }
        _ => config,
    };
    let pack = open_weight_source(
        source_config,
        gguf,
        manifest,
        smoothing.map(|s| &s.0),
        observer,
    )?;
    let (cache, device_budget) = model_cache(
        &device,
        pack.source,
        &plan,
        manifest,
        model,
        budget,
        info.domains,
    )?;
    let trace = config.trace.then(|| Arc::new(Trace::new()));
    let linear = Arc::new(model_linear(
        config,
        &cache,
        &plan,
        slots,
        trace.clone(),
        model,
    ));
    let draft = draft.open(
        config,
        &device,
        &device_budget,
        budget,
        info.domains,
        model,
        &linear,
    )?;
    Ok(OnDevice {
        parts: Box::new(DeviceParts {
            device,
            plan,
            cache,
            device_budget,
            linear,
            convert: pack.convert,
            pack_path: pack.path,
            pack_unwritable: pack.unwritable,
            weight_source,
        }),
        trace,
        draft,
    })
}

/// [`npu_weights`] for the device's plan of `plan_bytes`: a dense model's dense weights are all
/// of them, so its pack stays the device's source with [`DeviceWeights::Dense`] too.
fn device_weight_source(
    config: &EngineConfig,
    manifest: &Manifest,
    plan_bytes: u64,
) -> NpuWeightSource {
    let all_held;
    let held = if manifest.n_expert() == 0 && config.device_weights == DeviceWeights::Dense {
        all_held = EngineConfig {
            device_weights: DeviceWeights::All,
            ..config.clone()
        };
        &all_held
    } else {
        config
    };
    npu_weights(
        held,
        plan_bytes,
        std::fs::metadata(&config.model).map_or(0, |m| m.len()),
        config.ram_bytes.or_else(crate::host_ram_bytes),
    )
}

/// A dense-only device ([`DeviceWeights::Dense`]) refused where it would have to compute a MoE's
/// experts: a phase wholly on the device (only a split phase, decode or prefill, whose experts
/// stay on the CPU, can run without them).
fn check_device_weights(config: &EngineConfig, manifest: &Manifest) -> Result<(), RuntimeError> {
    let engines = config.engines();
    let on_device = [engines.prefill, engines.decode].contains(&PhaseEngine::Device);
    if config.device_weights == DeviceWeights::Dense && manifest.n_expert() > 0 && on_device {
        return Err(RuntimeError::Phases {
            what: "the device holds only the dense weights, but a phase runs wholly on it and \
                   would compute the MoE's experts: pair the CPU and the row splits (a CPU or split \
                   prefill, a CPU or split decode)"
                .to_owned(),
        });
    }
    Ok(())
}

/// Options that only a device run takes, refused with the CPU engine rather than ignored
/// (before anything is computed: smoothing would run a calibration pass first).
fn check_cpu_options(config: &EngineConfig) -> Result<(), RuntimeError> {
    let engines = config.engines();
    if !engines.uses(PhaseEngine::Cpu) {
        return Ok(());
    }
    // A draft lives in the device's weight cache: with a device beside the CPU engine, it has one.
    if config.draft.is_some() && !engines.uses(PhaseEngine::Device) {
        return Err(RuntimeError::CpuOption {
            option: "a draft model (--draft)",
            why: "drafts are kept in a device's weight cache; use prompt lookup instead",
        });
    }
    if config.smooth.is_some() {
        return Err(RuntimeError::CpuOption {
            option: "smoothing (--calib)",
            why: "it reduces int8 activation error on the NPU; the CPU computes at the file's bits",
        });
    }
    Ok(())
}

/// The CPU engine's matmuls for `model`: its workers on the cores `options` choose, every
/// weight checked against its kernel ([`GgufLinear::open`]).
fn open_cpu(
    config: &EngineConfig,
    options: &ork_cpu::CpuOptions,
    gguf: &Arc<GgufFile>,
    model: &Model,
) -> Result<Arc<GgufLinear>, RuntimeError> {
    check_cpu_options(config)?;
    let pool = Arc::new(CpuPool::new(options)?);
    let reads = options.expert_reads.clone();
    let linear = GgufLinear::open_with(Arc::clone(gguf), model.matmul_weights(), pool, reads)?;
    Ok(Arc::new(linear))
}

impl Engine {
    /// The configuration it was opened with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The GGUF file.
    pub fn gguf(&self) -> &Arc<GgufFile> {
        &self.gguf
    }

    /// The model's weight manifest.
    pub fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The model's chat template, if it has one, its output bounded by what the model's
    /// trained context can hold (`ork_exec::max_text_bytes`).
    ///
    /// # Errors
    /// A template that does not parse, naming the file.
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>, RuntimeError> {
        let max = ork_exec::max_text_bytes(&self.tokenizer, self.model.config().context_length);
        ChatTemplate::from_gguf(&self.gguf, &self.tokenizer)
            .map(|t| t.map(|t| t.with_max_bytes(max)))
            .map_err(|source| RuntimeError::Model {
                model: self.config.model.clone(),
                source,
            })
    }

    /// The device's parts, `None` for the CPU engine.
    fn parts(&self) -> Option<&DeviceParts> {
        match &self.compute {
            Compute::Device(p) | Compute::Mixed(p, _) => Some(p),
            Compute::Cpu(_) => None,
        }
    }

    /// The engine of each phase.
    pub fn engines(&self) -> PhaseEngines {
        self.config.engines()
    }

    /// Where the device's packed weights come from and why (`None` for the CPU engine alone).
    pub fn npu_weight_source(&self) -> Option<&NpuWeightSource> {
        self.parts().map(|p| &p.weight_source)
    }

    /// The device, `None` for the CPU engine.
    pub fn device(&self) -> Option<&Arc<dyn Device>> {
        self.parts().map(|p| &p.device)
    }

    /// The name of what computes the matmuls: the device's, or `cpu`; with engines per phase,
    /// `prefill X, decode Y`.
    pub fn compute_name(&self) -> String {
        match &self.compute {
            Compute::Device(p) => p.device.info().name.to_string(),
            Compute::Cpu(_) => "cpu".to_owned(),
            Compute::Mixed(p, _) => {
                let name = |e, rows: &Option<crate::SplitRows>| match e {
                    PhaseEngine::Device => p.device.info().name.to_string(),
                    PhaseEngine::Cpu => "cpu".to_owned(),
                    PhaseEngine::Split => format!(
                        "split ({} {}, cpu the rest)",
                        p.device.info().name,
                        rows.as_ref()
                            .map_or_else(String::new, crate::SplitRows::describe)
                    ),
                };
                let (e, c) = (self.engines(), &self.config);
                format!(
                    "prefill {}, decode {}",
                    name(e.prefill, &c.prefill_split_rows),
                    name(e.decode, &c.split_rows)
                )
            }
        }
    }

    /// Compute threads: the CPU engine's workers, or for a device the size of rayon's global
    /// pool, which the forward pass runs on ([`EngineConfig::threads`] sizes it when the first
    /// engine of the process loads).
    pub fn threads(&self) -> usize {
        match &self.compute {
            Compute::Cpu(l) | Compute::Mixed(_, l) => l.pool().threads(),
            Compute::Device(_) => rayon::current_num_threads(),
        }
    }

    /// The residency plan in force, `None` for the CPU engine.
    pub fn plan(&self) -> Option<&Plan> {
        self.parts().map(|p| &p.plan)
    }

    /// The weight cache, `None` for the CPU engine.
    pub fn cache(&self) -> Option<&Arc<WeightCache>> {
        self.parts().map(|p| &p.cache)
    }

    /// The device's byte budget per domain, shared by every cache on it; `None` for the CPU
    /// engine.
    pub fn device_budget(&self) -> Option<&Arc<DeviceBudget>> {
        self.parts().map(|p| &p.device_budget)
    }

    /// MoE models on a device: expert cache hits and speculative prefetch counters so far,
    /// summed over the engine's sessions (`None` for a dense model, and for the CPU engine,
    /// which has no expert cache).
    pub fn expert_stats(&self) -> Option<ExpertStats> {
        let moe = self.model.moe_stats()?;
        let linear = &self.parts()?.linear;
        let calls = linear.expert_calls.load(Ordering::Relaxed);
        let hits = linear.expert_hits.load(Ordering::Relaxed);
        Some(ExpertStats {
            expert_matmuls: calls,
            expert_hits: hits,
            expert_hit_rate: if calls == 0 {
                0.0
            } else {
                hits as f64 / calls as f64
            },
            predictions: moe.predictions,
            recall: moe.recall(),
        })
    }

    /// The cache's counters so far (all zero for the CPU engine, which has no cache: nothing
    /// is loaded, every weight is read in place).
    pub fn cache_stats(&self) -> CacheStats {
        self.parts().map(|p| p.cache.stats()).unwrap_or_default()
    }

    /// Where the smoothing factors came from (a calibration pass, or the `.orkpack`), `None`
    /// without smoothing.
    pub fn smoothing_origin(&self) -> Option<SmoothingOrigin> {
        self.smoothing_origin
    }

    /// What the self-populating `.orkpack` did at open (`None` without a pack).
    pub fn convert_report(&self) -> Option<&ConvertReport> {
        self.parts()?.convert.as_ref()
    }

    /// Why the configured `.orkpack` could not be written, when the engine runs from memory
    /// instead (read-only directory, full disk …); `None` when the pack is in use or none was
    /// asked for.
    pub fn pack_unwritable(&self) -> Option<&ork_store::StoreError> {
        self.parts()?.pack_unwritable.as_ref()
    }

    /// The `.orkpack` in use, if any.
    pub fn pack_path(&self) -> Option<&PathBuf> {
        self.parts()?.pack_path.as_ref()
    }

    /// The timeline, when the config asked for one (device engines only).
    pub fn trace(&self) -> Option<&Arc<Trace>> {
        self.trace.as_ref()
    }

    /// The draft kept beside the model, when the config asked for one.
    pub fn draft(&self) -> Option<&EngineDraft> {
        self.draft.as_ref()
    }

    /// The device's matmul backend, `None` for the CPU engine.
    pub fn linear(&self) -> Option<&Arc<EngineLinear>> {
        self.parts().map(|p| &p.linear)
    }

    /// The CPU engine's matmul backend, `None` for a device.
    pub fn cpu_linear(&self) -> Option<&Arc<GgufLinear>> {
        match &self.compute {
            Compute::Cpu(l) | Compute::Mixed(_, l) => Some(l),
            Compute::Device(_) => None,
        }
    }

    /// The decode row split (`--decode-device split`), `None` without one.
    pub fn split_linear(&self) -> Option<&Arc<crate::SplitLinear>> {
        self.split.as_ref()
    }

    /// The prefill row split (`--prefill-device split`), `None` without one.
    pub fn prefill_split_linear(&self) -> Option<&Arc<crate::SplitLinear>> {
        self.prefill_split.as_ref()
    }

    /// Activation precision of the device matmuls.
    pub fn activations(&self) -> ActPrecision {
        self.config.activations
    }
}
