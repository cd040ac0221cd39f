//! The cache's slot table: one slot per weight (loading or ready, pinned, last use, prefetch
//! generation), the per-domain byte counts booked in the device ledger, spare buffers kept for
//! reuse, and the eviction that makes room.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ork_device::{DeviceBuffer, DeviceWeight, DomainId};
use ork_manifest::WeightId;

use super::CacheStats;
use crate::budget::{Candidate, DeviceBudget, EvictionPolicy, Incoming};

/// Who is asking: the compute path (may evict anything evictable, weights prefetched for the
/// latest announcement last) or the prefetch thread (may not evict those, and never waits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Requester {
    Compute,
    Prefetch,
}

pub(super) enum SlotState {
    /// Room is reserved and a thread (`Slot::loader`) is filling the buffer.
    Loading,
    Ready(Arc<DeviceWeight>),
}

pub(super) struct Slot {
    /// The weight's block (the manifest's layer), for the eviction policy.
    pub(super) layer: Option<u32>,
    pub(super) state: SlotState,
    /// Who reserved the slot (meaningful while loading).
    pub(super) loader: Requester,
    pub(super) bytes: u64,
    pub(super) domain: DomainId,
    pub(super) last_use: u64,
    pub(super) pinned: bool,
    /// The announcement generation in which the prefetcher last brought in or asked for this
    /// weight, 0 once compute used it (or never).
    pub(super) wanted: u64,
}

impl Slot {
    /// Prefetched (or asked for by the prefetcher) for the latest announcement and not used
    /// since: compute is about to need it. A wrong guess stops being protected at the next
    /// announcement (protecting it longer fills the room with wrong guesses, and the
    /// prefetcher, finding no room, leaves the right ones to compute to load on demand).
    pub(super) fn protected(&self, generation: u64) -> bool {
        self.wanted != 0 && self.wanted >= generation
    }

    pub(super) fn evictable(&self, by: Requester, generation: u64) -> bool {
        !(self.pinned || by == Requester::Prefetch && self.protected(generation))
            && matches!(&self.state, SlotState::Ready(w) if Arc::strong_count(w) == 1)
    }
}

/// How far down the eviction policy's order [`State::evict`] looks for a weight whose buffer the
/// incoming weight can reuse.
const REUSE_WINDOW: usize = 8;

pub(super) struct State {
    pub(super) slots: HashMap<WeightId, Slot>,
    pub(super) tick: u64,
    /// Announcements seen by the prefetcher (starts at 1; see [`Slot::protected`]).
    pub(super) generation: u64,
    pub(super) resident: Vec<u64>,
    pub(super) pinned: Vec<u64>,
    pub(super) pinned_names: HashSet<WeightId>,
    /// Buffers of evicted weights kept for the next weight of the same size (their bytes stay
    /// counted in `resident`): streaming then reuses device buffers instead of freeing and
    /// allocating one per load, as the board's slots would.
    pub(super) spare: Vec<(u64, DeviceBuffer)>,
    pub(super) stats: CacheStats,
    /// The device-wide ledger every change of `resident` is booked in.
    pub(super) ledger: Arc<DeviceBudget>,
}

impl State {
    pub(super) fn total_resident(&self) -> u64 {
        self.resident.iter().sum()
    }

    /// Give `bytes` of `domain` back (to this cache's count and the device ledger).
    pub(super) fn release(&mut self, domain: DomainId, bytes: u64) {
        self.resident[domain.0 as usize] -= bytes;
        self.ledger.release(domain, bytes);
    }

    /// Drop a slot that never became ready and return its reserved bytes.
    pub(super) fn abandon(&mut self, id: WeightId) {
        if let Some(slot) = self.slots.remove(&id) {
            self.release(slot.domain, slot.bytes);
        }
    }

    /// Whether the prefetch thread is filling a weight of `domain` right now.
    pub(super) fn prefetch_loading(&self, domain: DomainId) -> bool {
        self.slots.values().any(|s| {
            s.domain == domain
                && s.loader == Requester::Prefetch
                && matches!(s.state, SlotState::Loading)
        })
    }

    /// Evict the weight of `domain` that `policy` picks among those `by` may evict, to make
    /// room for `incoming` (`None`: for another cache). Compute evicts a weight the prefetcher
    /// brought in for it only when nothing else is evictable. With `reuse_size` (the incoming
    /// weight's buffer size, when no spare buffer of that size is at hand), a weight with a
    /// buffer of exactly that size among the policy's first [`REUSE_WINDOW`] picks goes first,
    /// so the incoming weight reuses its buffer instead of allocating one. Returns whether one
    /// was evicted.
    pub(super) fn evict(
        &mut self,
        domain: DomainId,
        by: Requester,
        policy: &dyn EvictionPolicy,
        incoming: Option<Incoming>,
        reuse_size: Option<u64>,
    ) -> bool {
        let generation = self.generation;
        let evictable: Vec<(&WeightId, &Slot)> = self
            .slots
            .iter()
            .filter(|(_, s)| s.domain == domain && s.evictable(by, generation))
            .collect();
        let unprotected = evictable.iter().any(|(_, s)| !s.protected(generation));
        let (ids, candidates): (Vec<WeightId>, Vec<Candidate>) = evictable
            .into_iter()
            .filter(|(_, s)| !unprotected || !s.protected(generation))
            .map(|(&id, s)| {
                let c = Candidate {
                    id,
                    layer: s.layer,
                    bytes: s.bytes,
                    last_use: s.last_use,
                };
                (id, c)
            })
            .unzip();
        if candidates.is_empty() {
            return false;
        }
        let pick = policy
            .choose_for(incoming, &candidates)
            .min(candidates.len() - 1);
        let buffer_size = |id: WeightId| match self.slots.get(&id).map(|s| &s.state) {
            Some(SlotState::Ready(w)) => Some(w.buffer.size()),
            _ => None,
        };
        let pick = match reuse_size {
            Some(size) if buffer_size(ids[pick]) != Some(size) => {
                // The policy's next picks, in its order, until one has a buffer of `size`.
                let (mut rest, mut rest_ids) = (candidates.clone(), ids.clone());
                let mut found = None;
                for _ in 0..REUSE_WINDOW.min(rest.len()) {
                    let i = policy.choose_for(incoming, &rest).min(rest.len() - 1);
                    if buffer_size(rest_ids[i]) == Some(size) {
                        found = ids.iter().position(|&id| id == rest_ids[i]);
                        break;
                    }
                    rest.swap_remove(i);
                    rest_ids.swap_remove(i);
                }
                found.unwrap_or(pick)
            }
            _ => pick,
        };
        let victim = ids[pick];
        let slot = self.slots.remove(&victim).expect("victim exists");
        self.stats.evictions += 1;
        // Evictable means no lease: this is the last reference, so the buffer is free to reuse.
        match slot.state {
            SlotState::Ready(w) => match Arc::try_unwrap(w) {
                Ok(w) => self.spare.push((slot.bytes, w.buffer)),
                // Still shared (cannot happen for an evictable slot): it frees itself later.
                Err(_) => self.release(domain, slot.bytes),
            },
            SlotState::Loading => self.release(domain, slot.bytes),
        }
        true
    }

    /// [`State::evict`] to make room for `incoming`, whose buffer is `size` bytes: unless `reuse`
    /// already holds a buffer for it, prefer a victim of that size and take its buffer into
    /// `reuse`. Returns whether a weight was evicted.
    pub(super) fn evict_for(
        &mut self,
        domain: DomainId,
        by: Requester,
        policy: &dyn EvictionPolicy,
        incoming: Incoming,
        size: u64,
        reuse: &mut Option<DeviceBuffer>,
    ) -> bool {
        let evicted = self.evict(
            domain,
            by,
            policy,
            Some(incoming),
            reuse.is_none().then_some(size),
        );
        if evicted && reuse.is_none() {
            *reuse = self.take_spare(domain, size);
        }
        evicted
    }

    /// Take a spare buffer of exactly `size` bytes in `domain` (its bytes leave `resident`:
    /// the caller reserves them again for the weight it fills).
    pub(super) fn take_spare(&mut self, domain: DomainId, size: u64) -> Option<DeviceBuffer> {
        let i = self
            .spare
            .iter()
            .position(|(_, b)| b.domain() == domain && b.size() == size)?;
        let (bytes, b) = self.spare.swap_remove(i);
        self.release(domain, bytes);
        self.stats.buffers_reused += 1;
        Some(b)
    }

    /// Free the oldest spare buffer of `domain` (its IOVA returns to the window). Returns
    /// whether there was one.
    pub(super) fn drop_spare(&mut self, domain: DomainId) -> bool {
        let Some(i) = self.spare.iter().position(|(_, b)| b.domain() == domain) else {
            return false;
        };
        let (bytes, b) = self.spare.remove(i);
        self.release(domain, bytes);
        drop(b);
        true
    }
}
