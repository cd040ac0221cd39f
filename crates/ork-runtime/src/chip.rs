//! Chip checks: a precision the chip has no matmul type for is refused before anything is
//! converted or allocated.

use ork_device::ActPrecision;
use ork_manifest::Manifest;
use ork_pack::PackDtype;

use crate::{EngineConfig, RuntimeError};

/// Refuse, before anything is converted or allocated, a precision the chip has no matmul type
/// for (the device would refuse every task later): every weight is checked as the device will
/// see it (per-channel scales; its K and N limits are the split's business, not checked here).
pub fn check_chip(config: &EngineConfig, manifest: &Manifest) -> Result<(), RuntimeError> {
    use ork_device::{ElemType, MatmulShape};
    for w in manifest.execution_order() {
        let (k, n) = ork_store::matmul_dims(&w.slice).map_err(|source| RuntimeError::Plan {
            model: manifest.file().to_path_buf(),
            source,
        })?;
        let (dtype, group) = ork_store::weight_quant(&w.key, config.dtype, config.group);
        let shape = MatmulShape {
            a: ElemType::of_activations(config.activations),
            b: ElemType::of_weight(dtype),
            k,
            n,
            group: ork_store::effective_group(group, dtype, k),
        };
        let quant = config.quant().map_or_else(
            || {
                format!(
                    "--dtype {} --act {}",
                    config.dtype.name(),
                    config.activations.name()
                )
            },
            |q| format!("--quant {q}"),
        );
        if let Err(source) = config.soc.check_types(&shape) {
            if let (
                ork_device::DeviceError::Chip {
                    limit: ork_device::ChipLimit::Group { .. },
                    ..
                },
                Some(g),
            ) = (&source, shape.group.size())
            {
                return Err(RuntimeError::Chip {
                    model: config.model.clone(),
                    hint: format!(
                        "{quant}: the {} has no {}-weight group of {g} with {} activations \
                         (w8a8 groups: 128, 256, 512; w4a16 groups on the RK3576: 32, 64, 128); \
                         see docs/chip.md",
                        config.soc,
                        config.dtype.name(),
                        config.activations.name()
                    ),
                    source,
                });
            }
            let hint = match (config.activations, config.dtype) {
                (ActPrecision::F16, PackDtype::I8 | PackDtype::I4) => format!(
                    "the {} has no fp16 × int{} matmul (no w{}a16): use --act i8 (w8a8), \
                     --dtype f16 --act f16, or --soc rk3576 for a chip that has it",
                    config.soc,
                    if config.dtype == PackDtype::I8 { 8 } else { 4 },
                    if config.dtype == PackDtype::I8 { 8 } else { 4 },
                ),
                (ActPrecision::Int8, PackDtype::I4) => format!(
                    "the {} has no int8 × int4 matmul: use --dtype i8 (w8a8), or --soc rk3576",
                    config.soc
                ),
                (ActPrecision::Int8, PackDtype::F16) => {
                    "no chip has int8 × fp16: use --act f16 with --dtype f16".to_owned()
                }
                _ => "see docs/chip.md for the chip's matmul types".to_owned(),
            };
            return Err(RuntimeError::Chip {
                model: config.model.clone(),
                hint: format!("{quant}: {hint}"),
                source,
            });
        }
    }
    Ok(())
}
