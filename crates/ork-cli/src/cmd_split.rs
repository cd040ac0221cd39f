//! `--decode-device split` and `--prefill-device split`: the flags of the row splits, and each
//! phase's shares of the rows: one for every dense weight and phase (`--split-rows F`), or each
//! weight's own per phase as the board clock projects best for it (`--split-rows auto`, the
//! default; `ork_board::split::split_shares` for decode, `split_prefill` for prefill,
//! projected).
//!
//! `auto` needs a board: `--project BOARD` (run, plan), `--board NAME|FILE.json`, or this board
//! where an rknpu driver is found (as `ork doctor` finds it). Without one (x86, no flag) it is
//! refused (exit 2) naming `--board` and `--split-rows FRACTION`: the shares are the clock's for
//! a board's engines and bus, and the host's own engines (the emulator and the CPU engine on
//! the same cores) say nothing of them.

use std::fmt;

use anyhow::{bail, Context, Result};
use ork_board::cpu::CpuBoard;
use ork_board::split::{SplitDecode, SplitPrefill};
use ork_exec::Phase;
use ork_runtime::{EngineConfig, PhaseEngine, SplitRows};

use crate::cmd_engines::{BoardPrefillSplit, BoardSplit};

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

/// `--split-rows F` written into `config` for each phase that splits (`auto` is resolved
/// against a board by [`resolve`]).
pub fn fixed_shares(config: &mut EngineConfig, asked: Option<SplitArg>) {
    let Some(SplitArg::Share(f)) = asked else {
        return;
    };
    let e = config.engines();
    let rows = |p: PhaseEngine| (p == PhaseEngine::Split).then_some(SplitRows::All(f));
    config.split_rows = rows(e.decode);
    config.prefill_split_rows = rows(e.prefill);
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
    /// The phase that splits: `decode` or `prefill`.
    pub phase: &'static str,
    /// The board clock's projection of the decode split, when it chose the shares (projected).
    pub projected: Option<SplitDecode>,
    /// The board clock's projection of the prefill split, when it chose the shares (projected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub projected_prefill: Option<SplitPrefill>,
    /// With shares per weight: each kind of dense weight (its K, N and file type) and its share.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_shape: Vec<crate::cmd_engines::ShapeShare>,
    /// With shares per weight: each weight's, by manifest weight index.
    #[serde(skip)]
    pub shares: Vec<f64>,
}

impl ShareSource {
    /// The board clock's decode shares `b`, chosen by `from`.
    pub fn board(b: &BoardSplit, from: String) -> ShareSource {
        ShareSource {
            share: b.decode.npu_row_share,
            per_weight: true,
            from,
            phase: "decode",
            projected: Some(b.decode),
            projected_prefill: None,
            by_shape: b.by_shape.clone(),
            shares: b.shares.clone(),
        }
    }

    /// The board clock's prefill shares `b`, chosen by `from`.
    pub fn board_prefill(b: &BoardPrefillSplit, from: String) -> ShareSource {
        ShareSource {
            share: b.prefill.npu_row_share,
            per_weight: true,
            from,
            phase: "prefill",
            projected: None,
            projected_prefill: Some(b.prefill),
            by_shape: b.by_shape.clone(),
            shares: b.shares.clone(),
        }
    }

    /// `--split-rows F` for `phase`.
    fn fixed(share: f64, phase: Phase) -> ShareSource {
        ShareSource {
            share,
            per_weight: false,
            from: "--split-rows".to_owned(),
            phase: phase_name(phase),
            projected: None,
            projected_prefill: None,
            by_shape: Vec::new(),
            shares: Vec::new(),
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

/// The prompt the board's prefill shares are projected for: `ork plan --project`'s default
/// (one pass of 128 rows).
pub const SHARE_PROMPT: usize = 128;

/// Each phase's row split, when it splits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Splits {
    /// The prefill's.
    pub prefill: Option<ShareSource>,
    /// The decode's.
    pub decode: Option<ShareSource>,
}

impl Splits {
    /// Neither phase splits.
    pub fn is_none(&self) -> bool {
        self.prefill.is_none() && self.decode.is_none()
    }

    /// Each split's line ([`line()`]), prefill first.
    pub fn lines(&self) -> Vec<String> {
        [&self.prefill, &self.decode]
            .into_iter()
            .flatten()
            .map(line)
            .collect()
    }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Prefill => "prefill",
        Phase::Decode => "decode",
    }
}

/// The shares of `config`'s row splits, written into it: `asked` (`--split-rows`), else those
/// `--device auto` chose with the split (`chosen`), else the board clock's for the board
/// `boards` finds, from the model's shapes with the NPU's weights resident (packed at
/// `config`'s dtype), decode at [`SHARE_CONTEXT`], prefill for [`SHARE_PROMPT`].
///
/// # Errors
/// `--split-rows` without a split; `auto` without a board, or on one without an NPU or where
/// the clock gives the NPU no rows; a model or board that cannot be read.
pub fn resolve(
    config: &mut EngineConfig,
    asked: Option<SplitArg>,
    boards: &ShareBoards<'_>,
    chosen: &Splits,
) -> Result<Splits> {
    let e = config.engines();
    if e.prefill != PhaseEngine::Split && e.decode != PhaseEngine::Split {
        if let Some(a) = asked {
            bail!("--split-rows {a} needs --decode-device split or --prefill-device split");
        }
        return Ok(Splits::default());
    }
    let splits = Splits {
        prefill: share(
            config,
            Phase::Prefill,
            asked,
            boards,
            chosen.prefill.as_ref(),
        )?,
        decode: share(config, Phase::Decode, asked, boards, chosen.decode.as_ref())?,
    };
    config.prefill_split_rows = splits.prefill.as_ref().map(ShareSource::rows);
    config.split_rows = splits.decode.as_ref().map(ShareSource::rows);
    Ok(splits)
}

/// [`resolve`] for `run` (`project`: its `--project`), `serve` and `perplexity` (none): the
/// model options' `--split-rows`, `--board` and `--soc`, and what `--device auto` chose.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_for(
    config: &mut EngineConfig,
    opts: &crate::cli::ModelOpts,
    project: Option<&str>,
    chosen: &crate::auto::Chosen,
) -> Result<Splits> {
    let boards = ShareBoards {
        project,
        board: opts.board.as_deref(),
        soc: opts.soc.into(),
    };
    resolve(config, opts.split_rows, &boards, &chosen.splits)
}

/// [`resolve`]'s shares for `phase`.
fn share(
    config: &EngineConfig,
    phase: Phase,
    asked: Option<SplitArg>,
    boards: &ShareBoards<'_>,
    chosen: Option<&ShareSource>,
) -> Result<Option<ShareSource>> {
    if config.engines().of(phase) != PhaseEngine::Split {
        return Ok(None);
    }
    if let Some(SplitArg::Share(share)) = asked {
        return Ok(Some(ShareSource::fixed(share, phase)));
    }
    if let Some(c) = chosen {
        return Ok(Some(c.clone()));
    }
    let flag = match phase {
        Phase::Prefill => "--prefill-device",
        Phase::Decode => "--decode-device",
    };
    let Some((name, cpu)) = boards.resolve()? else {
        bail!(
            "{flag} split takes each weight's share of the rows from the board clock \
             (--split-rows auto, the default) and no board is known (no --board or --project, \
             no rknpu driver on this host): give --board NAME|FILE.json (a preset such as \
             orangepi5-16g), or one share for every weight with --split-rows FRACTION"
        );
    };
    let cb = cpu.with_context(|| format!("{name}: the board clock has no CPU model for it"))?;
    let manifest = crate::open_model::open_manifest(&config.model)?;
    let npu_bytes = ork_runtime::bench::stream::packed_model_bytes(&manifest, config.dtype)? as f64;
    let path = &config.model;
    let gguf = ork_gguf::GgufFile::open(path).with_context(|| format!("{}", path.display()))?;
    let c =
        ork_exec::ModelConfig::from_gguf(&gguf).with_context(|| format!("{}", path.display()))?;
    let shape = crate::cmd_engines::cpu_shape(path, &manifest, &c)?;
    let no_npu = || crate::auto::no_npu(&name, "to split with");
    let from = format!("the board clock's projection for {name} (projected)");
    let s = match phase {
        Phase::Decode => {
            let b =
                crate::cmd_engines::board_split(&manifest, &shape, &cb, npu_bytes, SHARE_CONTEXT)
                    .with_context(no_npu)?;
            ShareSource::board(&b, from)
        }
        Phase::Prefill => {
            let b = crate::cmd_engines::board_prefill_split(
                &manifest,
                &shape,
                &cb,
                (npu_bytes, ork_board::engines::Cores::Big),
                SHARE_PROMPT,
            )
            .with_context(no_npu)?;
            ShareSource::board_prefill(&b, from)
        }
    };
    if s.share <= 0.0 {
        bail!(
            "{name}: the board clock gives the NPU no rows of any weight of {} in the {}, so a \
             split is the CPU alone there; use cpu for that phase, or --split-rows FRACTION",
            path.display(),
            s.phase
        );
    }
    Ok(Some(s))
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
            "{} split: the device computes each dense weight's own share of its rows \
             ({:.1}% of the dense rows by bytes; K x N type: {}), on 32-row tiles, the CPU \
             engine the rest, at once; shares from {}",
            s.phase,
            100.0 * s.share,
            kinds.join(", "),
            s.from
        )
    } else {
        format!(
            "{} split: the device computes {:.1}% of each dense weight's rows (on 32-row \
             tiles), the CPU engine the rest, at once; share from {}",
            s.phase,
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
    if let Some(p) = &s.projected_prefill {
        let best = p.npu_ttft_s.min(p.cpu_ttft_s);
        line.push_str(&format!(
            ": TTFT({}) {:.3} s projected against the faster engine alone's {:.3} ({:.2}x; \
             both in the split's own model, docs/board-model.md)",
            p.prompt_tokens,
            p.ttft_s,
            best,
            best / p.ttft_s
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
            "[ork] {} split: {} calls split, {} on the device alone, {} on the cpu alone | \
             rows: device {}, cpu {}",
            self.share.phase, s.split_calls, s.device_calls, s.cpu_calls, s.device_rows, s.cpu_rows
        )
    }
}

/// The reports of `engine`'s splits (prefill, decode), `None` for a phase without one.
pub fn report(
    engine: &ork_runtime::Engine,
    splits: Splits,
) -> (Option<SplitReport>, Option<SplitReport>) {
    let one = |share: Option<ShareSource>, l: Option<&std::sync::Arc<ork_runtime::SplitLinear>>| {
        Some(SplitReport {
            share: share?,
            stats: l?.stats(),
        })
    };
    (
        one(splits.prefill, engine.prefill_split_linear()),
        one(splits.decode, engine.split_linear()),
    )
}
