//! Where weights come from when they are not resident: the `.orkpack` (a plain copy of
//! pre-tiled bytes) or the GGUF itself (pack on the fly).

use std::sync::Arc;

use ork_gguf::GgufFile;
use ork_manifest::{Manifest, Weight, WeightId};
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

/// The origin of non-resident weights, and the model's manifest: the one id space the cache
/// keys weights by, and the name table beside it (`docs/architecture.md`).
pub struct WeightSource {
    manifest: Arc<Manifest>,
    origin: Origin,
}

/// Where the bytes come from.
// One per cache, made once: the size of the `Pack` variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Origin {
    /// Pre-tiled weights from an `.orkpack`. A blob whose checksum fails at load time is
    /// repacked from `model` when one is given, otherwise the load fails naming the tensor.
    Pack {
        pack: Orkpack,
        model: Option<Arc<GgufFile>>,
        verify: bool,
        /// Per [`WeightId`]: the index of its entry in [`Orkpack::entries`], resolved once when
        /// the source is made.
        entries: Vec<usize>,
    },
    /// Pack every weight from the GGUF when it is needed (no cache file).
    Gguf {
        model: Arc<GgufFile>,
        dtype: PackDtype,
        group: ScaleGroup,
    },
}

impl std::fmt::Debug for WeightSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl WeightSource {
    /// Pre-tiled weights from `pack`, the weights of `manifest`. Each manifest weight is matched
    /// to its pack entry by name once, here; a blob whose checksum fails at load time is
    /// repacked from `model` when one is given, otherwise the load fails naming the tensor.
    /// `verify`: check checksums while loading (default on).
    ///
    /// # Errors
    /// [`ResidencyError::PackMismatch`], naming the pack and the tensor, when the pack's weights
    /// are not the manifest's: a weight missing, an entry the manifest does not list, or a
    /// shape that differs.
    pub fn pack(
        pack: Orkpack,
        manifest: Arc<Manifest>,
        model: Option<Arc<GgufFile>>,
        verify: bool,
    ) -> Result<WeightSource, ResidencyError> {
        let entries = resolve_pack(&pack, &manifest)?;
        Ok(WeightSource {
            manifest,
            origin: Origin::Pack {
                pack,
                model,
                verify,
                entries,
            },
        })
    }

    /// Every weight of `manifest` packed from `model` (the file it was derived from) when it is
    /// needed, to `dtype` with scale groups `group` where they fit (`ork_store::effective_group`:
    /// per channel for a weight whose K the group does not divide).
    pub fn gguf(
        model: Arc<GgufFile>,
        manifest: Arc<Manifest>,
        dtype: PackDtype,
        group: ScaleGroup,
    ) -> WeightSource {
        WeightSource {
            manifest,
            origin: Origin::Gguf {
                model,
                dtype,
                group,
            },
        }
    }

    /// The manifest whose ids the source (and its cache) keys weights by.
    pub fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }

    /// A short description for messages.
    pub fn describe(&self) -> String {
        match &self.origin {
            Origin::Pack { pack, .. } => format!("{}", pack.path().display()),
            Origin::Gguf { model, .. } => format!("{}", model.path().display()),
        }
    }

    /// The manifest's weight `id`.
    fn weight(&self, id: WeightId) -> Result<&Weight, ResidencyError> {
        self.manifest
            .weights()
            .get(id.index())
            .ok_or_else(|| ResidencyError::UnknownWeight {
                name: id.to_string(),
                source_desc: self.describe(),
            })
    }

    /// Layout of a weight.
    pub fn layout(&self, id: WeightId) -> Result<TiledLayout, ResidencyError> {
        let w = self.weight(id)?;
        match &self.origin {
            Origin::Pack { pack, entries, .. } => Ok(pack.entries()[entries[id.index()]].layout()),
            Origin::Gguf { dtype, group, .. } => {
                let (k, n) = matmul_dims(&w.slice)?;
                Ok(TiledLayout::new(
                    weight_quant(&w.key, *dtype, *group).0,
                    k,
                    n,
                ))
            }
        }
    }

    /// How a weight's scales cover K: the entry's group in a pack, the requested group where it
    /// fits when packing from the GGUF.
    pub fn group(&self, id: WeightId) -> Result<ScaleGroup, ResidencyError> {
        let w = self.weight(id)?;
        match &self.origin {
            Origin::Pack { pack, entries, .. } => Ok(pack.entries()[entries[id.index()]].group()),
            Origin::Gguf { dtype, group, .. } => {
                let l = self.layout(id)?;
                let (dtype, group) = weight_quant(&w.key, *dtype, *group);
                Ok(effective_group(group, dtype, l.k))
            }
        }
    }

    /// Fill `dst` (exactly the layout's blob bytes) with the weight's tiled bytes and return its
    /// scales (per channel, or `[N][K/g]` per group: [`WeightSource::group`]) and how they were
    /// obtained.
    pub fn fetch_into(
        &self,
        id: WeightId,
        dst: &mut [u8],
    ) -> Result<(Vec<f32>, Fetch), ResidencyError> {
        let w = self.weight(id)?;
        match &self.origin {
            Origin::Pack {
                pack,
                model,
                verify,
                entries,
            } => {
                let e = &pack.entries()[entries[id.index()]];
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
                        Ok((pack_from(model, w, dtype, group, dst)?, Fetch::Packed))
                    }
                    (Err(err), _) => Err(err.into()),
                }
            }
            Origin::Gguf { model, .. } => {
                let (dtype, group) = (self.layout(id)?.dtype, self.group(id)?);
                Ok((pack_from(model, w, dtype, group, dst)?, Fetch::Packed))
            }
        }
    }
}

/// Per weight of `manifest`, the index of its entry in `pack`: every entry must be a weight of
/// the manifest, of its shape, and every weight must have an entry.
fn resolve_pack(pack: &Orkpack, manifest: &Manifest) -> Result<Vec<usize>, ResidencyError> {
    let model = manifest.file().display();
    let mismatch = |tensor: &str, problem: String| ResidencyError::PackMismatch {
        path: pack.path().to_path_buf(),
        tensor: tensor.to_owned(),
        problem,
    };
    let mut entries = vec![None; manifest.weights().len()];
    for (i, e) in pack.entries().iter().enumerate() {
        let Some(id) = manifest.id(e.name()) else {
            let problem = format!("the pack has this weight, the model {model} does not");
            return Err(mismatch(e.name(), problem));
        };
        let (l, w) = (e.layout(), manifest.get(id));
        if (l.k, l.n) != (w.k, w.n) {
            let problem = format!(
                "the pack stores it as K×N = {}×{}, the model {model} as {}×{}",
                l.k, l.n, w.k, w.n
            );
            return Err(mismatch(e.name(), problem));
        }
        entries[id.index()] = Some(i);
    }
    manifest
        .weights()
        .iter()
        .zip(entries)
        .map(|(w, e)| {
            e.ok_or_else(|| {
                let problem = format!("the model {model} has this weight, the pack does not");
                mismatch(&w.key, problem)
            })
        })
        .collect()
}

/// Pack weight `w` of `model` (a 2-D tensor, or an expert's slice `TENSOR#EXPERT`) straight
/// into `dst` (per channel), or through a grouped pack and a copy (per group, symmetric or
/// affine; the scales returned are then steps followed by offsets).
fn pack_from(
    model: &GgufFile,
    w: &Weight,
    dtype: PackDtype,
    group: ScaleGroup,
    dst: &mut [u8],
) -> Result<Vec<f32>, ResidencyError> {
    let (name, t) = (w.key.as_str(), &w.slice);
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
