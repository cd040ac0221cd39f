//! Validating cache entries against the model they were packed from.

use ork_gguf::{GgufFile, TensorInfo};
use ork_pack::{LayoutId, PackDtype, PackedWeight, ScaleGroup, TiledLayout};

use crate::format::MAX_DIM;
use crate::{fingerprint, Entry, Orkpack, SourceInfo, StoreError};

/// What an entry must look like to be usable for a given source tensor and settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryKey {
    /// Geometry and dtype.
    pub layout: TiledLayout,
    /// Tiled layout.
    pub layout_id: LayoutId,
    /// Source fingerprint and ggml type.
    pub source: SourceInfo,
    /// How the scales cover K.
    pub group: ScaleGroup,
}

impl EntryKey {
    /// The key for packing `t` of `file` as `dtype` in the RK3588 native layout (reads the
    /// fingerprint sample of the tensor).
    pub fn for_tensor(
        file: &GgufFile,
        t: &TensorInfo,
        dtype: PackDtype,
    ) -> Result<EntryKey, StoreError> {
        Self::for_tensor_grouped(file, t, dtype, ScaleGroup::PerChannel)
    }

    /// The key for packing `t` as `dtype` with scale groups `group` where they fit
    /// ([`effective_group`]: per channel for a weight whose K the group does not divide).
    pub fn for_tensor_grouped(
        file: &GgufFile,
        t: &TensorInfo,
        dtype: PackDtype,
        group: ScaleGroup,
    ) -> Result<EntryKey, StoreError> {
        let (k, n) = matmul_dims(t)?;
        Ok(EntryKey {
            layout: TiledLayout::new(dtype, k, n),
            layout_id: LayoutId::Rk3588NativeB,
            source: SourceInfo {
                fingerprint: fingerprint(file, t),
                ggml_type: t.ty.id(),
            },
            group: effective_group(group, dtype, k),
        })
    }
}

/// The scale group a weight of `dtype` with reduction length `k` gets when `group` is asked for:
/// `group` itself when it is a multiple of 32 that divides `k` (the chip's per-group mode needs
/// whole groups; `docs/chip.md`), per channel otherwise (and always for fp16, which has no
/// scales to group; affine groups only for int4). SmolLM2's K = 576 weights therefore stay per channel under g128, g256 and
/// g512; only its `ffn_down` (K = 1536) is grouped.
pub fn effective_group(group: ScaleGroup, dtype: PackDtype, k: usize) -> ScaleGroup {
    match group {
        ScaleGroup::Group(g)
            if dtype != PackDtype::F16 && g > 0 && g.is_multiple_of(32) && k.is_multiple_of(g) =>
        {
            group
        }
        ScaleGroup::Affine(g)
            if dtype == PackDtype::I4 && g > 0 && g.is_multiple_of(32) && k.is_multiple_of(g) =>
        {
            group
        }
        _ => ScaleGroup::PerChannel,
    }
}

/// The dtype and scale group weight `name` is packed with when `dtype` and `group` are asked for
/// (before [`effective_group`]): the same, except that under affine int4 groups (w4a16-gN) the
/// output projection (`output.weight`, or `token_embd.weight` when tied) is packed int8 per
/// channel (fp16 × int8, an RK3576 type): on SmolLM2 (its head is Q8_0 in the GGUF) that gives
/// perplexity 18.33 against 19.16 as int4 affine g32 (`docs/chip.md`).
pub fn weight_quant(name: &str, dtype: PackDtype, group: ScaleGroup) -> (PackDtype, ScaleGroup) {
    let head = matches!(
        ork_manifest::classify(name),
        Some((
            ork_manifest::Role::Output | ork_manifest::Role::TokenEmbd,
            _
        ))
    );
    if head && group.is_affine() {
        (PackDtype::I8, ScaleGroup::PerChannel)
    } else {
        (dtype, group)
    }
}

/// `(K, N)` of a 2-D GGUF tensor (`dims = [ne0 = K, ne1 = N]`).
pub fn matmul_dims(t: &TensorInfo) -> Result<(usize, usize), StoreError> {
    let bad = |reason: String| StoreError::NotMatmulWeight {
        tensor: t.name.clone(),
        reason,
    };
    let [k, n] = t.dims[..] else {
        return Err(bad(format!("{} dims, a matmul weight has 2", t.dims.len())));
    };
    if k == 0 || n == 0 || k > MAX_DIM || n > MAX_DIM {
        return Err(bad(format!("dims [{k}, {n}] (each 1..={MAX_DIM})")));
    }
    Ok((k as usize, n as usize))
}

/// Verdict on one cache entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryStatus {
    /// Packed from this source with these settings, checksums intact.
    Valid,
    /// Intact, but packed from another source or with other settings: repack.
    Stale {
        /// What differs.
        reason: String,
    },
    /// Blob or scales do not match their checksums: repack.
    Corrupt {
        /// What failed.
        reason: String,
    },
}

/// Check `entry` of `pack` against source tensor `t` of `file` packed as `dtype`: a K, N,
/// dtype, layout, source type or fingerprint mismatch is [`EntryStatus::Stale`]; a checksum
/// mismatch of blob or scales is [`EntryStatus::Corrupt`].
pub fn check_entry(
    pack: &Orkpack,
    entry: &Entry,
    file: &GgufFile,
    t: &TensorInfo,
    dtype: PackDtype,
) -> EntryStatus {
    match EntryKey::for_tensor(file, t, dtype) {
        Ok(key) => check_entry_key(pack, entry, &key),
        Err(e) => EntryStatus::Stale {
            reason: e.to_string(),
        },
    }
}

/// [`check_entry`] against a precomputed key.
pub fn check_entry_key(pack: &Orkpack, entry: &Entry, key: &EntryKey) -> EntryStatus {
    if let Some(reason) = stale_reason(entry, key) {
        return EntryStatus::Stale { reason };
    }
    match pack.verify(entry) {
        Ok(()) => EntryStatus::Valid,
        Err(e) => EntryStatus::Corrupt {
            reason: e.to_string(),
        },
    }
}

/// Why `entry`'s metadata does not match `key`, if it does not.
pub(crate) fn stale_reason(entry: &Entry, key: &EntryKey) -> Option<String> {
    let (have, want) = (entry.layout(), key.layout);
    if (have.k, have.n) != (want.k, want.n) {
        return Some(format!(
            "shape k={} n={}, source has k={} n={}",
            have.k, have.n, want.k, want.n
        ));
    }
    if have.dtype != want.dtype {
        return Some(format!(
            "dtype {}, wanted {}",
            have.dtype.name(),
            want.dtype.name()
        ));
    }
    if entry.layout_id() != key.layout_id {
        return Some(format!(
            "layout {:?}, wanted {:?}",
            entry.layout_id(),
            key.layout_id
        ));
    }
    if entry.group() != key.group {
        return Some(format!(
            "{} scales, wanted {}",
            entry.group().name(),
            key.group.name()
        ));
    }
    let (hs, ws) = (entry.source(), key.source);
    if hs.ggml_type != ws.ggml_type {
        return Some(format!(
            "source ggml type {}, model has {}",
            hs.ggml_type, ws.ggml_type
        ));
    }
    if hs.fingerprint != ws.fingerprint {
        return Some(format!(
            "source fingerprint {:016x}, model has {:016x} (tensor values changed)",
            hs.fingerprint, ws.fingerprint
        ));
    }
    None
}

impl Orkpack {
    /// Load the packed weight for source tensor `t` of `file`, refusing a stale entry with
    /// [`StoreError::Stale`] and a damaged one with [`StoreError::CorruptBlob`].
    pub fn load_for(
        &self,
        file: &GgufFile,
        t: &TensorInfo,
        dtype: PackDtype,
        verify: bool,
    ) -> Result<PackedWeight, StoreError> {
        let key = EntryKey::for_tensor(file, t, dtype)?;
        self.load_keyed(&t.name, &key, verify)
    }

    /// Load entry `name`, refusing it with [`StoreError::Stale`] unless it matches `key`.
    pub fn load_keyed(
        &self,
        name: &str,
        key: &EntryKey,
        verify: bool,
    ) -> Result<PackedWeight, StoreError> {
        let e = self.entry(name).ok_or_else(|| StoreError::MissingEntry {
            path: self.path().to_path_buf(),
            tensor: name.to_string(),
        })?;
        if let Some(reason) = stale_reason(e, key) {
            return Err(StoreError::Stale {
                path: self.path().to_path_buf(),
                tensor: name.to_string(),
                reason,
            });
        }
        self.load(name, verify)
    }
}
