//! The checks a model passes before anything is converted or run — the one validation `ork
//! plan`, `ork convert` and `ork run` share through [`crate::Engine::load`] — and the bounded
//! reading of the calibration text (`docs/cli.md`).
//!
//! [`check_weights`] applies every chip rule to every matmul weight as it will run: the type
//! pair and scale group of the asked precision ([`crate::check_chip`], which says what to use
//! instead), then, for each chip-sized part the weight is cut into (`ork_device::split`), the
//! K / N limits of the padded shape the device is given and, for affine groups, the offsets
//! matmul ([`ork_device::Soc::check_as_run`], the rule the device itself applies). The router,
//! the output head and every split part are weights like the others here.

use std::path::Path;

use ork_device::{ElemType, MatmulShape};
use ork_manifest::Manifest;

use crate::{check_chip, EngineConfig, RuntimeError};

/// The fewest calibration tokens smoothing accepts. The factors come from each channel's
/// largest activation over the calibration text; over a handful of tokens those maxima are the
/// first position's (whose activations are outliers in most models) and the factors would
/// quietly degrade the model instead of helping it. 64 tokens is a floor, not a recommendation:
/// the figures in `docs/chip.md` use 2048.
pub const CALIB_MIN_TOKENS: usize = 64;

/// Refuse a model whose weights the chip cannot run in `config`'s precision, naming the weight,
/// its shape and the chip's limit.
///
/// # Errors
/// [`RuntimeError::Chip`] for the first weight (or part) the chip refuses,
/// [`RuntimeError::Plan`] for a tensor that is no matmul weight.
pub fn check_weights(config: &EngineConfig, manifest: &Manifest) -> Result<(), RuntimeError> {
    check_chip(config, manifest)?;
    let soc = config.soc;
    for w in manifest.execution_order() {
        let (k, n) = ork_store::matmul_dims(&w.slice).map_err(|source| RuntimeError::Plan {
            model: manifest.file().to_path_buf(),
            source,
        })?;
        let (dtype, group) = ork_store::weight_quant(&w.key, config.dtype, config.group);
        let group = ork_store::effective_group(group, dtype, k);
        let refuse = |what: String, source| RuntimeError::Chip {
            model: config.model.clone(),
            hint: format!(
                "weight '{}' (K {k} x N {n}{what}) as it runs on the {soc}; see docs/chip.md",
                w.key
            ),
            source,
        };
        let layout = ork_pack::TiledLayout::new(dtype, k, n);
        let parts = ork_device::split::split(&layout, group, soc)
            .map_err(|source| refuse(String::new(), source))?;
        let whole = parts.len() == 1;
        for p in &parts {
            let shape = MatmulShape {
                a: ElemType::of_activations(config.activations),
                b: ElemType::of_weight(dtype),
                k: p.layout.k,
                n: p.layout.n,
                group,
            };
            soc.check_as_run(&shape, p.layout.k_pad(), p.layout.n_pad())
                .map_err(|source| {
                    let what = if whole {
                        String::new()
                    } else {
                        format!(
                            ", part k {}..{} n {}..{}",
                            p.k.start, p.k.end, p.n.start, p.n.end
                        )
                    };
                    refuse(what, source)
                })?;
        }
    }
    Ok(())
}

/// The calibration text's bytes: a regular file of at most
/// [`ork_io::input::TEXT_INPUT_LIMIT`] bytes, refused without blocking or allocating otherwise.
pub(crate) fn read_calibration(path: &Path) -> Result<Vec<u8>, RuntimeError> {
    ork_io::input::read_input(path, ork_io::input::TEXT_INPUT_LIMIT).map_err(|e| {
        RuntimeError::Calibration {
            path: path.to_path_buf(),
            what: match e {
                ork_io::input::InputError::Io { source, .. } => source.to_string(),
                ork_io::input::InputError::NotRegular { kind, .. } => {
                    format!("is {kind}, not a regular file")
                }
                ork_io::input::InputError::TooLarge { size, limit, .. } => {
                    format!("{size} bytes or more, above the limit of {limit} bytes (docs/cli.md)")
                }
                other => other.to_string(),
            },
        }
    })
}

/// Refuse a calibration text of fewer than [`CALIB_MIN_TOKENS`] tokens.
pub(crate) fn check_calibration_tokens(path: &Path, tokens: usize) -> Result<(), RuntimeError> {
    if tokens < CALIB_MIN_TOKENS {
        return Err(RuntimeError::Calibration {
            path: path.to_path_buf(),
            what: format!(
                "{tokens} tokens; smoothing needs a calibration text of at least \
                 {CALIB_MIN_TOKENS} tokens (docs/chip.md)"
            ),
        });
    }
    Ok(())
}
