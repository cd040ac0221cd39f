//! Opening a model as the command line asks: the engine configuration from the model options,
//! the engine with its conversion bar and notices, the weight manifest, and the benches' packed
//! model size. Shared by the verbs that run a model (`run`, `perplexity`, `plan`, the benches,
//! `serve`).

use std::path::Path;

use anyhow::Result;
use ork_manifest::Manifest;
use ork_runtime::{Engine, EngineConfig, PackChoice, PhaseEngine, PhaseEngines};

use crate::cli::{DeviceArg, ModelOpts};

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The engine of each phase the command line asks for: `--prefill-device` and
/// `--decode-device`, each defaulting to `--device`.
pub(crate) fn phase_devices(opts: &ModelOpts) -> (DeviceArg, DeviceArg) {
    (
        opts.prefill_device.unwrap_or(opts.device),
        opts.decode_device.unwrap_or(opts.device),
    )
}

/// The device a run opens and the engine of each phase (`prefill`, `decode`): `None` for the
/// device when both phases are `cpu`; `None` for the phases when one engine computes both. A
/// decode split shares its rows with the device the prefill names, else with `device` (the
/// `--device` flag) when it names one, else with `auto` (an NPU if one is found, else the
/// emulator).
///
/// # Errors
/// Two different devices (a run opens one device; the other phase may be `cpu`).
pub(crate) fn phase_plan(
    (prefill, decode): (DeviceArg, DeviceArg),
    device: DeviceArg,
) -> Result<(Option<ork_device::DeviceKind>, Option<PhaseEngines>)> {
    let engine = |d: DeviceArg| match d {
        DeviceArg::Cpu => PhaseEngine::Cpu,
        DeviceArg::Split => PhaseEngine::Split,
        _ => PhaseEngine::Device,
    };
    let phases = PhaseEngines {
        prefill: engine(prefill),
        decode: engine(decode),
    };
    let named = |d: &DeviceArg| *d != DeviceArg::Cpu && *d != DeviceArg::Split;
    let mut devices: Vec<DeviceArg> = [prefill, decode].into_iter().filter(named).collect();
    if devices.is_empty() && [prefill, decode].contains(&DeviceArg::Split) {
        // A split beside `cpu` or another split: the split's device is `--device`'s.
        devices.push(Some(device).filter(named).unwrap_or(DeviceArg::Auto));
    }
    if let [a, b] = devices[..] {
        if a != b {
            anyhow::bail!(
                "--prefill-device {} with --decode-device {}: a run opens one device; pair a device with cpu, or name the same device for both",
                arg_name(a),
                arg_name(b)
            );
        }
    }
    let device = devices.first().and_then(|d| d.device_kind());
    Ok((device, phases.per_phase().then_some(phases)))
}

/// A `--device` value as the command line spells it.
pub(crate) fn arg_name(d: DeviceArg) -> String {
    use clap::ValueEnum;
    d.to_possible_value()
        .map_or_else(|| format!("{d:?}"), |v| v.get_name().to_owned())
}

/// The engine configuration the command line asks for (`--device cpu`: the CPU engine, with
/// `--threads` and `--cpus`; `--device` names the backend otherwise; `--prefill-device` and
/// `--decode-device` pair a device with the CPU engine, one per phase).
///
/// # Errors
/// `--cpus` without a phase on the CPU engine; two different devices.
pub(crate) fn engine_config(opts: &ModelOpts, trace: bool) -> Result<EngineConfig> {
    if opts.board.is_some() {
        anyhow::bail!(
            "--board chooses --device auto's engines for run, serve and plan; this command does \
             not choose by a board: name its engine with --device"
        );
    }
    config_for(opts, trace, phase_devices(opts), None)
}

/// [`engine_config`] for `ork run` and `ork serve`, with what `--device auto` chose on a board
/// (`replay`: `run --project`; see [`crate::auto::for_run`]).
pub(crate) fn engine_config_auto(
    opts: &ModelOpts,
    trace: bool,
    replay: bool,
) -> Result<(EngineConfig, crate::auto::Chosen)> {
    let (mut chosen, domains) = crate::auto::for_run(opts, replay)?;
    let mut config = config_for(opts, trace, (chosen.prefill, chosen.decode), domains)?;
    if chosen.by_projection() {
        // The chosen cores (every core where the projection says so) and, for a dense-only
        // split, a device holding the dense weights alone.
        chosen.apply(&mut config, (opts.cpus.is_some(), opts.threads.is_some()));
    }
    Ok((config, chosen))
}

/// The engine configuration for the engines `devices` and `domains` (`None`: `--domains`, else
/// [`crate::auto::run_domains`]).
fn config_for(
    opts: &ModelOpts,
    trace: bool,
    devices: (DeviceArg, DeviceArg),
    domains: Option<u32>,
) -> Result<EngineConfig> {
    let (device, phases) = phase_plan(devices, opts.device)?;
    let on_cpu = device.is_none() || phases.is_some();
    if opts.cpus.is_some() && !on_cpu {
        anyhow::bail!(
            "--cpus chooses the CPU engine's cores: it needs --device cpu, or a phase on cpu"
        );
    }
    if opts.pin_mb.is_some() && !on_cpu {
        anyhow::bail!(
            "--pin-mb keeps the CPU engine's hot MoE experts in RAM: it needs --device cpu, or \
             a phase on cpu or split (on a device, --budget-mb sets what stays resident)"
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
        device: device.unwrap_or(ork_device::DeviceKind::Auto),
        domains: 1,
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
        cpu: on_cpu.then(|| ork_cpu::CpuOptions {
            threads: opts.threads,
            cpus: opts.cpus.clone().map(|c| c.0),
            expert_reads: ork_cpu::ExpertReadOptions {
                readahead: !opts.no_prefetch,
                pin_bytes: opts.pin_mb.unwrap_or(0) << 20,
            },
        }),
        phases,
        ram_bytes: None,
        // `auto` is resolved against a board (`crate::cmd_split::resolve`).
        split_rows: None,
        prefill_split_rows: None,
        device_weights: ork_runtime::DeviceWeights::All,
    };
    crate::cmd_split::fixed_shares(&mut config, opts.split_rows);
    if let Some(q) = opts.quant {
        config.set_quant(q);
    }
    if device.is_some() {
        config.domains = domains
            .or_else(|| crate::auto::run_domains(opts, config.dtype, config.group))
            .unwrap_or(1);
    }
    Ok(config)
}

/// Refuse `--device cpu` for a benchmark of the device path (`what` names it), with a message
/// saying where CPU figures come from instead.
pub(crate) fn refuse_cpu(opts: &ModelOpts, what: &str) -> Result<()> {
    let (prefill, decode) = phase_devices(opts);
    if [prefill, decode]
        .iter()
        .any(|d| [DeviceArg::Cpu, DeviceArg::Split].contains(d))
    {
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

/// The benchmark drivers' front end (`ork_runtime::bench::stream`, `::spec`): engines open as
/// `ork run` opens them (the conversion bar, the rebuild notes).
pub(crate) fn bench_front() -> ork_runtime::bench::EngineFrontEnd<'static> {
    ork_runtime::bench::EngineFrontEnd {
        open: &open_for_bench,
    }
}

/// [`open_engine`] for the benchmark drivers: the engine's own error is handed over typed (the
/// spec benchmark looks for `RuntimeError::DraftTooLarge`).
fn open_for_bench(
    config: EngineConfig,
    quiet: bool,
) -> Result<Engine, ork_runtime::bench::FrontEndError> {
    open_engine(config, quiet).map_err(|e| match e.downcast::<ork_runtime::RuntimeError>() {
        Ok(e) => Box::new(e) as ork_runtime::bench::FrontEndError,
        Err(e) => e.into(),
    })
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

/// The weight manifest of the GGUF at `path`.
pub(crate) fn open_manifest(path: &Path) -> Result<Manifest> {
    let gguf = ork_gguf::GgufFile::open(path)?;
    Ok(Manifest::from_gguf(&gguf)?)
}

/// With engines per phase, one line on stderr at start-up: the engine of each phase and where
/// the device's weights come from, and why (the same as `--json`'s `engines` and
/// `npu_weights`).
pub(crate) fn say_engines(engine: &Engine) {
    if !engine.engines().per_phase() {
        return;
    }
    let mut line = format!("[ork] engines: {}", engine.compute_name());
    if let Some(l) = engine.cpu_linear() {
        let pool = l.pool();
        line.push_str(&format!(
            " (cpu: {} threads on cpus {})",
            pool.threads(),
            ork_cpu::topology::format_cpu_list(&pool.choice().cores)
        ));
    }
    if let Some(w) = engine.npu_weight_source() {
        let source = match w.source {
            ork_runtime::NpuWeights::Pack => "the .orkpack",
            ork_runtime::NpuWeights::StreamByPack => "stream-by-pack",
        };
        line.push_str(&format!(" | device weights from {source}: {}", w.why));
    }
    eprintln!("{line}");
}

/// Where the device's weights would come from for `config` (`ork plan`): the RAM is `ram`
/// (a board's, with `--project`), else the host's.
pub(crate) fn plan_weight_source(
    config: &EngineConfig,
    pack_bytes: u64,
    ram: Option<u64>,
) -> ork_runtime::NpuWeightSource {
    let gguf_bytes = std::fs::metadata(&config.model).map_or(0, |m| m.len());
    ork_runtime::npu_weights(
        config,
        pack_bytes,
        gguf_bytes,
        ram.or_else(ork_runtime::host_ram_bytes),
    )
}

/// `ork plan`'s line for the engines of the phases and the device's weights.
pub(crate) fn weight_source_line(
    config: &EngineConfig,
    w: &ork_runtime::NpuWeightSource,
) -> String {
    let e = config.engines();
    let name = |p: PhaseEngine| match p {
        PhaseEngine::Device => "device",
        PhaseEngine::Cpu => "cpu",
        PhaseEngine::Split => "split (device and cpu rows)",
    };
    let source = match w.source {
        ork_runtime::NpuWeights::Pack => "the .orkpack",
        ork_runtime::NpuWeights::StreamByPack => "stream-by-pack (no .orkpack)",
    };
    format!(
        "engines: prefill {}, decode {} | device weights from {source}: {}",
        name(e.prefill),
        name(e.decode),
        w.why
    )
}
