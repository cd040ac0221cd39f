//! Where weights come from when they are not resident: the `.orkpack` (a plain copy of
//! pre-tiled bytes) or the GGUF itself (pack on the fly).

use std::sync::Arc;

use ork_gguf::GgufFile;
use ork_pack::{GgufRows, PackDtype, ScaleGroup, TiledLayout};
use ork_store::{effective_group, matmul_dims, weight_quant, Orkpack, StoreError};

use crate::ResidencyError;

/// How a weight reached the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Copied from the .orkpack.
    Loaded,
    /// Packed from the GGUF source.
    Packed,
}

/// The origin of non-resident weights.
// One per cache, made once: the size of the `Pack` variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum WeightSource {
    /// Pre-tiled weights from an `.orkpack`. A blob whose checksum fails at load time is
    /// repacked from `model` when one is given, otherwise the load fails naming the tensor.
    Pack {
        /// The validated pack.
        pack: Orkpack,
        /// The model it was built from, for repacking a corrupt blob.
        model: Option<Arc<GgufFile>>,
        /// Verify checksums while loading (default on).
        verify: bool,
    },
    /// Pack every weight from the GGUF when it is needed (no cache file).
    Gguf {
        /// The model.
        model: Arc<GgufFile>,
        /// Dtype to pack to.
        dtype: PackDtype,
        /// Scale groups to pack with where they fit (`ork_store::effective_group`: per channel
        /// for a weight whose K the group does not divide).
        group: ScaleGroup,
    },
}

impl std::fmt::Debug for WeightSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl WeightSource {
    /// A short description for messages.
    pub fn describe(&self) -> String {
        match self {
            WeightSource::Pack { pack, .. } => format!("{}", pack.path().display()),
            WeightSource::Gguf { model, .. } => format!("{}", model.path().display()),
        }
    }

    /// Layout of a weight.
    pub fn layout(&self, name: &str) -> Result<TiledLayout, ResidencyError> {
        match self {
            WeightSource::Pack { pack, .. } => pack
                .entry(name)
                .map(|e| e.layout())
                .ok_or_else(|| self.unknown(name)),
            WeightSource::Gguf {
                model,
                dtype,
                group,
                ..
            } => {
                let t = ork_manifest::weight_view(model, name).ok_or_else(|| self.unknown(name))?;
                let (k, n) = matmul_dims(&t)?;
                Ok(TiledLayout::new(weight_quant(name, *dtype, *group).0, k, n))
            }
        }
    }

    /// How a weight's scales cover K: the entry's group in a pack, the requested group where it
    /// fits when packing from the GGUF.
    pub fn group(&self, name: &str) -> Result<ScaleGroup, ResidencyError> {
        match self {
            WeightSource::Pack { pack, .. } => pack
                .entry(name)
                .map(|e| e.group())
                .ok_or_else(|| self.unknown(name)),
            WeightSource::Gguf { dtype, group, .. } => {
                let l = self.layout(name)?;
                let (dtype, group) = weight_quant(name, *dtype, *group);
                Ok(effective_group(group, dtype, l.k))
            }
        }
    }

    fn unknown(&self, name: &str) -> ResidencyError {
        ResidencyError::UnknownWeight {
            name: name.to_owned(),
            source_desc: self.describe(),
        }
    }

    /// Fill `dst` (exactly the layout's blob bytes) with the weight's tiled bytes and return its
    /// scales (per channel, or `[N][K/g]` per group: [`WeightSource::group`]) and how they were
    /// obtained.
    pub fn fetch_into(
        &self,
        name: &str,
        dst: &mut [u8],
    ) -> Result<(Vec<f32>, Fetch), ResidencyError> {
        match self {
            WeightSource::Pack {
                pack,
                model,
                verify,
            } => {
                let e = pack.entry(name).ok_or_else(|| self.unknown(name))?;
                let loaded = pack
                    .load_into(e, dst, *verify)
                    .and_then(|()| pack.scales(e));
                match (loaded, model) {
                    (Ok(scales), _) => Ok((scales, Fetch::Loaded)),
                    // A blob that fails its checksum, or that can no longer be read (the file
                    // was cut short or replaced in place while open): pack it from the source.
                    (
                        Err(StoreError::CorruptBlob { .. } | StoreError::BlobUnreadable { .. }),
                        Some(model),
                    ) => {
                        let dtype = e.layout().dtype;
                        let group = e.group();
                        Ok((pack_from(model, name, dtype, group, dst)?, Fetch::Packed))
                    }
                    (Err(err), _) => Err(err.into()),
                }
            }
            WeightSource::Gguf { model, .. } => {
                let (dtype, group) = (self.layout(name)?.dtype, self.group(name)?);
                Ok((pack_from(model, name, dtype, group, dst)?, Fetch::Packed))
            }
        }
    }
}

/// Pack weight `name` of `model` (a 2-D tensor, or an expert's slice `TENSOR#EXPERT`) straight
/// into `dst` (per channel), or through a grouped pack and a copy (per group, symmetric or
/// affine; the scales returned are then steps followed by offsets).
fn pack_from(
    model: &GgufFile,
    name: &str,
    dtype: PackDtype,
    group: ScaleGroup,
    dst: &mut [u8],
) -> Result<Vec<f32>, ResidencyError> {
    let t =
        ork_manifest::weight_view(model, name).ok_or_else(|| ResidencyError::UnknownWeight {
            name: name.to_owned(),
            source_desc: model.path().display().to_string(),
        })?;
    let t = &t;
    let pack_err = |source| ResidencyError::Pack {
        name: name.to_owned(),
        source: Box::new(source),
    };
    let rows = GgufRows::new(model, t).map_err(pack_err)?;
    let (_, n) = matmul_dims(t)?;
    let mut scales = vec![0f32; n];
    let grouped = match group {
        ScaleGroup::PerChannel => None,
        ScaleGroup::Group(g) => Some(ork_pack::pack_grouped(&rows, dtype, g)),
        ScaleGroup::Affine(g) => Some(ork_pack::pack_affine(&rows, g)),
    };
    let packed = match grouped {
        None => ork_pack::pack_into(&rows, dtype, dst, &mut scales).map(drop),
        Some(pw) => pw.and_then(|pw| {
            if pw.data.len() != dst.len() {
                return Err(ork_pack::PackError::Shape {
                    k: pw.layout.k,
                    n: pw.layout.n,
                    reason: "destination is not the layout's blob size",
                });
            }
            dst.copy_from_slice(&pw.data);
            scales = pw.scales;
            Ok(())
        }),
    };
    // The model cut short while being read: the bytes packed may be zeros, not the weight.
    model
        .check_intact(name)
        .map_err(|source| ork_store::StoreError::Source {
            source: Box::new(source),
        })?;
    packed.map_err(pack_err)?;
    Ok(scales)
}
