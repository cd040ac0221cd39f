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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use ork_device::{Device, DeviceError, DeviceWeight, DomainId, MemFlags};
use ork_pack::TiledLayout;

use crate::source::{Fetch, WeightSource};
use crate::trace::{Lane, Trace};
use crate::ResidencyError;

/// Device bytes a weight occupies: its blob rounded up to whole pages.
pub fn device_bytes(layout: &TiledLayout) -> u64 {
    (layout.blob_bytes() as u64).div_ceil(4096) * 4096
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
    /// Weights the prefetch thread brought in.
    pub prefetched: u64,
    /// Times the compute path had to wait for a weight that was being fetched.
    pub waits: u64,
    /// Total time spent in those waits and in on-demand fetches, in seconds.
    pub stall_seconds: f64,
}

/// Who is asking: the compute path (may evict anything evictable) or the prefetch thread
/// (may not evict weights it prefetched that have not been used yet, and never waits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Requester {
    Compute,
    Prefetch,
}

enum SlotState {
    Loading,
    Ready(Arc<DeviceWeight>),
    Failed(String),
}

struct Slot {
    state: SlotState,
    bytes: u64,
    domain: DomainId,
    last_use: u64,
    pinned: bool,
    /// Brought in by the prefetcher and not used since.
    fresh: bool,
}

impl Slot {
    fn evictable(&self, by: Requester) -> bool {
        !self.pinned
            && !(by == Requester::Prefetch && self.fresh)
            && matches!(&self.state, SlotState::Ready(w) if Arc::strong_count(w) == 1)
    }
}

#[derive(Default)]
struct State {
    slots: HashMap<String, Slot>,
    tick: u64,
    resident: Vec<u64>,
    pinned: Vec<u64>,
    pinned_names: HashSet<String>,
    stats: CacheStats,
}

impl State {
    fn total_resident(&self) -> u64 {
        self.resident.iter().sum()
    }

    /// Evict the least-recently-used weight of `domain` that `by` may evict. Returns whether one was.
    fn evict_lru(&mut self, domain: DomainId, by: Requester) -> bool {
        let victim = self
            .slots
            .iter()
            .filter(|(_, s)| s.domain == domain && s.evictable(by))
            .min_by_key(|(_, s)| s.last_use)
            .map(|(n, _)| n.clone());
        let Some(name) = victim else {
            return false;
        };
        let slot = self.slots.remove(&name).expect("victim exists");
        self.resident[domain.0 as usize] -= slot.bytes;
        self.stats.evictions += 1;
        // Dropping the last Arc frees the buffer and returns the IOVA.
        drop(slot);
        true
    }
}

/// Settings of a [`WeightCache`].
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Byte budget of resident weights in each domain.
    pub budget_bytes: u64,
    /// Flags of weight buffers.
    pub flags: MemFlags,
    /// Domains the cache may place weights in (`placement` picks one per weight; default 0).
    pub domains: u32,
}

impl CacheConfig {
    /// A budget in bytes per domain, one domain, weight flags.
    pub fn new(budget_bytes: u64) -> Self {
        CacheConfig {
            budget_bytes,
            flags: MemFlags::WEIGHT,
            domains: 1,
        }
    }
}

/// The byte-budgeted LRU cache of device-resident weights.
pub struct WeightCache {
    device: Arc<dyn Device>,
    source: WeightSource,
    config: CacheConfig,
    placement: HashMap<String, DomainId>,
    layouts: Mutex<HashMap<String, TiledLayout>>,
    state: Mutex<State>,
    changed: Condvar,
    trace: Option<Arc<Trace>>,
}

impl std::fmt::Debug for WeightCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightCache")
            .field("source", &self.source)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A weight in use. While it lives, the weight cannot be evicted.
pub struct WeightLease<'a> {
    weight: Arc<DeviceWeight>,
    cache: &'a WeightCache,
}

impl std::ops::Deref for WeightLease<'_> {
    type Target = DeviceWeight;
    fn deref(&self) -> &DeviceWeight {
        &self.weight
    }
}

impl Drop for WeightLease<'_> {
    fn drop(&mut self) {
        // Wake anyone waiting for room; the Arc count drops right after this.
        let _guard = self.cache.lock();
        self.cache.changed.notify_all();
    }
}

impl WeightCache {
    /// A cache over `device` fed by `source`.
    pub fn new(
        device: Arc<dyn Device>,
        source: WeightSource,
        config: CacheConfig,
    ) -> Result<Self, ResidencyError> {
        let domains = config.domains.max(1);
        if domains > device.info().domains {
            return Err(ResidencyError::Placement(format!(
                "{domains} domains requested, the device has {}",
                device.info().domains
            )));
        }
        Ok(WeightCache {
            device,
            source,
            config: CacheConfig { domains, ..config },
            placement: HashMap::new(),
            layouts: Mutex::new(HashMap::new()),
            state: Mutex::new(State {
                resident: vec![0; domains as usize],
                pinned: vec![0; domains as usize],
                ..State::default()
            }),
            changed: Condvar::new(),
            trace: None,
        })
    }

    /// Place weights in domains (weights not named go to domain 0).
    pub fn with_placement(mut self, placement: HashMap<String, DomainId>) -> Self {
        self.placement = placement;
        self
    }

    /// Record loads, packs and waits on `trace`.
    pub fn with_trace(mut self, trace: Arc<Trace>) -> Self {
        self.trace = Some(trace);
        self
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

    /// The layout of a weight (cached).
    pub fn layout(&self, name: &str) -> Result<TiledLayout, ResidencyError> {
        let mut layouts = self.layouts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = layouts.get(name) {
            return Ok(*l);
        }
        let l = self.source.layout(name)?;
        layouts.insert(name.to_owned(), l);
        Ok(l)
    }

    /// The domain a weight lives in.
    pub fn domain_of(&self, name: &str) -> DomainId {
        self.placement.get(name).copied().unwrap_or_default()
    }

    /// Never evict `name`: it is fetched on first use and stays. Its bytes count against its
    /// domain's budget from now on.
    pub fn pin(&self, name: &str) -> Result<(), ResidencyError> {
        let bytes = device_bytes(&self.layout(name)?);
        let domain = self.domain_of(name);
        let mut st = self.lock();
        if st.pinned_names.insert(name.to_owned()) {
            st.pinned[domain.0 as usize] += bytes;
            if let Some(slot) = st.slots.get_mut(name) {
                slot.pinned = true;
            }
        }
        Ok(())
    }

    /// Counters so far.
    pub fn stats(&self) -> CacheStats {
        self.lock().stats.clone()
    }

    /// Resident weight bytes per domain.
    pub fn resident(&self) -> Vec<u64> {
        self.lock().resident.clone()
    }

    /// Whether `name` is resident (ready) right now.
    pub fn is_resident(&self, name: &str) -> bool {
        matches!(
            self.lock().slots.get(name).map(|s| &s.state),
            Some(SlotState::Ready(_))
        )
    }

    /// Use a weight: a lease on its resident copy, fetching it first if needed.
    pub fn get(&self, name: &str) -> Result<WeightLease<'_>, ResidencyError> {
        let layout = self.layout(name)?;
        let mut st = self.lock();
        let mut waited: Option<Instant> = None;
        loop {
            st.tick += 1;
            let tick = st.tick;
            match st.slots.get_mut(name) {
                Some(slot) => match &slot.state {
                    SlotState::Ready(w) => {
                        let weight = Arc::clone(w);
                        slot.last_use = tick;
                        slot.fresh = false;
                        st.stats.hits += 1;
                        if let Some(t0) = waited {
                            let d = t0.elapsed();
                            st.stats.stall_seconds += d.as_secs_f64();
                            if let Some(tr) = &self.trace {
                                tr.span(Lane::Wait, "wait", name, t0, d);
                            }
                        }
                        return Ok(WeightLease {
                            weight,
                            cache: self,
                        });
                    }
                    SlotState::Loading => {
                        if waited.is_none() {
                            waited = Some(Instant::now());
                            st.stats.waits += 1;
                        }
                        st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                    }
                    SlotState::Failed(reason) => {
                        let reason = reason.clone();
                        let bytes = slot.bytes;
                        let domain = slot.domain;
                        st.slots.remove(name);
                        st.resident[domain.0 as usize] -= bytes;
                        return Err(ResidencyError::Prefetch {
                            name: name.to_owned(),
                            reason,
                        });
                    }
                },
                None => break,
            }
        }
        drop(st);
        let t0 = Instant::now();
        let weight = self.fetch(name, layout, Requester::Compute)?;
        self.lock().stats.stall_seconds += t0.elapsed().as_secs_f64();
        Ok(WeightLease {
            weight: weight.expect("compute fetch always returns the weight"),
            cache: self,
        })
    }

    /// Bring `name` in on behalf of the prefetch thread: returns `Ok(false)` when there is no
    /// room without evicting weights that were prefetched and not used yet (try again later).
    pub(crate) fn prefetch(&self, name: &str) -> Result<bool, ResidencyError> {
        let layout = self.layout(name)?;
        if self.lock().slots.contains_key(name) {
            return Ok(true);
        }
        Ok(self.fetch(name, layout, Requester::Prefetch)?.is_some() || {
            // Present already (raced with compute) counts as done.
            self.lock().slots.contains_key(name)
        })
    }

    /// Reserve room, insert a loading slot, fetch, publish. Returns `None` for a prefetch that
    /// found no room or found the weight already present.
    fn fetch(
        &self,
        name: &str,
        layout: TiledLayout,
        by: Requester,
    ) -> Result<Option<Arc<DeviceWeight>>, ResidencyError> {
        let bytes = device_bytes(&layout);
        let domain = self.domain_of(name);
        let d = domain.0 as usize;
        let mut st = self.lock();
        if st.slots.contains_key(name) {
            // Someone else inserted it meanwhile; the compute path goes back through get().
            drop(st);
            return match by {
                Requester::Prefetch => Ok(None),
                Requester::Compute => Ok(Some(Arc::clone(&self.get(name)?.weight))),
            };
        }
        let pinned_here = st.pinned_names.contains(name);
        let pinned_other = st.pinned[d] - if pinned_here { bytes } else { 0 };
        if bytes + pinned_other > self.config.budget_bytes {
            return Err(ResidencyError::BudgetTooSmall {
                name: name.to_owned(),
                budget_mib: mib(self.config.budget_bytes),
                need_mib: mib(bytes),
                pinned_mib: mib(pinned_other),
                min_mib: (bytes + pinned_other).div_ceil(1 << 20),
            });
        }
        // Make room within the budget.
        while st.resident[d] + bytes > self.config.budget_bytes {
            if st.evict_lru(domain, by) {
                continue;
            }
            let loading = st
                .slots
                .values()
                .any(|s| s.domain == domain && matches!(s.state, SlotState::Loading));
            match by {
                Requester::Prefetch => return Ok(None),
                Requester::Compute if loading => {
                    st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                    if st.slots.contains_key(name) {
                        drop(st);
                        return Ok(Some(Arc::clone(&self.get(name)?.weight)));
                    }
                }
                Requester::Compute => {
                    return Err(ResidencyError::BudgetTooSmall {
                        name: name.to_owned(),
                        budget_mib: mib(self.config.budget_bytes),
                        need_mib: mib(bytes),
                        pinned_mib: mib(st.resident[d]),
                        min_mib: (bytes + st.resident[d]).div_ceil(1 << 20),
                    })
                }
            }
        }
        st.resident[d] += bytes;
        let total = st.total_resident();
        st.stats.peak_resident = st.stats.peak_resident.max(total);
        st.tick += 1;
        let tick = st.tick;
        st.slots.insert(
            name.to_owned(),
            Slot {
                state: SlotState::Loading,
                bytes,
                domain,
                last_use: tick,
                pinned: pinned_here,
                fresh: by == Requester::Prefetch,
            },
        );
        drop(st);

        // Fill outside the lock; a guard marks the slot failed if this thread unwinds.
        let mut guard = FillGuard {
            cache: self,
            name,
            done: false,
        };
        let started = Instant::now();
        let result = self.fill(name, layout, domain, by);
        let elapsed = started.elapsed();
        let mut st = self.lock();
        guard.done = true;
        let out = match result {
            Ok((weight, how)) => {
                let weight = Arc::new(weight);
                match how {
                    Fetch::Loaded => st.stats.loads += 1,
                    Fetch::Packed => st.stats.packs += 1,
                }
                if by == Requester::Prefetch {
                    st.stats.prefetched += 1;
                }
                st.stats.bytes_moved += layout.blob_bytes() as u64;
                if let Some(slot) = st.slots.get_mut(name) {
                    slot.state = SlotState::Ready(Arc::clone(&weight));
                }
                if let Some(tr) = &self.trace {
                    let lane = match by {
                        Requester::Compute => Lane::Compute,
                        Requester::Prefetch => Lane::Prefetch,
                    };
                    let cat = match how {
                        Fetch::Loaded => "load",
                        Fetch::Packed => "pack",
                    };
                    tr.span(lane, cat, name, started, elapsed);
                }
                Ok(Some(weight))
            }
            Err(e) => {
                match by {
                    // The compute path reports its own error; drop the slot.
                    Requester::Compute => {
                        st.slots.remove(name);
                        st.resident[d] -= bytes;
                    }
                    // Keep the failure for the compute path to report when it needs the weight.
                    Requester::Prefetch => {
                        if let Some(slot) = st.slots.get_mut(name) {
                            slot.state = SlotState::Failed(e.to_string());
                        }
                    }
                }
                Err(e)
            }
        };
        self.changed.notify_all();
        out
    }

    /// Allocate the weight's buffer (evicting on a wall hit) and fill it from the source.
    fn fill(
        &self,
        name: &str,
        layout: TiledLayout,
        domain: DomainId,
        by: Requester,
    ) -> Result<(DeviceWeight, Fetch), ResidencyError> {
        let size = layout.blob_bytes() as u64;
        let mut buffer = loop {
            match self.device.create_buffer(size, self.config.flags, domain) {
                Ok(b) => break b,
                Err(e @ DeviceError::WindowFull { .. }) => {
                    let mut st = self.lock();
                    st.stats.wall_hits += 1;
                    if !st.evict_lru(domain, by) {
                        return Err(ResidencyError::WindowExhausted {
                            name: name.to_owned(),
                            source: e,
                        });
                    }
                }
                Err(e) => {
                    return Err(ResidencyError::Device {
                        name: name.to_owned(),
                        source: e,
                    })
                }
            }
        };
        let (scales, how) = self.source.fetch_into(name, buffer.as_mut_slice())?;
        buffer
            .sync_to_device()
            .map_err(|source| ResidencyError::Device {
                name: name.to_owned(),
                source,
            })?;
        Ok((
            DeviceWeight {
                layout,
                buffer,
                scales,
            },
            how,
        ))
    }
}

/// Marks a loading slot failed if the filling thread unwinds (so waiters never hang).
struct FillGuard<'a> {
    cache: &'a WeightCache,
    name: &'a str,
    done: bool,
}

impl Drop for FillGuard<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.cache.lock();
        if let Some(slot) = st.slots.get_mut(self.name) {
            slot.state = SlotState::Failed("the loading thread panicked".to_owned());
        }
        self.cache.changed.notify_all();
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}
