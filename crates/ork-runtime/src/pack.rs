//! The self-populating `.orkpack`: checked, or converted from the GGUF, and read as the weight
//! cache's source; when it cannot be written the engine runs from memory and says why.

use std::path::PathBuf;
use std::sync::Arc;

use ork_gguf::GgufFile;
use ork_manifest::Manifest;
use ork_residency::WeightSource;
use ork_store::{ConvertOptions, ConvertReport};

#[cfg(doc)]
use crate::Engine;
use crate::{EngineConfig, RuntimeError};

/// Told about the `.orkpack` conversion while [`Engine::open`] runs it (a front end's progress
/// bar).
pub trait ConvertObserver: Sync {
    /// Conversion is about to check or pack the weights of `manifest`.
    fn started(&self, manifest: &Manifest);
    /// One weight was handled.
    fn tensor_done(&self, progress: &ork_store::Progress<'_>);
    /// Conversion is over (also after an error).
    fn finished(&self);
}

/// Where the weight cache's weights come from, and what the `.orkpack` did at open.
pub(crate) struct PackedSource {
    /// The pack, or the GGUF packed on demand.
    pub(crate) source: WeightSource,
    /// What conversion did (`None` without a pack).
    pub(crate) convert: Option<ConvertReport>,
    /// The `.orkpack` in use (`None` without one, or when it could not be written).
    pub(crate) path: Option<PathBuf>,
    /// Why the configured pack could not be written, when the engine runs from memory instead.
    pub(crate) unwritable: Option<ork_store::StoreError>,
}

/// Every weight of `manifest` packed from `gguf` when it is needed, at the config's dtype and
/// groups.
pub(crate) fn gguf_source(
    gguf: &Arc<GgufFile>,
    manifest: &Arc<Manifest>,
    config: &EngineConfig,
) -> WeightSource {
    WeightSource::gguf(
        Arc::clone(gguf),
        Arc::clone(manifest),
        config.dtype,
        config.group,
    )
}

/// The config's `.orkpack` checked, or converted from `gguf` (telling `observer`), as the cache's
/// source; without a pack, or when it cannot be written (read-only directory, full disk), the
/// GGUF packed on demand.
///
/// # Errors
/// [`RuntimeError::Pack`] when the pack cannot be prepared for any reason other than writing.
pub(crate) fn open_weight_source(
    config: &EngineConfig,
    gguf: &Arc<GgufFile>,
    manifest: &Arc<Manifest>,
    smoothing: Option<&ork_store::PackSmoothing>,
    observer: Option<&dyn ConvertObserver>,
) -> Result<PackedSource, RuntimeError> {
    let Some(path) = config.pack_path() else {
        return Ok(PackedSource {
            source: gguf_source(gguf, manifest, config),
            convert: None,
            path: None,
            unwritable: None,
        });
    };
    let mut copts = ConvertOptions::new(config.dtype);
    copts.group = config.group;
    copts.target = Some(config.soc.name());
    copts.verify = config.verify;
    copts.evict_src = config.evict_src;
    copts.threads = config.threads;
    copts.manifest = Some(&**manifest);
    copts.smoothing = smoothing;
    let progress = |p: &ork_store::Progress<'_>| {
        if let Some(o) = observer {
            o.tensor_done(p);
        }
    };
    copts.progress = Some(&progress);
    if let Some(o) = observer {
        o.started(manifest);
    }
    let result = ork_store::ensure(gguf, &path, &copts);
    if let Some(o) = observer {
        o.finished();
    }
    match result {
        Ok((pack, report)) => Ok(PackedSource {
            source: WeightSource::pack(
                pack,
                Arc::clone(manifest),
                Some(Arc::clone(gguf)),
                config.verify,
            )?,
            convert: Some(report),
            path: Some(path),
            unwritable: None,
        }),
        // The pack cannot be written (read-only directory, full disk): run from memory, as
        // without a pack, and say so (`Engine::pack_unwritable`).
        Err(e) if e.is_write_failure() => Ok(PackedSource {
            source: gguf_source(gguf, manifest, config),
            convert: None,
            path: None,
            unwritable: Some(e),
        }),
        Err(source) => Err(RuntimeError::Pack { path, source }),
    }
}
