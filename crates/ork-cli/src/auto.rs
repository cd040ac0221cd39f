//! `--device auto` on a board, and the automatic IOMMU domain count.
//!
//! The board is the one `--board NAME|FILE.json` names, else the one this machine is (as `ork
//! doctor` finds it: an rknpu driver that opens, its chip, `/proc/meminfo`'s RAM). On a board,
//! the engine of each phase is the pairing the board clock projects best for the model
//! (`ork_board::engines::RULE`), the decode row split among them (each weight at the share the
//! clock projects best for it); the NPU's phase runs on the NPU if this host has one, else on
//! the emulator, and the start-up line says which. Without a board, `auto` keeps its meaning:
//! the NPU if one is found, else the emulator. See docs/architecture.md, "Engines per phase".

use std::path::Path;

use anyhow::Result;
use ork_board::cpu::{CpuBoard, FITTED_CPU};
use ork_board::engines::{Cores, Engine as Side, NpuHolds, Pairing};
use ork_board::{Board, Projection};
use ork_manifest::Manifest;
use ork_pack::{PackDtype, ScaleGroup};
use ork_residency::{Mode, Plan as Placement};
use ork_runtime::Engine;

use crate::cli::{DeviceArg, ModelOpts};
use crate::cmd_engines::{PlanEngines, PROCESS_BYTES};
use crate::cmd_project::PlanProject;
use crate::cmd_split::ShareSource;

/// `engines_chosen_by` when no board is known.
pub const NO_BOARD: &str = "no board (no --board, no rknpu driver on this host): the NPU if one \
                            is found, else the emulator";

/// `engines_chosen_by` when `--device`, `--prefill-device` or `--decode-device` name them.
pub const COMMAND_LINE: &str = "command line";

/// A board the engines are chosen for.
#[derive(Debug)]
pub struct AutoBoard {
    /// Its name as printed (`orangepi5-16g`; this board: its chip, driver and RAM).
    pub label: String,
    /// The NPU's board (`None`: a CPU-only preset).
    pub npu: Option<Board>,
    /// The CPU engine's board (`None`: its CPU is not modelled).
    pub cpu: Option<CpuBoard>,
    /// IOMMU domains it gives: the driver's count on this board, else 16 (the RK3588 and
    /// RK3576 with the vendor driver 0.9.6+ and runtime 2.0+, as `ork doctor` says).
    pub domains: u32,
    /// Found on this machine rather than named.
    pub this_host: bool,
}

impl AutoBoard {
    /// The board `flag` names (a preset, a chip or a board file).
    pub fn named(flag: &str, name: &str) -> Result<AutoBoard> {
        let (npu, cpu) = crate::cmd_project::boards_named(flag, name)?;
        let label = npu
            .as_ref()
            .map(|b| b.name.clone())
            .or_else(|| cpu.as_ref().map(|c| c.name.clone()))
            .unwrap_or_else(|| name.to_owned());
        Ok(AutoBoard {
            label,
            npu,
            cpu,
            domains: ork_device::MAX_DOMAINS,
            this_host: false,
        })
    }

    /// This machine as `ork doctor` finds it: an rknpu driver that opens (buffers only), its
    /// chip (else `soc`) and the host's RAM; `None` without a driver.
    pub fn this_host(soc: ork_device::Soc) -> Option<AutoBoard> {
        let options = ork_device::OpenOptions::new().compute(false).soc(soc);
        let dev = ork_device::open(ork_device::DeviceKind::Rknpu, &options).ok()?;
        let info = dev.info();
        let chip = info.soc.unwrap_or(soc);
        let ram = ork_runtime::host_ram_bytes()?;
        let mut b = Board::named(&chip.to_string()).ok()?;
        b.ram_bytes = ram as f64;
        b.name = format!(
            "{chip} (this board: {}, {:.1} GiB RAM)",
            info.name,
            ram as f64 / (1u64 << 30) as f64
        );
        Some(AutoBoard {
            label: b.name.clone(),
            cpu: CpuBoard::of(&b, &FITTED_CPU),
            npu: Some(b),
            domains: info.domains,
            this_host: true,
        })
    }

    /// `--board NAME`'s board, else this machine's.
    pub fn resolve(arg: Option<&str>, soc: ork_device::Soc) -> Result<Option<AutoBoard>> {
        match arg {
            Some(name) => AutoBoard::named("--board", name).map(Some),
            None => Ok(AutoBoard::this_host(soc)),
        }
    }

    /// Where its plan may hold weights beyond one domain.
    pub fn room(&self, window: u64) -> Room {
        match &self.npu {
            Some(b) => Room::Board {
                ram: b.ram_bytes - b.reserved_bytes,
                domains: self.domains,
            },
            None => Room::emulator(window),
        }
    }
}

/// Where a plan may hold its weights in more than one IOMMU domain (`--domains` not given).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Room {
    /// A board: resident across as many domains as the weights need (up to `domains`), when
    /// they fit `ram` bytes beside ork's own ([`PROCESS_BYTES`]), as rkllm does; else one.
    Board {
        /// RAM beside the OS's reserve, bytes.
        ram: f64,
        /// The board's domains.
        domains: u32,
    },
    /// No board (the emulator): one domain, as before, unless the weights exceed one `window`;
    /// then as a board with the host's RAM (`None`: unknown, one domain) and the emulator's 16.
    Emulator {
        /// One domain's window, bytes.
        window: u64,
        /// The host's RAM beside a 1 GiB reserve, bytes.
        ram: Option<f64>,
    },
}

impl Room {
    /// The emulator on this host, with windows of `window` bytes.
    pub fn emulator(window: u64) -> Room {
        Room::Emulator {
            window,
            ram: ork_runtime::host_ram_bytes().map(|b| b as f64 - (1u64 << 30) as f64),
        }
    }
}

/// The plan `place(domains)` makes: with `domains` given, that; with `auto` (no `--domains`,
/// no `--budget-mb`), as [`Room`] says; otherwise one domain.
pub fn place<E>(
    domains: Option<u32>,
    auto: bool,
    room: Room,
    place: impl Fn(u32) -> Result<Placement, E>,
) -> Result<Placement, E> {
    let (ram, most, window) = match (domains, auto, room) {
        (Some(d), _, _) => return place(d),
        (None, false, _) => return place(1),
        (None, true, Room::Board { ram, domains }) => (Some(ram), domains, None),
        (None, true, Room::Emulator { window, ram }) => {
            (ram, ork_device::MAX_DOMAINS, Some(window))
        }
    };
    let one = place(1)?;
    let Some(ram) = ram.filter(|_| window.is_none_or(|w| one.model_bytes > w)) else {
        return Ok(one);
    };
    let p = place(most.max(1))?;
    if p.mode == Mode::Resident && p.model_bytes as f64 <= ram - PROCESS_BYTES {
        Ok(p)
    } else {
        Ok(one)
    }
}

/// What a plan of the model's weights needs besides the boards.
pub struct PlanInputs<'a> {
    /// The GGUF.
    pub model: &'a Path,
    /// Its weights.
    pub manifest: &'a Manifest,
    /// Weight dtype, scale groups and chip.
    pub quant: (PackDtype, ScaleGroup, ork_device::Soc),
    /// Budget per domain and window per domain, bytes.
    pub budget: u64,
    /// Window per domain, bytes.
    pub window: u64,
    /// `--domains`.
    pub domains: Option<u32>,
    /// Whether the domain count is automatic (no `--domains`, no `--budget-mb`).
    pub auto: bool,
    /// Where more than one domain may be used.
    pub room: Room,
}

/// The placement, the NPU's projection on `npu` (a runnable plan) and every pairing with the
/// CPU engine on `cpu`.
pub struct Projected {
    /// The residency plan.
    pub placement: Placement,
    /// A MoE's dense weights alone, placed as the pack is (what a dense-only split's NPU
    /// holds; `None`: a dense model, whose placement is `placement`).
    pub dense: Option<Placement>,
    /// The NPU's projection.
    pub npu: Option<Projection>,
    /// The pairings and the choice (`None` without a CPU board).
    pub engines: Option<PlanEngines>,
}

/// Plan the weights and project them on the boards (`ork plan`; `--device auto`'s choice).
pub fn project(
    i: &PlanInputs<'_>,
    (npu, cpu): (Option<&Board>, Option<&CpuBoard>),
    args: &PlanProject,
) -> Result<Projected> {
    let slots = ork_runtime::default_slots();
    let plan = |domains| {
        ork_runtime::plan_weights(
            i.manifest, i.quant.0, i.quant.1, i.budget, i.window, domains, slots,
        )
        .map_err(anyhow::Error::from)
    };
    let placement = place(i.domains, i.auto, i.room, plan)?;
    let dense = if i.manifest.n_expert() > 0 {
        let dense_plan = |domains| {
            ork_runtime::plan_dense_weights(
                i.manifest, i.quant.0, i.quant.1, i.budget, i.window, domains, slots,
            )
            .map_err(anyhow::Error::from)
        };
        Some(place(i.domains, i.auto, i.room, dense_plan)?)
    } else {
        None
    };
    let projected = match npu {
        Some(b) if placement.runnable => Some(crate::cmd_project::project_plan(
            i.model,
            i.manifest,
            &placement,
            b,
            args,
            i.quant,
            (slots, i.budget),
        )?),
        _ => None,
    };
    let engines = crate::cmd_engines::for_plan(
        i.model,
        i.manifest,
        cpu,
        (&placement, dense.as_ref()),
        i.budget,
        projected.as_ref(),
        (args.prompt_tokens as usize, args.gen_tokens as usize),
    )?;
    Ok(Projected {
        placement,
        dense,
        npu: projected,
        engines,
    })
}

/// `ork plan`'s placement and projection on `board` (`None`: none known), and what `--device
/// auto` chose for `given` (the command line's engines), `config`'s engines set to a board's
/// choice. This board, found rather than named: a model its clock cannot project is planned as
/// without a board, saying why.
pub fn plan_on_board(
    args: &crate::cli::PlanArgs,
    (board, given): (Option<&AutoBoard>, (DeviceArg, DeviceArg)),
    manifest: &Manifest,
    config: &mut ork_runtime::EngineConfig,
    (budget, window): (u64, u64),
) -> Result<(Projected, Chosen)> {
    if let Some(b) = board {
        refuse_npu_phases(b, given)?;
    }
    let inputs = PlanInputs {
        model: &args.model,
        manifest,
        quant: (config.dtype, config.group, config.soc),
        budget,
        window,
        domains: args.domains,
        auto: args.domains.is_none() && args.budget_mb.is_none(),
        room: board.map_or_else(|| Room::emulator(window), |b| b.room(window)),
    };
    let boards = board.map_or((None, None), |b| (b.npu.as_ref(), b.cpu.as_ref()));
    let mut chosen = Chosen::given(given);
    let projected = match (project(&inputs, boards, &args.project), board) {
        (Ok(x), Some(b)) => {
            chosen = Chosen::of(given, x.engines.as_ref(), &b.label);
            x
        }
        (Ok(x), None) => x,
        (Err(e), Some(b)) if b.this_host => {
            chosen.by = format!(
                "{} (the projection on {} failed: {e:#})",
                chosen.by, b.label
            );
            project(&inputs, (None, None), &args.project)?
        }
        (Err(e), _) => return Err(e),
    };
    if chosen.by_projection() {
        let phase = |d| match d {
            DeviceArg::Cpu => ork_runtime::PhaseEngine::Cpu,
            DeviceArg::Split => ork_runtime::PhaseEngine::Split,
            _ => ork_runtime::PhaseEngine::Device,
        };
        config.phases = Some(ork_runtime::PhaseEngines {
            prefill: phase(chosen.prefill),
            decode: phase(chosen.decode),
        });
        config.split_rows = chosen.splits.decode.as_ref().map(ShareSource::rows);
        config.prefill_split_rows = chosen.splits.prefill.as_ref().map(ShareSource::rows);
        chosen.apply(config, (args.cpus.is_some(), args.threads.is_some()));
    }
    Ok((projected, chosen))
}

/// `board`'s error for an NPU it does not have, `what` saying what needed one.
pub fn no_npu(board: &str, what: &str) -> String {
    format!("{board}: the board has no NPU {what}")
}

/// Refuse the engines the command line names (`given`) on a board without an NPU (a CPU-only
/// preset, `pi5-16g`) where a phase names a device or a split: the board cannot run it, and its
/// projection would be the CPU's. `auto` for both phases chooses among what the board has.
fn refuse_npu_phases(board: &AutoBoard, given: (DeviceArg, DeviceArg)) -> Result<()> {
    if board.npu.is_some() || given == (DeviceArg::Auto, DeviceArg::Auto) {
        return Ok(());
    }
    let phases = [("prefill", given.0), ("decode", given.1)];
    match phases.into_iter().find(|&(_, d)| d != DeviceArg::Cpu) {
        Some((phase, d)) => anyhow::bail!(
            "{}",
            no_npu(
                &board.label,
                &format!(
                    "for the {phase} ({}): run it on cpu (--{phase}-device cpu), or name a \
                     board with an NPU",
                    crate::open_model::arg_name(d)
                )
            )
        ),
        None => Ok(()),
    }
}

/// What `--device auto` chose, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Chosen {
    /// The prefill's engine.
    pub prefill: DeviceArg,
    /// The decode's engine.
    pub decode: DeviceArg,
    /// Why: `projection BOARD`, [`NO_BOARD`], [`COMMAND_LINE`], or why a board's projection
    /// could not choose.
    pub by: String,
    /// The chosen pairing as projected.
    pub pairing: Option<Pairing>,
    /// With a split chosen (decode, prefill or both): its shares per weight, as the projection
    /// that chose it made them.
    pub splits: crate::cmd_split::Splits,
    /// The CPU's cores the projection chose (`None`: no phase on the CPU, or not chosen by a
    /// projection).
    pub cores: Option<Cores>,
    /// What the projection chose for the NPU to hold (`None` likewise).
    pub npu_holds: Option<NpuHolds>,
    /// How the cores were applied to the run: the projection's, or the command line's
    /// `--cpus`/`--threads` over them (`None`: no phase on the CPU).
    pub cores_by: Option<String>,
    /// The model has MoE experts (a dense-only device differs from the whole pack only then).
    pub moe: bool,
}

impl Chosen {
    /// The engines the command line names (`auto` for both: [`NO_BOARD`]'s meaning).
    pub fn given((prefill, decode): (DeviceArg, DeviceArg)) -> Chosen {
        let auto = (prefill, decode) == (DeviceArg::Auto, DeviceArg::Auto);
        Chosen {
            prefill,
            decode,
            by: if auto { NO_BOARD } else { COMMAND_LINE }.to_owned(),
            pairing: None,
            splits: Default::default(),
            cores: None,
            npu_holds: None,
            cores_by: None,
            moe: false,
        }
    }

    /// The pairing `engines` chose on `board`, for `given` = (auto, auto); `given` otherwise.
    /// The NPU's phase is `auto` (the NPU if this host has one, else the emulator); a split
    /// decode is `split`, with the projection's shares per weight.
    pub fn of(given: (DeviceArg, DeviceArg), engines: Option<&PlanEngines>, board: &str) -> Chosen {
        let c = Chosen::given(given);
        let Some(e) = engines.filter(|_| c.by == NO_BOARD) else {
            return c;
        };
        let arg = |s: Side| match s {
            Side::Npu => DeviceArg::Auto,
            Side::Cpu => DeviceArg::Cpu,
            Side::Split => DeviceArg::Split,
        };
        let chosen = e.choice.engines;
        let on = |cores, holds| (Some(cores), Some(holds)) == (chosen.cores, chosen.npu_holds);
        let split = e
            .split_shares
            .as_ref()
            .filter(|s| chosen.decode == Side::Split && on(s.cores, s.npu_holds));
        let prefill_split = e
            .prefill_split
            .as_ref()
            .filter(|s| chosen.prefill == Side::Split && on(s.cores, s.npu_holds));
        let from = format!("--device auto's projection for {board} (projected)");
        Chosen {
            prefill: arg(chosen.prefill),
            decode: arg(chosen.decode),
            by: format!("projection {board}"),
            pairing: e.choice.chosen().copied(),
            splits: crate::cmd_split::Splits {
                prefill: prefill_split.map(|s| ShareSource::board_prefill(&s.split, from.clone())),
                decode: split.map(|s| ShareSource::board(&s.split, from)),
            },
            cores: chosen.cores,
            npu_holds: chosen.npu_holds,
            cores_by: None,
            moe: e.shape.weights.iter().any(|w| w.experts > 1),
        }
    }

    /// Apply the chosen cores and NPU holdings to `config` (whose engines are already the
    /// choice's): the CPU engine on every core where the choice says so (the command line's
    /// `--cpus` and `--threads`, `given`, override it and say so), and the device holding only
    /// the dense weights for a dense-only split of a MoE (a dense model's dense weights are its
    /// whole pack).
    pub fn apply(&mut self, config: &mut ork_runtime::EngineConfig, given: (bool, bool)) {
        if self.npu_holds == Some(NpuHolds::Dense) && self.moe {
            config.device_weights = ork_runtime::DeviceWeights::Dense;
        }
        let Some(cores) = self.cores else {
            return;
        };
        let said = match (cores, given) {
            (Cores::All, (false, _)) => {
                if let Some(cpu) = config.cpu.as_mut() {
                    cpu.cpus = Some(every_core());
                }
                "every core (the projection's choice)"
            }
            (Cores::Big, (false, _)) => "the big cores (the projection's choice)",
            (_, (true, _)) => "--cpus given (over the projection's)",
        };
        let threads = if given.1 {
            ", --threads given (over one per core)"
        } else {
            ""
        };
        self.cores_by = Some(format!("{said}{threads}"));
    }

    /// The pairing's name, with its cores and what the NPU holds.
    fn pairing_name(&self) -> Option<String> {
        let p = self.pairing?;
        Some(crate::cmd_engines::pairing_name(&p.engines()))
    }

    /// Whether a board's projection chose.
    pub fn by_projection(&self) -> bool {
        self.pairing.is_some()
    }

    /// The choice and its reason, for `ork plan`'s text and the start-up line.
    pub fn line(&self) -> String {
        let Some(p) = self.pairing else {
            return format!("engines chosen by: {}", self.by);
        };
        let cores = self
            .cores_by
            .as_ref()
            .map_or_else(String::new, |c| format!("; cpu cores: {c}"));
        format!(
            "engines chosen by: {}: {} (projected TTFT {:.2} s, decode {:.2} tok/s: the least \
             TTFT + decode time of the pairings; docs/architecture.md, \"Engines per \
             phase\"){cores}",
            self.by,
            self.pairing_name().unwrap_or_default(),
            p.ttft_s,
            p.decode_tok_s,
        )
    }
}

/// Every core the CPU engine may run on ([`ork_cpu::Topology::usable_cores`] of the process's
/// affinity mask).
pub fn every_core() -> Vec<usize> {
    ork_cpu::Topology::system().usable_cores(&ork_cpu::allowed_cpus())
}

/// The prompt and generated tokens a run's choice is projected for: `ork plan`'s defaults
/// (128 and 64), within the model's `context`.
fn run_request(context: usize) -> PlanProject {
    let prompt = 128.min(context / 2).max(1);
    PlanProject {
        prompt_tokens: prompt as u64,
        gen_tokens: 64.min(context.saturating_sub(prompt)).max(1) as u64,
        ..PlanProject::default()
    }
}

/// `ork run` and `ork serve`: the engines `--device auto` picks (`replay`: `run --project`,
/// which replays one device's work, keeps `auto`'s meaning) and the domain count, before the
/// model is loaded. A projection that fails keeps `auto`'s meaning and says why.
pub fn for_run(opts: &ModelOpts, replay: bool) -> Result<(Chosen, Option<u32>)> {
    let given = crate::open_model::phase_devices(opts);
    let soc = ork_device::Soc::from(opts.soc);
    let mut c = Chosen::given(given);
    let board = if c.by == NO_BOARD {
        AutoBoard::resolve(opts.board.as_deref(), soc)?
    } else {
        // The engines are given; `--board` still names a board and is checked, with them.
        if let Some(name) = opts.board.as_deref() {
            refuse_npu_phases(&AutoBoard::named("--board", name)?, given)?;
        }
        None
    };
    let Some(board) = board else {
        return Ok((c, None));
    };
    if replay {
        c.by = format!(
            "--project replays one device's work, so {} is not used to choose: the NPU if one \
             is found, else the emulator",
            board.label
        );
        return Ok((c, None));
    }
    match run_projection(opts, &board) {
        Ok((e, domains)) => Ok((Chosen::of(given, e.as_ref(), &board.label), Some(domains))),
        Err(e) => {
            c.by = format!(
                "{NO_BOARD} (the projection on {} failed: {e:#})",
                board.label
            );
            Ok((c, None))
        }
    }
}

/// The pairings on `board` for the run `opts` asks for, and the domains its plan uses.
fn run_projection(opts: &ModelOpts, board: &AutoBoard) -> Result<(Option<PlanEngines>, u32)> {
    let manifest = crate::open_model::open_manifest(&opts.model)?;
    let gguf = ork_gguf::GgufFile::open(&opts.model)?;
    let context = ork_exec::ModelConfig::from_gguf(&gguf)?.context_length;
    let mut config = ork_runtime::EngineConfig::new(&opts.model);
    config.dtype = opts.dtype.into();
    if let Some(q) = opts.quant {
        config.set_quant(q);
    }
    let window = crate::cli::WINDOW_MIB << 20;
    let room = match (board.room(window), Room::emulator(window)) {
        // The run allocates on this host too: the smaller RAM.
        (Room::Board { ram, domains }, Room::Emulator { ram: Some(h), .. }) => Room::Board {
            ram: ram.min(h),
            domains,
        },
        (r, _) => r,
    };
    let inputs = PlanInputs {
        model: &opts.model,
        manifest: &manifest,
        quant: (config.dtype, config.group, opts.soc.into()),
        budget: ork_runtime::budget_bytes(opts.budget_mb.map(|mb| mb << 20))?,
        window,
        domains: opts.domains,
        auto: opts.domains.is_none() && opts.budget_mb.is_none(),
        room,
    };
    let p = project(
        &inputs,
        (board.npu.as_ref(), board.cpu.as_ref()),
        &run_request(context),
    )?;
    // A dense-only split's device holds the dense weights, placed as such.
    let dense_only = p
        .engines
        .as_ref()
        .is_some_and(|e| e.choice.engines.npu_holds == Some(NpuHolds::Dense));
    let placed = p
        .dense
        .as_ref()
        .filter(|_| dense_only)
        .unwrap_or(&p.placement);
    Ok((
        p.engines,
        opts.domains.unwrap_or(placed.domains_used.max(1)),
    ))
}

/// The domains a run without a board uses when `--domains` is not given: one, unless the
/// weights exceed one window ([`Room::Emulator`]); `None` when the model cannot be read (its
/// load reports why).
pub fn run_domains(opts: &ModelOpts, dtype: PackDtype, group: ScaleGroup) -> Option<u32> {
    if let Some(d) = opts.domains {
        return Some(d);
    }
    let manifest = crate::open_model::open_manifest(&opts.model).ok()?;
    let budget = ork_runtime::budget_bytes(opts.budget_mb.map(|mb| mb << 20)).ok()?;
    let window = crate::cli::WINDOW_MIB << 20;
    let slots = ork_runtime::default_slots();
    let p = place(
        None,
        opts.budget_mb.is_none(),
        Room::emulator(window),
        |d| {
            ork_runtime::plan_weights(&manifest, dtype, group, budget, window, d, slots)
                .map_err(anyhow::Error::from)
        },
    )
    .ok()?;
    Some(p.domains_used.max(1))
}

/// The start-up line of a run whose `--device` is `auto` (stderr): the choice, its reason, and
/// what computes each phase on this host; where the NPU's phase runs on the emulator, it says
/// so.
pub fn say(chosen: &Chosen, engine: &Engine) {
    if chosen.by == COMMAND_LINE {
        return;
    }
    let mut line = format!(
        "[ork] --device auto: {}; running: {}",
        chosen.line(),
        engine.compute_name()
    );
    let emulated = engine
        .device()
        .is_some_and(|d| d.info().name.starts_with("emulated"));
    if chosen.by_projection() && emulated {
        line.push_str(" (this host has no NPU: the emulator computes the npu phase)");
    }
    eprintln!("{line}");
}
