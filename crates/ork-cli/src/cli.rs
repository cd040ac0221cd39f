//! Command-line definitions (clap derive). The behaviour lives in the library crates; this file
//! only says what the user can type.

use clap::{Args, Parser, Subcommand, ValueEnum};
use ork_runtime::DraftKind;
use std::path::PathBuf;

/// Exit codes, shared by every verb.
pub const EXIT_HELP: &str = "\
Exit codes:
  0  success
  1  verify found a stale, corrupt or missing entry (each is named on stdout);
     probe stream found leaked buffers; probe persist read back different bytes;
     plan found the model cannot run (a weight larger than the budget or window)
  2  usage error, bad input or I/O error (one line on stderr names the file, tensor and problem)
  A closed standard output (`ork ... | head -c1`) ends the run quietly, killed by SIGPIPE
  (shells report 141); `ork serve` is never killed by a closed pipe. Text inputs (--prompt-file,
  --calib, perplexity --file, serve --chat-template-file) must be regular files of at most
  8 MiB (docs/cli.md).

Environment:
  ORK_PERSIST=PATH         .orkpack cache to read or build (same as --pack)
  ORK_WCACHE_BUDGET_MB=N   weight-cache budget in MiB (default 3072; same as --budget-mb)
  ORK_EVICT_SRC=1          drop each source tensor's pages once packed (same as --evict-src)";

/// ork: run LLMs on accelerators whose address window is smaller than the model.
#[derive(Parser, Debug)]
#[command(name = "ork", version, about, after_help = EXIT_HELP)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The chip whose matmul types and limits a run keeps to (docs/chip.md).
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum SocArg {
    /// RK3588: w8a8 (int8 × int8) and fp16 × fp16; no fp16 × int8/int4.
    Rk3588,
    /// RK3576: also fp16 × int8 (w8a16), fp16 × int4 (w4a16) and int8 × int4.
    Rk3576,
}

impl From<SocArg> for ork_device::Soc {
    fn from(s: SocArg) -> Self {
        match s {
            SocArg::Rk3588 => ork_device::Soc::Rk3588,
            SocArg::Rk3576 => ork_device::Soc::Rk3576,
        }
    }
}

/// Weight dtype on the device.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DtypeArg {
    /// int8 symmetric per output channel (w8a8).
    I8,
    /// int4 symmetric per output channel.
    I4,
    /// fp16 passthrough.
    F16,
}

impl From<DtypeArg> for ork_pack::PackDtype {
    fn from(d: DtypeArg) -> Self {
        match d {
            DtypeArg::I8 => ork_pack::PackDtype::I8,
            DtypeArg::I4 => ork_pack::PackDtype::I4,
            DtypeArg::F16 => ork_pack::PackDtype::F16,
        }
    }
}

/// Which device backend runs the matmuls.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DeviceArg {
    /// An NPU that can do the job if one is found, else the emulator (`ork_device::open`).
    Auto,
    /// The emulated RK3588 NPU (CPU, enforces the IOVA window).
    Emu,
    /// The Rockchip rknpu DRM driver (Linux, on the board).
    Rknpu,
    /// Rockchip's vendor runtime librknnrt.so (ORK_RKNN_LIB or the usual paths), computing
    /// through its matmul API (docs/rknn.md).
    Rknn,
    /// No device: the CPU engine computes every matmul in place from the GGUF's blocks, at the
    /// file's own bits (no .orkpack, no weight cache; docs/cpu.md). --threads and --cpus choose
    /// its workers.
    Cpu,
    /// `--decode-device split`, `--prefill-device split` (both: `--device split`): each of that
    /// phase's matmuls' rows split between the device (the other phase's when it names one,
    /// else `--device` when it names one, else `auto`: an NPU if one is found, else the
    /// emulator) and the CPU engine, both at once; `--split-rows` gives the device's share, one
    /// for all weights or `auto` (each weight's from the board clock, per phase;
    /// docs/architecture.md, "Engines per phase").
    Split,
}

impl DeviceArg {
    /// The device backend to open, `None` for the CPU engine and for the split (which uses the
    /// device another flag names).
    pub fn device_kind(self) -> Option<ork_device::DeviceKind> {
        match self {
            DeviceArg::Auto => Some(ork_device::DeviceKind::Auto),
            DeviceArg::Emu => Some(ork_device::DeviceKind::Emu),
            DeviceArg::Rknpu => Some(ork_device::DeviceKind::Rknpu),
            DeviceArg::Rknn => Some(ork_device::DeviceKind::Rknn),
            DeviceArg::Cpu | DeviceArg::Split => None,
        }
    }
}

/// A `--cpus` core list (one value, not a repeated flag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

/// Parse a `--cpus` core list (`4-7`, `0,2,4-5`).
pub fn cpus_parser(s: &str) -> Result<CpuList, String> {
    ork_cpu::topology::parse_cpu_list(s).map(CpuList)
}

/// The verbs.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Pack every matmul weight of a GGUF model into an .orkpack (pack → dump → free).
    Convert(ConvertArgs),
    /// List an .orkpack's header and entries.
    Inspect(InspectArgs),
    /// Check an .orkpack against its model: exit 0 if every entry is valid, 1 if any is stale or corrupt.
    Verify(VerifyArgs),
    /// Generate text with a model on the (emulated) NPU through the weight cache.
    Run(RunArgs),
    /// Perplexity of a text file (llama.cpp convention: second half of each window is scored).
    Perplexity(PerplexityArgs),
    /// Benchmarks; figures are ratios measured in the same run.
    Bench(BenchArgs),
    /// Device probes (DMA window, streaming, persistence).
    Probe(ProbeArgs),
    /// Placement plan: resident across domains, or streamed through the budgeted cache.
    Plan(PlanArgs),
    /// What this machine has for ork (CPU, NPU driver, librknnrt, IOMMU domains) and, where an
    /// NPU is there, whether it computes what the CPU computes: exit 0 if every check that
    /// could run passed, 1 if one failed.
    Doctor(DoctorArgs),
    /// OpenAI-compatible HTTP server with continuous batching (docs/serve.md).
    Serve(ServeArgs),
}

/// `ork doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// A model for the tiny run (8 greedy tokens on the NPU vs the emulator).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The chip the matmul checks keep to.
    #[arg(long, value_enum, default_value = "rk3588")]
    pub soc: SocArg,
    /// One JSON object instead of the text report.
    #[arg(long)]
    pub json: bool,
}

/// `ork serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences decoded together at most.
    #[arg(long, default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub max_seqs: usize,
    /// Requests waiting for a slot at most; beyond, 503 at once.
    #[arg(long, default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65536))]
    pub queue: usize,
    /// Context per sequence (default: the model's trained context).
    #[arg(long, value_parser = count_parser(2))]
    pub ctx: Option<usize>,
    /// Require `Authorization: Bearer KEY` on the /v1 routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Prompt tokens evaluated per step at most (how long a new request can delay the others).
    #[arg(long, default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65536))]
    pub prefill_chunk: usize,
    /// Seconds a drain (SIGTERM) lets running requests finish before cutting them.
    #[arg(long, default_value_t = 30, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(0..=86400))]
    pub drain_secs: u64,
    /// Seconds a connection has to send a complete request head once it is ready for one
    /// (after connecting or after its previous response): the header and idle timeout.
    #[arg(long, default_value_t = 15, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=3600))]
    pub header_timeout_secs: u64,
    /// Seconds a request body has to arrive after its head (beyond: 408).
    #[arg(long, default_value_t = 60, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=3600))]
    pub body_timeout_secs: u64,
    /// Connections open at once at most; one more is answered 503 and closed.
    #[arg(long, default_value_t = 256, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65536))]
    pub max_connections: usize,
    /// MiB of finished sequences' KV caches kept so that a request sharing their prefix (the
    /// next turn of a conversation) prefills only the rest; 0 turns prefix reuse off.
    #[arg(long, default_value_t = 256, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=1048576))]
    pub prefix_cache_mb: usize,
    /// Keep the prefix cache in DIR across restarts: read when the server starts, written
    /// (atomically, checksummed) when it stops, one file per model, quantization, device, KV
    /// cache type and context; a file made under other settings is never used.
    #[arg(long, value_name = "DIR")]
    pub prefix_cache_dir: Option<std::path::PathBuf>,
    /// With --prefix-cache-dir: write a changed prefix cache this often while serving, so that
    /// a power cut loses at most this much (the disk write runs beside decoding); 0: only when
    /// the server stops.
    #[arg(long, default_value_t = 60, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(0..=86400))]
    pub prefix_cache_save_secs: u64,
    /// A Jinja chat template to use instead of the GGUF's own (e.g. one that shows tools to
    /// the model; docs/serve.md, "Tool calls").
    #[arg(long, value_name = "FILE")]
    pub chat_template_file: Option<std::path::PathBuf>,
    /// Speculative verification: `lookup` (the one draft `serve` takes) drafts each greedy
    /// request's next tokens from its prompt and text (n-grams, no draft model) and verifies them
    /// within the batched step on the prefill engine (docs/serve.md, "Speculative verification").
    #[arg(long, value_parser = ["lookup"])]
    pub draft: Option<String>,
    /// Most draft tokens per verification (1 to 256).
    #[arg(long, requires = "draft", default_value_t = DEFAULT_DRAFT_MAX, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub draft_max: usize,
}

/// `ork convert`.
#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The GGUF model.
    pub model: PathBuf,
    /// Output file (default: MODEL with extension .orkpack).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Weight dtype.
    #[arg(long, value_enum, default_value = "i8")]
    pub dtype: DtypeArg,
    /// Quantization mode (see `ork run --help`); overrides --dtype.
    #[arg(long, value_parser = quant_parser, conflicts_with = "dtype")]
    pub quant: Option<ork_runtime::Quant>,
    /// The chip the pack is made for (recorded in it; a quant the chip lacks is refused).
    #[arg(long, value_enum, default_value = "rk3588")]
    pub soc: SocArg,
    /// A calibration text for SmoothQuant-style smoothing (docs/chip.md): a few hundred tokens
    /// run through the f32 reference to measure each channel's activation range, which is
    /// migrated into the weights before they are packed. Never the text perplexity is scored on.
    #[arg(long)]
    pub calib: Option<PathBuf>,
    /// Smoothing strength alpha in [0, 1] (with --calib): s = max|X|^alpha / max|W|^(1-alpha).
    /// Default 0.7, the best measured with the default targets (docs/chip.md).
    #[arg(long, default_value_t = 0.7, value_parser = parse_unit, requires = "calib")]
    pub smooth: f32,
    /// Which matmul inputs are smoothed (with --calib): norm (q/k/v and gate/up, after a norm),
    /// norm,vo (also attn_output, folded into v per head), norm,down (also ffn_down, folded
    /// into up) or all. Default norm,down, the best measured (docs/chip.md).
    #[arg(long, default_value_t = ork_exec::SmoothTargets::default(), value_parser = smooth_targets_parser, requires = "calib")]
    pub smooth_targets: ork_exec::SmoothTargets,
    /// Drop each source tensor's pages once packed (also ORK_EVICT_SRC=1).
    #[arg(long)]
    pub evict_src: bool,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = threads_parser())]
    pub threads: Option<usize>,
    /// Print one JSON object instead of text; no progress bar.
    #[arg(long)]
    pub json: bool,
}

/// `ork inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The .orkpack file.
    pub file: PathBuf,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// `ork verify`.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The .orkpack file.
    pub file: PathBuf,
    /// The GGUF model it should have been built from.
    #[arg(long)]
    pub model: PathBuf,
    /// Also repack every weight from the source and compare bytes.
    #[arg(long)]
    pub deep: bool,
    /// Dtype the pack is expected to hold (default: whatever the file holds).
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Options shared by the verbs that run a model.
#[derive(Args, Debug, Clone)]
pub struct ModelOpts {
    /// The GGUF model.
    #[arg(long)]
    pub model: PathBuf,
    /// .orkpack cache (read if valid, else built; default: ORK_PERSIST or MODEL.orkpack).
    #[arg(long)]
    pub pack: Option<PathBuf>,
    /// Do not use an .orkpack: pack every weight on the fly from the GGUF.
    #[arg(long, conflicts_with = "pack")]
    pub no_pack: bool,
    /// Weight-cache budget in MiB (default: ORK_WCACHE_BUDGET_MB or 3072).
    #[arg(long, value_parser = mib_parser())]
    pub budget_mb: Option<u64>,
    /// Device backend (both phases; see --prefill-device and --decode-device).
    #[arg(long, value_enum, default_value = "auto")]
    pub device: DeviceArg,
    /// Engines per phase: what computes the prompt's prefill, speculative verification and
    /// perplexity (default: --device). One of the two phases may be `cpu` and the other a
    /// device: one session, one KV cache (docs/architecture.md, "Engines per phase").
    #[arg(long, value_enum)]
    pub prefill_device: Option<DeviceArg>,
    /// Engines per phase: what computes the decode steps (one token per sequence; serve's
    /// batched steps too). Default: --device.
    #[arg(long, value_enum)]
    pub decode_device: Option<DeviceArg>,
    /// With --decode-device split or --prefill-device split: the device's share of each dense
    /// weight's rows, strictly between 0 and 1, the same for every weight and phase (rounded to
    /// the device's 32-row tiles per weight); or `auto` (the default): each weight its own
    /// share per phase, the one the board clock projects best for its type and size, on the
    /// board --project (run), --board, or this board (an rknpu driver) names; refused without a
    /// board (docs/board-model.md).
    #[arg(long, value_name = "FRACTION|auto", value_parser = crate::cmd_split::parse_split_rows)]
    pub split_rows: Option<crate::cmd_split::SplitArg>,
    /// IOMMU domains to use (1..=16). Default: on a board (--board, or an rknpu driver here),
    /// as many as the weights need to stay resident when they fit its RAM, as rkllm does;
    /// without a board, one unless the weights exceed one 4 GiB window; with --budget-mb, one.
    #[arg(long, value_parser = domains_parser())]
    pub domains: Option<u32>,
    /// The board --device auto chooses the engine of each phase for: a preset
    /// (`orangepi5-16g`, `pi5-16g`, …), a chip or a board file (`.json`, as --project takes);
    /// default: this board, where an rknpu driver is found (as `ork doctor` finds it). The
    /// pairing the board clock projects best runs (docs/architecture.md, "Engines per phase");
    /// without a board, auto means the NPU if one is found, else the emulator.
    #[arg(long, value_name = "BOARD|CHIP|FILE")]
    pub board: Option<String>,
    /// Skip checksum verification of blobs loaded from the .orkpack.
    #[arg(long)]
    pub no_verify: bool,
    /// Disable the prefetch thread and, for a resident plan, the first-pass loader (compute waits
    /// for every load).
    #[arg(long)]
    pub no_prefetch: bool,
    /// MoE models: no speculative expert prefetch in decode (experts are announced only once
    /// their block's router has run).
    #[arg(long)]
    pub no_speculate: bool,
    /// Write a Chrome trace-event (Perfetto) timeline of loads, computes and waits.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Worker threads for compute (default: all cores; with --device cpu, one per core it
    /// runs on).
    #[arg(long, value_parser = threads_parser())]
    pub threads: Option<usize>,
    /// With --device cpu (or a phase on cpu): the cores its workers run on, as `taskset -c`
    /// writes them (`4-7`); default: the big cores of a big.LITTLE CPU, else every core
    /// (docs/cpu.md).
    #[arg(long, value_parser = cpus_parser)]
    pub cpus: Option<CpuList>,
    /// With the CPU engine on a MoE model (--device cpu, or a phase on cpu or split): MiB of the
    /// most-routed experts kept locked in RAM (mlock; the rest are read ahead from storage as
    /// routed). Above the RAM: exit 2.
    #[arg(long, value_parser = mib_parser())]
    pub pin_mb: Option<u64>,
    /// Activation precision on the NPU: int8 per token (w8a8) or fp16 (w8a16; no activation
    /// quantization error, slower).
    #[arg(long = "act", value_enum, default_value = "i8")]
    pub activations: ActArg,
    /// Weight dtype on the device (the .orkpack is repacked if it holds another).
    #[arg(long, value_enum, default_value = "i8")]
    pub dtype: DtypeArg,
    /// The chip to keep to: a matmul type the chip lacks is refused (fp16 activations with
    /// int8/int4 weights exist on the rk3576 only).
    #[arg(long, value_enum, default_value = "rk3588")]
    pub soc: SocArg,
    /// Quantization mode, as rkllm names them: w8a8 (int8 per channel), w8a8-g128/-g256/-g512
    /// (int8 with one scale per 128/256/512 k where that divides K), w16a16 (fp16), and on the
    /// rk3576 only w4a16 (int4 per channel) and w4a16-g32/-g64/-g128 (int4 with one scale per
    /// 32/64/128 k where that divides K). Overrides --dtype and --act.
    #[arg(long, value_parser = quant_parser, conflicts_with_all = ["dtype", "activations"])]
    pub quant: Option<ork_runtime::Quant>,
    /// What the KV cache stores: f16 (half the memory, llama.cpp's default) or f32 (the values
    /// as computed). Host memory, not the device's (docs/kv-cache.md).
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_cache: KvCacheArg,
    /// A calibration text for SmoothQuant-style smoothing (docs/chip.md): a few hundred tokens
    /// run through the f32 reference to measure each channel's activation range, which is
    /// migrated into the weights before they are packed. Never the text perplexity is scored on.
    #[arg(long)]
    pub calib: Option<PathBuf>,
    /// Smoothing strength alpha in [0, 1] (with --calib): s = max|X|^alpha / max|W|^(1-alpha).
    /// Default 0.7, the best measured with the default targets (docs/chip.md).
    #[arg(long, default_value_t = 0.7, value_parser = parse_unit, requires = "calib")]
    pub smooth: f32,
    /// Which matmul inputs are smoothed (with --calib): norm (q/k/v and gate/up, after a norm),
    /// norm,vo (also attn_output, folded into v per head), norm,down (also ffn_down, folded
    /// into up) or all. Default norm,down, the best measured (docs/chip.md).
    #[arg(long, default_value_t = ork_exec::SmoothTargets::default(), value_parser = smooth_targets_parser, requires = "calib")]
    pub smooth_targets: ork_exec::SmoothTargets,
}

/// Parse a `--smooth-targets` list.
pub fn smooth_targets_parser(s: &str) -> Result<ork_exec::SmoothTargets, String> {
    s.parse()
}

/// Parse a `--quant` name.
pub fn quant_parser(s: &str) -> Result<ork_runtime::Quant, String> {
    s.parse()
}

/// What the KV cache stores.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum KvCacheArg {
    /// IEEE half precision.
    F16,
    /// f32.
    F32,
}

impl From<KvCacheArg> for ork_runtime::KvType {
    fn from(a: KvCacheArg) -> Self {
        match a {
            KvCacheArg::F16 => ork_runtime::KvType::F16,
            KvCacheArg::F32 => ork_runtime::KvType::F32,
        }
    }
}

/// Activation precision of the device matmuls.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum ActArg {
    /// int8, one scale per token (w8a8).
    I8,
    /// fp16 (w8a16).
    F16,
}

impl From<ActArg> for ork_device::ActPrecision {
    fn from(a: ActArg) -> Self {
        match a {
            ActArg::I8 => ork_device::ActPrecision::Int8,
            ActArg::F16 => ork_device::ActPrecision::F16,
        }
    }
}

/// `ork run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Prompt text.
    #[arg(
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    pub prompt: Option<String>,
    /// Read the prompt from a UTF-8 file.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 64, value_parser = count_parser(0))]
    pub n_predict: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Apply the model's chat template to the prompt.
    #[arg(long)]
    pub chat: bool,
    #[command(flatten)]
    pub speculative: SpecArgs,
    #[command(flatten)]
    pub project: crate::cmd_project::RunProject,
    /// Print one JSON object (with the text) instead of streaming.
    #[arg(long)]
    pub json: bool,
}

/// `lookup`, `self`, `self:N` or a GGUF path.
pub(crate) fn parse_draft(s: &str) -> Result<DraftKind, String> {
    match s {
        "lookup" => Ok(DraftKind::Lookup),
        "self" => Ok(DraftKind::SelfLayers(None)),
        _ => match s.strip_prefix("self:") {
            Some(n) => match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(DraftKind::SelfLayers(Some(n))),
                _ => Err(format!(
                    "self:{n}: the number of blocks must be a whole number ≥ 1"
                )),
            },
            None if s.is_empty() => Err("give lookup, self, self:N or a GGUF file".to_owned()),
            None => Ok(DraftKind::Model(PathBuf::from(s))),
        },
    }
}

/// Default `--draft-max`, chosen by measurement (`docs/speculative.md`).
pub const DEFAULT_DRAFT_MAX: usize = 8;

/// Speculative decoding options of `ork run`.
#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: draft tokens with `lookup` (prompt n-grams), `self` / `self:N` (the
    /// model's first N blocks) or a smaller GGUF with the same vocabulary, and verify them in
    /// one batched pass of the model.
    #[arg(long, value_parser = parse_draft)]
    pub draft: Option<DraftKind>,
    /// Most draft tokens per verifier pass (at least 1).
    #[arg(long, requires = "draft", default_value_t = DEFAULT_DRAFT_MAX, value_parser = count_parser(0))]
    pub draft_max: usize,
    /// A draft model stops drafting where its most likely token is below this probability.
    #[arg(long, requires = "draft", default_value_t = 0.0, value_parser = parse_unit)]
    pub draft_p_min: f32,
    /// Keep the draft length at --draft-max (no adapting to acceptance).
    #[arg(long, requires = "draft")]
    pub draft_fixed: bool,
    /// Tree verification: verify a tree of up to N drafted tokens per pass (branches at most
    /// --draft-max deep) instead of one chain; prompt lookup drafts its alternative followers as
    /// branches (docs/speculative.md).
    #[arg(long, requires = "draft", value_parser = count_parser(0))]
    pub draft_tree: Option<usize>,
}

/// A number in [0, 1].
pub(crate) fn parse_unit(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s} is not a number in [0, 1]")),
    }
}

/// `ork perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelOpts,
    /// The text to score.
    #[arg(long)]
    pub file: PathBuf,
    /// Context length per window.
    #[arg(long, default_value_t = 512, value_parser = count_parser(2))]
    pub ctx: usize,
    /// Score exactly this many windows (at least 1; the text must hold them).
    #[arg(long, value_parser = count_parser(1))]
    pub chunks: Option<usize>,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// `ork bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Which benchmark.
    #[command(subcommand)]
    pub which: BenchCommand,
}

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Pack throughput per source type, load vs memcpy, reload vs pack.
    Pack {
        /// The GGUF model to take weights from.
        #[arg(long)]
        model: PathBuf,
        /// Threads.
        #[arg(long, default_value_t = 1, value_parser = threads_parser())]
        threads: usize,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// The CPU engine (`--device cpu`): prefill and decode tok/s on the GGUF's own blocks.
    /// Compare with llama.cpp in the same run through `scripts/bench-cpu.sh`.
    Cpu {
        /// The GGUF model.
        #[arg(long)]
        model: PathBuf,
        /// Worker threads (default: one per chosen core).
        #[arg(long, value_parser = threads_parser())]
        threads: Option<usize>,
        /// The cores to run on, as `taskset -c` takes them (`4-7`, `0,2`).
        #[arg(long, value_parser = cpus_parser)]
        cpus: Option<CpuList>,
        /// Prompt tokens, prefilled in one batch.
        #[arg(long, default_value_t = 128, value_parser = count_parser(1))]
        prompt_tokens: usize,
        /// Tokens decoded one at a time after the prompt.
        #[arg(long, default_value_t = 64, value_parser = count_parser(1))]
        gen_tokens: usize,
        /// Timed passes after one untimed warm-up (best and median are reported).
        #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
        rounds: usize,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Emulated int8 matmul GOP/s against this machine's roofline.
    Gemm {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Speculative decoding: generation tok/s with each draft kind vs without, streamed at
    /// several budgets and resident, same run.
    Spec(SpecBenchArgs),
    /// Tokenizer build, encode and decode speed per model on one text, as ratios to the first
    /// model's (same run).
    Tokenizer {
        /// GGUF models whose tokenizers to compare (repeat the flag).
        #[arg(long, required = true)]
        model: Vec<PathBuf>,
        /// The text to encode (UTF-8).
        #[arg(long)]
        file: PathBuf,
        /// Timed rounds per model (the median is reported).
        #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
        rounds: usize,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Streamed vs resident prefill (and prefetch off), same run.
    Stream {
        #[command(flatten)]
        model: ModelOpts,
        /// Prefill tokens.
        #[arg(long, default_value_t = 512, value_parser = count_parser(1))]
        tokens: usize,
        /// Interleaved timed rounds per configuration (the median is reported).
        #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
        rounds: usize,
        /// Draw the timeline and bars as an SVG.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Measure decode instead of prefill: after a prefill of `--tokens` prompt tokens,
        /// decode this many tokens greedily (end-of-text ignored) per round, timing and counting
        /// the decode steps only; MoE models add a streamed run without speculative expert
        /// prefetch.
        #[arg(long, value_parser = count_parser(1))]
        decode: Option<usize>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `ork bench spec`.
#[derive(Args, Debug)]
pub struct SpecBenchArgs {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Tokens to generate per run.
    #[arg(long, default_value_t = 64, value_parser = count_parser(2))]
    pub tokens: usize,
    /// Interleaved timed rounds per configuration (the median is reported).
    #[arg(long, default_value_t = 2, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    pub rounds: usize,
    /// Most draft tokens per verifier pass.
    #[arg(long, default_value_t = DEFAULT_DRAFT_MAX, value_parser = count_parser(1))]
    pub draft_max: usize,
    /// Tokens per tree of the tree-verified lookup draft (`lookup-tree`).
    #[arg(long, default_value_t = 16, value_parser = count_parser(1))]
    pub draft_tree: usize,
    /// The drafts to compare with plain decoding: lookup, lookup-tree, self, model.
    #[arg(long, value_delimiter = ',', default_value = "lookup,lookup-tree,self,model", value_parser = ["lookup", "lookup-tree", "self", "model"])]
    pub drafts: Vec<String>,
    /// The draft model (default: the model's first eighth of blocks, written to a temporary
    /// GGUF).
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Weight budgets in MiB to stream at (default: 1/4, 1/2 and 3/4 of the model), besides
    /// the resident run.
    #[arg(long, value_delimiter = ',')]
    pub budgets_mb: Vec<u64>,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// `ork probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Which probe.
    #[command(subcommand)]
    pub which: ProbeCommand,
    /// Device backend.
    #[arg(long, value_enum, default_value = "emu", global = true)]
    pub device: DeviceArg,
    /// JSON output.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Create mode of the DMA probe.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DmaMode {
    /// MEM_CREATE only.
    Create,
    /// MEM_CREATE then map into host memory.
    CreateMmap,
}

/// Probes.
#[derive(Subcommand, Debug)]
pub enum ProbeCommand {
    /// Allocate DMA buffers until the window is full.
    Dma {
        /// Buffer size in MB (at most the 4096 MiB window).
        #[arg(long, default_value_t = 64, value_parser = window_mib_parser())]
        mb: u64,
        /// Create mode.
        #[arg(long, value_enum, default_value = "create")]
        mode: DmaMode,
        /// Domains to spread over (1..=16).
        #[arg(long, default_value_t = 1, value_parser = domains_parser())]
        domains: u32,
    },
    /// Pack/free cycles through the window.
    Stream {
        /// Total GB to cycle (0 < GB <= 1e6).
        #[arg(long, default_value_t = 26.8, value_parser = parse_total_gb)]
        total_gb: f64,
        /// Weight size in MB (at most the 4096 MiB window).
        #[arg(long, default_value_t = 268, value_parser = window_mib_parser())]
        mb: u64,
    },
    /// Dump a packed weight, reload it into a fresh buffer, compare; pack vs load time.
    Persist {
        /// Weight size in MB (a synthetic K×N weight; at most the 4096 MiB window).
        #[arg(long, default_value_t = 16, value_parser = window_mib_parser())]
        mb: u64,
    },
}

/// `ork plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The GGUF model.
    #[arg(long)]
    pub model: PathBuf,
    /// Window per domain in MiB.
    #[arg(long, default_value_t = 4096, value_parser = mib_parser())]
    pub window_mb: u64,
    /// Domains available (1..=16). Default: on a board (`--project`, `--board` or this one)
    /// and without `--budget-mb`, as many as the weights need (up to the board's count) when
    /// they fit its RAM beside its reserve, else 1; without a board, 1 unless the weights
    /// exceed one window (then as on a board, the host's RAM and the emulator's 16).
    #[arg(long, value_parser = domains_parser())]
    pub domains: Option<u32>,
    /// The board `--device auto` chooses the engines for (as `ork run --board`); the plan is
    /// projected on it. Default: `--project`'s board, else this board where an rknpu driver
    /// is found.
    #[arg(long, value_name = "BOARD|CHIP|FILE", conflicts_with = "project")]
    pub board: Option<String>,
    /// Weight-cache budget in MiB (default: ORK_WCACHE_BUDGET_MB or 3072).
    #[arg(long, value_parser = mib_parser())]
    pub budget_mb: Option<u64>,
    /// Weight dtype.
    #[arg(long, value_enum, default_value = "i8")]
    pub dtype: DtypeArg,
    /// Quantization mode (see `ork run --help`); overrides --dtype.
    #[arg(long, value_parser = quant_parser, conflicts_with = "dtype")]
    pub quant: Option<ork_runtime::Quant>,
    /// The chip to plan for: its matmul type pair and how weights beyond its limits are split.
    #[arg(long, value_enum, default_value = "rk3588")]
    pub soc: SocArg,
    /// Prefill tokens assumed for the per-token figures.
    #[arg(long, default_value_t = 512, value_parser = count_parser(1))]
    pub prefill_tokens: usize,
    /// `cpu`: plan the CPU engine instead (weights read in place, threads and cores, KV cache
    /// bytes; docs/cpu.md). The other values plan the NPU, as without the flag.
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Engines per phase: the prefill's engine (default: --device). With one phase on `cpu`
    /// and the other on a device, the plan says where the device's weights come from (the
    /// .orkpack, or stream-by-pack when the pack and the GGUF would not fit the RAM) and why.
    #[arg(long, value_enum)]
    pub prefill_device: Option<DeviceArg>,
    /// Engines per phase: the decode's engine (default: --device); `split` shares each decode
    /// matmul's rows between the device and the CPU engine (`split` for --prefill-device: each
    /// prefill matmul's).
    #[arg(long, value_enum)]
    pub decode_device: Option<DeviceArg>,
    /// With a split phase: the device's share of every dense weight's rows, or `auto` (the
    /// default): each weight's own per phase, as the board clock projects best on the board
    /// --project or --board names (refused without one).
    #[arg(long, value_name = "FRACTION|auto", value_parser = crate::cmd_split::parse_split_rows)]
    pub split_rows: Option<crate::cmd_split::SplitArg>,
    /// With --device cpu: worker threads (default: one per chosen core).
    #[arg(long, value_parser = threads_parser())]
    pub threads: Option<usize>,
    /// With --device cpu: the cores to run on (`4-7`; default: the big cores).
    #[arg(long, value_parser = cpus_parser)]
    pub cpus: Option<CpuList>,
    /// With --device cpu: the context the KV cache figure is for (default: the model's).
    #[arg(long, value_parser = count_parser(1))]
    pub ctx: Option<usize>,
    #[command(flatten)]
    pub project: crate::cmd_project::PlanProject,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

// Bounds of every user-given number: a value outside is refused with clap's usage error (exit
// 2), never clamped or reinterpreted, and every later multiplication (MiB → bytes, counts →
// buffers) stays far inside u64/usize.

/// Largest MiB figure accepted (16 TiB): `MiB << 20` cannot overflow.
pub const MAX_MIB: u64 = ork_runtime::MAX_BUDGET_MIB;
/// Most IOMMU domains (the emulator's and the RK3588's limit).
pub const MAX_DOMAINS: u32 = 16;
/// Largest token / window / context count accepted.
pub const MAX_COUNT: u64 = 1 << 24;
/// Largest buffer a probe allocates, in MiB: one IOVA window (4 GiB).
pub const WINDOW_MIB: u64 = 4096;

/// 1..=[`MAX_MIB`].
pub fn mib_parser() -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::new().range(1..=MAX_MIB)
}

/// 1..=[`WINDOW_MIB`].
fn window_mib_parser() -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::new().range(1..=WINDOW_MIB)
}

/// 1..=[`MAX_DOMAINS`].
fn domains_parser() -> clap::builder::RangedU64ValueParser<u32> {
    clap::builder::RangedU64ValueParser::new().range(1..=u64::from(MAX_DOMAINS))
}

/// 1..=1024 threads.
fn threads_parser() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..=1024)
}

/// `min..=MAX_COUNT`.
fn count_parser(min: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(min..=MAX_COUNT)
}

/// A finite GB figure in (0, 1e6].
fn parse_total_gb(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 && v <= 1e6 {
        Ok(v)
    } else {
        Err(format!("{s} is not in (0, 1e6]"))
    }
}
