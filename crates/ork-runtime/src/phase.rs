//! Engines per phase: one session, one KV cache (host memory), its prompt's matmuls on one
//! engine and its decode steps' on another — the NPU device (through the `.orkpack` and the
//! weight cache) and the CPU engine (the GGUF's blocks at their own bits), in either order.
//!
//! The session says which phase a forward pass is ([`ork_exec::Phase`]: a prompt chunk, the
//! verification of drafted tokens and perplexity are [`Phase::Prefill`]; the next token of each
//! sequence, alone or in a server's batched step, is [`Phase::Decode`]); [`PhaseLinear`] hands
//! the pass the engine of that phase ([`Linear::for_phase`]). Nothing is guessed from the number
//! of rows. See `docs/architecture.md`, "Engines per phase".

use std::sync::Arc;

use ork_exec::{ExecError, Linear, Phase, WeightId};

use crate::{EngineConfig, PackChoice, RuntimeError};

/// Which engine computes a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseEngine {
    /// The engine's device (emulated NPU, rknpu, rknn), int8 weights through the weight cache.
    Device,
    /// The CPU engine, in place from the GGUF's map at the file's bits.
    Cpu,
    /// Each matmul's rows split between the device and the CPU engine, both at once
    /// ([`crate::SplitLinear`], `--decode-device split`, `--prefill-device split`).
    Split,
}

impl PhaseEngine {
    /// Whether this phase's engine is, or includes, `engine` (a split includes both).
    pub fn includes(self, engine: PhaseEngine) -> bool {
        self == engine || self == PhaseEngine::Split
    }
}

/// The engine of each phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PhaseEngines {
    /// Prompt chunks, speculative verification, perplexity.
    pub prefill: PhaseEngine,
    /// Decode steps (one token per sequence; several sequences in a batched step).
    pub decode: PhaseEngine,
}

impl PhaseEngines {
    /// Both phases on `engine`.
    pub fn one(engine: PhaseEngine) -> PhaseEngines {
        PhaseEngines {
            prefill: engine,
            decode: engine,
        }
    }

    /// Whether the two phases run on different engines.
    pub fn mixed(self) -> bool {
        self.prefill != self.decode
    }

    /// Whether the run needs its engines named per phase (a config's `phases`): the phases
    /// differ, or a phase splits its rows between the two engines.
    pub fn per_phase(self) -> bool {
        self.mixed() || self.prefill == PhaseEngine::Split
    }

    /// Whether either phase runs on `engine`.
    pub fn uses(self, engine: PhaseEngine) -> bool {
        self.prefill.includes(engine) || self.decode.includes(engine)
    }

    /// The engine of `phase`.
    pub fn of(self, phase: Phase) -> PhaseEngine {
        match phase {
            Phase::Prefill => self.prefill,
            Phase::Decode => self.decode,
        }
    }
}

/// A matmul backend of one engine per phase: a forward pass asks [`Linear::for_phase`] for its
/// phase's engine and runs every matmul there.
///
/// A call made on the backend itself, outside a forward pass that named its phase, goes to the
/// prefill engine (the one that holds every weight in the model's own numbering either way;
/// the results of the two differ only by the engines' numerics).
pub struct PhaseLinear {
    prefill: Arc<dyn Linear>,
    decode: Arc<dyn Linear>,
}

impl PhaseLinear {
    /// `prefill` computes [`Phase::Prefill`]'s matmuls, `decode` [`Phase::Decode`]'s.
    pub fn new(prefill: Arc<dyn Linear>, decode: Arc<dyn Linear>) -> PhaseLinear {
        PhaseLinear { prefill, decode }
    }

    /// The engine of `phase`.
    pub fn engine(&self, phase: Phase) -> &Arc<dyn Linear> {
        match phase {
            Phase::Prefill => &self.prefill,
            Phase::Decode => &self.decode,
        }
    }
}

impl std::fmt::Debug for PhaseLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhaseLinear").finish_non_exhaustive()
    }
}

impl Linear for PhaseLinear {
    fn matmul(
        &self,
        weight: WeightId,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ExecError> {
        self.prefill.matmul(weight, x, m, y)
    }

    fn matmul_many(
        &self,
        weights: &[WeightId],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), ExecError> {
        self.prefill.matmul_many(weights, x, m, ys)
    }

    fn upcoming(&self, weights: &[WeightId]) {
        self.prefill.upcoming(weights);
    }

    fn for_phase(&self, phase: Phase) -> Option<&dyn Linear> {
        Some(&**self.engine(phase))
    }

    fn record(&self, event: ork_board::Event) {
        self.prefill.record(event);
    }
}

/// Where the device's packed (int8 …) weights come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NpuWeights {
    /// The `.orkpack`, converted once from the GGUF and read from then on.
    Pack,
    /// Stream-by-pack: no `.orkpack`; each weight is packed from the GGUF's blocks into the
    /// weight cache when it is needed, under the budget.
    StreamByPack,
}

/// The decision [`npu_weights`] made, with the figures it used.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NpuWeightSource {
    /// The choice.
    pub source: NpuWeights,
    /// The device's packed weights, bytes (the plan's model bytes).
    pub pack_bytes: u64,
    /// The GGUF file, bytes (its pages serve the CPU engine).
    pub gguf_bytes: u64,
    /// The RAM the two were held against, bytes (`None`: not known).
    pub ram_bytes: Option<u64>,
    /// Why, in words.
    pub why: String,
}

/// Where the device's weights come from for `config`: the `.orkpack` unless `--no-pack` says
/// otherwise, or, when the CPU engine computes a phase (its pages of the GGUF must stay in
/// RAM) and the pack plus the GGUF would not fit `ram_bytes`, stream-by-pack; a device that
/// holds only the dense weights ([`crate::DeviceWeights::Dense`]) packs them from the GGUF
/// (the default `.orkpack` would hold every expert too). An explicit `--pack FILE` is kept as
/// asked (the device reads only its weights from it).
pub fn npu_weights(
    config: &EngineConfig,
    pack_bytes: u64,
    gguf_bytes: u64,
    ram_bytes: Option<u64>,
) -> NpuWeightSource {
    let both = pack_bytes.saturating_add(gguf_bytes);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let (source, why) = match (
        &config.pack,
        config.engines().uses(PhaseEngine::Cpu),
        ram_bytes,
    ) {
        (PackChoice::None, _, _) => (NpuWeights::StreamByPack, "--no-pack".to_owned()),
        (PackChoice::Path(_), _, _) => (NpuWeights::Pack, "--pack names the file".to_owned()),
        (PackChoice::Default, _, _) if config.device_weights == crate::DeviceWeights::Dense => (
            NpuWeights::StreamByPack,
            format!(
                "the device holds only the dense weights ({:.0} MiB, a decode split): packed \
                 from the GGUF's blocks as the cache loads them, the experts never packed",
                mib(pack_bytes)
            ),
        ),
        (PackChoice::Default, false, _) => (
            NpuWeights::Pack,
            "the device computes every phase: the GGUF is read only to convert".to_owned(),
        ),
        (PackChoice::Default, true, Some(ram)) if both > ram => (
            NpuWeights::StreamByPack,
            format!(
                "pack {:.0} MiB + GGUF {:.0} MiB > RAM {:.0} MiB: the GGUF's pages serve the CPU \
                 engine, so the device's weights are packed from them as they are needed",
                mib(pack_bytes),
                mib(gguf_bytes),
                mib(ram)
            ),
        ),
        (PackChoice::Default, true, Some(ram)) => (
            NpuWeights::Pack,
            format!(
                "pack {:.0} MiB + GGUF {:.0} MiB fit RAM {:.0} MiB",
                mib(pack_bytes),
                mib(gguf_bytes),
                mib(ram)
            ),
        ),
        (PackChoice::Default, true, None) => (
            NpuWeights::Pack,
            "the RAM is not known (no /proc/meminfo): the pack, as without the CPU engine"
                .to_owned(),
        ),
    };
    NpuWeightSource {
        source,
        pack_bytes,
        gguf_bytes,
        ram_bytes,
        why,
    }
}

/// The host's RAM (`MemTotal` of `/proc/meminfo`), `None` where it cannot be read.
pub fn host_ram_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// A pairing the config cannot run, refused before anything is opened: the CPU engine named
/// for a phase without its options, or its options without a phase for it.
pub(crate) fn check_phases(config: &EngineConfig) -> Result<(), RuntimeError> {
    crate::split::check_split(config)?;
    let Some(p) = config.phases else {
        return Ok(());
    };
    match (p.uses(PhaseEngine::Cpu), config.cpu.is_some()) {
        (true, false) => Err(RuntimeError::Phases {
            what: format!(
                "the CPU engine computes the {} but the config gives no CPU options",
                if p.prefill == PhaseEngine::Cpu {
                    "prefill"
                } else {
                    "decode"
                }
            ),
        }),
        (false, true) => Err(RuntimeError::Phases {
            what: "CPU options were given but no phase runs on the CPU engine".to_owned(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn config(pack: PackChoice, engines: PhaseEngines) -> EngineConfig {
        let mut c = EngineConfig::new("m.gguf");
        c.pack = pack;
        c.cpu = engines
            .uses(PhaseEngine::Cpu)
            .then(ork_cpu::CpuOptions::default);
        c.phases = engines.per_phase().then_some(engines);
        c
    }

    const MIXED: PhaseEngines = PhaseEngines {
        prefill: PhaseEngine::Device,
        decode: PhaseEngine::Cpu,
    };

    #[test]
    fn the_pack_unless_pack_and_gguf_overflow_the_ram_beside_the_cpu_engine() {
        let mixed = config(PackChoice::Default, MIXED);
        let fits = npu_weights(&mixed, 600 * MIB, 400 * MIB, Some(1024 * MIB));
        assert_eq!(fits.source, NpuWeights::Pack);
        assert_eq!((fits.pack_bytes, fits.gguf_bytes), (600 * MIB, 400 * MIB));
        let over = npu_weights(&mixed, 700 * MIB, 400 * MIB, Some(1024 * MIB));
        assert_eq!(over.source, NpuWeights::StreamByPack);
        assert!(over.why.contains("700 MiB") && over.why.contains("1024 MiB"));
        // The device alone reads the GGUF only to convert: the pack, whatever the RAM.
        let alone = config(PackChoice::Default, PhaseEngines::one(PhaseEngine::Device));
        let big = npu_weights(&alone, 700 * MIB, 400 * MIB, Some(1024 * MIB));
        assert_eq!(big.source, NpuWeights::Pack);
        // What the user named is kept.
        let no_pack = config(PackChoice::None, MIXED);
        let small = npu_weights(&no_pack, MIB, MIB, Some(1024 * MIB));
        assert_eq!(small.source, NpuWeights::StreamByPack);
        let named = config(PackChoice::Path("p.orkpack".into()), MIXED);
        let kept = npu_weights(&named, 700 * MIB, 400 * MIB, Some(1024 * MIB));
        assert_eq!(kept.source, NpuWeights::Pack);
    }

    #[test]
    fn a_phase_on_the_cpu_needs_its_options() {
        let mut c = config(PackChoice::Default, MIXED);
        c.cpu = None;
        assert!(matches!(check_phases(&c), Err(RuntimeError::Phases { .. })));
        let mut c = config(PackChoice::Default, MIXED);
        c.phases = Some(PhaseEngines::one(PhaseEngine::Device));
        assert!(matches!(check_phases(&c), Err(RuntimeError::Phases { .. })));
        assert!(check_phases(&config(PackChoice::Default, MIXED)).is_ok());
    }
}
