//! The board's CPU as an engine: GGUF weights computed at their own bits by dot-product kernels
//! on the big (and optionally little) cores, every weight read from the page cache (or storage)
//! over the board's one DDR bus.
//!
//! A pass of `m` rows costs, per matmul weight, the larger of its compute (multiply-adds ÷ 256 ×
//! the kernel's cycles per 256 weights, [`GGML_CYCLES`] at M = 1 and the prefill kernel's
//! [`GGML_GEMM_CYCLES`] ÷ the fitted `gemm_gain` at M > 1, shared among the threads as
//! [`Pool`] says: evenly as llama.cpp's row split, the slowest core setting the time, or in
//! chunks as ork's pool) and its reads (bytes ÷ the cores' read rate, the storage's for bytes
//! the page cache cannot hold); plus attention (the
//! [`HostKind::attention`] flops and bytes, as the NPU clock charges the host) and a fixed cost
//! per block and pass. Three parameters are fitted ([`crate::cpu_fit`]) on llama.cpp's published
//! RK3588 CPU figures. Every figure is a projection: see `docs/board-model.md`.

use serde::Serialize;

use crate::events::{Event, HostKind};
use crate::{Board, BoardError};

/// The CPU cost model's version, printed with its projections.
pub const CPU_MODEL: &str = "cpu-0.1+fit-rk-llama.cpp-readme+ggml-0.3.36-llvm-mca-14";

const GB: f64 = 1e9;
const GIB: f64 = (1u64 << 30) as f64;

/// A GGUF weight type, computed at its own bits: ork-kernels' own type, whose block geometry
/// (ggml's, `ggml-common.h`) is the one table of it.
pub use ork_kernels::blocks::WeightType as FileType;

/// The type ggml names `name`, if ork's kernels know it.
pub fn file_type(name: &str) -> Option<FileType> {
    FileType::ALL.into_iter().find(|t| t.name() == name)
}

/// Bytes of one row of `k` weights of `ty` (a partial last block counted whole).
pub fn row_bytes(ty: FileType, k: usize) -> u64 {
    let (len, bytes) = ty.geometry();
    (k as u64).div_ceil(len as u64) * bytes as u64
}

/// Cycles per 256 weights of ggml's M = 1 dot kernel for each type on the Cortex-A76 and the
/// Cortex-A55: `scripts/kernel-cycles.sh` (llvm-mca 14's scheduling models on the hot loop of
/// `ggml_vec_dot_*` from llama-cpp-python 0.3.36's llama.cpp, `aarch64-linux-gnu-gcc -O3
/// -march=armv8.2-a+dotprod+fp16`). An estimate from a scheduling model, not a measurement
/// (`docs/kernels.md`). F32 and BF16 have no entry: see [`cycles`].
pub const GGML_CYCLES: [(FileType, f64, f64); 13] = [
    (FileType::F16, 64.4, 224.0),
    (FileType::Q4_0, 72.5, 204.0),
    (FileType::Q4_1, 80.6, 216.0),
    (FileType::Q5_0, 128.5, 328.0),
    (FileType::Q5_1, 144.6, 368.0),
    (FileType::Q8_0, 64.6, 204.0),
    (FileType::Q2_K, 80.2, 236.0),
    (FileType::Q3_K, 97.2, 305.0),
    (FileType::Q4_K, 58.2, 215.0),
    (FileType::Q5_K, 83.2, 263.0),
    (FileType::Q6_K, 105.2, 292.0),
    (FileType::IQ4_NL, 84.8, 228.0),
    (FileType::IQ4_XS, 77.2, 207.0),
];

/// ork's column of the same table: the hot loop of ork-kernels' M = 1 NEON dotprod kernel of each
/// type (`scripts/kernel-cycles.sh`, the same llvm-mca models; ork-kernels built for
/// aarch64 with `-C target-cpu=cortex-a76`; F16 is the kernel for cores with fp16 arithmetic,
/// which sums in fp16 as ggml does). An estimate, not a measurement; at or below ggml's for
/// every type on both cores (`docs/kernels.md`). The test `cycles_tables_equal_the_kernels_doc` ties both columns to that doc's
/// table, which the script prints.
pub const ORK_CYCLES: [(FileType, f64, f64); 13] = [
    (FileType::F16, 40.1, 128.0),
    (FileType::Q4_0, 43.2, 177.0),
    (FileType::Q4_1, 52.2, 199.0),
    (FileType::Q5_0, 97.7, 327.0),
    (FileType::Q5_1, 105.2, 315.0),
    (FileType::Q8_0, 46.2, 158.0),
    (FileType::Q2_K, 53.2, 180.0),
    (FileType::Q3_K, 56.0, 262.0),
    (FileType::Q4_K, 47.2, 157.0),
    (FileType::Q5_K, 64.2, 247.0),
    (FileType::Q6_K, 69.7, 275.0),
    (FileType::IQ4_NL, 60.2, 204.0),
    (FileType::IQ4_XS, 65.2, 197.0),
];

/// Cycles per 256 multiply-adds (weights × activation rows) of the kernel llama.cpp runs for
/// prefill (M > 1) on the Cortex-A76 and the Cortex-A55: `scripts/kernel-cycles.sh --gemm` (the
/// same llvm-mca 14 models and build as [`GGML_CYCLES`]). On a dotprod core without i8mm, ggml's
/// CPU_REPACK buffer takes Q4_0, Q8_0, IQ4_NL (4 rows interleaved by 4 bytes) and Q4_K, Q5_K,
/// Q6_K (8 rows by 4 bytes) and runs their `ggml_gemm_*` (`ggml-cpu/repack.cpp`,
/// `ggml-cpu/arch/arm/repack.cpp`); F16 runs llamafile's tinyBLAS (`llamafile/sgemm.cpp`, its
/// 4 × 6 fp16 tile); every other type its `ggml_vec_dot_*` row by row, [`GGML_CYCLES`]'s
/// figure. An estimate, not a measurement (`docs/kernels.md`).
pub const GGML_GEMM_CYCLES: [(FileType, f64, f64); 13] = [
    (FileType::F16, 72.1, 78.7),
    (FileType::Q4_0, 15.8, 29.4),
    (FileType::Q4_1, 80.6, 216.0),
    (FileType::Q5_0, 128.5, 328.0),
    (FileType::Q5_1, 144.6, 368.0),
    (FileType::Q8_0, 20.1, 62.0),
    (FileType::Q2_K, 80.2, 236.0),
    (FileType::Q3_K, 97.2, 305.0),
    (FileType::Q4_K, 35.0, 109.6),
    (FileType::Q5_K, 33.4, 75.3),
    (FileType::Q6_K, 32.3, 115.3),
    (FileType::IQ4_NL, 26.3, 58.0),
    (FileType::IQ4_XS, 77.2, 207.0),
];

/// ork's column of the prefill table: the hot loop of ork-kernels' M > 1 NEON dotprod path of
/// each type (`scripts/kernel-cycles.sh --gemm`; the same build as [`ORK_CYCLES`]), cycles per
/// 256 multiply-adds. An estimate, not a measurement (`docs/kernels.md`).
pub const ORK_GEMM_CYCLES: [(FileType, f64, f64); 13] = [
    (FileType::F16, 40.1, 128.0),
    (FileType::Q4_0, 30.6, 139.6),
    (FileType::Q4_1, 22.0, 113.6),
    (FileType::Q5_0, 32.5, 149.5),
    (FileType::Q5_1, 35.1, 160.8),
    (FileType::Q8_0, 26.3, 113.8),
    (FileType::Q2_K, 13.0, 72.5),
    (FileType::Q3_K, 9.8, 61.8),
    (FileType::Q4_K, 16.6, 93.6),
    (FileType::Q5_K, 16.6, 93.6),
    (FileType::Q6_K, 15.4, 82.2),
    (FileType::IQ4_NL, 34.8, 141.1),
    (FileType::IQ4_XS, 14.6, 83.9),
];

/// ork's k-quant M > 1 decode: cycles per 256 weights decoded (one super-block into the tile's
/// form) on the Cortex-A76 and Cortex-A55 models (`scripts/kernel-cycles.sh --gemm`, the
/// `decode` column: the loop of `k_quants::decode_row`). The driver decodes each weight row
/// once per chunk of activation rows (`ork_kernels::blocks::k_quant_chunk_rows`), outside the
/// tile whose cycles [`ORK_GEMM_CYCLES`] holds; [`prefill_cycles`] adds it. An estimate, not a
/// measurement (`docs/kernels.md`).
pub const ORK_DECODE_CYCLES: [(FileType, f64, f64); 6] = [
    (FileType::Q2_K, 98.1, 248.0),
    (FileType::Q3_K, 56.1, 162.0),
    (FileType::Q4_K, 67.1, 167.0),
    (FileType::Q5_K, 67.1, 295.0),
    (FileType::Q6_K, 88.1, 298.0),
    (FileType::IQ4_XS, 159.2, 698.0),
];

/// ork's attention loops (`ork_kernels::attend`, the loops ork-exec's attention runs) on the
/// Cortex-A76 and Cortex-A55 models (`scripts/kernel-cycles.sh --attention`): cycles per key and
/// query head of the scores at a head of [`ATTN_DIM`] (the whole call of the `fmla` dot of two
/// heads over four keys, its lane sums included, over eight), cycles per multiply-add of the
/// value rows' weighted sums (two heads sharing each row's loads), and cycles per score of the
/// softmax (largest, exponentials, f64 sum). [`attention_s`] charges them for ork's engine on
/// those cores; elsewhere (A72/A53, no figures) the assumed `core_flops`. An estimate, not a
/// measurement (`docs/kernels.md`, "Attention").
pub const ORK_ATTENTION_CYCLES: [(Core, AttentionCycles); 2] = [
    (
        Core::A76,
        AttentionCycles {
            scores: 39.5,
            values: 0.282,
            softmax: 17.31,
        },
    ),
    (
        Core::A55,
        AttentionCycles {
            scores: 114.5,
            values: 0.906,
            softmax: 37.50,
        },
    ),
];

/// The head size [`ORK_ATTENTION_CYCLES`]' scores figure is for.
pub const ATTN_DIM: usize = 128;

/// One core's row of [`ORK_ATTENTION_CYCLES`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionCycles {
    /// Cycles per key and query head of the scores at a head of [`ATTN_DIM`].
    pub scores: f64,
    /// Cycles per multiply-add of the weighted sums of the value rows.
    pub values: f64,
    /// Cycles per score of the softmax.
    pub softmax: f64,
}

impl AttentionCycles {
    /// Cycles per key and query head with heads of `head_dim` values (the scores scaled from
    /// [`ATTN_DIM`] by the head's size: their fixed part, the lane sums, is taken as scaling
    /// too).
    pub fn per_key(&self, head_dim: usize) -> f64 {
        let d = head_dim as f64;
        self.scores * d / ATTN_DIM as f64 + self.values * d + self.softmax
    }
}

/// `core`'s row of [`ORK_ATTENTION_CYCLES`], if it has one.
pub fn ork_attention_cycles(core: Core) -> Option<AttentionCycles> {
    ORK_ATTENTION_CYCLES
        .iter()
        .find(|c| c.0 == core)
        .map(|c| c.1)
}

/// Whose kernels a CPU projection charges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernels {
    /// llama.cpp's ggml (the fit's rows are llama.cpp's).
    Ggml,
    /// ork's, where [`ORK_CYCLES`] has the type; ggml's otherwise.
    Ork,
}

/// Cycles per 256 weights of ggml's M = 1 dot kernel for each type on the Cortex-A72 and the
/// Cortex-A53 (the RK3576's cores: ARMv8.0-A, no dotprod, no fp16 arithmetic):
/// `scripts/kernel-cycles.sh --cores rk3576` (llvm-mca 14's cortex-a72 / cortex-a53 models on the
/// hot loop of ggml's plain-NEON `ggml_vec_dot_*`, the same sources built with
/// `-march=armv8-a`). An estimate from a scheduling model, not a measurement. ork's kernels need
/// dotprod: there is no ork column for these cores.
pub const GGML_CYCLES_ARMV8_0: [(FileType, f64, f64); 13] = [
    (FileType::F16, 257.7, 496.1),
    (FileType::Q4_0, 96.8, 316.0),
    (FileType::Q4_1, 100.6, 320.0),
    (FileType::Q5_0, 148.7, 456.0),
    (FileType::Q5_1, 160.7, 544.0),
    (FileType::Q8_0, 84.7, 288.0),
    (FileType::Q2_K, 105.2, 290.0),
    (FileType::Q3_K, 96.2, 282.0),
    (FileType::Q4_K, 95.2, 309.0),
    (FileType::Q5_K, 116.2, 363.0),
    (FileType::Q6_K, 100.3, 292.0),
    (FileType::IQ4_NL, 114.6, 376.0),
    (FileType::IQ4_XS, 126.2, 356.0),
];

/// A core kind of a big.LITTLE CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Core {
    /// Cortex-A76 (the big cores of the RK3588 and the BCM2712).
    A76,
    /// Cortex-A55 (the RK3588's little cores).
    A55,
    /// Cortex-A72 (the RK3576's big cores).
    A72,
    /// Cortex-A53 (the RK3576's little cores).
    A53,
}

/// Cycles per 256 weights of `ty`'s dot kernel on `core`, from `kernels`' column (ggml's where
/// ork's lacks the type or the core: the A72/A53 have only ggml's plain-NEON column). F32 is
/// charged twice ggml's F16 (4 lanes per fp32 `fmla` instead of 8), for either column: ork's F16
/// figure on FP16 cores is its fp16-accumulating kernel, which F32 cannot use. BF16 is charged as
/// F32 (ggml converts bf16 to f32 on cores without bf16 instructions, as these). Both assumed,
/// not estimated.
pub fn cycles(ty: FileType, core: Core, kernels: Kernels) -> f64 {
    lookup(ty, core, kernels, (&GGML_CYCLES, &ORK_CYCLES))
}

/// Cycles per 256 multiply-adds of `ty`'s prefill (M > 1) kernel on `core`, from `kernels`'
/// column of the prefill tables ([`GGML_GEMM_CYCLES`], [`ORK_GEMM_CYCLES`]); F32 and BF16 as
/// [`cycles`] charges them, from ggml's F16 prefill figure. The A72/A53 have no prefill table:
/// their M = 1 figures ([`GGML_CYCLES_ARMV8_0`]), assumed.
pub fn gemm_cycles(ty: FileType, core: Core, kernels: Kernels) -> f64 {
    lookup(ty, core, kernels, (&GGML_GEMM_CYCLES, &ORK_GEMM_CYCLES))
}

/// Cycles per 256 multiply-adds of a prefill pass of `rows` activation rows over a weight of `k`
/// columns: [`gemm_cycles`], plus, for ork's k-quants on a dotprod core, the decode of each
/// weight row ([`ORK_DECODE_CYCLES`]) once per chunk of rows
/// (`ork_kernels::blocks::k_quant_chunk_rows`), shared by the rows of its chunk. For a MoE
/// expert, `rows` are the rows routed to it.
pub fn prefill_cycles(ty: FileType, core: Core, kernels: Kernels, rows: f64, k: usize) -> f64 {
    let tile = gemm_cycles(ty, core, kernels);
    let decode = match (kernels, core) {
        (Kernels::Ork, Core::A76) => column(&ORK_DECODE_CYCLES, ty, true).unwrap_or(0.0),
        (Kernels::Ork, Core::A55) => column(&ORK_DECODE_CYCLES, ty, false).unwrap_or(0.0),
        _ => 0.0,
    };
    if decode == 0.0 || rows <= 0.0 {
        return tile;
    }
    let chunk = ork_kernels::blocks::k_quant_chunk_rows(k) as f64;
    tile + decode * (rows / chunk).ceil() / rows
}

type CycleTable = [(FileType, f64, f64)];

/// `ty`'s figure in table `t`: the big core's column or the little core's.
fn column(t: &CycleTable, ty: FileType, big: bool) -> Option<f64> {
    t.iter()
        .find(|c| c.0 == ty)
        .map(|c| if big { c.1 } else { c.2 })
}

/// [`cycles`] and [`gemm_cycles`] on the (ggml, ork) tables `t` of dotprod cores.
fn lookup(ty: FileType, core: Core, kernels: Kernels, t: (&CycleTable, &CycleTable)) -> f64 {
    let (dotprod, big) = match core {
        Core::A76 => (true, true),
        Core::A55 => (true, false),
        Core::A72 => (false, true),
        Core::A53 => (false, false),
    };
    let pick = |t: &CycleTable, ty: FileType| column(t, ty, big);
    let one = |ty| {
        if !dotprod {
            return pick(&GGML_CYCLES_ARMV8_0, ty);
        }
        let ork = match kernels {
            Kernels::Ork => pick(t.1, ty),
            Kernels::Ggml => None,
        };
        ork.or_else(|| pick(t.0, ty))
    };
    match ty {
        FileType::F32 | FileType::BF16 => {
            let f16 = if dotprod {
                pick(t.0, FileType::F16)
            } else {
                one(FileType::F16)
            };
            2.0 * f16.unwrap_or(f64::NAN)
        }
        t => one(t).unwrap_or(f64::NAN),
    }
}

/// A board's CPU: its cores, their clocks and read rates, and the fitted costs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cpu {
    /// The big and the little cores' kind.
    pub kinds: (Core, Core),
    /// How the fitted parameters apply: fitted on this chip's rows, or carried over unfitted.
    pub fit: &'static str,
    /// Big cores and their clock (Hz).
    pub big: (f64, f64),
    /// Little cores and their clock (Hz); (0, 0) without.
    pub little: (f64, f64),
    /// Read rate of one core (bytes/s).
    pub core_read_bw: f64,
    /// Read rate of all cores together (bytes/s): the fitted fraction of the DDR bus.
    pub read_bw: f64,
    /// Fixed cost of one block in one pass (graph nodes, thread barriers), seconds (fitted).
    pub layer_s: f64,
    /// A pass of many rows' multiply-adds per cycle over its prefill kernel's llvm-mca estimate
    /// ([`gemm_cycles`]; fitted on llama.cpp's prefill against ggml's kernels).
    pub gemm_gain: f64,
    /// Effective fp32 operations per second of one core on attention (assumed): llama.cpp's,
    /// and ork's on cores without [`ORK_ATTENTION_CYCLES`] figures.
    pub core_flops: f64,
}

/// The CPU fit's three parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuFitted {
    /// All cores' read rate as a fraction of the board's theoretical DDR rate.
    pub read_frac: f64,
    /// Fixed cost per block and pass, seconds.
    pub layer_s: f64,
    /// Prefill multiply-adds per cycle over the prefill kernel's estimate ([`gemm_cycles`]).
    pub gemm_gain: f64,
}

/// The fit as [`crate::cpu_fit::fit_cpu`] computes it (a test recomputes it).
pub const FITTED_CPU: CpuFitted = CpuFitted {
    read_frac: 0.71260,
    layer_s: 188.59e-6,
    gemm_gain: 0.78621,
};

/// A board as the CPU engine sees it: the CPU, the DDR bus it shares with the NPU (if any), RAM
/// for the page cache and the storage behind it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuBoard {
    /// The board's name.
    pub name: String,
    /// Its CPU.
    pub cpu: Cpu,
    /// Its theoretical DDR rate, bytes/s (the bus the NPU shares).
    pub ddr_bw: f64,
    /// RAM, bytes.
    pub ram_bytes: f64,
    /// RAM the system keeps, not available to the page cache.
    pub reserved_bytes: f64,
    /// Sequential read rate of the model's storage, bytes/s.
    pub storage_read_bw: f64,
    /// The board has an NPU the clock models.
    pub npu: bool,
    /// Its NPU's cost model (the row split's NPU side, [`crate::split`]); `None` without.
    #[serde(skip)]
    pub chip: Option<crate::Chip>,
}

/// CPU-only boards: (name, RAM GiB, storage GB/s, what the storage is).
const CPU_ONLY: &[(&str, f64, f64, &str)] = &[("pi5-16g", 16.0, 0.45, "NVMe (PCIe 2.0 x1)")];

impl Cpu {
    /// The RK3588's: 4 × Cortex-A76 at 2.352 GHz and 4 × Cortex-A55 at 1.8 GHz, one A76 core
    /// reading 11.4 GB/s (the middle of the 10.5–12.3 GB/s measured), the fit's costs, all
    /// cores reading the fitted fraction of `ddr_bw`.
    pub fn rk3588(ddr_bw: f64, f: &CpuFitted, core_flops: f64) -> Cpu {
        Cpu {
            kinds: (Core::A76, Core::A55),
            fit: FIT_RK3588,
            big: (4.0, 2.352e9),
            little: (4.0, 1.8e9),
            core_read_bw: 11.4 * GB,
            read_bw: f.read_frac * ddr_bw,
            layer_s: f.layer_s,
            gemm_gain: f.gemm_gain,
            core_flops,
        }
    }

    /// The Raspberry Pi 5's BCM2712: 4 × Cortex-A76 at 2.4 GHz, no little cores, one core
    /// reading 6.0 GB/s (memcpy), the RK3588's fitted costs and read fraction (assumed to carry
    /// over: the same core).
    pub fn bcm2712(ddr_bw: f64, f: &CpuFitted, core_flops: f64) -> Cpu {
        Cpu {
            fit: UNFITTED,
            big: (4.0, 2.4e9),
            little: (0.0, 0.0),
            core_read_bw: 6.0 * GB,
            ..Cpu::rk3588(ddr_bw, f, core_flops)
        }
    }

    /// The RK3576's: 4 × Cortex-A72 at 2.2 GHz and 4 × Cortex-A53 at 1.8 GHz (Rockchip's RK3576
    /// specification as reproduced by raspberryme.com, the source of its 32-bit bus,
    /// `docs/board-model.md`), one core reading `core_read_bw` (the chip's `memcpy_bw`:
    /// assumed, not measured on an A72), the RK3588's fitted costs and read fraction of its own
    /// bus: **unfitted** (no published RK3576 CPU row).
    pub fn rk3576(ddr_bw: f64, f: &CpuFitted, core_flops: f64, core_read_bw: f64) -> Cpu {
        Cpu {
            kinds: (Core::A72, Core::A53),
            fit: UNFITTED,
            big: (4.0, 2.2e9),
            little: (4.0, 1.8e9),
            core_read_bw,
            ..Cpu::rk3588(ddr_bw, f, core_flops)
        }
    }
}

/// [`Cpu::fit`] of the RK3588, whose rows the fit used.
pub const FIT_RK3588: &str = "fitted on llama.cpp's RK3588 rows (rk-llama.cpp README)";
/// [`Cpu::fit`] of every other CPU.
pub const UNFITTED: &str = "unfitted: the RK3588 fit's parameters, carried over";

impl CpuBoard {
    /// The CPU side of `board` with the fit `f`; `None` for a chip whose cores the model does
    /// not know (the RK3588's and the RK3576's it does).
    pub fn of(board: &Board, f: &CpuFitted) -> Option<CpuBoard> {
        let c = &board.chip;
        let cpu = match c.name.as_str() {
            "rk3588" => Cpu::rk3588(c.ddr_bw, f, c.host_core_flops),
            "rk3576" => Cpu::rk3576(c.ddr_bw, f, c.host_core_flops, c.memcpy_bw),
            _ => return None,
        };
        Some(CpuBoard {
            name: board.name.clone(),
            cpu,
            ddr_bw: c.ddr_bw,
            ram_bytes: board.ram_bytes,
            reserved_bytes: board.reserved_bytes,
            storage_read_bw: board.storage_read_bw,
            npu: true,
            chip: Some(c.clone()),
        })
    }

    /// A CPU-only preset (`pi5-16g`: Raspberry Pi 5 16 GB, LPDDR4X-4267 on a 32-bit bus, 17.07
    /// GB/s theoretical), with the fit `f`.
    pub fn cpu_only(name: &str, f: &CpuFitted) -> Option<CpuBoard> {
        let &(name, ram, storage, _) = CPU_ONLY.iter().find(|p| p.0 == name)?;
        let ddr_bw = 4267e6 * 4.0;
        Some(CpuBoard {
            name: name.into(),
            cpu: Cpu::bcm2712(ddr_bw, f, crate::Chip::rk3588().host_core_flops),
            ddr_bw,
            ram_bytes: ram * GIB,
            reserved_bytes: GIB,
            storage_read_bw: storage * GB,
            npu: false,
            chip: None,
        })
    }

    /// The CPU-only preset names.
    pub fn cpu_only_names() -> Vec<&'static str> {
        CPU_ONLY.iter().map(|p| p.0).collect()
    }

    /// A preset `NAME` for the CPU engine: a CPU-only preset, else the board
    /// [`Board::named`] gives (`Ok(None)` when its CPU is not modelled). Board files are read
    /// by the front end under the input rule and given to [`CpuBoard::of`].
    pub fn resolve(arg: &str) -> Result<Option<CpuBoard>, BoardError> {
        if let Some(b) = CpuBoard::cpu_only(arg, &FITTED_CPU) {
            return Ok(Some(b));
        }
        Ok(CpuBoard::of(&Board::named(arg)?, &FITTED_CPU))
    }
}

/// One matmul weight as the CPU computes it: `n` rows of `k` weights of type `ty`, in
/// `experts` experts (1 for a dense weight).
#[derive(Clone, Debug, PartialEq)]
pub struct CpuWeight {
    /// Inner dimension.
    pub k: usize,
    /// Output rows (per expert).
    pub n: usize,
    /// The file's type.
    pub ty: FileType,
    /// Experts (1: dense).
    pub experts: usize,
    /// The output projection: computed for the last row of a pass only.
    pub output: bool,
}

impl CpuWeight {
    /// Bytes of the weight in the file (all experts).
    pub fn bytes(&self) -> u64 {
        row_bytes(self.ty, self.k) * (self.n * self.experts) as u64
    }
}

/// A model's shape for the CPU engine.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuShape {
    /// Blocks.
    pub n_layer: usize,
    /// Query heads, KV heads, head dimension.
    pub heads: (usize, usize, usize),
    /// Per block, the keys a sliding-window layer sees (`None`: global).
    pub windows: Vec<Option<usize>>,
    /// Every matmul weight.
    pub weights: Vec<CpuWeight>,
    /// Experts chosen per token (0: dense).
    pub top_k: usize,
    /// Bytes actually stored per byte the types give (1.0, or a published file's size over its
    /// types' bytes where the file's own type mix is not known).
    pub bytes_scale: f64,
    /// Bytes of the file's weights not in `weights` (the token embedding when untied), read
    /// one row per token.
    pub other_bytes: u64,
}

impl CpuShape {
    /// Bytes of the file's weights.
    pub fn file_bytes(&self) -> f64 {
        self.weights.iter().map(|w| w.bytes() as f64).sum::<f64>() * self.bytes_scale
            + self.other_bytes as f64
    }

    /// Bytes one decoded token reads (dense weights, the chosen experts, the output).
    pub fn active_bytes(&self) -> f64 {
        self.weights
            .iter()
            .map(|w| w.bytes() as f64 * active_experts(w, self.top_k, 1) / w.experts as f64)
            .sum::<f64>()
            * self.bytes_scale
    }
}

/// Distinct experts of `w` a pass of `rows` rows touches (uniform routing of `top_k` of them per
/// row; all of a dense weight's one).
fn active_experts(w: &CpuWeight, top_k: usize, rows: usize) -> f64 {
    if w.experts <= 1 || top_k == 0 {
        return 1.0;
    }
    let e = w.experts as f64;
    let miss = 1.0 - (top_k as f64 / e).min(1.0);
    e * (1.0 - miss.powi(rows.min(i32::MAX as usize) as i32))
}

/// How a matmul's rows are shared among the threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pool {
    /// Evenly, fixed in advance (llama.cpp's row split): the slowest core's share sets the time.
    Even,
    /// ork's pool (`ork-cpu` `pool.rs`, `linear.rs`): each weight's rows cut into
    /// [`CHUNKS_PER_THREAD`] chunks per thread of at least [`MIN_CHUNK_ROWS`] rows, every
    /// worker taking the next unclaimed chunk when it finishes one, one round per weight (per
    /// expert of a MoE weight). On cores of one kind this is the even split; beside slower
    /// cores the round ends when the last chunk, possibly a slow core's, does.
    Chunks,
}

/// Chunks per worker thread of one weight's round in ork's pool (`ork-cpu` `linear.rs`,
/// `CHUNKS_PER_THREAD`).
pub const CHUNKS_PER_THREAD: usize = 4;
/// Fewest rows in a chunk of ork's pool (`ork-cpu` `linear.rs`, `MIN_CHUNK_ROWS`).
pub const MIN_CHUNK_ROWS: usize = 16;

/// How the CPU engine runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuPlan {
    /// Threads: the big cores first, then little ones.
    pub threads: usize,
    /// How a matmul's rows are shared among them.
    pub pool: Pool,
    /// Whose kernels.
    pub kernels: Kernels,
    /// RAM the page cache may give the file (bytes), after the system's reserve and whatever
    /// else (the NPU's buffers) holds RAM.
    pub cache_bytes: f64,
    /// Bytes per KV-cache value.
    pub kv_bytes: usize,
}

/// The threads' count and the cores' all-together read rate for `plan` on `b`.
fn threads_and_bw(b: &CpuBoard, plan: &CpuPlan) -> (f64, f64, f64) {
    let cpu = &b.cpu;
    let big = (plan.threads as f64).min(cpu.big.0);
    let little = (plan.threads as f64 - big).min(cpu.little.0).max(0.0);
    let read_bw = cpu
        .read_bw
        .min((big + little) * cpu.core_read_bw)
        .min(b.ddr_bw);
    (big, little, read_bw)
}

/// Time of the matmuls of one pass of `m` rows (the output projection for the last row).
pub fn weights_s(shape: &CpuShape, b: &CpuBoard, plan: &CpuPlan, m: usize) -> f64 {
    shape
        .weights
        .iter()
        .map(|w| {
            let c = weight_cost(shape, w, b, plan, m);
            c.compute_s.max(c.read_s)
        })
        .sum()
}

/// One weight's share of a pass on the CPU: its compute and its read time (the larger is its
/// time) and the bytes it reads over the DDR bus (not those from storage).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WeightCost {
    /// Compute, seconds.
    pub compute_s: f64,
    /// Reads (page cache over the bus, the rest from storage), seconds.
    pub read_s: f64,
    /// Bytes read over the DDR bus.
    pub bus_bytes: f64,
}

/// The share of a weight's bytes the page cache holds, by kind: what ork-cpu's expert reader
/// (`readahead.rs`, docs/moe.md) leaves there when the file does not fit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheHits {
    /// Dense (non-expert) weights: read every token and never released.
    pub dense: f64,
    /// Expert weights: the experts kept after use over all of them (uniform routing).
    pub experts: f64,
}

/// The page cache's share of each kind of weight with `cache` bytes for the file (the memory
/// limit less the system's room and the process's own memory, as ork-cpu's `keep_budget`).
///
/// A file that fits is held whole. One that does not:
/// - a MoE's dense tensors (and the token embedding) stay: they are read on every token and ork
///   never releases them, so the kernel's LRU keeps them;
/// - ork keeps the most-routed experts that fit what is left less two blocks' routed experts
///   (the block computing and the one read ahead), and releases every other expert after use:
///   under uniform routing (this model's) the kept experts' share of all of them is the share
///   of routed bytes found in RAM. Router skew only raises it.
/// - a dense model's weights are all read every pass; the cache's share of them is the model
///   (not a claim about LRU on a scan larger than the cache, which can do worse).
pub fn cache_hits(shape: &CpuShape, cache: f64) -> CacheHits {
    let file = shape.file_bytes();
    if cache >= file {
        return CacheHits {
            dense: 1.0,
            experts: 1.0,
        };
    }
    let bytes = |expert: bool| -> f64 {
        let of = |w: &&CpuWeight| (w.experts > 1) == expert;
        shape
            .weights
            .iter()
            .filter(of)
            .map(|w| w.bytes() as f64)
            .sum::<f64>()
            * shape.bytes_scale
    };
    let experts = bytes(true);
    if experts <= 0.0 || shape.top_k == 0 {
        let share = (cache / file).clamp(0.0, 1.0);
        return CacheHits {
            dense: share,
            experts: share,
        };
    }
    let dense = bytes(false) + shape.other_bytes as f64;
    let n_expert = shape.weights.iter().map(|w| w.experts).max().unwrap_or(1) as f64;
    let routed_block = experts / shape.n_layer.max(1) as f64 * shape.top_k as f64 / n_expert;
    let keep = (cache - dense - 2.0 * routed_block).max(0.0);
    CacheHits {
        dense: (cache / dense).clamp(0.0, 1.0),
        experts: (keep / experts).clamp(0.0, 1.0),
    }
}

/// The cost of weight `w` of `shape` in a pass of `m` rows on `b` as `plan` says.
pub fn weight_cost(
    shape: &CpuShape,
    w: &CpuWeight,
    b: &CpuBoard,
    plan: &CpuPlan,
    m: usize,
) -> WeightCost {
    let cpu = &b.cpu;
    let (big, little, read_bw) = threads_and_bw(b, plan);
    // The share of this weight the page cache holds; the rest comes from storage on every read.
    let hits = cache_hits(shape, plan.cache_bytes);
    let cached = if w.experts > 1 {
        hits.experts
    } else {
        hits.dense
    };
    let rows = if w.output { 1 } else { m };
    let per_row_experts = if w.experts > 1 {
        shape.top_k as f64
    } else {
        1.0
    };
    let macs = rows as f64 * per_row_experts * (w.k * w.n) as f64;
    let active = active_experts(w, shape.top_k, rows);
    let touched = active / w.experts as f64;
    // A pass of many rows runs the prefill kernel, at the fitted share of its estimate; each
    // expert the pass touches gets its share of the routed rows.
    let weight_rows = rows as f64 * per_row_experts / active;
    let table = |core: Core| {
        if rows > 1 {
            prefill_cycles(w.ty, core, plan.kernels, weight_rows, w.k)
        } else {
            cycles(w.ty, core, plan.kernels)
        }
    };
    let gain = if rows > 1 { cpu.gemm_gain } else { 1.0 };
    // Seconds per 256 multiply-adds on one big and one little core.
    let big_s = table(cpu.kinds.0) / cpu.big.1;
    let little_s = table(cpu.kinds.1) / cpu.little.1;
    let compute_s = match plan.pool {
        _ if little <= 0.0 => macs / 256.0 * big_s / big,
        // Rows split evenly over the threads: the slowest core's share sets the time.
        Pool::Even => macs / 256.0 * big_s.max(little_s) / (big + little),
        // One round per expert the rows touch, each cut into chunks of the weight's rows.
        Pool::Chunks => {
            let cores = (big as usize, little as usize);
            active * chunked_s(macs / active / 256.0, w.n, cores, (big_s, little_s))
        }
    };
    let bytes = w.bytes() as f64 * shape.bytes_scale * touched;
    WeightCost {
        compute_s: compute_s / gain,
        read_s: bytes * cached / read_bw + bytes * (1.0 - cached) / b.storage_read_bw,
        bus_bytes: bytes * cached,
    }
}

/// The time of one round of ork's pool ([`Pool::Chunks`]): `blocks` units of 256 multiply-adds
/// over a weight of `n` rows, cut into chunks of whole rows, on `cores` (big, little) threads
/// that take `secs` (big, little) seconds per unit. Every worker takes the next chunk when it
/// finishes one (big cores first on a tie); the round ends with its last chunk.
pub fn chunked_s(blocks: f64, n: usize, cores: (usize, usize), secs: (f64, f64)) -> f64 {
    let threads = cores.0 + cores.1;
    if threads == 0 || n == 0 {
        return 0.0;
    }
    let rows = n
        .div_ceil(threads * CHUNKS_PER_THREAD)
        .max(MIN_CHUNK_ROWS)
        .min(n);
    let per_row = blocks / n as f64;
    let mut free: Vec<(f64, f64)> = (0..threads)
        .map(|t| (0.0, if t < cores.0 { secs.0 } else { secs.1 }))
        .collect();
    let mut r0 = 0;
    while r0 < n {
        let chunk = rows.min(n - r0);
        let next = free
            .iter_mut()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("threads > 0");
        next.0 += chunk as f64 * per_row * next.1;
        r0 += chunk;
    }
    free.iter().map(|f| f.0).fold(0.0, f64::max)
}

/// Time of one pass's attention (every block) and fixed per-block costs, `m` rows over
/// `context` positions.
pub fn attention_s(
    shape: &CpuShape,
    b: &CpuBoard,
    plan: &CpuPlan,
    m: usize,
    context: usize,
) -> f64 {
    let (big, little, read_bw) = threads_and_bw(b, plan);
    let (heads, kv, hd) = shape.heads;
    let assumed = big + little * little_attention_speed(&b.cpu);
    let mut t = shape.n_layer as f64 * b.cpu.layer_s;
    for l in 0..shape.n_layer {
        let window = shape.windows.get(l).copied().flatten();
        if let Event::Host { flops, bytes, .. } =
            HostKind::attention(m, context, window, heads, kv, hd, plan.kv_bytes)
        {
            // ork-exec's attention computes each row over the keys it sees only.
            let pairs = (HostKind::keys_seen(m, context, window) * heads) as f64;
            let compute = match (plan.kernels, ork_attention_rate(&b.cpu, big, little, hd)) {
                (Kernels::Ork, Some(rate)) => pairs / rate,
                (Kernels::Ork, None) => 4.0 * pairs * hd as f64 / (assumed * b.cpu.core_flops),
                // llama.cpp without flash attention computes every row's scores over all the
                // cached keys and masks them after (`build_attn_mha`: `kq = ggml_mul_mat(k, q)`):
                // the event's count.
                (Kernels::Ggml, _) => flops / (assumed * b.cpu.core_flops),
            };
            t += compute.max(bytes / read_bw);
        }
    }
    t
}

/// Keys times query heads per second that `big` and `little` cores attend over with ork's
/// attention loops ([`ORK_ATTENTION_CYCLES`]) at heads of `head_dim`; `None` where a core kind in
/// use has no figures.
fn ork_attention_rate(cpu: &Cpu, big: f64, little: f64, head_dim: usize) -> Option<f64> {
    let (big_core, little_core) = cpu.kinds;
    let per_core =
        |core, clock: f64| ork_attention_cycles(core).map(|c| clock / c.per_key(head_dim));
    let mut rate = big * per_core(big_core, cpu.big.1)?;
    if little > 0.0 {
        rate += little * per_core(little_core, cpu.little.1)?;
    }
    Some(rate)
}

/// A little core's attention rate as a fraction of a big core's: their clocks' ratio times
/// the ratio of ggml's F16 dot kernel's cycles per 256 weights on the two cores (llvm-mca's
/// models, [`cycles`]; attention's dot products run over the f16 KV cache). `core_flops` is a
/// big core's rate; before this, a little core was charged as a big one. An estimate, not fitted:
/// the fit's rows use the big cores only.
pub fn little_attention_speed(cpu: &Cpu) -> f64 {
    let (big_core, little_core) = cpu.kinds;
    let ratio = cycles(FileType::F16, big_core, Kernels::Ggml)
        / cycles(FileType::F16, little_core, Kernels::Ggml);
    if cpu.big.1 > 0.0 && ratio.is_finite() {
        cpu.little.1 / cpu.big.1 * ratio
    } else {
        0.0
    }
}

/// Time of a prefill of `prompt` rows (one pass from an empty context).
pub fn prefill_s(shape: &CpuShape, b: &CpuBoard, plan: &CpuPlan, prompt: usize) -> f64 {
    weights_s(shape, b, plan, prompt) + attention_s(shape, b, plan, prompt, 0)
}

/// Time of `steps` decode passes of one row, the first at `context` positions.
pub fn decode_s(
    shape: &CpuShape,
    b: &CpuBoard,
    plan: &CpuPlan,
    context: usize,
    steps: usize,
) -> f64 {
    steps as f64 * weights_s(shape, b, plan, 1)
        + (0..steps)
            .map(|i| attention_s(shape, b, plan, 1, context + i))
            .sum::<f64>()
}

/// The CPU engine's projected figures: TTFT of a `prompt`-token prefill (one pass) and decode
/// tokens per second over `gen` tokens after it (the first comes from the prefill; with `gen`
/// ≤ 1, one step is projected).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CpuProjection {
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Prompt tokens per second.
    pub prefill_tok_s: f64,
    /// Decode tokens per second.
    pub decode_tok_s: f64,
}

/// Project `shape` on `b` as `plan` says: a prefill of `prompt` rows, then `gen − 1` decode
/// passes.
pub fn project(
    shape: &CpuShape,
    b: &CpuBoard,
    plan: &CpuPlan,
    prompt: usize,
    gen: usize,
) -> CpuProjection {
    let ttft = prefill_s(shape, b, plan, prompt);
    let steps = gen.saturating_sub(1).max(1);
    let decode = decode_s(shape, b, plan, prompt, steps);
    CpuProjection {
        ttft_s: ttft,
        prefill_tok_s: prompt as f64 / ttft,
        decode_tok_s: steps as f64 / decode,
    }
}

/// What one decode step's time on the CPU is made of: each weight costs the larger of its
/// compute and its reads ([`weight_cost`]), attributed here to whichever binds; then attention
/// and the fixed per-block cost. The parts sum to the step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DecodeBounds {
    /// Weights whose compute binds, seconds, by file type (ggml's name).
    pub compute_s: Vec<(&'static str, f64)>,
    /// Weights whose reads bind: the bytes over the DDR bus, seconds.
    pub ddr_read_s: f64,
    /// Weights whose reads bind: the bytes the page cache cannot hold, from storage, seconds.
    pub storage_read_s: f64,
    /// Attention over the context (every block), seconds.
    pub attention_s: f64,
    /// The fixed cost per block (`layer_s` × blocks), seconds.
    pub fixed_s: f64,
    /// The step, seconds.
    pub step_s: f64,
}

/// [`DecodeBounds`] of one decode step of `shape` at `context` positions on `b` as `plan` says.
pub fn decode_bounds(
    shape: &CpuShape,
    b: &CpuBoard,
    plan: &CpuPlan,
    context: usize,
) -> DecodeBounds {
    let mut d = DecodeBounds::default();
    let (_, _, read_bw) = threads_and_bw(b, plan);
    for w in &shape.weights {
        let c = weight_cost(shape, w, b, plan, 1);
        if c.compute_s >= c.read_s {
            let name = w.ty.name();
            match d.compute_s.iter_mut().find(|x| x.0 == name) {
                Some(x) => x.1 += c.compute_s,
                None => d.compute_s.push((name, c.compute_s)),
            }
        } else {
            let ddr = c.bus_bytes / read_bw;
            d.ddr_read_s += ddr;
            d.storage_read_s += c.read_s - ddr;
        }
    }
    d.fixed_s = shape.n_layer as f64 * b.cpu.layer_s;
    d.attention_s = attention_s(shape, b, plan, 1, context) - d.fixed_s;
    d.step_s = d.compute_s.iter().map(|x| x.1).sum::<f64>()
        + d.ddr_read_s
        + d.storage_read_s
        + d.attention_s
        + d.fixed_s;
    d
}
