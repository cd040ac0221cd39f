//! The cache's weight ids are the manifest's ([`WeightId`], `docs/architecture.md`): what the
//! cache keeps about each weight (name, layout, scale group, domain, parts) sits in a table
//! indexed by that id, filled on first use, so that a use by id does no string hashing or
//! comparison.

use std::sync::{Arc, OnceLock};

use ork_device::split::{split, Part};
use ork_device::DomainId;
use ork_manifest::WeightId;
use ork_pack::{ScaleGroup, TiledLayout};

use super::WeightCache;
use crate::ResidencyError;

/// One weight the cache knows.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Its id.
    pub(crate) id: WeightId,
    /// Its name in the manifest (`.orkpack` entry, GGUF tensor or `TENSOR#EXPERT`): for
    /// messages and traces.
    pub(crate) name: Arc<str>,
    /// Its block (the manifest's layer), for the eviction policy.
    pub(crate) layer: Option<u32>,
    pub(crate) layout: TiledLayout,
    pub(crate) group: ScaleGroup,
    /// The domain the placement gives it (checked against the device when used).
    pub(crate) domain: DomainId,
    /// Its chip-sized parts, computed on first use.
    pub(crate) parts: OnceLock<Arc<[Part]>>,
}

/// What the cache keeps about each weight of the manifest, by id (filled on first use).
pub(super) struct Keys {
    pub(super) entries: Box<[OnceLock<Arc<Entry>>]>,
}

impl Keys {
    /// One empty cell per weight of a manifest of `n` weights.
    pub(super) fn new(n: usize) -> Keys {
        Keys {
            entries: (0..n).map(|_| OnceLock::new()).collect(),
        }
    }
}

/// A weight named to a [`WeightCache`] or [`crate::DeviceMatmul`]: its [`WeightId`] (the
/// manifest's, what the engine's hot path passes), or its name (resolved on each call with one
/// lookup in the manifest; for tools, tests and set-up).
pub trait WeightKey {
    /// The weight's id in `cache`.
    ///
    /// # Errors
    /// For a name, [`ResidencyError::UnknownWeight`] when the manifest holds no such matmul
    /// weight.
    fn weight_id(&self, cache: &WeightCache) -> Result<WeightId, ResidencyError>;
}

impl WeightKey for WeightId {
    fn weight_id(&self, _: &WeightCache) -> Result<WeightId, ResidencyError> {
        Ok(*self)
    }
}

impl WeightKey for str {
    fn weight_id(&self, cache: &WeightCache) -> Result<WeightId, ResidencyError> {
        cache.id(self)
    }
}

impl WeightKey for String {
    fn weight_id(&self, cache: &WeightCache) -> Result<WeightId, ResidencyError> {
        cache.id(self)
    }
}

impl<T: WeightKey + ?Sized> WeightKey for &T {
    fn weight_id(&self, cache: &WeightCache) -> Result<WeightId, ResidencyError> {
        (**self).weight_id(cache)
    }
}

impl WeightCache {
    /// The id of weight `name`: the manifest's ([`ork_manifest::Manifest::id`]), the key a hot
    /// path resolves once and passes on every use ([`WeightKey`]).
    ///
    /// # Errors
    /// [`ResidencyError::UnknownWeight`] for a name the manifest holds no matmul weight of.
    pub fn id(&self, name: &str) -> Result<WeightId, ResidencyError> {
        self.source
            .manifest()
            .id(name)
            .ok_or_else(|| ResidencyError::UnknownWeight {
                name: name.to_owned(),
                source_desc: self.source.describe(),
            })
    }

    /// The ids of `keys` ([`WeightCache::id`] of each name).
    ///
    /// # Errors
    /// The first key the manifest does not hold, as [`WeightCache::id`].
    pub fn ids<K: WeightKey>(&self, keys: &[K]) -> Result<Vec<WeightId>, ResidencyError> {
        keys.iter().map(|k| k.weight_id(self)).collect()
    }

    /// The name of weight `id` (`None` for an id not of this cache's manifest).
    pub fn name(&self, id: WeightId) -> Option<Arc<str>> {
        self.entry(id).ok().map(|e| Arc::clone(&e.name))
    }

    /// What the cache keeps about weight `id` (its layout and scale group read from the source
    /// on first use).
    pub(crate) fn entry(&self, id: WeightId) -> Result<Arc<Entry>, ResidencyError> {
        let cell =
            self.keys
                .entries
                .get(id.index())
                .ok_or_else(|| ResidencyError::UnknownWeight {
                    name: id.to_string(),
                    source_desc: self.source.describe(),
                })?;
        if let Some(e) = cell.get() {
            return Ok(Arc::clone(e));
        }
        let w = self.source.manifest().get(id);
        let e = Arc::new(Entry {
            id,
            name: w.key.as_str().into(),
            layer: w.layer,
            layout: self.source.layout(id)?,
            group: self.source.group(id)?,
            domain: self.placement.get(id.index()).copied().unwrap_or_default(),
            parts: OnceLock::new(),
        });
        // Two threads reading it at once read the same: either may be kept.
        Ok(Arc::clone(cell.get_or_init(|| e)))
    }

    /// What the cache keeps about a weight named by id or name.
    pub(crate) fn entry_of(&self, key: impl WeightKey) -> Result<Arc<Entry>, ResidencyError> {
        self.entry(key.weight_id(self)?)
    }

    /// The layout of a weight.
    pub fn layout(&self, key: impl WeightKey) -> Result<TiledLayout, ResidencyError> {
        Ok(self.entry_of(key)?.layout)
    }

    /// How a weight's scales cover K (from its source).
    pub fn group(&self, key: impl WeightKey) -> Result<ScaleGroup, ResidencyError> {
        Ok(self.entry_of(key)?.group)
    }

    /// The chip-sized parts a weight is computed in (see `docs/chip.md`): N-chunks of at most
    /// the chip's N limit, K-segments when K exceeds its K limit; one part, the whole weight,
    /// when it fits or when the device models no chip. The weight's device buffer holds the
    /// parts' blobs one after another ([`ork_device::split::part_offsets`]).
    pub fn parts(&self, key: impl WeightKey) -> Result<Arc<[Part]>, ResidencyError> {
        let e = self.entry_of(key)?;
        self.parts_of(&e)
    }

    /// [`WeightCache::parts`] of a known weight.
    pub(crate) fn parts_of(&self, e: &Entry) -> Result<Arc<[Part]>, ResidencyError> {
        if let Some(p) = e.parts.get() {
            return Ok(Arc::clone(p));
        }
        let (layout, group) = (e.layout, e.group);
        let device_err = |source| ResidencyError::Device {
            name: e.name.to_string(),
            source,
        };
        let p: Arc<[Part]> = match self.soc {
            Some(soc) => split(&layout, group, soc).map_err(device_err)?.into(),
            None => Arc::new([Part {
                n: 0..layout.n,
                k: 0..layout.k,
                layout,
                bytes: ork_device::split::PartBytes::Range(0..layout.blob_bytes()),
            }]),
        };
        // Two threads computing it at once compute the same parts: either may be kept.
        Ok(Arc::clone(e.parts.get_or_init(|| p)))
    }

    /// The domain a weight lives in (domain 0 for a weight the source does not hold).
    pub fn domain_of(&self, key: impl WeightKey) -> DomainId {
        self.entry_of(key).map_or(DomainId::default(), |e| e.domain)
    }

    /// The domain of `e`, checked against the device.
    pub(super) fn checked_domain(&self, e: &Entry) -> Result<DomainId, ResidencyError> {
        let domain = e.domain;
        let have = self.device.info().domains;
        if domain.0 >= have {
            return Err(ResidencyError::Placement(format!(
                "weight '{}' is placed in domain {domain}, the device has {have}",
                e.name
            )));
        }
        Ok(domain)
    }
}
