//! Bringing a weight in, for the compute path or the prefetch thread: room is reserved in the
//! device ledger (spare buffers freed, weights evicted, the device's other caches asked, or a
//! fill in progress waited for), a loading slot inserted, the buffer filled from the source
//! outside the lock and the weight published. A full device window although the budget allows
//! the weight is a wall hit, relieved by one more eviction.

use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use ork_device::split::{arrange, native_order};
use ork_device::{BufferIntent, DeviceBuffer, DeviceError, DeviceWeight, DomainId};
use ork_manifest::WeightId;

use super::keys::Entry;
use super::slots::{Requester, Slot, SlotState, State};
use super::{mib, WeightCache};
use crate::budget::Reclaim;
use crate::source::Fetch;
use crate::trace::Lane;
use crate::ResidencyError;

/// What [`WeightCache::fetch`] achieved.
pub(super) enum Fetched {
    /// The weight, for the compute path's lease.
    Lease(Arc<DeviceWeight>),
    /// Prefetched (or found present): the slot holds it.
    Done,
    /// A prefetch found no room it may make; try again when compute moves on.
    NoRoom,
}

impl WeightCache {
    /// The executor announced the weights it uses next (the prefetch thread saw a new
    /// announcement): weights prefetched for announcements before the previous one are no longer
    /// protected from eviction.
    pub(crate) fn next_generation(&self) {
        self.lock().generation += 1;
    }

    /// Bring weight `id` in on behalf of the prefetch thread: returns `Ok(false)` when there is
    /// no room without evicting weights that were prefetched and not used yet (try again later).
    pub(crate) fn prefetch(&self, id: WeightId) -> Result<bool, ResidencyError> {
        let e = self.entry(id)?;
        {
            let mut st = self.lock();
            let generation = st.generation;
            if let Some(slot) = st.slots.get_mut(&id) {
                // Asked for again: keep it for the compute that is about to use it.
                if !slot.pinned {
                    slot.wanted = generation;
                }
                return Ok(true);
            }
        }
        Ok(match self.fetch(id, &e, Requester::Prefetch)? {
            Fetched::Done => true,
            // Present after all (compute fetched it meanwhile) counts as done.
            Fetched::NoRoom => self.lock().slots.contains_key(&id),
            Fetched::Lease(_) => unreachable!("the prefetch path holds no lease"),
        })
    }

    /// Reserve room, insert a loading slot, fetch, publish.
    pub(super) fn fetch(
        &self,
        id: WeightId,
        e: &Entry,
        by: Requester,
    ) -> Result<Fetched, ResidencyError> {
        let bytes = self.device.footprint(e.layout.blob_bytes() as u64);
        let domain = self.checked_domain(e)?;
        let st = self.lock();
        if st.slots.contains_key(&id) {
            // Someone else inserted it meanwhile; the compute path goes back through get().
            drop(st);
            return match by {
                Requester::Prefetch => Ok(Fetched::Done),
                Requester::Compute => Ok(Fetched::Lease(Arc::clone(self.get_entry(id, e)?.arc()))),
            };
        }
        let pinned_here = st.pinned_names.contains(&id);
        self.check_budget_fits(e, domain, bytes, pinned_here)?;
        let want = Want {
            id,
            e,
            by,
            domain,
            bytes,
        };
        let (mut st, reuse) = match self.make_room(st, &want)? {
            Room::Reserved(st, reuse) => (st, reuse),
            Room::Done(fetched) => return Ok(fetched),
        };
        insert_loading_slot(&mut st, &want, pinned_here);
        drop(st);
        self.fill_and_publish(&want, reuse)
    }

    /// The weight must fit in the budget beside the weights pinned in its domain (its own
    /// bytes not counted twice when it is pinned itself).
    fn check_budget_fits(
        &self,
        e: &Entry,
        domain: DomainId,
        bytes: u64,
        pinned_here: bool,
    ) -> Result<(), ResidencyError> {
        let pinned_other = self.budget.pinned(domain) - if pinned_here { bytes } else { 0 };
        if bytes + pinned_other > self.config.budget_bytes {
            return Err(ResidencyError::BudgetTooSmall {
                name: e.name.to_string(),
                budget_mib: mib(self.config.budget_bytes),
                need_mib: mib(bytes),
                pinned_mib: mib(pinned_other),
                min_mib: (bytes + pinned_other).div_ceil(1 << 20),
            });
        }
        Ok(())
    }

    /// Make room within the budget: reuse a spare buffer of this size if there is one, free
    /// spares of other sizes, then evict least-recently-used weights (whose buffers become
    /// spares, taken when they fit), then (compute only) ask the device's other caches or wait
    /// for a fill in progress. Ends with the bytes reserved and the lock held, or early when
    /// the weight appeared meanwhile or a prefetch finds no room.
    fn make_room<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        want: &Want<'_>,
    ) -> Result<Room<'a>, ResidencyError> {
        let Want {
            id,
            e,
            by,
            domain,
            bytes,
        } = *want;
        let size = e.layout.blob_bytes() as u64;
        let incoming = crate::budget::Incoming { id, layer: e.layer };
        let d = domain.0 as usize;
        let mut reuse = st.take_spare(domain, size);
        while !self.budget.try_reserve(domain, bytes) {
            if st.drop_spare(domain) {
                continue;
            }
            if st.evict_for(domain, by, &*self.policy, incoming, size, &mut reuse) {
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
                if st.slots.contains_key(&id) {
                    drop(st);
                    return self.lease_now(id, e);
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
                if st.evict_for(domain, by, &*self.policy, incoming, size, &mut reuse) {
                    continue;
                }
            }
            // A thread here holds no loading slot, so waiting for one cannot close a cycle.
            let loading = st
                .slots
                .values()
                .any(|s| s.domain == domain && matches!(s.state, SlotState::Loading));
            match by {
                Requester::Prefetch => return Ok(Room::Done(Fetched::NoRoom)),
                Requester::Compute if loading => {
                    st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                    if st.slots.contains_key(&id) {
                        drop(st);
                        return self.lease_now(id, e);
                    }
                }
                Requester::Compute => {
                    return Err(ResidencyError::BudgetTooSmall {
                        name: e.name.to_string(),
                        budget_mib: mib(self.config.budget_bytes),
                        need_mib: mib(bytes),
                        pinned_mib: mib(self.budget.used(domain)),
                        min_mib: (bytes + self.budget.used(domain)).div_ceil(1 << 20),
                    })
                }
            }
        }
        Ok(Room::Reserved(st, reuse))
    }

    /// The weight appeared while this thread waited: lease it.
    fn lease_now(&self, id: WeightId, e: &Entry) -> Result<Room<'_>, ResidencyError> {
        Ok(Room::Done(Fetched::Lease(Arc::clone(
            self.get_entry(id, e)?.arc(),
        ))))
    }

    /// Fill the loading slot outside the lock (a guard drops the slot if this thread unwinds),
    /// then publish the weight, or drop the slot on an error, and wake the waiters.
    fn fill_and_publish(
        &self,
        want: &Want<'_>,
        reuse: Option<DeviceBuffer>,
    ) -> Result<Fetched, ResidencyError> {
        let mut guard = FillGuard {
            cache: self,
            id: want.id,
            done: false,
        };
        let events = self.events();
        let record = FillRecord {
            started: Instant::now(),
            created: reuse.is_none(),
            after: events.as_ref().map_or(0, |r| r.rec.matmuls()),
            events,
        };
        let result = self.fill(want.e, want.domain, want.by, reuse);
        let elapsed = record.started.elapsed();
        let mut st = self.lock();
        guard.done = true;
        let out = match result {
            Ok((weight, how)) => Ok(self.publish(&mut st, want, weight, how, &record, elapsed)),
            Err(e) => {
                // Drop the slot and its reserved bytes. A compute thread waiting for this weight
                // then finds no slot and fetches it itself, so a failed prefetch costs time, not
                // correctness, and the error the caller sees (naming the tensor) comes from its
                // own attempt.
                st.abandon(want.id);
                match (want.by, e) {
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

    /// A filled weight: count it, mark its slot ready, record it on the board and the trace.
    fn publish(
        &self,
        st: &mut State,
        want: &Want<'_>,
        weight: DeviceWeight,
        how: Fetch,
        record: &FillRecord,
        elapsed: Duration,
    ) -> Fetched {
        let (by, name, layout) = (want.by, &*want.e.name, want.e.layout);
        let weight = Arc::new(weight);
        match how {
            Fetch::Loaded => st.stats.loads += 1,
            Fetch::Packed => st.stats.packs += 1,
        }
        if by == Requester::Prefetch {
            st.stats.prefetched += 1;
        }
        st.stats.bytes_moved += layout.blob_bytes() as u64;
        if let Some(slot) = st.slots.get_mut(&want.id) {
            slot.state = SlotState::Ready(Arc::clone(&weight));
        }
        if let Some(rec) = &record.events {
            let (domain, created) = (want.domain.0, record.created);
            crate::board::load(rec, want.id, &layout, domain, created, by, record.after);
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
            tr.span(lane, cat, name, record.started, elapsed);
        }
        match by {
            Requester::Compute => Fetched::Lease(weight),
            // Only the slot may hold a prefetched weight: a second reference, even for the
            // moment after the lock is released, would look like a lease and make the weight
            // unevictable to a compute thread woken by the notify in fill_and_publish.
            Requester::Prefetch => {
                drop(weight);
                Fetched::Done
            }
        }
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
        e: &Entry,
        domain: DomainId,
        by: Requester,
        reuse: Option<DeviceBuffer>,
    ) -> Result<(DeviceWeight, Fetch), ResidencyError> {
        let (name, layout) = (&*e.name, e.layout);
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
        let parts = self.parts_of(e)?;
        let (scales, how) = self.source.fetch_into(e.id, buffer.as_mut_slice())?;
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
            group: e.group,
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

/// The weight one [`WeightCache::fetch`] brings in, and for whom.
#[derive(Clone, Copy)]
struct Want<'e> {
    id: WeightId,
    e: &'e Entry,
    by: Requester,
    domain: DomainId,
    /// Its footprint on the device.
    bytes: u64,
}

/// How [`WeightCache::make_room`] ended.
enum Room<'a> {
    /// The bytes are reserved, the lock still held; a spare buffer of the weight's size to
    /// reuse, if one was found.
    Reserved(MutexGuard<'a, State>, Option<DeviceBuffer>),
    /// Nothing to fill: the weight appeared meanwhile, or a prefetch found no room.
    Done(Fetched),
}

/// What a fill records on the board and the trace once it is published.
struct FillRecord {
    started: Instant,
    /// The buffer was created for this fill (not a reused spare).
    created: bool,
    /// The board's matmul count when the fill began.
    after: u64,
    events: Option<crate::board::Recording>,
}

/// Insert the loading slot of a weight whose bytes were just reserved.
fn insert_loading_slot(st: &mut State, want: &Want<'_>, pinned: bool) {
    let d = want.domain.0 as usize;
    st.resident[d] += want.bytes;
    let total = st.total_resident();
    st.stats.peak_resident = st.stats.peak_resident.max(total);
    st.tick += 1;
    let tick = st.tick;
    let wanted = match want.by {
        Requester::Prefetch => st.generation,
        Requester::Compute => 0,
    };
    st.slots.insert(
        want.id,
        Slot {
            layer: want.e.layer,
            state: SlotState::Loading,
            loader: want.by,
            bytes: want.bytes,
            domain: want.domain,
            last_use: tick,
            pinned,
            wanted,
        },
    );
}

/// Drops a loading slot (and its reserved bytes) if the filling thread unwinds, and wakes the
/// waiters, which then fetch the weight themselves instead of hanging.
struct FillGuard<'a> {
    cache: &'a WeightCache,
    id: WeightId,
    done: bool,
}

impl Drop for FillGuard<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.cache.lock();
        st.abandon(self.id);
        self.cache.changed.notify_all();
    }
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
