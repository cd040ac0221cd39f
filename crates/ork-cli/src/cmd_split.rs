//! `--decode-device split`: the flags of the decode row split, and its shares of the rows: one
//! for every dense weight (`--split-rows F`), or each weight's own as the board clock projects
//! best for it (`--split-rows auto`, the default; `ork_board::split::split_shares`, projected).
//!
//! `auto` needs a board: `--project BOARD` (run, plan), `--board NAME|FILE.json`, or this board
//! where an rknpu driver is found (as `ork doctor` finds it). Without one (x86, no flag) it is
//! refused (exit 2) naming `--board` and `--split-rows FRACTION`: the shares are the clock's for
//! a board's engines and bus, and the host's own engines (the emulator and the CPU engine on
//! the same cores) say nothing of them.

use std::fmt;

use anyhow::{bail, Context, Result};
use ork_board::cpu::CpuBoard;
use ork_board::split::SplitDecode;
use ork_runtime::{EngineConfig, PhaseEngine, SplitRows};

use crate::cli::DeviceArg;
use crate::cmd_engines::BoardSplit;

/// `--split-rows`: one share for every dense weight, or each weight's from the board clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SplitArg {
    /// `auto`: each weight's share as the board clock projects best for it.
    Auto,
    /// One share for every dense weight, strictly between 0 and 1.
    Share(f64),
}

impl fmt::Display for SplitArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitArg::Auto => f.write_str("auto"),
            SplitArg::Share(v) => write!(f, "{v}"),
        }
    }
}

/// Parse a `--split-rows` value: `auto`, or a finite number strictly between 0 and 1.
pub fn parse_split_rows(s: &str) -> Result<SplitArg, String> {
    if s.trim() == "auto" {
        return Ok(SplitArg::Auto);
    }
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is neither auto nor a number ({e})"))?;
    if v.is_finite() && v > 0.0 && v < 1.0 {
        Ok(SplitArg::Share(v))
    } else {
        Err(format!(
            "{s} is not strictly between 0 and 1 (the device's share of each weight's rows; \
             for one engine alone use --decode-device cpu or a device)"
        ))
    }
}

/// Refuse a split the command line cannot run: on the prefill.
pub fn check_devices(prefill: DeviceArg) -> Result<()> {
    if prefill == DeviceArg::Split {
        bail!(
            "--prefill-device split (or --device split): the row split is for decode steps \
             only; use --decode-device split"
        );
    }
    Ok(())
}

/// Where `--split-rows auto` finds its board: `--project`'s (run, plan; empty: the `--soc`
/// chip), else `--board`'s, else this board where an rknpu driver is found.
#[derive(Clone, Copy, Debug)]
pub struct ShareBoards<'a> {
    /// `--project`.
    pub project: Option<&'a str>,
    /// `--board`.
    pub board: Option<&'a str>,
    /// `--soc`.
    pub soc: ork_device::Soc,
}

impl ShareBoards<'_> {
    /// The board and its name, `None` when none is known.
    fn resolve(&self) -> Result<Option<(String, Option<CpuBoard>)>> {
        if let Some(name) = self.project {
            let soc = self.soc.to_string();
            let name = if name.is_empty() { soc.as_str() } else { name };
            let (_, cpu) = crate::cmd_project::boards_named("--project", name)?;
            return Ok(Some((format!("--project {name}"), cpu)));
        }
        let board = crate::auto::AutoBoard::resolve(self.board, self.soc)?;
        Ok(board.map(|b| (b.label, b.cpu)))
    }
}

/// Where a split's shares came from, for the start-up line and `--json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ShareSource {
    /// The device's share of the rows: the one share, or with shares per weight the dense
    /// rows' share weighted by their int8 bytes.
    pub share: f64,
    /// Whether each weight has its own share (`--split-rows auto`).
    pub per_weight: bool,
    /// `--split-rows`, or the board the clock projected the shares for.
    pub from: String,
    /// The board clock's projection of the split, when it chose the shares (projected).
    pub projected: Option<SplitDecode>,
    /// With shares per weight: each kind of dense weight (its K, N and file type) and its share.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_shape: Vec<crate::cmd_engines::ShapeShare>,
    /// With shares per weight: each weight's, by manifest weight index.
    #[serde(skip)]
    pub shares: Vec<f64>,
}

impl ShareSource {
    /// The board clock's shares `b`, chosen by `from`.
    pub fn board(b: &BoardSplit, from: String) -> ShareSource {
        ShareSource {
            share: b.decode.npu_row_share,
            per_weight: true,
            from,
            projected: Some(b.decode),
            by_shape: b.by_shape.clone(),
            shares: b.shares.clone(),
        }
    }

    /// The runtime's shares.
    pub fn rows(&self) -> SplitRows {
        if self.per_weight {
            SplitRows::PerWeight(self.shares.clone())
        } else {
            SplitRows::All(self.share)
        }
    }
}

/// Context positions the board's shares are projected at: `ork plan --project`'s default run
/// (128 prompt tokens, 64 generated: the middle of the decode).
pub const SHARE_CONTEXT: usize = 128 + 64 / 2;

/// The shares of `config`'s decode split, written into it: `asked` (`--split-rows`), else
/// those `--device auto` chose with the split (`chosen`), else the board clock's for the board
/// `boards` finds, from the model's shapes with the NPU's weights resident (packed at
/// `config`'s dtype) at [`SHARE_CONTEXT`]. `None` without a split.
///
/// # Errors
/// `--split-rows` without a split; `auto` without a board, or on one without an NPU or where
/// the clock gives the NPU no rows; a model or board that cannot be read.
pub fn resolve(
    config: &mut EngineConfig,
    asked: Option<SplitArg>,
    boards: &ShareBoards<'_>,
    chosen: Option<&ShareSource>,
) -> Result<Option<ShareSource>> {
    let source = share(config, asked, boards, chosen)?;
    config.split_rows = source.as_ref().map(ShareSource::rows);
    Ok(source)
}

/// [`resolve`] for `run` (`project`: its `--project`) and `serve` (none): the model options'
/// `--split-rows`, `--board` and `--soc`, and what `--device auto` chose.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_for(
    config: &mut EngineConfig,
    opts: &crate::cli::ModelOpts,
    project: Option<&str>,
    chosen: &crate::auto::Chosen,
) -> Result<Option<ShareSource>> {
    let boards = ShareBoards {
        project,
        board: opts.board.as_deref(),
        soc: opts.soc.into(),
    };
    resolve(config, opts.split_rows, &boards, chosen.split.as_ref())
}

/// [`resolve`]'s shares.
fn share(
    config: &EngineConfig,
    asked: Option<SplitArg>,
    boards: &ShareBoards<'_>,
    chosen: Option<&ShareSource>,
) -> Result<Option<ShareSource>> {
    if config.engines().decode != PhaseEngine::Split {
        if let Some(a) = asked {
            bail!("--split-rows {a} needs --decode-device split");
        }
        return Ok(None);
    }
    if let Some(SplitArg::Share(share)) = asked {
        return Ok(Some(ShareSource {
            share,
            per_weight: false,
            from: "--split-rows".to_owned(),
            projected: None,
            by_shape: Vec::new(),
            shares: Vec::new(),
        }));
    }
    if let Some(c) = chosen {
        return Ok(Some(c.clone()));
    }
    let Some((name, cpu)) = boards.resolve()? else {
        bail!(
            "--decode-device split takes each weight's share of the rows from the board clock \
             (--split-rows auto, the default) and no board is known (no --board or --project, \
             no rknpu driver on this host): give --board NAME|FILE.json (a preset such as \
             orangepi5-16g), or one share for every weight with --split-rows FRACTION"
        );
    };
    let cb = cpu.with_context(|| format!("{name}: the board clock has no CPU model for it"))?;
    let manifest = crate::open_model::open_manifest(&config.model)?;
    let npu_bytes = ork_runtime::bench::stream::packed_model_bytes(&manifest, config.dtype)?;
    let path = &config.model;
    let gguf = ork_gguf::GgufFile::open(path).with_context(|| format!("{}", path.display()))?;
    let c =
        ork_exec::ModelConfig::from_gguf(&gguf).with_context(|| format!("{}", path.display()))?;
    let shape = crate::cmd_engines::cpu_shape(path, &manifest, &c)?;
    let b =
        crate::cmd_engines::board_split(&manifest, &shape, &cb, npu_bytes as f64, SHARE_CONTEXT)
            .with_context(|| format!("{name}: the board has no NPU to split decode with"))?;
    if b.decode.npu_row_share <= 0.0 {
        bail!(
            "{name}: the board clock gives the NPU no rows of any weight of {}, so a split is \
             the CPU alone there; use --decode-device cpu, or --split-rows FRACTION",
            path.display()
        );
    }
    Ok(Some(ShareSource::board(
        &b,
        format!("the board clock's projection for {name} (projected)"),
    )))
}

/// One line for stderr (`run`, `serve`) or `plan`'s text: the shares and where they came from.
pub fn line(s: &ShareSource) -> String {
    let mut line = if s.per_weight {
        let kinds: Vec<String> = s
            .by_shape
            .iter()
            .map(|k| format!("{}x{} {} {:.0}%", k.k, k.n, k.ty, 100.0 * k.share))
            .collect();
        format!(
            "decode split: the device computes each dense weight's own share of its rows \
             ({:.1}% of the dense rows by bytes; K x N type: {}), on 32-row tiles, the CPU \
             engine the rest, at once; shares from {}",
            100.0 * s.share,
            kinds.join(", "),
            s.from
        )
    } else {
        format!(
            "decode split: the device computes {:.1}% of each dense weight's rows (on 32-row \
             tiles), the CPU engine the rest, at once; share from {}",
            100.0 * s.share,
            s.from
        )
    };
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
