//! Using a weight: [`WeightCache::get`] and the [`WeightLease`] it returns, which keeps the
//! weight from eviction while it lives; a hit, a wait for a weight being filled, or a fetch.

use std::sync::Arc;
use std::time::Instant;

use ork_device::DeviceWeight;
use ork_manifest::WeightId;

use super::fetch::Fetched;
use super::keys::{Entry, WeightKey};
use super::slots::{Requester, SlotState};
use super::WeightCache;
use crate::trace::Lane;
use crate::ResidencyError;

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

    pub(super) fn arc(&self) -> &Arc<DeviceWeight> {
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
    /// Whether the weight is resident (ready) right now (`false` for one the source lacks).
    pub fn is_resident(&self, key: impl WeightKey) -> bool {
        let Ok(id) = key.weight_id(self) else {
            return false;
        };
        matches!(
            self.lock().slots.get(&id).map(|s| &s.state),
            Some(SlotState::Ready(_))
        )
    }

    /// Use a weight: a lease on its resident copy, fetching it first if needed.
    pub fn get(&self, key: impl WeightKey) -> Result<WeightLease<'_>, ResidencyError> {
        let id = key.weight_id(self)?;
        let e = self.entry(id)?;
        self.get_entry(id, &e)
    }

    /// [`WeightCache::get`] of weight `id`, known as `e`.
    pub(crate) fn get_entry(
        &self,
        id: WeightId,
        e: &Entry,
    ) -> Result<WeightLease<'_>, ResidencyError> {
        let mut st = self.lock();
        let mut waited: Option<Instant> = None;
        loop {
            st.tick += 1;
            let tick = st.tick;
            match st.slots.get_mut(&id) {
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
                                tr.span(Lane::Wait, "wait", &e.name, t0, d);
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
        let weight = match self.fetch(id, e, Requester::Compute)? {
            Fetched::Lease(w) => w,
            Fetched::Done | Fetched::NoRoom => {
                unreachable!("the compute path gets the weight or an error")
            }
        };
        self.lock().stats.stall_seconds += t0.elapsed().as_secs_f64();
        Ok(WeightLease::new(weight, self))
    }

    /// A lease on the weight if it is resident now, counted as a hit as [`WeightCache::get`]
    /// counts one; `None` when it is absent or still loading (nothing is fetched or waited for).
    pub fn get_if_resident(&self, key: impl WeightKey) -> Option<WeightLease<'_>> {
        let id = key.weight_id(self).ok()?;
        let mut guard = self.lock();
        let st = &mut *guard;
        st.tick += 1;
        let slot = st.slots.get_mut(&id)?;
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
}
