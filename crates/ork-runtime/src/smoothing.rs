//! SmoothQuant-style smoothing folded into the weights before they are packed: the factors from
//! the `.orkpack` when it holds them for the same parameters, else from a calibration pass.

use std::path::PathBuf;
use std::sync::Arc;

use ork_exec::{Model, Tokenizer};
use ork_gguf::GgufFile;

use crate::{EngineConfig, RuntimeError};

/// SmoothQuant-style smoothing (`docs/chip.md`): per input channel of q/k/v and gate/up,
/// `s = max|X|^alpha / max|W|^(1-alpha)`, `max|X|` measured by running `calib` through the f32
/// reference; `1/s` is folded into the RMSNorm before, `s` into the weights. `targets` adds the
/// inputs no norm precedes (`v → o` per head, `up → down`), `1/s` folded into the projection
/// before. A pack made with other smoothing (or none) is rebuilt with the reason.
#[derive(Clone, Debug, PartialEq)]
pub struct Smoothing {
    /// Migration strength in `[0, 1]` (0.7 by default in the CLI).
    pub alpha: f32,
    /// The calibration text (a few hundred tokens; never the text perplexity is measured on).
    pub calib: PathBuf,
    /// Which matmul inputs are smoothed besides the normed ones.
    pub targets: ork_exec::SmoothTargets,
}

/// Tokens of the calibration text used at most (windows of [`CALIB_CTX`]).
pub const CALIB_MAX_TOKENS: usize = 2048;
/// Window length of the calibration run.
pub const CALIB_CTX: usize = 512;

/// Where the smoothing factors of a load came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SmoothingOrigin {
    /// A calibration pass through the f32 reference computed them.
    Calibrated,
    /// The `.orkpack`'s smoothing section held them for the same parameters (α, calibration
    /// text and token count, model): no calibration pass ran.
    FromPack,
}

/// What [`apply_smoothing`] gives: the smoothed in-memory GGUF, its model, the record for the
/// pack and where the factors came from.
pub(crate) struct Smoothed {
    pub(crate) gguf: Arc<GgufFile>,
    pub(crate) model: Arc<Model>,
    pub(crate) record: ork_store::PackSmoothing,
    pub(crate) origin: SmoothingOrigin,
}

/// Fold `smooth` into `gguf`: the factors from the configured `.orkpack` when its smoothing
/// section was made with the same parameters, else from a calibration pass.
pub(crate) fn apply_smoothing(
    config: &EngineConfig,
    smooth: &Smoothing,
    gguf: &GgufFile,
    model: &Arc<Model>,
    tokenizer: &Tokenizer,
) -> Result<Smoothed, RuntimeError> {
    let bad = |what: String| RuntimeError::Calibration {
        path: smooth.calib.clone(),
        what,
    };
    let bytes = crate::validate::read_calibration(&smooth.calib)?;
    let calib_hash = ork_store::PackSmoothing::hash(&bytes);
    let text = String::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(bad("the file is empty".to_owned()));
    }
    let model_err = |source| RuntimeError::Model {
        model: config.model.clone(),
        source,
    };
    let mut tokens = tokenizer.encode(&text, true, false).map_err(model_err)?;
    crate::validate::check_calibration_tokens(&smooth.calib, tokens.len())?;
    tokens.truncate(CALIB_MAX_TOKENS);
    // The factors depend on every tensor of the model (norms included), so the parameters name
    // the model by all its tensors' fingerprints.
    let mut fps = Vec::with_capacity(gguf.tensors().len() * 8);
    for t in gguf.tensors() {
        fps.extend_from_slice(&ork_store::fingerprint(gguf, t).to_le_bytes());
    }
    let mut record = ork_store::PackSmoothing {
        alpha: smooth.alpha,
        calib_hash,
        calib_tokens: tokens.len() as u32,
        model_fingerprint: ork_store::PackSmoothing::hash(&fps),
        v_to_o: smooth.targets.v_to_o,
        up_to_down: smooth.targets.up_to_down,
        blocks: Vec::new(),
    };
    let stored = config
        .pack_path()
        .and_then(|p| ork_store::Orkpack::open(&p).ok())
        .and_then(|pack| pack.smoothing().cloned())
        .filter(|s| s.same_parameters(&record) && s.blocks.len() == model.config().n_layer);
    let (factors, origin) = match stored {
        Some(s) => (
            s.blocks
                .into_iter()
                .map(|b| ork_exec::BlockSmoothing {
                    attn: b.attn,
                    ffn: b.ffn,
                    vo: b.vo,
                    down: b.down,
                })
                .collect::<Vec<_>>(),
            SmoothingOrigin::FromPack,
        ),
        None => {
            let reference = Arc::new(
                ork_exec::CpuF32Linear::from_gguf(gguf, model.matmul_weights())
                    .map_err(model_err)?,
            );
            let f = ork_exec::smoothing_factors(
                model,
                &reference,
                &tokens,
                CALIB_CTX,
                smooth.alpha,
                smooth.targets,
            )
            .map_err(model_err)?;
            (f, SmoothingOrigin::Calibrated)
        }
    };
    record.blocks = factors
        .iter()
        .map(|b| ork_store::SmoothedBlock {
            attn: b.attn.clone(),
            ffn: b.ffn.clone(),
            vo: b.vo.clone(),
            down: b.down.clone(),
        })
        .collect();
    let label = config
        .model
        .with_extension(format!("smooth-{}-{}.gguf", smooth.alpha, smooth.targets));
    let file = Arc::new(ork_exec::smoothed_gguf(gguf, model, &factors, label).map_err(model_err)?);
    let smoothed = Arc::new(Model::load(&file).map_err(model_err)?);
    Ok(Smoothed {
        gguf: file,
        model: smoothed,
        record,
        origin,
    })
}
