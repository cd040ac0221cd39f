//! The byte-budgeted LRU weight cache.
//!
//! Every use of a weight goes through [`WeightCache::get`], which returns a [`WeightLease`]. A
//! resident weight is a hit; a missing one is fetched from the [`WeightSource`] (a copy from the
//! `.orkpack`, or a pack from the GGUF) into a fresh device buffer, after evicting the
//! least-recently-used weights until it fits the budget of its domain. Evicting a weight drops its
//! [`DeviceWeight`], which frees its buffer and returns its IOVA. A weight that a lease still
//! holds is never evicted, so no task reads a freed or reused buffer. If the device reports its
//! window full although the budget allows the weight (fragmentation, another user), one more
//! weight is evicted and the allocation retried, and that is counted as a *wall hit*.
//!
//! Here: the cache, its settings and counters, building it, pinning. Beside it:
//! - [`keys`]: weight ids and what the cache keeps about each weight (layout, scale group,
//!   domain, chip-sized parts);
//! - [`slots`]: the slot table, the byte counts booked in the device ledger, spare buffers and
//!   eviction;
//! - [`lease`]: using a weight, [`WeightCache::get`] and the [`WeightLease`] it returns;
//! - [`fetch`]: bringing a weight in, for the compute path or the prefetch thread: making room
//!   (evicting, asking the device's other caches, waiting), filling the buffer, wall hits.
//!
//! [`DeviceWeight`]: ork_device::DeviceWeight

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use ork_device::{Device, DomainId, Soc};
use ork_pack::TiledLayout;

use crate::budget::{DeviceBudget, EvictionPolicy, Lru};
use crate::source::WeightSource;
use crate::trace::Trace;
use crate::ResidencyError;

mod fetch;
mod keys;
mod lease;
mod slots;
pub(crate) use keys::Entry;
use keys::Keys;
pub use keys::WeightKey;
pub use lease::WeightLease;
pub(crate) use slots::Requester;
use slots::State;

/// Device bytes a weight occupies on the RK3588 (emulated or rknpu), for the planner, which runs
/// without a device: the same [`ork_device::window::footprint`] those devices' `footprint` is.
/// With a device at hand, ask it ([`Device::footprint`]).
pub fn device_bytes(layout: &TiledLayout) -> u64 {
    ork_device::window::footprint(layout.blob_bytes() as u64)
}

/// Counters of a cache since it was created.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CacheStats {
    /// Uses that found the weight resident.
    pub hits: u64,
    /// Weights copied from the .orkpack into device buffers.
    pub loads: u64,
    /// Weights packed from the GGUF source.
    pub packs: u64,
    /// Weights evicted to make room.
    pub evictions: u64,
    /// Allocations the device refused although the budget allowed them (goal: 0).
    pub wall_hits: u64,
    /// Bytes copied or packed into device buffers.
    pub bytes_moved: u64,
    /// Highest resident weight bytes seen (all domains).
    pub peak_resident: u64,
    /// Loads that reused the device buffer of an evicted weight instead of allocating one.
    pub buffers_reused: u64,
    /// Weights the prefetch thread brought in.
    pub prefetched: u64,
    /// Times the compute path had to wait for a weight that was being fetched.
    pub waits: u64,
    /// Total time spent in those waits and in on-demand fetches, in seconds.
    pub stall_seconds: f64,
}

/// Settings of a [`WeightCache`].
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Byte budget of resident weights in each domain.
    pub budget_bytes: u64,
    /// Domains the cache may place weights in (`placement` picks one per weight; default 0).
    pub domains: u32,
}

impl CacheConfig {
    /// A budget in bytes per domain, one domain.
    pub fn new(budget_bytes: u64) -> Self {
        CacheConfig {
            budget_bytes,
            domains: 1,
        }
    }
}

/// The byte-budgeted LRU cache of device-resident weights.
pub struct WeightCache {
    device: Arc<dyn Device>,
    source: WeightSource,
    config: CacheConfig,
    /// Per [`ork_manifest::WeightId`]: the domain the placement gives the weight (domain 0 past
    /// its end).
    placement: Vec<DomainId>,
    /// What the cache keeps about each weight, by id ([`WeightCache::id`]).
    keys: Keys,
    /// The chip whose limits the device enforces (`None`: no chip, weights run whole).
    soc: Option<Soc>,
    state: Mutex<State>,
    changed: Condvar,
    trace: Mutex<Option<Arc<Trace>>>,
    /// The board clock's recorder (`docs/board-model.md`).
    events: Mutex<Option<crate::board::Recording>>,
    /// The device-wide ledger (its own unless made with [`WeightCache::with_budget`]).
    budget: Arc<DeviceBudget>,
    /// This cache's id on the ledger.
    member: u64,
    policy: Box<dyn EvictionPolicy>,
}

impl std::fmt::Debug for WeightCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightCache")
            .field("source", &self.source)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl WeightCache {
    /// A cache over `device` fed by `source`, with a budget of its own
    /// (`config.budget_bytes` per domain).
    pub fn new(
        device: Arc<dyn Device>,
        source: WeightSource,
        config: CacheConfig,
    ) -> Result<Self, ResidencyError> {
        let budget = DeviceBudget::new(config.budget_bytes, device.info().domains);
        Self::with_budget(device, source, config, budget)
    }

    /// A cache over `device` fed by `source` that books its weights in `budget`, the ledger it
    /// shares with the device's other caches (`config.budget_bytes` is ignored: the ledger's
    /// budget rules). Register the cache on the ledger ([`DeviceBudget::register`]) once it is
    /// in an `Arc`, so the other caches can ask it for room.
    pub fn with_budget(
        device: Arc<dyn Device>,
        source: WeightSource,
        config: CacheConfig,
        budget: Arc<DeviceBudget>,
    ) -> Result<Self, ResidencyError> {
        let config = CacheConfig {
            budget_bytes: budget.budget(),
            ..config
        };
        let domains = config.domains.max(1);
        if domains > device.info().domains {
            return Err(ResidencyError::Placement(format!(
                "{domains} domains requested, the device has {}",
                device.info().domains
            )));
        }
        // Counters exist for every domain of the device, so a placement naming any of them
        // can be accounted; `domain_of` refuses the others.
        let info = device.info();
        let device_domains = info.domains as usize;
        let weights = source.manifest().weights().len();
        Ok(WeightCache {
            soc: info.soc,
            device,
            source,
            config: CacheConfig { domains, ..config },
            placement: Vec::new(),
            keys: Keys::new(weights),
            state: Mutex::new(State {
                slots: HashMap::new(),
                tick: 0,
                generation: 1,
                resident: vec![0; device_domains],
                pinned: vec![0; device_domains],
                pinned_names: HashSet::new(),
                spare: Vec::new(),
                stats: CacheStats::default(),
                ledger: Arc::clone(&budget),
            }),
            changed: Condvar::new(),
            trace: Mutex::new(None),
            events: Mutex::new(None),
            member: budget.new_member_id(),
            budget,
            policy: Box::new(Lru),
        })
    }

    /// Choose eviction victims with `policy` instead of [`Lru`].
    pub fn with_policy(mut self, policy: Box<dyn EvictionPolicy>) -> Self {
        self.policy = policy;
        self
    }

    /// The device-wide ledger this cache books its weights in.
    pub fn device_budget(&self) -> &Arc<DeviceBudget> {
        &self.budget
    }

    pub(crate) fn member_id(&self) -> u64 {
        self.member
    }

    /// Place weights in domains (weights not named go to domain 0). The cache's domain count
    /// grows to cover the placement; a domain the device does not have is reported as
    /// [`ResidencyError::Placement`] when a weight placed there is pinned or used.
    pub fn with_placement(mut self, placement: HashMap<ork_manifest::WeightId, DomainId>) -> Self {
        let used = placement.values().map(|d| d.0 + 1).max().unwrap_or(1);
        self.config.domains = self.config.domains.max(used);
        self.placement = vec![DomainId::default(); self.keys.entries.len()];
        for (id, domain) in placement {
            if let Some(d) = self.placement.get_mut(id.index()) {
                *d = domain;
            }
        }
        for (e, domain) in self.keys.entries.iter_mut().zip(&self.placement) {
            if let Some(e) = e.get_mut() {
                Arc::make_mut(e).domain = *domain;
            }
        }
        self
    }

    /// Record loads, packs and waits on `trace`.
    pub fn with_trace(self, trace: Arc<Trace>) -> Self {
        self.set_trace(Some(trace));
        self
    }

    /// Start (or stop, with `None`) recording loads, packs and waits on `trace`.
    pub fn set_trace(&self, trace: Option<Arc<Trace>>) {
        *self.trace.lock().unwrap_or_else(|p| p.into_inner()) = trace;
    }

    /// Start (or stop, with `None`) recording loads for the board clock, its weights keyed as
    /// `model`'s (the run's model, or a draft beside it: each numbers its weights from 0).
    pub fn set_events(&self, events: Option<Arc<ork_board::Recorder>>, model: ork_board::Model) {
        *self.events.lock().unwrap_or_else(|p| p.into_inner()) =
            events.map(|rec| crate::board::Recording { rec, model });
    }

    fn events(&self) -> Option<crate::board::Recording> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn trace(&self) -> Option<Arc<Trace>> {
        self.trace.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The source of non-resident weights.
    pub fn source(&self) -> &WeightSource {
        &self.source
    }

    /// Budget per domain, in bytes.
    pub fn budget(&self) -> u64 {
        self.config.budget_bytes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Never evict `name`: it is fetched on first use and stays. Its bytes count against its
    /// domain's budget from now on; pinning more than the budget holds is
    /// [`ResidencyError::BudgetTooSmall`] (naming this weight, with the minimum budget).
    pub fn pin(&self, key: impl WeightKey) -> Result<(), ResidencyError> {
        let id = key.weight_id(self)?;
        let e = self.entry(id)?;
        let bytes = self.device.footprint(e.layout.blob_bytes() as u64);
        let domain = self.checked_domain(&e)?;
        let mut st = self.lock();
        if st.pinned_names.contains(&id) {
            return Ok(());
        }
        // Pins of every cache on the device count against the one budget.
        if let Err(pinned) = self.budget.try_pin(domain, bytes) {
            return Err(ResidencyError::BudgetTooSmall {
                name: e.name.to_string(),
                budget_mib: mib(self.config.budget_bytes),
                need_mib: mib(bytes),
                pinned_mib: mib(pinned),
                min_mib: (pinned + bytes).div_ceil(1 << 20),
            });
        }
        if st.pinned_names.insert(id) {
            st.pinned[domain.0 as usize] += bytes;
            if let Some(slot) = st.slots.get_mut(&id) {
                slot.pinned = true;
            }
        }
        Ok(())
    }

    /// Counters so far.
    pub fn stats(&self) -> CacheStats {
        self.lock().stats.clone()
    }

    /// Resident weight bytes per domain, one entry for each of the device's domains.
    pub fn resident(&self) -> Vec<u64> {
        self.lock().resident.clone()
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}
