//! The cost model as data: a chip's parameters, a board (chip + RAM + storage), the presets, and
//! board description files. Every parameter's source is in `docs/board-model.md`.

use serde::{Deserialize, Serialize};

use crate::events::WeightType;
use crate::BoardError;

const GB: f64 = 1e9;
const GIB: f64 = (1u64 << 30) as f64;

/// The largest board description file read: 1 MiB (a board file is a few hundred bytes; the
/// limit keeps a link to `/dev/zero` or a huge JSON from being read whole).
pub const BOARD_FILE_LIMIT: u64 = 1 << 20;

/// Shape limits and core count of one chip's NPU, as Rockchip states them (RKNPU User Guide
/// table 3-7; `docs/chip.md`): the one table of these facts. `ork-device`'s `Soc::caps` (what the
/// emulator and the split helpers enforce) and this crate's cost model ([`Chip::calls`]) both
/// read it, and a test in `ork-device` ties the two.
///
/// It lives here because `ork-board` sits below `ork-device` (of ork it depends only on
/// `ork-manifest` and `ork-gguf`, which parse): `ork-device` may depend on it without a cycle,
/// while `ork-board` depending on `ork-device` would pull the device layer (ioctls, the vendor
/// runtime's loader) into `ork-exec`, which records the board's events and knows no device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChipLimits {
    /// The chip's name (`rk3588`, `rk3576`).
    pub name: &'static str,
    /// NPU cores.
    pub npu_cores: u32,
    /// K must be a multiple of this (all types).
    pub k_align: usize,
    /// Largest K of one call.
    pub k_max: usize,
    /// Above `k_max` the weight is cut into K-segments of this length.
    pub k_segment: usize,
    /// Largest N of one call with int8 weights, `None` where Rockchip does not state it.
    pub n_max_int8: Option<usize>,
    /// Largest N with fp16 weights, `None` where unknown.
    pub n_max_fp16: Option<usize>,
    /// Largest N with int4 weights, `None` where unknown.
    pub n_max_int4: Option<usize>,
}

/// The RK3588's limits (RKNPU User Guide table 3-7).
pub const RK3588_LIMITS: ChipLimits = ChipLimits {
    name: "rk3588",
    npu_cores: 3,
    k_align: 32,
    k_max: 10240,
    k_segment: 8192,
    n_max_int8: Some(4096),
    n_max_fp16: Some(4096),
    n_max_int4: Some(8192),
};

/// The RK3576's limits: the K limits are the RK3588's; table 3-7 gives N limits for the RK3588
/// only, so the RK3576's are unknown here (the cost model assumes the RK3588's, [`Chip::rk3576`]).
pub const RK3576_LIMITS: ChipLimits = ChipLimits {
    name: "rk3576",
    npu_cores: 2,
    k_align: 32,
    k_max: 10240,
    k_segment: 8192,
    n_max_int8: None,
    n_max_fp16: None,
    n_max_int4: None,
};

/// Every chip's limits, in [`CHIPS`] order.
pub const CHIP_LIMITS: [ChipLimits; 2] = [RK3588_LIMITS, RK3576_LIMITS];

/// One chip's costs. All rates are per second, all times in seconds, all sizes in bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chip {
    /// The chip's name (`rk3588`, `rk3576`).
    pub name: String,
    /// NPU cores.
    pub npu_cores: f64,
    /// Effective NPU multiply-accumulate throughput of int8 weights, ops per second (2 per MAC)
    /// with every core working: what a large-M matmul reaches through the vendor runtime
    /// (fitted).
    pub npu_int8_ops: f64,
    /// fp16 throughput relative to int8 (the per-cycle MAC counts' ratio).
    pub fp16_ratio: f64,
    /// int4 throughput relative to int8.
    pub int4_ratio: f64,
    /// Rate at which one matmul call reads its weight from DDR (fitted from decode, where each
    /// call is M = 1 and reads its whole weight).
    pub npu_read_bw: f64,
    /// Fixed cost of one matmul call: submit, job start, completion (fitted).
    pub call_s: f64,
    /// Switching the NPU from one IOMMU domain to another (detach/attach and flush).
    pub domain_switch_s: f64,
    /// DDR bandwidth shared by NPU reads, copies and the CPU.
    pub ddr_bw: f64,
    /// Allocating one device buffer and mapping it into the IOMMU (fixed part).
    pub alloc_s: f64,
    /// IOMMU mapping per byte of a new buffer.
    pub map_s_per_byte: f64,
    /// Cache sync (flush) per byte copied into a device buffer.
    pub sync_s_per_byte: f64,
    /// memcpy rate of one CPU core (a load copies on one thread).
    pub memcpy_bw: f64,
    /// Host cores used for host operations (the big cores).
    pub host_cores: f64,
    /// Effective fp32 operations per second of one host core on ork's host operations.
    pub host_core_flops: f64,
    /// Fixed cost of one host operation (fork/join on the thread pool).
    pub host_op_s: f64,
    /// Largest N of one int8 (and fp16) call; larger weights run as N-chunks.
    pub n_max: f64,
    /// Largest N of one int4 call.
    pub n_max_int4: f64,
    /// Largest K of one call; larger weights run as K-segments of `k_segment`.
    pub k_max: f64,
    /// K-segment length for K beyond `k_max`.
    pub k_segment: f64,
}

impl Chip {
    /// Operations per second of a matmul with weights of type `ty`.
    pub fn ops(&self, ty: WeightType) -> f64 {
        match ty {
            WeightType::Int8 => self.npu_int8_ops,
            WeightType::Fp16 => self.npu_int8_ops * self.fp16_ratio,
            WeightType::Int4 => self.npu_int8_ops * self.int4_ratio,
        }
    }

    /// Device calls a `K × N` weight of type `ty` takes on this chip (N-chunks × K-segments), the
    /// rule of `docs/chip.md`.
    pub fn calls(&self, k: usize, n: usize, ty: WeightType) -> u32 {
        let n_max = match ty {
            WeightType::Int4 => self.n_max_int4,
            _ => self.n_max,
        } as usize;
        // A validated chip has whole limits of at least 32 (`PARAMETER_RANGES`); the `max(1)`
        // keeps a chip built in code from dividing by zero.
        let chunks = n.div_ceil(n_max.max(1));
        let segs = if k as f64 > self.k_max {
            k.div_ceil((self.k_segment as usize).max(1))
        } else {
            1
        };
        u32::try_from(chunks.saturating_mul(segs).max(1)).unwrap_or(u32::MAX)
    }

    /// Every parameter within its physical range ([`PARAMETER_RANGES`]), the limits whole
    /// numbers, and a K-segment no longer than the longest K of one call; `prefix` names where
    /// the parameters came from (`chip.`, `overrides.`) in the error.
    pub fn validate(&self, prefix: &str) -> Result<(), BoardError> {
        for (key, value) in self.fields() {
            check_range(&format!("{prefix}{key}"), key, value, &value.to_string())?;
        }
        if self.k_segment > self.k_max {
            return Err(BoardError::BadValue {
                field: format!("{prefix}k_segment"),
                value: self.k_segment.to_string(),
                why: format!(
                    "longer than k_max ({}): a K-segment must fit one call",
                    self.k_max
                ),
            });
        }
        Ok(())
    }

    /// The RK3588 (see `docs/board-model.md` for each figure's source; three are fitted by
    /// [`crate::fit`] and stored here).
    pub fn rk3588() -> Chip {
        Chip {
            name: "rk3588".into(),
            npu_cores: f64::from(RK3588_LIMITS.npu_cores),
            npu_int8_ops: crate::fit::FITTED_RK3588.npu_int8_ops,
            fp16_ratio: 0.5,
            int4_ratio: 2.0,
            npu_read_bw: crate::fit::FITTED_RK3588.npu_read_bw,
            call_s: crate::fit::FITTED_RK3588.call_s,
            domain_switch_s: 20e-6,
            ddr_bw: 33.8 * GB,
            alloc_s: 50e-6,
            map_s_per_byte: 1.0 / (20.0 * GB),
            sync_s_per_byte: 1.0 / (40.0 * GB),
            memcpy_bw: 10.1 * GB,
            host_cores: 4.0,
            host_core_flops: 8.0 * GB,
            host_op_s: 5e-6,
            n_max: known(RK3588_LIMITS.n_max_int8),
            n_max_int4: known(RK3588_LIMITS.n_max_int4),
            k_max: RK3588_LIMITS.k_max as f64,
            k_segment: RK3588_LIMITS.k_segment as f64,
        }
    }

    /// The RK3576: two NPU cores, the same per-core MAC counts and call cost assumed; its DDR is
    /// half the RK3588's (a 32-bit bus at the same pinned 2112 MHz, sourced in
    /// `docs/board-model.md`); its memcpy figure is an assumption, not a measurement.
    pub fn rk3576() -> Chip {
        Chip::rk3576_from(Chip::rk3588())
    }

    /// The RK3576 derived from an RK3588 model `a`: two cores of the same per-core rate; its
    /// int4 weights run against fp16 activations (w4a16), at the fp16 rate. Its LPDDR bus is 32
    /// bits wide where the RK3588's is 64, at the same frequency rkllm pins (2112 MHz): the DDR
    /// rate is half, and the NPU's weight-read rate keeps the RK3588's fraction of it (the
    /// fraction is assumed; the bus width and frequency are sourced in `docs/board-model.md`).
    pub fn rk3576_from(a: Chip) -> Chip {
        const BUS: f64 = 32.0 / 64.0;
        Chip {
            name: "rk3576".into(),
            npu_cores: f64::from(RK3576_LIMITS.npu_cores),
            npu_int8_ops: a.npu_int8_ops * f64::from(RK3576_LIMITS.npu_cores) / a.npu_cores,
            int4_ratio: a.fp16_ratio,
            ddr_bw: a.ddr_bw * BUS,
            npu_read_bw: a.npu_read_bw * BUS,
            // The RK3576's N limits are unknown (None in its table): `a`'s are assumed.
            n_max: RK3576_LIMITS.n_max_int8.map_or(a.n_max, |n| n as f64),
            n_max_int4: RK3576_LIMITS.n_max_int4.map_or(a.n_max_int4, |n| n as f64),
            k_max: RK3576_LIMITS.k_max as f64,
            k_segment: RK3576_LIMITS.k_segment as f64,
            ..a
        }
    }

    /// Every field with its name, for validation.
    fn fields(&self) -> [(&'static str, f64); 19] {
        [
            ("npu_cores", self.npu_cores),
            ("npu_int8_ops", self.npu_int8_ops),
            ("fp16_ratio", self.fp16_ratio),
            ("int4_ratio", self.int4_ratio),
            ("npu_read_bw", self.npu_read_bw),
            ("call_s", self.call_s),
            ("domain_switch_s", self.domain_switch_s),
            ("ddr_bw", self.ddr_bw),
            ("alloc_s", self.alloc_s),
            ("map_s_per_byte", self.map_s_per_byte),
            ("sync_s_per_byte", self.sync_s_per_byte),
            ("memcpy_bw", self.memcpy_bw),
            ("host_cores", self.host_cores),
            ("host_core_flops", self.host_core_flops),
            ("host_op_s", self.host_op_s),
            ("n_max", self.n_max),
            ("n_max_int4", self.n_max_int4),
            ("k_max", self.k_max),
            ("k_segment", self.k_segment),
        ]
    }
}

/// A board: a chip, its RAM and the read bandwidth of the storage the `.orkpack` is on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Board {
    /// The board's name.
    pub name: String,
    /// Its chip.
    pub chip: Chip,
    /// RAM in bytes.
    pub ram_bytes: f64,
    /// Sequential read bandwidth of the pack's storage (bytes per second), for reads the page
    /// cache does not hold.
    pub storage_read_bw: f64,
    /// RAM the OS and the process keep for themselves, not available to the page cache.
    pub reserved_bytes: f64,
}

/// The presets: (name, chip, RAM GiB, storage read GB/s, what the storage is).
const PRESETS: &[(&str, &str, f64, f64, &str)] = &[
    ("orangepi5-8g", "rk3588", 8.0, 0.9, "NVMe (PCIe 2.0 x1)"),
    ("orangepi5-16g", "rk3588", 16.0, 0.9, "NVMe (PCIe 2.0 x1)"),
    ("orangepi5-32g", "rk3588", 32.0, 0.9, "NVMe (PCIe 2.0 x1)"),
    ("rock5b-16g", "rk3588", 16.0, 3.0, "NVMe (PCIe 3.0 x4)"),
    ("turing-rk1-32g", "rk3588", 32.0, 3.0, "NVMe (PCIe 3.0 x4)"),
    ("rk3576-8g", "rk3576", 8.0, 0.9, "NVMe (PCIe 2.0 x1)"),
];

/// Chip names [`Board::named`] knows (those of [`CHIP_LIMITS`]).
pub const CHIPS: &[&str] = &[RK3588_LIMITS.name, RK3576_LIMITS.name];

/// A limit the RK3588's table states (`Some`), as the model's float.
fn known(limit: Option<usize>) -> f64 {
    limit.map_or(f64::INFINITY, |n| n as f64)
}

impl Board {
    /// A chip alone as a board: 16 GiB of RAM and an NVMe drive at 0.9 GB/s.
    fn of_chip(chip: Chip) -> Board {
        Board {
            name: chip.name.clone(),
            chip,
            ram_bytes: 16.0 * GIB,
            storage_read_bw: 0.9 * GB,
            reserved_bytes: GIB,
        }
    }

    /// A preset board or a chip by name; [`BoardError::Unknown`] lists the known names
    /// ([`Board::every_name`]), [`BoardError::NoNpu`] for a CPU-only preset (`pi5-16g`).
    pub fn named(name: &str) -> Result<Board, BoardError> {
        let chip = |c: &str| match c {
            "rk3576" => Chip::rk3576(),
            _ => Chip::rk3588(),
        };
        if CHIPS.contains(&name) {
            return Ok(Board::of_chip(chip(name)));
        }
        if crate::cpu::CpuBoard::cpu_only_names().contains(&name) {
            return Err(BoardError::NoNpu {
                name: name.to_owned(),
            });
        }
        PRESETS
            .iter()
            .find(|p| p.0 == name)
            .map(|&(name, c, ram, storage, _)| Board {
                name: name.into(),
                chip: chip(c),
                ram_bytes: ram * GIB,
                storage_read_bw: storage * GB,
                reserved_bytes: GIB,
            })
            .ok_or_else(|| BoardError::Unknown {
                // Escaped: a name from the command line may hold an ANSI escape or a newline.
                name: name.escape_debug().to_string(),
                known: Board::every_name().join(", "),
            })
    }

    /// Every name [`Board::named`] accepts: the chips, then the presets.
    pub fn known() -> Vec<&'static str> {
        CHIPS
            .iter()
            .copied()
            .chain(PRESETS.iter().map(|p| p.0))
            .collect()
    }

    /// Every board name the command line takes: [`Board::known`], then the CPU-only presets
    /// ([`crate::cpu::CpuBoard::cpu_only_names`], which `ork plan --project` projects on the CPU
    /// engine alone).
    pub fn every_name() -> Vec<&'static str> {
        let mut names = Board::known();
        names.extend(crate::cpu::CpuBoard::cpu_only_names());
        names
    }

    /// Whether `--project ARG` names a board description file rather than a preset or chip:
    /// `ARG` ends in `.json`, or names something that exists and is not a directory (a FIFO or
    /// device is then refused by the reader, not mistaken for a name). The CLI reads it under
    /// the input rule (a regular file, opened without blocking, at most [`BOARD_FILE_LIMIT`]
    /// bytes) and parses it with [`Board::from_bytes`].
    pub fn names_file(arg: &str) -> bool {
        arg.ends_with(".json") || std::fs::metadata(arg).is_ok_and(|m| !m.is_dir())
    }

    /// A board description file's bytes, `file` naming it in errors: UTF-8 text, then
    /// [`Board::from_json`].
    pub fn from_bytes(file: &str, bytes: &[u8]) -> Result<Board, BoardError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            BoardError::Parse(format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.valid_up_to()
            ))
            .in_file(file)
        })?;
        Board::from_json(text).map_err(|e| e.in_file(file))
    }

    /// A board description: `{"name", "chip": {every Chip field} | "rk3588" | "rk3576",
    /// "ram_gib", "storage_read_gbps"}`, with optional `"overrides"` of chip fields when `chip`
    /// is a name. A missing parameter, or one that is not a finite number within its physical
    /// range ([`PARAMETER_RANGES`]), is refused naming it; so is a name with control characters.
    pub fn from_json(text: &str) -> Result<Board, BoardError> {
        let doc: serde_json::Value =
            serde_json::from_str(text).map_err(|e| BoardError::Parse(e.to_string()))?;
        let obj = doc.as_object().ok_or_else(|| {
            BoardError::Parse("the board description is not a JSON object".into())
        })?;
        let number = |key: &str| -> Result<f64, BoardError> {
            let v = obj.get(key).ok_or(BoardError::Missing {
                field: key.to_owned(),
            })?;
            parameter(key, key, v)
        };
        let name = board_name(obj.get("name"))?;
        let mut chip = match obj.get("chip") {
            None => {
                return Err(BoardError::Missing {
                    field: "chip".into(),
                })
            }
            Some(serde_json::Value::String(c)) => match c.as_str() {
                "rk3588" => Chip::rk3588(),
                "rk3576" => Chip::rk3576(),
                other => {
                    return Err(BoardError::Unknown {
                        name: other.to_owned(),
                        known: CHIPS.join(", "),
                    })
                }
            },
            Some(v @ serde_json::Value::Object(fields)) => {
                // Each field checked by name before the whole is read, so a missing or bad one is
                // named.
                let template = Chip::rk3588();
                for (key, _) in template.fields() {
                    let value = fields.get(key).ok_or(BoardError::Missing {
                        field: format!("chip.{key}"),
                    })?;
                    parameter(&format!("chip.{key}"), key, value)?;
                }
                let chip: Chip = serde_json::from_value(v.clone())
                    .map_err(|e| BoardError::Parse(e.to_string()))?;
                chip.validate("chip.")?;
                chip
            }
            Some(_) => {
                return Err(BoardError::Parse(
                    "\"chip\" must be a chip name or an object of chip parameters".into(),
                ))
            }
        };
        if let Some(over) = obj.get("overrides") {
            let over = over.as_object().ok_or_else(|| {
                BoardError::Parse("\"overrides\" must be an object of chip parameters".into())
            })?;
            let mut value = serde_json::to_value(&chip).expect("a chip serializes");
            for (key, v) in over {
                let field = format!("overrides.{key}");
                if key == "name" || !chip.fields().iter().any(|(k, _)| k == key) {
                    return Err(BoardError::Parse(format!(
                        "{field}: no such chip parameter"
                    )));
                }
                value[key] = serde_json::Value::from(parameter(&field, key, v)?);
            }
            chip = serde_json::from_value(value).map_err(|e| BoardError::Parse(e.to_string()))?;
            chip.validate("overrides.")?;
        }
        for key in obj.keys() {
            if !["name", "chip", "overrides", "ram_gib", "storage_read_gbps"]
                .contains(&key.as_str())
            {
                return Err(BoardError::Parse(format!("unknown field \"{key}\"")));
            }
        }
        Ok(Board {
            name,
            chip,
            ram_bytes: number("ram_gib")? * GIB,
            storage_read_bw: number("storage_read_gbps")? * GB,
            reserved_bytes: GIB,
        })
    }
}

/// The longest board name a file may give (it is printed in every projection).
const NAME_MAX: usize = 64;

/// The board's `name`: a string of at most [`NAME_MAX`] characters without control characters
/// (an ANSI escape or a newline in it would be written raw to the terminal and into every
/// projection line).
fn board_name(v: Option<&serde_json::Value>) -> Result<String, BoardError> {
    let v = v.ok_or(BoardError::Missing {
        field: "name".into(),
    })?;
    let bad = |why: &str| BoardError::BadValue {
        field: "name".into(),
        // JSON-escaped: the control characters are shown as escapes, not sent to the terminal.
        value: v.to_string(),
        why: why.to_owned(),
    };
    let name = v.as_str().ok_or_else(|| bad("not a string"))?;
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.chars().count() > NAME_MAX {
        return Err(bad(&format!("longer than {NAME_MAX} characters")));
    }
    if name.chars().any(char::is_control) {
        return Err(bad("a name with control characters (escapes, newlines)"));
    }
    Ok(name.to_owned())
}

/// The physical range of a board parameter: every chip parameter and the board's own two.
pub struct ParameterRange {
    /// The parameter's name (a [`Chip`] field, `ram_gib` or `storage_read_gbps`).
    pub name: &'static str,
    /// The least value accepted.
    pub min: f64,
    /// The largest value accepted.
    pub max: f64,
    /// Whether it must be a whole number (a count or a matrix dimension).
    pub whole: bool,
    /// Why these bounds.
    pub why: &'static str,
}

const fn range(
    name: &'static str,
    min: f64,
    max: f64,
    whole: bool,
    why: &'static str,
) -> ParameterRange {
    ParameterRange {
        name,
        min,
        max,
        whole,
        why,
    }
}

const RATE: &str = "100 MB/s (below any DDR or NVMe link) to 10 TB/s (above HBM3e)";
const FIXED: &str = "10 ns (tens of cycles) to 1 s (no driver call takes longer)";
const PER_BYTE: &str = "the reciprocal of 10 MB/s to 10 TB/s";
const LIMIT: &str = "a whole matrix dimension: at least 32 (the NPU's K alignment, \
                     docs/chip.md) and at most 2^24";

/// Every board parameter's physical range, the reason beside it (`docs/board-model.md`, "Your
/// own board"). A value outside it is refused: far outside, a rate of 1e-308 or a time of 1e308
/// made the replay divide by a vanishing rate or step through times no board takes (endless or
/// infinite projections, issue 39); within them, every projected time is finite.
pub const PARAMETER_RANGES: &[ParameterRange] = &[
    range(
        "npu_cores",
        1.0,
        64.0,
        true,
        "Rockchip NPUs have 1 to 3 cores; 64 covers any NPU",
    ),
    range(
        "npu_int8_ops",
        1e9,
        1e16,
        false,
        "1 GOPS to 10 POPS (above any chip's int8 peak)",
    ),
    range(
        "fp16_ratio",
        0.01,
        100.0,
        false,
        "a ratio of per-cycle MAC counts (0.5 on the RK3588)",
    ),
    range(
        "int4_ratio",
        0.01,
        100.0,
        false,
        "a ratio of per-cycle MAC counts (2 on the RK3588)",
    ),
    range("npu_read_bw", 1e8, 1e13, false, RATE),
    range("call_s", 1e-8, 1.0, false, FIXED),
    range("domain_switch_s", 1e-8, 1.0, false, FIXED),
    range("ddr_bw", 1e8, 1e13, false, RATE),
    range("alloc_s", 1e-8, 1.0, false, FIXED),
    range("map_s_per_byte", 1e-13, 1e-7, false, PER_BYTE),
    range("sync_s_per_byte", 1e-13, 1e-7, false, PER_BYTE),
    range("memcpy_bw", 1e8, 1e13, false, RATE),
    range(
        "host_cores",
        1.0,
        256.0,
        true,
        "a whole number of cores, 1 to 256",
    ),
    range(
        "host_core_flops",
        1e7,
        1e13,
        false,
        "10 MFLOP/s to 10 TFLOP/s per core",
    ),
    range("host_op_s", 1e-9, 1.0, false, FIXED),
    range("n_max", 32.0, 16_777_216.0, true, LIMIT),
    range("n_max_int4", 32.0, 16_777_216.0, true, LIMIT),
    range("k_max", 32.0, 16_777_216.0, true, LIMIT),
    range("k_segment", 32.0, 16_777_216.0, true, LIMIT),
    range("ram_gib", 0.25, 4096.0, false, "256 MiB to 4 TiB of RAM"),
    range(
        "storage_read_gbps",
        0.001,
        1000.0,
        false,
        "1 MB/s (a slow SD card) to 1 TB/s",
    ),
];

/// `x`, the value of parameter `key` given as `field` (`value` as written), within its range.
fn check_range(field: &str, key: &str, x: f64, value: &str) -> Result<f64, BoardError> {
    let bad = |why: String| BoardError::BadValue {
        field: field.to_owned(),
        value: value.to_owned(),
        why,
    };
    if !x.is_finite() {
        return Err(bad("not finite".into()));
    }
    if x < 0.0 {
        return Err(bad("negative".into()));
    }
    if x == 0.0 {
        return Err(bad("zero".into()));
    }
    let r = PARAMETER_RANGES
        .iter()
        .find(|r| r.name == key)
        .ok_or_else(|| bad("not a board parameter".into()))?;
    if !(r.min..=r.max).contains(&x) {
        return Err(bad(format!("outside {} ..= {} ({})", r.min, r.max, r.why)));
    }
    if r.whole && x.fract() != 0.0 {
        return Err(bad(format!("not a whole number ({})", r.why)));
    }
    Ok(x)
}

/// `v`, the value of parameter `key` given as `field`, as a finite number within its range.
fn parameter(field: &str, key: &str, v: &serde_json::Value) -> Result<f64, BoardError> {
    let bad = |why: &str| BoardError::BadValue {
        field: field.to_owned(),
        value: v.to_string(),
        why: why.to_owned(),
    };
    // JSON has no NaN or infinity; a string spelling one is refused as non-finite.
    if let Some(s) = v.as_str() {
        let lower = s.to_ascii_lowercase();
        if ["nan", "inf", "infinity", "-inf", "-infinity"].contains(&lower.as_str()) {
            return Err(bad("not finite"));
        }
        return Err(bad("not a number"));
    }
    let x = v.as_f64().ok_or_else(|| bad("not a number"))?;
    check_range(field, key, x, &v.to_string())
}

/// A validated board: its chip's parameters ([`Chip::validate`]) and its own.
impl Board {
    /// Every parameter within its range ([`PARAMETER_RANGES`]): a board built in code is held
    /// to the rule a board file is.
    pub fn validate(&self) -> Result<(), BoardError> {
        self.chip.validate("chip.")?;
        check_range(
            "ram_gib",
            "ram_gib",
            self.ram_bytes / GIB,
            &(self.ram_bytes / GIB).to_string(),
        )?;
        let gbps = self.storage_read_bw / GB;
        check_range(
            "storage_read_gbps",
            "storage_read_gbps",
            gbps,
            &gbps.to_string(),
        )?;
        Ok(())
    }
}
