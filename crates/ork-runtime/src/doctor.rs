//! `ork doctor`: what this machine has for ork (CPU and SIMD, the rknpu driver, the vendor runtime
//! `librknnrt.so`, IOMMU domains) and, where an NPU is there, whether it computes what the CPU
//! reference computes (see `docs/rknn.md`, "What a board owner runs first").
//!
//! Every check ends as [`Status::Pass`], [`Status::Fail`], [`Status::Info`] (a fact) or
//! [`Status::Skip`] (could not run here, with what it would check). [`DoctorReport::passed`] is
//! true when no check that ran failed. Against ork's CI stand-in runtime (`ORK_RKNN_LIB` naming
//! it, no NPU) the matmul checks run and are labelled as the stand-in's: they test ork's backend
//! and the stand-in, not a chip.

use std::path::PathBuf;
use std::sync::Arc;

use half::f16;
use ork_device::check_data::{random_weight, CheckRng};
use ork_device::{
    upload, Activations, BufferIntent, CoreMask, Device, DeviceError, DeviceKind, DomainId,
    EmuConfig, EmuDevice, MatmulTask, OpenOptions, RknnDevice, Soc,
};
use ork_exec::{generate, GenerateOptions, Sampler, SamplerOptions};
use ork_pack::{PackDtype, ScaleGroup};

use crate::{Engine, EngineConfig, PackChoice};

mod calibrate;
pub use calibrate::Calibration;

/// How a check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// It ran and passed.
    Pass,
    /// It ran and failed.
    Fail,
    /// A fact about the machine.
    Info,
    /// It could not run here (the detail says why and what it would check).
    Skip,
}

impl Status {
    /// "pass", "FAIL", "info", "skip".
    pub const fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Info => "info",
            Status::Skip => "skip",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// How it ended.
    pub status: Status,
    /// What was found.
    pub detail: String,
}

/// What the matmul checks ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// No NPU and no runtime library: only facts were gathered.
    None,
    /// The vendor runtime on an NPU.
    Npu,
    /// ork's CI stand-in runtime (no NPU).
    StandIn,
}

/// The whole report.
#[derive(Clone, Debug)]
pub struct DoctorReport {
    /// What the matmul checks ran on.
    pub target: Target,
    /// The checks, in order.
    pub checks: Vec<Check>,
    /// The board clock's recalibration measurements, where a runtime could compute (`None`
    /// without one, or when they failed: a check says so).
    pub calibration: Option<Calibration>,
}

impl DoctorReport {
    /// True when no check that ran failed (what `ork doctor`'s exit code 0 means).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The report as text a board owner can paste into a bug report.
    pub fn render(&self) -> String {
        let mut s = format!("ork doctor (ork {})\n", env!("CARGO_PKG_VERSION"));
        for c in &self.checks {
            s.push_str(&format!(
                "[{:>4}] {}: {}\n",
                c.status.name(),
                c.name,
                c.detail
            ));
        }
        s.push_str(match (self.target, self.passed()) {
            (_, false) => "result: a check FAILED (see above)\n",
            (Target::None, true) => {
                "result: ok; no NPU here, so nothing was run on one (the skipped checks say what \
                 would run)\n"
            }
            (Target::StandIn, true) => {
                "result: ok against ork's CI stand-in runtime (no NPU: this tests ork, not a chip)\n"
            }
            (Target::Npu, true) => "result: ok, the NPU computes what the CPU reference computes\n",
        });
        s
    }
}

/// What `ork doctor` is asked.
#[derive(Clone, Debug)]
pub struct DoctorOptions {
    /// A model for the tiny run (8 greedy tokens on the NPU and on the emulator); `None` skips it.
    pub model: Option<PathBuf>,
    /// The chip the matmul checks keep to.
    pub soc: Soc,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            model: None,
            soc: Soc::Rk3588,
        }
    }
}

fn push(
    checks: &mut Vec<Check>,
    name: impl Into<String>,
    status: Status,
    detail: impl Into<String>,
) {
    checks.push(Check {
        name: name.into(),
        status,
        detail: detail.into(),
    });
}

fn cpu_line() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find(|l| {
            l.starts_with("model name") || l.starts_with("Hardware") || l.starts_with("Model")
        })
        .and_then(|l| l.split_once(':'))
        .map_or("unknown model".to_string(), |(_, v)| v.trim().to_string());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let isas: Vec<&str> = ork_device::kernel::Isa::available()
        .iter()
        .map(|i| i.name())
        .collect();
    format!(
        "{model} ({}, {threads} threads); kernels: {}; in use: {}",
        std::env::consts::ARCH,
        isas.join(", "),
        ork_device::kernel::Isa::best().name()
    )
}

/// Run `ork doctor`'s checks.
pub fn doctor(options: &DoctorOptions) -> DoctorReport {
    let mut checks = Vec::new();
    push(&mut checks, "cpu", Status::Info, cpu_line());

    // The driver.
    let npu = open_rknpu();
    match &npu {
        Ok(info) => push(&mut checks, "rknpu driver", Status::Info, info.clone()),
        Err(DeviceError::NotFound { what }) => push(
            &mut checks,
            "rknpu driver",
            Status::Info,
            format!("none: {what}"),
        ),
        Err(e) => push(&mut checks, "rknpu driver", Status::Fail, e.to_string()),
    }

    // The runtime.
    let open = OpenOptions::new().soc(options.soc);
    let rknn = RknnDevice::open(&open);
    let target = match (&npu, &rknn) {
        (_, Err(_)) => Target::None,
        (_, Ok(d)) if d.version().runtime.contains("stand-in") => Target::StandIn,
        (Ok(_), Ok(_)) => Target::Npu,
        // A runtime library without an NPU that is not the stand-in: nothing to compute on.
        (Err(_), Ok(_)) => Target::None,
    };
    runtime_checks(&mut checks, &rknn, npu.is_ok());

    let label = match target {
        Target::StandIn => " [stand-in]",
        _ => "",
    };
    let mut calibration = None;
    match (target, rknn) {
        (Target::None, _) => {
            let why = if npu.is_ok() {
                "an NPU driver but no usable librknnrt.so"
            } else {
                "no NPU"
            };
            for (name, what) in would_check(options.soc) {
                push(
                    &mut checks,
                    name,
                    Status::Skip,
                    format!("{why}: would check {what}"),
                );
            }
        }
        (_, Ok(dev)) => {
            let dev: Arc<dyn Device> = Arc::new(dev);
            matmul_checks(&mut checks, dev.as_ref(), options.soc, label);
            dma_probe(&mut checks, dev.as_ref(), label);
            calibration = calibrate_into(&mut checks, dev.as_ref(), target, label);
            drop(dev);
            model_run(&mut checks, options, label);
        }
        (_, Err(_)) => {}
    }
    DoctorReport {
        target,
        checks,
        calibration,
    }
}

/// The runtime library's lines: its versions and IOMMU domains (`driver`: an NPU driver was
/// found to confirm them), or why there is none.
fn runtime_checks(checks: &mut Vec<Check>, rknn: &Result<RknnDevice, DeviceError>, driver: bool) {
    match rknn {
        Ok(d) => {
            let v = d.version();
            push(
                checks,
                "librknnrt",
                Status::Info,
                format!("{}: runtime {}, driver {}", v.library, v.runtime, v.driver),
            );
            push(
                checks,
                "IOMMU domains",
                Status::Info,
                format!(
                    "runtime ≥ 2.0 gives every matmul context an IOMMU domain: {} usable{}",
                    d.info().domains,
                    if driver {
                        ""
                    } else {
                        " (no driver here to confirm)"
                    }
                ),
            );
        }
        Err(DeviceError::NotFound { what }) => {
            push(checks, "librknnrt", Status::Info, format!("none: {what}"));
            push(
                checks,
                "IOMMU domains",
                Status::Info,
                "unknown without the runtime (vendor driver 0.9.6+ and runtime 2.0+ give 16)",
            );
        }
        Err(e) => push(checks, "librknnrt", Status::Fail, e.to_string()),
    }
}

/// The recalibration measurements as `info` lines (a failure to measure is a failed check).
fn calibrate_into(
    checks: &mut Vec<Check>,
    dev: &dyn Device,
    target: Target,
    label: &str,
) -> Option<Calibration> {
    match calibrate::calibrate(dev) {
        Ok(c) => {
            for line in c.lines(target == Target::Npu) {
                push(checks, format!("calibration{label}"), Status::Info, line);
            }
            Some(c)
        }
        Err(e) => {
            push(checks, format!("calibration{label}"), Status::Fail, e);
            None
        }
    }
}

fn open_rknpu() -> Result<String, DeviceError> {
    let dev = ork_device::open(DeviceKind::Rknpu, &OpenOptions::new().compute(false))?;
    let i = dev.info();
    Ok(format!(
        "{}, driver {}, {} IOMMU domains",
        i.name,
        i.driver_version.unwrap_or_else(|| "unknown".into()),
        i.domains
    ))
}

/// The checks that need an NPU, and what each would check.
fn would_check(soc: Soc) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = cases(soc)
        .into_iter()
        .map(|c| (format!("matmul {}", c.name), c.what.to_string()))
        .collect();
    v.push((
        "dma probe".into(),
        "8 × 16 MiB runtime buffers per domain written, synced both ways, read back and freed"
            .into(),
    ));
    v.push((
        "model run".into(),
        "8 greedy tokens of --model on the NPU equal the emulator's".into(),
    ));
    v.push((
        "calibration".into(),
        "the board clock's parameters a board run measures (call_s, npu_read_bw, npu_int8_ops, \
         alloc_s, map_s_per_byte, memcpy_bw, sync_s_per_byte, a host read rate; \
         docs/board-model.md); the emulator's timings are not a board's, so none are printed"
            .into(),
    ));
    v
}

/// One matmul check: a type pair and shape, compared with the emulator (the CPU reference).
struct Case {
    name: &'static str,
    what: &'static str,
    dtype: PackDtype,
    f16_acts: bool,
    group: ScaleGroup,
    m: usize,
    k: usize,
    n: usize,
    exact: bool,
}

fn cases(soc: Soc) -> Vec<Case> {
    let mut v = vec![
        Case {
            name: "int8 × int8 decode",
            what: "w8a8 at M = 1 (K 576, N 576) equals the CPU reference bit for bit",
            dtype: PackDtype::I8,
            f16_acts: false,
            group: ScaleGroup::PerChannel,
            m: 1,
            k: 576,
            n: 576,
            exact: true,
        },
        Case {
            name: "int8 × int8 prefill",
            what: "w8a8 at M = 37 (K 1536, N 576) equals the CPU reference bit for bit",
            dtype: PackDtype::I8,
            f16_acts: false,
            group: ScaleGroup::PerChannel,
            m: 37,
            k: 1536,
            n: 576,
            exact: true,
        },
        Case {
            name: "int8 × int8 N-chunks",
            what: "a weight wider than N 4096 bound as chunks inside one memory object \
                   (rknn_create_mem_from_fd offsets) equals the CPU reference",
            dtype: PackDtype::I8,
            f16_acts: false,
            group: ScaleGroup::PerChannel,
            m: 2,
            k: 576,
            n: 8256,
            exact: true,
        },
        Case {
            name: "int8 × int8 per-group g128",
            what: "per-group scales in the order [N][K/g] (unverified on a board) give the CPU \
                   reference",
            dtype: PackDtype::I8,
            f16_acts: false,
            group: ScaleGroup::Group(128),
            m: 3,
            k: 1536,
            n: 576,
            exact: false,
        },
        Case {
            name: "fp16 × fp16",
            what: "fp16 × fp16 → fp32 (K 576, N 192) within fp16 rounding of the CPU reference",
            dtype: PackDtype::F16,
            f16_acts: true,
            group: ScaleGroup::PerChannel,
            m: 3,
            k: 576,
            n: 192,
            exact: false,
        },
    ];
    if soc == Soc::Rk3576 {
        v.push(Case {
            name: "fp16 × int8",
            what: "w8a16 (K 576, N 192) within rounding of the CPU reference",
            dtype: PackDtype::I8,
            f16_acts: true,
            group: ScaleGroup::PerChannel,
            m: 3,
            k: 576,
            n: 192,
            exact: false,
        });
        v.push(Case {
            name: "int8 × int4",
            what: "int4 weights: the nibble order inside a byte (INT4_EVEN_K_IN_LOW_NIBBLE, \
                   unverified on a board) gives the CPU reference bit for bit",
            dtype: PackDtype::I4,
            f16_acts: false,
            group: ScaleGroup::PerChannel,
            m: 3,
            k: 576,
            n: 192,
            exact: true,
        });
    }
    v
}

/// Run `c` on `dev` and on the emulator; `Ok(detail)` when they agree.
fn run_case(dev: &dyn Device, soc: Soc, c: &Case) -> Result<String, String> {
    // The reference computes whole shapes: the N-chunk case checks the device's own chunking.
    let emu = EmuDevice::with_config(EmuConfig {
        soc,
        enforce_limits: false,
        ..EmuConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let mut rng = CheckRng::new(0x5eed ^ c.n as u64);
    let (pw, _) = random_weight(c.dtype, c.k, c.n, c.group, &mut rng);
    let a8: Vec<i8> = (0..c.m * c.k).map(|_| rng.next_u64() as i8).collect();
    let a16: Vec<f16> = (0..c.m * c.k)
        .map(|_| f16::from_f32((rng.next_u64() % 4001) as f32 / 1000.0 - 2.0))
        .collect();
    let sa: Vec<f32> = (0..c.m).map(|i| 0.01 + i as f32 * 1e-4).collect();
    let mut outs = Vec::new();
    for d in [dev, &emu as &dyn Device] {
        let w = upload(d, &pw, DomainId(0)).map_err(|e| e.to_string())?;
        let mut out = vec![0f32; c.m * c.n];
        let task = MatmulTask {
            m: c.m,
            activations: if c.f16_acts {
                Activations::HostF16(&a16)
            } else {
                Activations::Host(&a8)
            },
            act_scales: if c.f16_acts { &[] } else { &sa },
            weight: w.as_weight(),
            cores: CoreMask::AUTO,
        };
        d.matmul(&task, &mut out).map_err(|e| e.to_string())?;
        outs.push(out);
    }
    let (got, want) = (&outs[0], &outs[1]);
    let mut worst = 0f32;
    for (i, (x, y)) in got.iter().zip(want).enumerate() {
        let err = (x - y).abs();
        let tol = if c.exact {
            0.0
        } else {
            // fp16 rounding of the inputs and f32 sums: a relative bound on the magnitude.
            2e-3 * (1.0 + y.abs())
        };
        if err > tol || !x.is_finite() {
            return Err(format!(
                "output [{}, {}] is {x}, the CPU reference {y} (tolerance {tol})",
                i / c.n,
                i % c.n
            ));
        }
        worst = worst.max(err);
    }
    Ok(if c.exact {
        format!("M {} K {} N {}: bit-identical", c.m, c.k, c.n)
    } else {
        format!(
            "M {} K {} N {}: largest difference {worst:e}",
            c.m, c.k, c.n
        )
    })
}

fn matmul_checks(checks: &mut Vec<Check>, dev: &dyn Device, soc: Soc, label: &str) {
    for c in cases(soc) {
        let (status, detail) = match run_case(dev, soc, &c) {
            Ok(d) => (Status::Pass, d),
            Err(e) => (Status::Fail, format!("{e} (checks: {})", c.what)),
        };
        push(checks, format!("matmul {}{label}", c.name), status, detail);
    }
}

/// A short DMA probe: buffers in the first and last domain written, synced to and from the
/// device, read back and freed; the window returns to where it was.
fn dma_probe(checks: &mut Vec<Check>, dev: &dyn Device, label: &str) {
    let r = (|| -> Result<String, String> {
        let before = dev.stats();
        let last = DomainId(dev.info().domains - 1);
        let mut held = Vec::new();
        for d in [DomainId(0), last] {
            for i in 0..8u8 {
                let mut b = dev
                    .create_buffer(16 << 20, BufferIntent::Probe, d)
                    .map_err(|e| format!("buffer {i} in domain {d}: {e}"))?;
                let s = b.as_mut_slice();
                let n = s.len();
                for j in (0..n).step_by(4096) {
                    s[j] = i ^ (j >> 12) as u8;
                }
                b.sync_to_device().map_err(|e| e.to_string())?;
                b.sync_from_device().map_err(|e| e.to_string())?;
                held.push((i, b));
            }
        }
        for (i, b) in &held {
            let s = b.as_slice();
            if (0..s.len())
                .step_by(4096)
                .any(|j| s[j] != *i ^ (j >> 12) as u8)
            {
                return Err(format!("buffer {i}: bytes changed across syncs"));
            }
        }
        drop(held);
        let after = dev.stats();
        if after.resident_per_domain != before.resident_per_domain {
            return Err("freed buffers did not return their window share".into());
        }
        Ok(format!(
            "16 × 16 MiB in domains 0 and {last}: written, synced both ways, read back, freed"
        ))
    })();
    match r {
        Ok(d) => push(checks, format!("dma probe{label}"), Status::Pass, d),
        Err(e) => push(checks, format!("dma probe{label}"), Status::Fail, e),
    }
}

/// 8 greedy tokens of the model on the runtime and on the emulator.
fn model_run(checks: &mut Vec<Check>, options: &DoctorOptions, label: &str) {
    let name = format!("model run{label}");
    let Some(model) = &options.model else {
        push(
            checks,
            name,
            Status::Skip,
            "no --model given (ork doctor --model M.gguf runs 8 greedy tokens on the NPU and on \
             the emulator and compares them)",
        );
        return;
    };
    let greedy = |kind: DeviceKind| -> Result<Vec<u32>, String> {
        let mut cfg = EngineConfig::new(model);
        cfg.pack = PackChoice::None;
        cfg.device = kind;
        cfg.soc = options.soc;
        cfg.prefetch = false;
        let engine = Engine::open(cfg).map_err(|e| e.to_string())?;
        let prompt = engine
            .tokenizer()
            .encode("The capital of France is", true, false)
            .map_err(|e| e.to_string())?;
        let mut session = engine.session();
        let mut sampler = Sampler::new(SamplerOptions {
            temperature: 0.0,
            ..SamplerOptions::default()
        })
        .map_err(|e| e.to_string())?;
        let opts = GenerateOptions {
            max_tokens: 8,
            stop_tokens: Vec::new(),
        };
        let gen = generate(&mut session, &prompt, &opts, &mut sampler, |_| Ok(()))
            .map_err(|e| e.to_string())?;
        Ok(gen.tokens)
    };
    let r = greedy(DeviceKind::Rknn).and_then(|n| greedy(DeviceKind::Emu).map(|e| (n, e)));
    match r {
        Ok((n, e)) if n == e => push(
            checks,
            name,
            Status::Pass,
            format!(
                "{}: 8 greedy tokens equal the emulator's {e:?}",
                model.display()
            ),
        ),
        Ok((n, e)) => push(
            checks,
            name,
            Status::Fail,
            format!("{}: tokens {n:?}, the emulator's {e:?}", model.display()),
        ),
        Err(e) => push(checks, name, Status::Fail, e),
    }
}
