//! One byte budget per device and domain, shared by every [`crate::WeightCache`] on the device,
//! and the eviction choice as a trait.
//!
//! A [`DeviceBudget`] is a per-domain ledger of the bytes all its caches hold (resident weights,
//! weights being filled, spare buffers) and of the bytes they pin. A cache reserves room in the
//! ledger before it fills a weight and returns it when the weight (or spare buffer) is freed, so
//! caches sharing a ledger never hold more than the budget together. A cache that needs room
//! first evicts its own entries ([`EvictionPolicy`] picks which), then asks the other caches
//! registered on the ledger ([`DeviceBudget::register`]) to give back one unpinned, unleased entry
//! each, and, when they have none free yet, waits until one of them releases bytes.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use ork_device::DomainId;
use ork_manifest::WeightId;

/// A cache entry the eviction policy may choose: not pinned, not leased, ready.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    /// The weight (the manifest's id).
    pub id: WeightId,
    /// Its block (the manifest's layer; `None` outside the blocks).
    pub layer: Option<u32>,
    /// Device bytes.
    pub bytes: u64,
    /// The cache's use counter at its last use (higher = more recent).
    pub last_use: u64,
}

/// The weight room is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// The weight (the manifest's id).
    pub id: WeightId,
    /// Its block (the manifest's layer; `None` outside the blocks).
    pub layer: Option<u32>,
}

/// Which evictable entry of a domain to evict. The mechanism (reserve, evict, retry) lives in the
/// cache; a policy only chooses, so an expert-aware policy can replace [`Lru`] alone.
pub trait EvictionPolicy: Send + Sync + std::fmt::Debug {
    /// The index in `candidates` (never empty) of the entry to evict.
    fn choose(&self, candidates: &[Candidate]) -> usize;

    /// [`EvictionPolicy::choose`] knowing which weight the room is for (`None`: room asked for
    /// by another cache). The default ignores it.
    fn choose_for(&self, incoming: Option<Incoming>, candidates: &[Candidate]) -> usize {
        let _ = incoming;
        self.choose(candidates)
    }
}

/// Least recently used first.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lru;

impl EvictionPolicy for Lru {
    fn choose(&self, candidates: &[Candidate]) -> usize {
        candidates
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.last_use)
            .map_or(0, |(i, _)| i)
    }
}

/// Per-layer eviction for streamed models whose passes walk the blocks in order (MoE experts):
/// room for a weight of block `L` is taken first from the block whose next use lies farthest
/// ahead, which is the block just behind `L` (its weights come back only in the next pass),
/// then `L - 2`, and so on around to `L` itself; the least recently used within a block. A
/// weight of a block ahead of `L` that the last pass left in the cache stays for the coming
/// block, where LRU would evict exactly those first (a cyclic scan is LRU's worst case: with
/// less room than a pass, it never hits). Weights outside the blocks (`output.weight`,
/// `token_embd.weight`) count as one block after the last. Blocks are the manifest's layers
/// ([`Candidate::layer`]), never parsed from names.
#[derive(Clone, Copy, Debug)]
pub struct LayerOrder {
    /// Blocks of the model.
    pub n_layer: usize,
}

impl LayerOrder {
    /// The position of a weight of block `layer` in a pass: its block, or `n_layer` for weights
    /// outside the blocks.
    fn position(&self, layer: Option<u32>) -> usize {
        layer.map_or(self.n_layer, |b| (b as usize).min(self.n_layer))
    }
}

impl EvictionPolicy for LayerOrder {
    fn choose(&self, candidates: &[Candidate]) -> usize {
        Lru.choose(candidates)
    }

    fn choose_for(&self, incoming: Option<Incoming>, candidates: &[Candidate]) -> usize {
        let Some(at) = incoming.map(|w| self.position(w.layer)) else {
            return Lru.choose(candidates);
        };
        let period = self.n_layer + 1;
        // How many blocks after `at` the candidate's block comes again (0: `at` itself).
        let ahead = |c: &Candidate| (self.position(c.layer) + period - at) % period;
        candidates
            .iter()
            .enumerate()
            // Farthest next use first; 0 (the incoming weight's own block) is the last resort.
            .max_by_key(|(_, c)| (ahead(c), std::cmp::Reverse(c.last_use)))
            .map_or(0, |(i, _)| i)
    }
}

/// A cache that can give room back to the ledger on another cache's request.
pub(crate) trait Reclaim: Send + Sync {
    /// Free one spare buffer or evict one evictable entry of `domain`; whether anything was.
    fn reclaim(&self, domain: DomainId) -> bool;
}

#[derive(Default)]
struct Ledger {
    /// Bytes held per domain by all caches.
    used: Vec<u64>,
    /// Bytes pinned per domain by all caches.
    pinned: Vec<u64>,
    /// Caches that can be asked for room, by id.
    members: Vec<(u64, Weak<dyn Reclaim>)>,
    next_id: u64,
}

/// The shared per-domain byte ledger of one device.
pub struct DeviceBudget {
    budget_bytes: u64,
    ledger: Mutex<Ledger>,
    released: Condvar,
}

impl std::fmt::Debug for DeviceBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = self.lock();
        f.debug_struct("DeviceBudget")
            .field("budget_bytes", &self.budget_bytes)
            .field("used", &l.used)
            .field("pinned", &l.pinned)
            .field("members", &l.members.len())
            .finish()
    }
}

impl DeviceBudget {
    /// A ledger of `budget_bytes` per domain for `domains` domains.
    pub fn new(budget_bytes: u64, domains: u32) -> Arc<DeviceBudget> {
        let d = domains.max(1) as usize;
        Arc::new(DeviceBudget {
            budget_bytes,
            ledger: Mutex::new(Ledger {
                used: vec![0; d],
                pinned: vec![0; d],
                ..Ledger::default()
            }),
            released: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Budget per domain, in bytes.
    pub fn budget(&self) -> u64 {
        self.budget_bytes
    }

    /// Bytes all caches hold in `domain` now.
    pub fn used(&self, domain: DomainId) -> u64 {
        self.lock()
            .used
            .get(domain.0 as usize)
            .copied()
            .unwrap_or(0)
    }

    /// Bytes all caches pin in `domain`.
    pub fn pinned(&self, domain: DomainId) -> u64 {
        self.lock()
            .pinned
            .get(domain.0 as usize)
            .copied()
            .unwrap_or(0)
    }

    /// Let the other caches of this ledger ask `cache` for room. A cache that is not registered
    /// still keeps within the budget, but can only wait for the others to free room themselves.
    pub fn register(&self, cache: &Arc<crate::WeightCache>) {
        let weak: Weak<dyn Reclaim> = Arc::downgrade(cache) as Weak<dyn Reclaim>;
        let mut l = self.lock();
        l.members.retain(|(_, w)| w.strong_count() > 0);
        let id = cache.member_id();
        if !l.members.iter().any(|(i, _)| *i == id) {
            l.members.push((id, weak));
        }
    }

    /// A fresh id for a cache of this ledger.
    pub(crate) fn new_member_id(&self) -> u64 {
        let mut l = self.lock();
        l.next_id += 1;
        l.next_id
    }

    fn slot(v: &mut Vec<u64>, d: usize) -> &mut u64 {
        if v.len() <= d {
            v.resize(d + 1, 0);
        }
        &mut v[d]
    }

    /// Reserve `bytes` in `domain` if they fit the budget.
    pub(crate) fn try_reserve(&self, domain: DomainId, bytes: u64) -> bool {
        let mut l = self.lock();
        let used = Self::slot(&mut l.used, domain.0 as usize);
        if *used + bytes > self.budget_bytes {
            return false;
        }
        *used += bytes;
        true
    }

    /// Return `bytes` of `domain` and wake caches waiting for room.
    pub(crate) fn release(&self, domain: DomainId, bytes: u64) {
        let mut l = self.lock();
        let used = Self::slot(&mut l.used, domain.0 as usize);
        *used = used.saturating_sub(bytes);
        drop(l);
        self.released.notify_all();
    }

    /// Pin `bytes` more in `domain` if all caches' pins then fit the budget; returns the bytes
    /// pinned before when they do not.
    pub(crate) fn try_pin(&self, domain: DomainId, bytes: u64) -> Result<(), u64> {
        let mut l = self.lock();
        let pinned = Self::slot(&mut l.pinned, domain.0 as usize);
        if *pinned + bytes > self.budget_bytes {
            return Err(*pinned);
        }
        *pinned += bytes;
        Ok(())
    }

    /// Whether caches other than `me` are registered (and alive).
    pub(crate) fn has_others(&self, me: u64) -> bool {
        self.lock()
            .members
            .iter()
            .any(|(id, w)| *id != me && w.strong_count() > 0)
    }

    /// Ask every other registered cache to give back one entry of `domain`; whether any did.
    /// The caller must hold no cache lock (the others take theirs).
    pub(crate) fn reclaim_from_others(&self, me: u64, domain: DomainId) -> bool {
        let others: Vec<Arc<dyn Reclaim>> = self
            .lock()
            .members
            .iter()
            .filter(|(id, _)| *id != me)
            .filter_map(|(_, w)| w.upgrade())
            .collect();
        let mut any = false;
        for o in others {
            any |= o.reclaim(domain);
        }
        any
    }

    /// Whether caches other than one holding `own` bytes of `domain` hold bytes there that are
    /// not pinned (leased or being filled: they come back eventually).
    pub(crate) fn others_hold_unpinned(&self, domain: DomainId, own: u64, own_pinned: u64) -> bool {
        let l = self.lock();
        let d = domain.0 as usize;
        let used = l.used.get(d).copied().unwrap_or(0);
        let pinned = l.pinned.get(d).copied().unwrap_or(0);
        used.saturating_sub(own) > pinned.saturating_sub(own_pinned)
    }

    /// Wait (briefly) until some cache releases bytes.
    pub(crate) fn wait_for_release(&self) {
        let l = self.lock();
        // The timeout covers a release that happened between the caller's check and this wait.
        let _ = self
            .released
            .wait_timeout(l, Duration::from_millis(2))
            .unwrap_or_else(|p| p.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ork_manifest::{Role, WeightNames};

    /// The weights the test names: per block 0..4 `attn_q` and four experts' gate/up/down, and
    /// the output projection, as the manifest names them.
    fn table() -> WeightNames {
        const EXPERT: [Role; 3] = [Role::ExpertGate, Role::ExpertUp, Role::ExpertDown];
        WeightNames::from_roles(
            (0..4u32)
                .flat_map(|l| {
                    let experts = (0..4).flat_map(move |x| EXPERT.map(|r| (r, Some(l), Some(x))));
                    std::iter::once((Role::AttnQ, Some(l), None)).chain(experts)
                })
                .chain([(Role::Output, None, None)]),
        )
    }

    fn incoming(names: &WeightNames, key: &str) -> Incoming {
        let id = names.id(key).unwrap();
        Incoming {
            id,
            layer: names.get(id).layer,
        }
    }

    fn cands(names: &WeightNames, keys: &[(&str, u64)]) -> Vec<Candidate> {
        keys.iter()
            .map(|&(key, last_use)| {
                let w = incoming(names, key);
                Candidate {
                    id: w.id,
                    layer: w.layer,
                    bytes: 1,
                    last_use,
                }
            })
            .collect()
    }

    #[test]
    fn layer_order_evicts_the_block_just_behind_first_and_its_own_block_last() {
        let names = table();
        let p = LayerOrder { n_layer: 4 };
        let c = cands(
            &names,
            &[
                ("blk.2.ffn_up_exps.weight#0", 1),
                ("blk.3.ffn_up_exps.weight#1", 9),
                ("blk.0.ffn_up_exps.weight#1", 5),
                ("blk.1.ffn_up_exps.weight#1", 7),
                ("output.weight", 2),
            ],
        );
        let key = |c: &Candidate| names.key(c.id).to_owned();
        let pick = |w: &str, c: &[Candidate]| key(&c[p.choose_for(Some(incoming(&names, w)), c)]);
        // For block 2, block 1 was just computed: its next use is a whole pass away.
        assert_eq!(
            pick("blk.2.ffn_gate_exps.weight#3", &c),
            "blk.1.ffn_up_exps.weight#1"
        );
        assert_eq!(pick("blk.0.attn_q.weight", &c), "output.weight");
        // Weights outside the blocks come after the last block: block 3 is just behind them.
        assert_eq!(pick("output.weight", &c), "blk.3.ffn_up_exps.weight#1");
        // Only the incoming weight's own block left: LRU within it.
        let own = cands(
            &names,
            &[
                ("blk.2.ffn_up_exps.weight#0", 4),
                ("blk.2.ffn_down_exps.weight#0", 3),
            ],
        );
        assert_eq!(pick("blk.2.ffn_gate_exps.weight#1", &own), key(&own[1]));
        // Within a block, least recently used first.
        let same = cands(
            &names,
            &[
                ("blk.1.ffn_up_exps.weight#0", 8),
                ("blk.1.ffn_up_exps.weight#2", 6),
                ("blk.3.ffn_up_exps.weight#2", 1),
            ],
        );
        assert_eq!(pick("blk.2.ffn_gate_exps.weight#1", &same), key(&same[1]));
        // No incoming weight (another cache asks for room): plain LRU.
        assert_eq!(
            key(&c[p.choose_for(None, &c)]),
            "blk.2.ffn_up_exps.weight#0"
        );
    }
}
