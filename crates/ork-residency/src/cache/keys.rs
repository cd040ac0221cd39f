//! The cache's weight ids: each weight its source knows gets a [`WeightId`] the first time it
//! is named, with what the cache keeps about it (name, layout, scale group, domain, parts), so
//! that a use by id does no string hashing or comparison (`docs/architecture.md`).

use std::collections::HashMap;
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
    /// Its name in the source (`.orkpack` entry, GGUF tensor or `TENSOR#EXPERT`): for messages,
    /// traces and the eviction policy.
    pub(crate) name: Arc<str>,
    pub(crate) layout: TiledLayout,
    pub(crate) group: ScaleGroup,
    /// The domain the placement gives it (checked against the device when used).
    pub(crate) domain: DomainId,
    /// Its chip-sized parts, computed on first use.
    pub(crate) parts: OnceLock<Arc<[Part]>>,
}

/// The weights named so far, by id and by name.
#[derive(Default)]
pub(super) struct Keys {
    pub(super) entries: Vec<Arc<Entry>>,
    pub(super) ids: HashMap<Arc<str>, WeightId>,
}

/// A weight named to a [`WeightCache`] or [`crate::DeviceMatmul`]: its [`WeightId`] in that
/// cache ([`WeightCache::id`], resolved once, what the engine's hot path passes), or its name
/// (resolved on each call with one lookup; for tools, tests and set-up).
pub trait WeightKey {
    /// The weight's id in `cache`.
    ///
    /// # Errors
    /// For a name, the source's error when it holds no such matmul weight.
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
    /// The id of weight `name` in this cache, given the first time the weight is named (its
    /// layout and scale group read from the source then): the key a hot path resolves once
    /// and passes on every use ([`WeightKey`]).
    ///
    /// # Errors
    /// The source's error for a name it holds no matmul weight of
    /// ([`ResidencyError::UnknownWeight`] and the like).
    pub fn id(&self, name: &str) -> Result<WeightId, ResidencyError> {
        let read = |k: &Keys| k.ids.get(name).copied();
        if let Some(id) = read(&self.keys.read().unwrap_or_else(|p| p.into_inner())) {
            return Ok(id);
        }
        let layout = self.source.layout(name)?;
        let group = self.source.group(name)?;
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = read(&keys) {
            return Ok(id);
        }
        let id =
            WeightId(u32::try_from(keys.entries.len()).map_err(|_| {
                ResidencyError::Placement(format!("more than {} weights", u32::MAX))
            })?);
        let name: Arc<str> = name.into();
        keys.entries.push(Arc::new(Entry {
            name: Arc::clone(&name),
            layout,
            group,
            domain: self.placement.get(&*name).copied().unwrap_or_default(),
            parts: std::sync::OnceLock::new(),
        }));
        keys.ids.insert(name, id);
        Ok(id)
    }

    /// The ids of `keys` ([`WeightCache::id`] of each name).
    ///
    /// # Errors
    /// The first key the source does not hold, as [`WeightCache::id`].
    pub fn ids<K: WeightKey>(&self, keys: &[K]) -> Result<Vec<WeightId>, ResidencyError> {
        keys.iter().map(|k| k.weight_id(self)).collect()
    }

    /// The name of weight `id` (`None` for an id this cache never gave).
    pub fn name(&self, id: WeightId) -> Option<Arc<str>> {
        self.entry(id).ok().map(|e| Arc::clone(&e.name))
    }

    /// What the cache keeps about weight `id`.
    pub(crate) fn entry(&self, id: WeightId) -> Result<Arc<Entry>, ResidencyError> {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        keys.entries
            .get(id.index())
            .cloned()
            .ok_or_else(|| ResidencyError::UnknownWeight {
                name: id.to_string(),
                source_desc: self.source.describe(),
            })
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
