//! `--decode-device split`: the flags of the decode row split, and its share of the rows from
//! `--split-rows` or from the board clock's projection (`ork_board::split`, projected).

use std::path::Path;

use anyhow::{bail, Context, Result};
use ork_board::split::{split_decode, SplitDecode};
use ork_runtime::{EngineConfig, PhaseEngine};

use crate::cli::DeviceArg;

/// Parse a `--split-rows` share: a finite number strictly between 0 and 1.
pub fn parse_share(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a number ({e})"))?;
    if v.is_finite() && v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(format!(
            "{s} is not strictly between 0 and 1 (the device's share of each weight's rows; \
             for one engine alone use --decode-device cpu or a device)"
        ))
    }
}

/// Refuse a split the command line cannot run: on the prefill, or beside no device.
pub fn check_devices(prefill: DeviceArg, decode: DeviceArg) -> Result<()> {
    if prefill == DeviceArg::Split {
        bail!(
            "--prefill-device split (or --device split): the row split is for decode steps \
             only; use --decode-device split"
        );
    }
    if decode == DeviceArg::Split && prefill == DeviceArg::Cpu {
        bail!(
            "--decode-device split shares each decode matmul's rows between a device and the \
             CPU engine, but --device/--prefill-device cpu names no device: give --device emu, \
             rknpu, rknn or auto"
        );
    }
    Ok(())
}

/// Where a split's share came from, for the start-up line and `--json`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ShareSource {
    /// The device's share of the rows.
    pub share: f64,
    /// `--split-rows`, or the board the clock projected it for.
    pub from: String,
    /// The board clock's projection of the split, when it chose the share (projected).
    pub projected: Option<SplitDecode>,
}

/// Context positions the board's share is projected at: `ork plan --project`'s default run
/// (128 prompt tokens, 64 generated: the middle of the decode).
pub const SHARE_CONTEXT: usize = 128 + 64 / 2;

/// The share of `config`'s decode split: `--split-rows` (already in `config`), else the board
/// clock's for `project` (a board with an NPU; `soc` when `project` is empty), from the model's
/// shapes with the NPU's weights resident (packed at `config`'s dtype) at [`SHARE_CONTEXT`].
/// `None` without a split.
///
/// # Errors
/// A split with neither, a model or board that cannot be read, a board without an NPU.
pub fn share(
    config: &EngineConfig,
    project: Option<&str>,
    soc: &str,
) -> Result<Option<ShareSource>> {
    if config.engines().decode != PhaseEngine::Split {
        if let Some(f) = config.split_rows {
            bail!("--split-rows {f} needs --decode-device split");
        }
        return Ok(None);
    }
    if let Some(share) = config.split_rows {
        return Ok(Some(ShareSource {
            share,
            from: "--split-rows".to_owned(),
            projected: None,
        }));
    }
    let Some(name) = project else {
        bail!(
            "--decode-device split needs the device's share of the rows: --split-rows FRACTION, \
             or (run, plan) --project BOARD for the board clock's share"
        );
    };
    let manifest = crate::open_model::open_manifest(&config.model)?;
    let npu_bytes = ork_runtime::bench::stream::packed_model_bytes(&manifest, config.dtype)?;
    let s = projected(
        &config.model,
        &manifest,
        name,
        (soc, npu_bytes, SHARE_CONTEXT),
    )?;
    Ok(Some(ShareSource {
        share: s.npu_row_share,
        from: format!("the board clock's projection for {name} (projected)"),
        projected: Some(s),
    }))
}

/// The board clock's split of the model at `path` on board `name` (see [`share`]).
fn projected(
    path: &Path,
    manifest: &ork_manifest::Manifest,
    name: &str,
    (soc, npu_bytes, context): (&str, u64, usize),
) -> Result<SplitDecode> {
    let board_name = if name.is_empty() { soc } else { name };
    let (_, cpu_board) = crate::cmd_project::boards_named("--project", board_name)?;
    let cb = cpu_board
        .with_context(|| format!("--project {name}: the board clock has no CPU model for it"))?;
    let gguf = ork_gguf::GgufFile::open(path).with_context(|| format!("{}", path.display()))?;
    let c =
        ork_exec::ModelConfig::from_gguf(&gguf).with_context(|| format!("{}", path.display()))?;
    let shape = crate::cmd_engines::cpu_shape(path, manifest, &c)?;
    let plan =
        crate::cmd_engines::cpu_plan(&cb, cb.ram_bytes - cb.reserved_bytes - npu_bytes as f64);
    let s = split_decode(&shape, &cb, &plan, context)
        .with_context(|| format!("--project {name}: the board has no NPU to split decode with"))?;
    if !(s.npu_row_share > 0.0 && s.npu_row_share < 1.0) {
        bail!(
            "--project {name}: the board clock gives the NPU {:.0}% of the rows for {}, so a \
             split is no faster than one engine there; use --decode-device cpu or a device, or \
             --split-rows FRACTION",
            100.0 * s.npu_row_share,
            path.display()
        );
    }
    Ok(s)
}

/// [`share`], written into `config`; with the project a run may still replay (`None` with a
/// split: the clock replays the NPU's work alone, and a split run's device rows are half of
/// it).
///
/// # Errors
/// As [`share`].
pub fn resolve<'a>(
    config: &mut EngineConfig,
    project: Option<&'a str>,
    soc: &str,
) -> Result<(Option<ShareSource>, Option<&'a str>)> {
    let split = share(config, project, soc)?;
    config.split_rows = split.as_ref().map(|s| s.share);
    let replay = if split.is_some() { None } else { project };
    Ok((split, replay))
}

/// One line for stderr (`run`, `serve`) or `plan`'s text: the share and where it came from.
pub fn line(s: &ShareSource) -> String {
    let mut line = format!(
        "decode split: the device computes {:.1}% of each dense weight's rows (on 32-row tiles), \
         the CPU engine the rest, at once; share from {}",
        100.0 * s.share,
        s.from
    );
    if let Some(p) = &s.projected {
        line.push_str(&format!(
            ": {:.2} tok/s projected against the CPU alone's {:.2} ({:.2}x)",
            p.decode_tok_s,
            p.cpu_decode_tok_s,
            p.decode_tok_s / p.cpu_decode_tok_s
        ));
    }
    line
}

/// What a split run reports: the share and its source, and what each engine computed.
#[derive(Debug, serde::Serialize)]
pub struct SplitReport {
    /// The share and where it came from.
    #[serde(flatten)]
    pub share: ShareSource,
    /// Calls and rows per engine (`ork_runtime::SplitStats`).
    #[serde(flatten)]
    pub stats: ork_runtime::SplitStats,
}

impl SplitReport {
    /// One line for stderr.
    pub fn line(&self) -> String {
        let s = &self.stats;
        format!(
            "[ork] decode split: {} calls split, {} on the device alone, {} on the cpu alone | \
             rows: device {}, cpu {}",
            s.split_calls, s.device_calls, s.cpu_calls, s.device_rows, s.cpu_rows
        )
    }
}

/// The report of `engine`'s split, `None` without one.
pub fn report(engine: &ork_runtime::Engine, share: Option<ShareSource>) -> Option<SplitReport> {
    Some(SplitReport {
        share: share?,
        stats: engine.split_linear()?.stats(),
    })
}
