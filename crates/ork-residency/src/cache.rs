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

use ork_device::split::{arrange, native_order, split, Part};
use ork_device::{BufferIntent, Device, DeviceBuffer, DeviceError, DeviceWeight, DomainId, Soc};
use ork_pack::{ScaleGroup, TiledLayout};

use crate::budget::{DeviceBudget, EvictionPolicy, Lru, Reclaim};
use crate::source::{Fetch, WeightSource};
use crate::trace::{Lane, Trace};
use crate::ResidencyError;

mod slots;
pub(crate) use slots::Requester;
use slots::{Slot, SlotState, State};

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

/// What [`WeightCache::fetch`] achieved.
enum Fetched {
    /// The weight, for the compute path's lease.
    Lease(Arc<DeviceWeight>),
    /// Prefetched (or found present): the slot holds it.
    Done,
    /// A prefetch found no room it may make; try again when compute moves on.
    NoRoom,
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
    placement: HashMap<String, DomainId>,
    layouts: Mutex<HashMap<String, TiledLayout>>,
    /// The chip whose limits the device enforces (`None`: no chip, weights run whole).
    soc: Option<Soc>,
    /// Each weight's chip-sized parts (computed once per name).
    parts: Mutex<HashMap<String, Arc<[Part]>>>,
    state: Mutex<State>,
    changed: Condvar,
    trace: Mutex<Option<Arc<Trace>>>,
    /// The board clock's recorder (`docs/board-model.md`).
    events: Mutex<Option<Arc<ork_board::Recorder>>>,
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

/// A weight in use. While it lives, the weight cannot be evicted.
pub struct WeightLease<'a> {
    /// `Some` until the lease is dropped.
    weight: Option<Arc<DeviceWeight>>,
    cache: &'a WeightCache,
}

impl<'a> WeightLease<'a> {
    fn new(weight: Arc<DeviceWeight>, cache: &'a WeightCache) -> Self {
        WeightLease {
            weight: Some(weight),
            cache,
        }
    }

    fn arc(&self) -> &Arc<DeviceWeight> {
        self.weight
            .as_ref()
            .expect("a lease holds its weight until dropped")
    }
}

impl std::ops::Deref for WeightLease<'_> {
    type Target = DeviceWeight;
    fn deref(&self) -> &DeviceWeight {
        self.arc()
    }
}

impl Drop for WeightLease<'_> {
    fn drop(&mut self) {
        // Release the weight *before* waking waiters: a waiter that wakes must already see the
        // weight as evictable (`Arc::strong_count == 1`), or it could give up or sleep forever.
        let _guard = self.cache.lock();
        drop(self.weight.take());
        self.cache.changed.notify_all();
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
        Ok(WeightCache {
            soc: info.soc,
            parts: Mutex::new(HashMap::new()),
            device,
            source,
            config: CacheConfig { domains, ..config },
            placement: HashMap::new(),
            layouts: Mutex::new(HashMap::new()),
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
    pub fn with_placement(mut self, placement: HashMap<String, DomainId>) -> Self {
        let used = placement.values().map(|d| d.0 + 1).max().unwrap_or(1);
        self.config.domains = self.config.domains.max(used);
        self.placement = placement;
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

    /// Start (or stop, with `None`) recording loads for the board clock.
    pub fn set_events(&self, events: Option<Arc<ork_board::Recorder>>) {
        *self.events.lock().unwrap_or_else(|p| p.into_inner()) = events;
    }

    fn events(&self) -> Option<Arc<ork_board::Recorder>> {
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

    /// How a weight's scales cover K (from its source).
    pub fn group(&self, name: &str) -> Result<ScaleGroup, ResidencyError> {
        self.source.group(name)
    }

    /// The chip-sized parts a weight is computed in (see `docs/chip.md`): N-chunks of at most
    /// the chip's N limit, K-segments when K exceeds its K limit; one part, the whole weight,
    /// when it fits or when the device models no chip. The weight's device buffer holds the
    /// parts' blobs one after another ([`ork_device::split::part_offsets`]).
    pub fn parts(&self, name: &str) -> Result<Arc<[Part]>, ResidencyError> {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = parts.get(name) {
            return Ok(Arc::clone(p));
        }
        let layout = self.layout(name)?;
        let group = self.group(name)?;
        let device_err = |source| ResidencyError::Device {
            name: name.to_owned(),
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
        parts.insert(name.to_owned(), Arc::clone(&p));
        Ok(p)
    }

    /// The domain a weight lives in.
    pub fn domain_of(&self, name: &str) -> DomainId {
        self.placement.get(name).copied().unwrap_or_default()
    }

    /// [`Self::domain_of`], checked against the device.
    fn checked_domain(&self, name: &str) -> Result<DomainId, ResidencyError> {
        let domain = self.domain_of(name);
        let have = self.device.info().domains;
        if domain.0 >= have {
            return Err(ResidencyError::Placement(format!(
                "weight '{name}' is placed in domain {domain}, the device has {have}"
            )));
        }
        Ok(domain)
    }

    /// Never evict `name`: it is fetched on first use and stays. Its bytes count against its
    /// domain's budget from now on; pinning more than the budget holds is
    /// [`ResidencyError::BudgetTooSmall`] (naming this weight, with the minimum budget).
    pub fn pin(&self, name: &str) -> Result<(), ResidencyError> {
        let bytes = self
            .device
            .footprint(self.layout(name)?.blob_bytes() as u64);
        let domain = self.checked_domain(name)?;
        let mut st = self.lock();
        if st.pinned_names.contains(name) {
            return Ok(());
        }
        // Pins of every cache on the device count against the one budget.
        if let Err(pinned) = self.budget.try_pin(domain, bytes) {
            return Err(ResidencyError::BudgetTooSmall {
                name: name.to_owned(),
                budget_mib: mib(self.config.budget_bytes),
                need_mib: mib(bytes),
                pinned_mib: mib(pinned),
                min_mib: (pinned + bytes).div_ceil(1 << 20),
            });
        }
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

    /// Resident weight bytes per domain, one entry for each of the device's domains.
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
                        slot.wanted = 0;
                        st.stats.hits += 1;
                        if let Some(t0) = waited {
                            let d = t0.elapsed();
                            st.stats.stall_seconds += d.as_secs_f64();
                            if let Some(tr) = &self.trace() {
                                tr.span(Lane::Wait, "wait", name, t0, d);
                            }
                        }
                        return Ok(WeightLease::new(weight, self));
                    }
                    SlotState::Loading => {
                        if waited.is_none() {
                            waited = Some(Instant::now());
                            st.stats.waits += 1;
                        }
                        st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                    }
                },
                None => break,
            }
        }
        drop(st);
        let t0 = Instant::now();
        let weight = match self.fetch(name, layout, Requester::Compute)? {
            Fetched::Lease(w) => w,
            Fetched::Done | Fetched::NoRoom => {
                unreachable!("the compute path gets the weight or an error")
            }
        };
        self.lock().stats.stall_seconds += t0.elapsed().as_secs_f64();
        Ok(WeightLease::new(weight, self))
    }

    /// A lease on `name` if it is resident now, counted as a hit as [`WeightCache::get`] counts
    /// one; `None` when it is absent or still loading (nothing is fetched or waited for).
    pub fn get_if_resident(&self, name: &str) -> Option<WeightLease<'_>> {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.tick += 1;
        let slot = st.slots.get_mut(name)?;
        let SlotState::Ready(w) = &slot.state else {
            return None;
        };
        let weight = Arc::clone(w);
        slot.last_use = st.tick;
        slot.wanted = 0;
        st.stats.hits += 1;
        drop(guard);
        Some(WeightLease::new(weight, self))
    }

    /// The executor announced the weights it uses next (the prefetch thread saw a new
    /// announcement): weights prefetched for announcements before the previous one are no longer
    /// protected from eviction.
    pub(crate) fn next_generation(&self) {
        self.lock().generation += 1;
    }

    /// Bring `name` in on behalf of the prefetch thread: returns `Ok(false)` when there is no
    /// room without evicting weights that were prefetched and not used yet (try again later).
    pub(crate) fn prefetch(&self, name: &str) -> Result<bool, ResidencyError> {
        let layout = self.layout(name)?;
        {
            let mut st = self.lock();
            let generation = st.generation;
            if let Some(slot) = st.slots.get_mut(name) {
                // Asked for again: keep it for the compute that is about to use it.
                if !slot.pinned {
                    slot.wanted = generation;
                }
                return Ok(true);
            }
        }
        Ok(match self.fetch(name, layout, Requester::Prefetch)? {
            Fetched::Done => true,
            // Present after all (compute fetched it meanwhile) counts as done.
            Fetched::NoRoom => self.lock().slots.contains_key(name),
            Fetched::Lease(_) => unreachable!("the prefetch path holds no lease"),
        })
    }

    /// Reserve room, insert a loading slot, fetch, publish.
    fn fetch(
        &self,
        name: &str,
        layout: TiledLayout,
        by: Requester,
    ) -> Result<Fetched, ResidencyError> {
        let bytes = self.device.footprint(layout.blob_bytes() as u64);
        let domain = self.checked_domain(name)?;
        let d = domain.0 as usize;
        let mut st = self.lock();
        if st.slots.contains_key(name) {
            // Someone else inserted it meanwhile; the compute path goes back through get().
            drop(st);
            return match by {
                Requester::Prefetch => Ok(Fetched::Done),
                Requester::Compute => Ok(Fetched::Lease(Arc::clone(self.get(name)?.arc()))),
            };
        }
        let pinned_here = st.pinned_names.contains(name);
        let pinned_other = self.budget.pinned(domain) - if pinned_here { bytes } else { 0 };
        if bytes + pinned_other > self.config.budget_bytes {
            return Err(ResidencyError::BudgetTooSmall {
                name: name.to_owned(),
                budget_mib: mib(self.config.budget_bytes),
                need_mib: mib(bytes),
                pinned_mib: mib(pinned_other),
                min_mib: (bytes + pinned_other).div_ceil(1 << 20),
            });
        }
        // Make room within the budget: reuse a spare buffer of this size if there is one, free
        // spares of other sizes, then evict least-recently-used weights (whose buffers become
        // spares, taken when they fit).
        let size = layout.blob_bytes() as u64;
        let mut reuse = st.take_spare(domain, size);
        while !self.budget.try_reserve(domain, bytes) {
            if st.drop_spare(domain) {
                continue;
            }
            if st.evict_for(domain, by, &*self.policy, name, size, &mut reuse) {
                continue;
            }
            if by == Requester::Compute && self.budget.has_others(self.member) {
                // Nothing of ours to give: ask the device's other caches, without our lock.
                let (own, own_pinned) = (st.resident[d], st.pinned[d]);
                drop(st);
                let got = self.budget.reclaim_from_others(self.member, domain);
                if !got && self.budget.others_hold_unpinned(domain, own, own_pinned) {
                    // Their room is leased or being filled: it comes back.
                    self.budget.wait_for_release();
                }
                st = self.lock();
                if st.slots.contains_key(name) {
                    drop(st);
                    return Ok(Fetched::Lease(Arc::clone(self.get(name)?.arc())));
                }
                if got
                    || self
                        .budget
                        .others_hold_unpinned(domain, st.resident[d], st.pinned[d])
                {
                    continue;
                }
                // Our own state moved while unlocked: look again before judging it below.
                if st.drop_spare(domain) {
                    continue;
                }
                if st.evict_for(domain, by, &*self.policy, name, size, &mut reuse) {
                    continue;
                }
            }
            // A thread here holds no loading slot, so waiting for one cannot close a cycle.
            let loading = st
                .slots
                .values()
                .any(|s| s.domain == domain && matches!(s.state, SlotState::Loading));
            match by {
                Requester::Prefetch => return Ok(Fetched::NoRoom),
                Requester::Compute if loading => {
                    st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                    if st.slots.contains_key(name) {
                        drop(st);
                        return Ok(Fetched::Lease(Arc::clone(self.get(name)?.arc())));
                    }
                }
                Requester::Compute => {
                    return Err(ResidencyError::BudgetTooSmall {
                        name: name.to_owned(),
                        budget_mib: mib(self.config.budget_bytes),
                        need_mib: mib(bytes),
                        pinned_mib: mib(self.budget.used(domain)),
                        min_mib: (bytes + self.budget.used(domain)).div_ceil(1 << 20),
                    })
                }
            }
        }
        st.resident[d] += bytes;
        let total = st.total_resident();
        st.stats.peak_resident = st.stats.peak_resident.max(total);
        st.tick += 1;
        let tick = st.tick;
        let wanted = match by {
            Requester::Prefetch => st.generation,
            Requester::Compute => 0,
        };
        st.slots.insert(
            name.to_owned(),
            Slot {
                state: SlotState::Loading,
                loader: by,
                bytes,
                domain,
                last_use: tick,
                pinned: pinned_here,
                wanted,
            },
        );
        drop(st);

        // Fill outside the lock; a guard drops the slot if this thread unwinds.
        let mut guard = FillGuard {
            cache: self,
            name,
            done: false,
        };
        let started = Instant::now();
        let (events, created) = (self.events(), reuse.is_none());
        let after = events.as_ref().map_or(0, |r| r.matmuls());
        let result = self.fill(name, layout, domain, by, reuse);
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
                if let Some(rec) = &events {
                    crate::board::load(rec, name, &layout, domain.0, created, by, after);
                }
                if let Some(tr) = &self.trace() {
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
                match by {
                    Requester::Compute => Ok(Fetched::Lease(weight)),
                    // Only the slot may hold a prefetched weight: a second reference, even for
                    // the moment after the lock is released, would look like a lease and make
                    // the weight unevictable to a compute thread woken by the notify below.
                    Requester::Prefetch => {
                        drop(weight);
                        Ok(Fetched::Done)
                    }
                }
            }
            Err(e) => {
                // Drop the slot and its reserved bytes. A compute thread waiting for this weight
                // then finds no slot and fetches it itself, so a failed prefetch costs time, not
                // correctness, and the error the caller sees (naming the tensor) comes from its
                // own attempt.
                st.abandon(name);
                match (by, e) {
                    // The window is full of weights the prefetcher may not evict: no room yet.
                    (Requester::Prefetch, ResidencyError::WindowExhausted { .. }) => {
                        Ok(Fetched::NoRoom)
                    }
                    (_, e) => Err(e),
                }
            }
        };
        self.changed.notify_all();
        out
    }

    /// The device refused an allocation in `domain` with a full window although the budget
    /// allowed it: count a wall hit and make room — evict the least-recently-used weight `by`
    /// may evict, or, for the compute path, wait until a prefetch fill of that domain finishes
    /// (its weight is then evictable, or its reservation is gone). Returns `false` when nothing
    /// can give room. The prefetch thread never waits, so compute waiting for it cannot deadlock.
    pub(crate) fn relieve_wall(&self, domain: DomainId, by: Requester) -> bool {
        let mut st = self.lock();
        st.stats.wall_hits += 1;
        if st.drop_spare(domain) {
            return true;
        }
        if st.evict(domain, by, &*self.policy, None, None) {
            st.drop_spare(domain);
            return true;
        }
        if by == Requester::Compute && st.prefetch_loading(domain) {
            drop(self.changed.wait(st).unwrap_or_else(|p| p.into_inner()));
            return true;
        }
        false
    }

    /// Allocate the weight's buffer (evicting on a wall hit) and fill it from the source.
    fn fill(
        &self,
        name: &str,
        layout: TiledLayout,
        domain: DomainId,
        by: Requester,
        reuse: Option<DeviceBuffer>,
    ) -> Result<(DeviceWeight, Fetch), ResidencyError> {
        let size = layout.blob_bytes() as u64;
        let mut buffer = if let Some(b) = reuse {
            b
        } else {
            loop {
                match self
                    .device
                    .create_buffer(size, BufferIntent::Weight, domain)
                {
                    Ok(mut b) => {
                        // A fresh buffer: its pages are mapped in at once. A reused one
                        // already has them, so it is not asked again on every streamed load.
                        b.will_write_all();
                        break b;
                    }
                    Err(e @ DeviceError::WindowFull { .. }) => {
                        if !self.relieve_wall(domain, by) {
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
            }
        };
        let device_err = |source| ResidencyError::Device {
            name: name.to_owned(),
            source,
        };
        let parts = self.parts(name)?;
        let (scales, how) = self.source.fetch_into(name, buffer.as_mut_slice())?;
        if !native_order(&parts) {
            // K-segments: store the parts' own blobs one after another (one copy, at fill time).
            let native = buffer.as_slice().to_vec();
            arrange(&layout, &native, &parts, buffer.as_mut_slice()).map_err(device_err)?;
        }
        buffer.sync_to_device().map_err(device_err)?;
        let weight = DeviceWeight {
            layout,
            buffer,
            scales,
            group: self.group(name)?,
        };
        // The device sees the parts, never the whole weight beyond the chip's limits.
        for part in crate::parts::operands(&weight, &parts).map_err(device_err)? {
            self.device
                .prepare_weight(&part.weight())
                .map_err(device_err)?;
        }
        Ok((weight, how))
    }
}

/// Drops a loading slot (and its reserved bytes) if the filling thread unwinds, and wakes the
/// waiters, which then fetch the weight themselves instead of hanging.
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
        st.abandon(self.name);
        self.cache.changed.notify_all();
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

impl Reclaim for WeightCache {
    fn reclaim(&self, domain: DomainId) -> bool {
        let mut st = self.lock();
        let freed = st.drop_spare(domain)
            || (st.evict(domain, Requester::Compute, &*self.policy, None, None) && {
                // The victim's buffer became a spare: free it, its bytes go back to the ledger.
                st.drop_spare(domain);
                true
            });
        drop(st);
        if freed {
            self.changed.notify_all();
        }
        freed
    }
}
