//! Opening a model as the command line asks: the engine configuration from the model options,
//! the engine with its conversion bar and notices, the weight manifest, and the benches' packed
//! model size. Shared by the verbs that run a model (`run`, `perplexity`, `plan`, the benches,
//! `serve`).

use std::path::Path;

use anyhow::Result;
use ork_manifest::Manifest;
use ork_pack::PackDtype;
use ork_runtime::{plan_weights, Engine, EngineConfig, PackChoice};

use crate::cli::{DeviceArg, ModelOpts};

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The engine configuration the command line asks for (`--device cpu`: the CPU engine, with
/// `--threads` and `--cpus`; `--device` names the backend otherwise).
///
/// # Errors
/// `--cpus` without `--device cpu`.
pub(crate) fn engine_config(opts: &ModelOpts, trace: bool) -> Result<EngineConfig> {
    if opts.cpus.is_some() && opts.device != DeviceArg::Cpu {
        anyhow::bail!("--cpus chooses the CPU engine's cores: it needs --device cpu");
    }
    if opts.pin_mb.is_some() && opts.device != DeviceArg::Cpu {
        anyhow::bail!(
            "--pin-mb keeps the CPU engine's hot MoE experts in RAM: it needs --device cpu \
             (on a device, --budget-mb sets what stays resident)"
        );
    }
    let mut config = EngineConfig {
        model: opts.model.clone(),
        pack: match (&opts.pack, opts.no_pack) {
            (_, true) => PackChoice::None,
            (Some(p), false) => PackChoice::Path(p.clone()),
            (None, false) => PackChoice::Default,
        },
        budget_bytes: opts.budget_mb.map(|mb| mb << 20),
        device: opts
            .device
            .device_kind()
            .unwrap_or(ork_device::DeviceKind::Auto),
        domains: opts.domains,
        dtype: opts.dtype.into(),
        activations: opts.activations.into(),
        group: ork_pack::ScaleGroup::PerChannel,
        soc: opts.soc.into(),
        threads: opts.threads,
        prefetch: !opts.no_prefetch,
        trace,
        verify: !opts.no_verify,
        evict_src: env_flag("ORK_EVICT_SRC"),
        draft: None,
        expert_speculation: (!opts.no_speculate).then_some(1),
        smooth: opts.calib.as_ref().map(|calib| ork_runtime::Smoothing {
            alpha: opts.smooth,
            calib: calib.clone(),
            targets: opts.smooth_targets,
        }),
        kv_cache: opts.kv_cache.into(),
        cpu: (opts.device == DeviceArg::Cpu).then(|| ork_cpu::CpuOptions {
            threads: opts.threads,
            cpus: opts.cpus.clone().map(|c| c.0),
            expert_reads: ork_cpu::ExpertReadOptions {
                readahead: !opts.no_prefetch,
                pin_bytes: opts.pin_mb.unwrap_or(0) << 20,
            },
        }),
    };
    if let Some(q) = opts.quant {
        config.set_quant(q);
    }
    Ok(config)
}

/// Refuse `--device cpu` for a benchmark of the device path (`what` names it), with a message
/// saying where CPU figures come from instead.
pub(crate) fn refuse_cpu(opts: &ModelOpts, what: &str) -> Result<()> {
    if opts.device == DeviceArg::Cpu {
        anyhow::bail!(
            "{what} measures the device path (the .orkpack, the weight cache, streaming); \
             --device cpu has none of them: time the CPU engine with `ork run --device cpu` (its stats line)"
        );
    }
    Ok(())
}

/// Open the engine, drawing the conversion bar unless `quiet`; say on stderr why an existing
/// `.orkpack` was rebuilt, or that it could not be written and the run goes on from memory.
pub(crate) fn open_engine(config: EngineConfig, quiet: bool) -> Result<Engine> {
    open_loaded(Engine::load(config)?, quiet)
}

/// [`open_engine`] for a model already loaded (and checked by the caller).
pub(crate) fn open_loaded(loaded: ork_runtime::LoadedModel, quiet: bool) -> Result<Engine> {
    let bar = crate::progress::ConvertBar::hidden_until_started(quiet);
    let engine = loaded.open(Some(&bar))?;
    if let (Some(report), Some(path)) = (engine.convert_report(), engine.pack_path()) {
        // Say why an existing file was rewritten (stale, corrupt, other dtype …).
        if let Some(why) = report.rebuild.as_ref().filter(|_| report.rewritten) {
            if *why != ork_store::RebuildReason::Missing {
                eprintln!("[ork] rebuilt {}: {why}", path.display());
            }
        }
    }
    if let Some(e) = engine.pack_unwritable() {
        eprintln!(
            "[ork] warning: cannot write the weight cache ({e}); running without it (as --no-pack)"
        );
    }
    Ok(engine)
}

/// The bytes of every weight of `manifest` packed as `dtype` with per-channel scales (the
/// benches' model size).
pub(crate) fn packed_model_bytes(manifest: &Manifest, dtype: PackDtype) -> Result<u64> {
    Ok(plan_weights(
        manifest,
        dtype,
        ork_pack::ScaleGroup::PerChannel,
        u64::MAX / 4,
        u64::MAX / 4,
        1,
        4,
    )?
    .model_bytes)
}

/// The weight manifest of the GGUF at `path`.
pub(crate) fn open_manifest(path: &Path) -> Result<Manifest> {
    let gguf = ork_gguf::GgufFile::open(path)?;
    Ok(Manifest::from_gguf(&gguf)?)
}
