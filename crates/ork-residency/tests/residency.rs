//! Integration tests of the residency layer: the budgeted weight cache (budget, leaks, counters,
//! pinning, wall hits, sources, corrupt blobs), the prefetch thread (bit-identical outputs, no
//! eviction under a lease, counted waits, a panicking thread), the planner with multi-domain
//! placement, and the execution order.
//!
//! Fixtures are small synthetic llama-like GGUF models built with `ork_gguf::writer`, so the
//! whole file runs in seconds.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ork_device::window::WindowConfig;
use ork_device::{
    ActPrecision, BufferIntent, Device, DeviceBuffer, DeviceError, DeviceInfo, DeviceStats,
    DomainId, EmuConfig, EmuDevice, MatmulStats, MatmulTask,
};
use ork_gguf::writer::GgufBuilder;
use ork_gguf::{GgmlType, GgufFile};
use ork_manifest::{Manifest, WeightId};
use ork_pack::{PackDtype, TiledLayout};
use ork_residency::plan::domain_map;
use ork_residency::{
    device_bytes, execution_order, plan, CacheConfig, CacheStats, DeviceMatmul, Lane, LayerOrder,
    Mode, PlanInput, ResidencyError, ScheduleSource, Trace, Warmup, WeightCache, WeightSource,
};
use ork_store::{ensure, ConvertOptions, Orkpack, StoreError};
use proptest::prelude::*;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;
const GIB4: u64 = 1 << 32;
/// Tokens per matmul in the tests.
const M: usize = 3;
/// Prefetch slots (RK3588: 3 cores + 1).
const SLOTS: usize = 4;
/// Smallest activation buffer `DeviceMatmul` allocates (per domain).
const ACT_BYTES: u64 = 64 * KIB;

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

/// The shared SplitMix64 generator for weights, inputs, access sequences and jitter.
use ork_testkit::Rng;

/// Per block: (role, K, N, type). Types and shapes vary between blocks so that F32 and Q8_0
/// sources, padded N (40 → 64) and K = 64..512 are all exercised.
fn block_tensors(b: usize) -> Vec<(&'static str, u64, u64, GgmlType)> {
    let (t0, t1) = if b.is_multiple_of(2) {
        (GgmlType::F32, GgmlType::Q8_0)
    } else {
        (GgmlType::Q8_0, GgmlType::F32)
    };
    vec![
        ("attn_q.weight", 128, 128, t0),
        ("attn_k.weight", 128, if b == 0 { 40 } else { 32 }, t1),
        ("attn_v.weight", 64, 64, t0),
        ("attn_output.weight", 128, 128, t1),
        ("ffn_gate.weight", 128, 512, t1),
        ("ffn_up.weight", 128, 512, t0),
        ("ffn_down.weight", 512, 128, t1),
    ]
}

const BLOCKS: usize = 2;

/// GGUF bytes of the fixture model: `BLOCKS` llama blocks, 1-D norms, a tied `token_embd`
/// (K = 128, N = 1024, the largest weight) and optionally a separate `output.weight`. Tensors
/// are written in reverse order so the execution order has to be derived, not copied.
fn model_bytes(with_output: bool) -> Vec<u8> {
    let mut rng = Rng(0x5EED);
    let mut tensors: Vec<(String, Vec<u64>, GgmlType)> =
        vec![("token_embd.weight".into(), vec![128, 1024], GgmlType::Q8_0)];
    for b in 0..BLOCKS {
        tensors.push((
            format!("blk.{b}.attn_norm.weight"),
            vec![128],
            GgmlType::F32,
        ));
        for (role, k, n, ty) in block_tensors(b) {
            tensors.push((format!("blk.{b}.{role}"), vec![k, n], ty));
        }
        tensors.push((format!("blk.{b}.ffn_norm.weight"), vec![128], GgmlType::F32));
    }
    tensors.push(("output_norm.weight".into(), vec![128], GgmlType::F32));
    if with_output {
        tensors.push(("output.weight".into(), vec![128, 256], GgmlType::Q8_0));
    }
    let mut builder = GgufBuilder::new().kv(
        "general.architecture",
        ork_gguf::MetaValue::String("llama".into()),
    );
    for (name, dims, ty) in tensors.into_iter().rev() {
        let count: u64 = dims.iter().product();
        let values: Vec<f32> = (0..count).map(|_| rng.f32() * 0.5).collect();
        builder = builder
            .tensor_f32(name, &dims, ty, &values)
            .expect("fixture tensor");
    }
    builder.to_bytes().expect("fixture model")
}

/// The shared fixture model (tied embeddings).
fn model() -> Arc<GgufFile> {
    static MODEL: OnceLock<Arc<GgufFile>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| {
        Arc::new(GgufFile::from_bytes("fixture.gguf", model_bytes(false)).expect("parse fixture"))
    }))
}

/// A clean `.orkpack` of the fixture (built once with `ensure`), in a temp dir kept for the
/// whole test binary.
fn clean_pack_path() -> PathBuf {
    static PACK: OnceLock<PathBuf> = OnceLock::new();
    PACK.get_or_init(|| {
        let path = ork_testkit::process_dir().join("fixture.orkpack");
        ensure(&model(), &path, &ConvertOptions::new(PackDtype::I8)).expect("ensure");
        path
    })
    .clone()
}

/// The fixture's manifest (its ids are the cache's).
fn manifest() -> Arc<Manifest> {
    static MANIFEST: OnceLock<Arc<Manifest>> = OnceLock::new();
    Arc::clone(MANIFEST.get_or_init(|| Arc::new(Manifest::from_gguf(&model()).expect("manifest"))))
}

/// `model`'s manifest, for a fixture other than the shared one.
fn manifest_of(model: &GgufFile) -> Arc<Manifest> {
    Arc::new(Manifest::from_gguf(model).expect("manifest"))
}

/// `model` packed on demand (int8, scale groups `group`), and its `.orkpack` at `path`.
fn both_sources(
    model: &Arc<GgufFile>,
    path: &std::path::Path,
    group: ork_pack::ScaleGroup,
) -> [WeightSource; 2] {
    let m = manifest_of(model);
    let pack = Orkpack::open(path).expect("open pack");
    [
        WeightSource::gguf(Arc::clone(model), Arc::clone(&m), PackDtype::I8, group),
        WeightSource::pack(pack, m, None, true).expect("pack source"),
    ]
}

fn pack_source(path: &std::path::Path, with_model: bool) -> WeightSource {
    let pack = Orkpack::open(path).expect("open pack");
    WeightSource::pack(pack, manifest(), with_model.then(model), true).expect("pack source")
}

fn gguf_source() -> WeightSource {
    WeightSource::gguf(
        model(),
        manifest(),
        PackDtype::I8,
        ork_pack::ScaleGroup::PerChannel,
    )
}

/// Matmul weights in execution order with their device bytes.
fn weights() -> Vec<(String, u64)> {
    let m = model();
    execution_order(&ork_manifest::Manifest::from_gguf(&m).unwrap())
        .into_iter()
        .map(|name| {
            let t = m.tensor(&name).expect("listed");
            let (k, n) = ork_store::matmul_dims(t).expect("2-D");
            let bytes = device_bytes(&TiledLayout::new(PackDtype::I8, k, n));
            (name, bytes)
        })
        .collect()
}

fn names() -> Vec<String> {
    weights().into_iter().map(|w| w.0).collect()
}

fn largest() -> u64 {
    weights().iter().map(|w| w.1).max().expect("weights")
}

fn total() -> u64 {
    weights().iter().map(|w| w.1).sum()
}

fn emu_config(domains: u32, window: u64) -> EmuConfig {
    EmuConfig {
        domains,
        window: WindowConfig {
            size: window,
            ..WindowConfig::default()
        },
        switch_cost: Duration::from_micros(1),
        threads: 1,
        ..EmuConfig::default()
    }
}

fn emu(domains: u32, window: u64) -> Arc<EmuDevice> {
    Arc::new(EmuDevice::with_config(emu_config(domains, window)).expect("emu config"))
}

/// The RK3576, the chip with fp16 × int8 / int4 (w8a16) and int8 × int4; the default RK3588
/// refuses them (docs/chip.md).
fn emu_rk3576() -> Arc<EmuDevice> {
    Arc::new(
        EmuDevice::with_config(EmuConfig {
            soc: ork_device::Soc::Rk3576,
            ..emu_config(1, GIB4)
        })
        .expect("emu config"),
    )
}

/// Fixed activations for `name`: `M × K` values.
fn input(name: &str, k: usize) -> Vec<f32> {
    let mut h = std::hash::DefaultHasher::new();
    name.hash(&mut h);
    let mut rng = Rng(h.finish());
    (0..M * k).map(|_| rng.f32() * 2.0).collect()
}

/// Run `passes` forward passes (every weight of `schedule` once, in order) and return each
/// output's bits, pass by pass.
fn run_passes(
    dm: &DeviceMatmul,
    schedule: &[String],
    passes: usize,
) -> Result<Vec<Vec<u32>>, ResidencyError> {
    let mut outs = Vec::new();
    for _ in 0..passes {
        for name in schedule {
            let l = dm.cache().layout(name)?;
            let x = input(name, l.k);
            let mut y = vec![0f32; M * l.n];
            dm.matmul(name, &x, M, &mut y)?;
            outs.push(y.iter().map(|v| v.to_bits()).collect());
        }
    }
    Ok(outs)
}

/// Outputs of `passes` passes on a plain emulator with every weight resident (the reference).
fn reference_outputs(passes: usize) -> Vec<Vec<u32>> {
    let cache =
        WeightCache::new(emu(1, GIB4), gguf_source(), CacheConfig::new(total())).expect("cache");
    let dm = DeviceMatmul::new(Arc::new(cache), None);
    run_passes(&dm, &names(), passes).expect("reference run")
}

fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// Resident bytes the cache reports must equal what its ready weights occupy: nothing is
/// reserved for a fill that is no longer running.
fn resident_matches_slots(cache: &WeightCache) -> bool {
    let ready: u64 = weights()
        .iter()
        .filter(|(n, _)| cache.is_resident(n))
        .map(|w| w.1)
        .sum();
    cache.resident().iter().sum::<u64>() == ready
}

// ---------------------------------------------------------------------------------------------
// A device wrapper: random delays, gates, panics, and invariant checks
// ---------------------------------------------------------------------------------------------

fn on_prefetch_thread() -> bool {
    std::thread::current().name() == Some("ork-prefetch")
}

/// Delegates to an [`EmuDevice`]; sleeps a random 0..=`max_sleep_us` in `matmul` and
/// `create_buffer`; can hold the prefetch thread in `create_buffer` until opened, and panic
/// there. It checks two invariants on every call: device bytes never exceed `limit`, and a
/// weight's bytes do not change while a task reads them.
struct Jitter {
    inner: EmuDevice,
    rng: Mutex<Rng>,
    max_sleep_us: u64,
    panic_in_prefetch: bool,
    /// `Some(open)`: the prefetch thread waits in `create_buffer` until `open`.
    gate: Option<(Mutex<bool>, Condvar)>,
    /// Times the prefetch thread arrived at the gate.
    arrived: AtomicU64,
    limit: u64,
    /// Highest device resident total seen above `limit` (0 = never).
    over_limit: AtomicU64,
    /// Tasks whose weight bytes changed while the task ran.
    torn: AtomicU64,
}

impl Jitter {
    fn new(config: EmuConfig, max_sleep_us: u64, limit: u64, seed: u64) -> Self {
        Jitter {
            inner: EmuDevice::with_config(config).expect("emu config"),
            rng: Mutex::new(Rng(seed)),
            max_sleep_us,
            panic_in_prefetch: false,
            gate: None,
            arrived: AtomicU64::new(0),
            limit,
            over_limit: AtomicU64::new(0),
            torn: AtomicU64::new(0),
        }
    }

    fn gated(mut self) -> Self {
        self.gate = Some((Mutex::new(false), Condvar::new()));
        self
    }

    fn open_gate(&self) {
        if let Some((open, cv)) = &self.gate {
            *open.lock().unwrap() = true;
            cv.notify_all();
        }
    }

    fn sleep(&self) {
        if self.max_sleep_us == 0 {
            return;
        }
        let us = self.rng.lock().unwrap().below(self.max_sleep_us + 1);
        std::thread::sleep(Duration::from_micros(us));
    }

    fn check_limit(&self) {
        let r = self.inner.stats().resident_total();
        if r > self.limit {
            self.over_limit.fetch_max(r, Ordering::Relaxed);
        }
    }
}

impl Device for Jitter {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }

    fn create_buffer(
        &self,
        size: u64,
        intent: BufferIntent,
        domain: DomainId,
    ) -> Result<DeviceBuffer, DeviceError> {
        if on_prefetch_thread() {
            if let Some((open, cv)) = &self.gate {
                self.arrived.fetch_add(1, Ordering::SeqCst);
                let mut g = open.lock().unwrap();
                while !*g {
                    g = cv.wait(g).unwrap();
                }
            }
            if self.panic_in_prefetch {
                panic!("injected panic in the prefetch thread");
            }
        }
        self.sleep();
        let b = self.inner.create_buffer(size, intent, domain)?;
        self.check_limit();
        Ok(b)
    }

    fn matmul(&self, task: &MatmulTask<'_>, out: &mut [f32]) -> Result<MatmulStats, DeviceError> {
        let before = hash_bytes(task.weight.bytes.as_slice());
        self.sleep();
        let r = self.inner.matmul(task, out);
        self.sleep();
        if hash_bytes(task.weight.bytes.as_slice()) != before {
            self.torn.fetch_add(1, Ordering::Relaxed);
        }
        self.check_limit();
        r
    }

    fn footprint(&self, size: u64) -> u64 {
        self.inner.footprint(size)
    }

    fn prepare_weight(&self, weight: &ork_device::WeightRef<'_>) -> Result<(), DeviceError> {
        self.inner.prepare_weight(weight)
    }

    fn as_integer(&self) -> Option<&dyn ork_device::IntegerOracle> {
        self.inner.as_integer()
    }

    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
}

/// Wait (polling) until `cond` holds; false after `timeout`.
fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    cond()
}

/// Run `f` on its own thread; fail the test (instead of hanging CI) if it does not finish
/// within `deadline`.
fn with_deadline<T: Send + 'static>(
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(deadline) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("hung: no result within {deadline:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the test thread panicked"),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Budget, leaks and counters (property test)
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Random access sequences at random budgets (≥ the largest weight): the device and the
    /// cache never hold more than the budget, their accounting agrees exactly, the counters
    /// add up, and dropping the cache frees every buffer.
    #[test]
    fn budget_holds_counters_add_up_and_nothing_leaks(
        seq in proptest::collection::vec(0usize..64, 1..120),
        extra_pages in 0u64..200,
        from_pack in any::<bool>(),
    ) {
        let ws = weights();
        let budget = largest() + extra_pages * 4096;
        let dev = emu(1, GIB4);
        let source = if from_pack { pack_source(&clean_pack_path(), false) } else { gguf_source() };
        let cache = WeightCache::new(dev.clone(), source, CacheConfig::new(budget)).unwrap();
        prop_assert_eq!(cache.budget(), budget);
        let mut gets = 0u64;
        for i in seq {
            let (name, bytes) = &ws[i % ws.len()];
            let lease = cache.get(name).unwrap();
            gets += 1;
            prop_assert_eq!(lease.layout, cache.layout(name).unwrap());
            prop_assert_eq!(lease.buffer.size(), lease.layout.blob_bytes() as u64);
            prop_assert!(*bytes <= budget);
            let device = dev.stats().resident_total();
            let cached = cache.resident()[0];
            prop_assert!(device <= budget, "device holds {} > budget {}", device, budget);
            prop_assert_eq!(device, cached);
        }
        let st = cache.stats();
        prop_assert_eq!(st.hits + st.loads + st.packs, gets, "every use is a hit or a fetch");
        if from_pack {
            prop_assert_eq!(st.packs, 0);
        } else {
            prop_assert_eq!(st.loads, 0);
        }
        let resident_now = ws.iter().filter(|(n, _)| cache.is_resident(n)).count() as u64;
        prop_assert_eq!(st.loads + st.packs - st.evictions, resident_now);
        prop_assert_eq!(st.wall_hits, 0);
        prop_assert_eq!(st.prefetched, 0);
        prop_assert_eq!(st.waits, 0);
        prop_assert!(st.peak_resident <= budget);
        prop_assert!(dev.stats().peak_resident <= budget);
        prop_assert_eq!(dev.stats().buffers_live, resident_now);
        drop(cache);
        let after = dev.stats();
        prop_assert_eq!(after.buffers_live, 0);
        prop_assert_eq!(after.resident_total(), 0);
    }
}

// ---------------------------------------------------------------------------------------------
// 2. A budget below the largest weight
// ---------------------------------------------------------------------------------------------

#[test]
fn budget_below_largest_weight_names_it_and_the_minimum() {
    let (big, big_bytes) = weights().into_iter().max_by_key(|w| w.1).unwrap();
    assert_eq!(big, "token_embd.weight");
    let budget = big_bytes - 4096;
    let dev = emu(1, GIB4);
    let cache = WeightCache::new(dev.clone(), gguf_source(), CacheConfig::new(budget)).unwrap();
    match cache.get(&big) {
        Err(ResidencyError::BudgetTooSmall {
            name,
            need_mib,
            min_mib,
            pinned_mib,
            budget_mib,
        }) => {
            assert_eq!(name, big);
            assert_eq!((need_mib * MIB as f64) as u64, big_bytes);
            assert_eq!(min_mib, big_bytes.div_ceil(MIB));
            assert_eq!(pinned_mib, 0.0);
            assert_eq!((budget_mib * MIB as f64) as u64, budget);
        }
        other => panic!("expected BudgetTooSmall, got {:?}", other.map(|_| ())),
    }
    // Nothing was reserved or allocated for the refused weight; smaller ones still work.
    assert_eq!(cache.resident(), vec![0]);
    assert_eq!(dev.stats().buffers_live, 0);
    cache.get("blk.0.attn_q.weight").unwrap();

    // The planner says the same.
    let p = plan(&PlanInput {
        weights: weights(),
        budget_bytes: budget,
        window_bytes: GIB4,
        domains: 1,
        slots: SLOTS,
    });
    assert!(!p.runnable);
    assert_eq!(p.min_budget_bytes, big_bytes);
    assert_eq!(p.largest, (big.clone(), big_bytes));
}

#[test]
fn pins_beyond_the_budget_are_refused_naming_the_weight() {
    let ws: HashMap<String, u64> = weights().into_iter().collect();
    let q = "blk.0.ffn_gate.weight";
    let u = "blk.0.ffn_up.weight";
    let budget = ws[q] + ws[u] + 4096;
    let cache = WeightCache::new(emu(1, GIB4), gguf_source(), CacheConfig::new(budget)).unwrap();
    cache.pin(q).unwrap();
    cache.pin(u).unwrap();
    cache.pin(u).unwrap(); // pinning twice counts once
    match cache.pin("blk.0.ffn_down.weight") {
        Err(ResidencyError::BudgetTooSmall { name, min_mib, .. }) => {
            assert_eq!(name, "blk.0.ffn_down.weight");
            assert_eq!(
                min_mib,
                (ws[q] + ws[u] + ws["blk.0.ffn_down.weight"]).div_ceil(MIB)
            );
        }
        other => panic!("expected BudgetTooSmall, got {other:?}"),
    }
    // What is left beside the pins still serves the small weights, not a large one.
    cache.get("blk.0.attn_v.weight").unwrap();
    assert!(matches!(
        cache.get("token_embd.weight"),
        Err(ResidencyError::BudgetTooSmall { .. })
    ));
}

#[test]
fn unknown_weight_and_bad_placement_are_typed_errors() {
    let cache = WeightCache::new(emu(2, GIB4), gguf_source(), CacheConfig::new(MIB)).unwrap();
    // A 1-D tensor is no matmul weight of the manifest.
    assert!(matches!(
        cache.get("blk.0.attn_norm.weight"),
        Err(ResidencyError::UnknownWeight { name, .. }) if name == "blk.0.attn_norm.weight"
    ));
    assert!(matches!(
        cache.get("no.such.weight"),
        Err(ResidencyError::UnknownWeight { name, .. }) if name == "no.such.weight"
    ));
    // More domains than the device has.
    let config = CacheConfig {
        domains: 3,
        ..CacheConfig::new(MIB)
    };
    assert!(matches!(
        WeightCache::new(emu(2, GIB4), gguf_source(), config),
        Err(ResidencyError::Placement(_))
    ));
    // A placement naming a domain the device lacks is refused when the weight is used, not a
    // panic (the cache's own domain count grows to cover the placement otherwise).
    let id = |name: &str| manifest().id(name).expect("a fixture weight");
    let placement = HashMap::from([
        (id("blk.0.attn_q.weight"), DomainId(5)),
        (id("blk.0.attn_k.weight"), DomainId(1)),
    ]);
    let cache = WeightCache::new(emu(2, GIB4), gguf_source(), CacheConfig::new(MIB))
        .unwrap()
        .with_placement(placement);
    assert!(matches!(
        cache.get("blk.0.attn_q.weight"),
        Err(ResidencyError::Placement(_))
    ));
    assert!(matches!(
        cache.pin("blk.0.attn_q.weight"),
        Err(ResidencyError::Placement(_))
    ));
    let k = cache.get("blk.0.attn_k.weight").unwrap();
    assert_eq!(k.buffer.domain(), DomainId(1));
    drop(k);
    assert_eq!(cache.resident()[1], weights()[1].1);
}

// ---------------------------------------------------------------------------------------------
// 3. Pinning and leases
// ---------------------------------------------------------------------------------------------

#[test]
fn pinned_weights_are_never_evicted() {
    let ws = weights();
    let pins = [
        "token_embd.weight",
        "blk.1.ffn_down.weight",
        "blk.0.attn_v.weight",
    ];
    let pinned: u64 = ws
        .iter()
        .filter(|(n, _)| pins.contains(&n.as_str()))
        .map(|w| w.1)
        .sum();
    // Room for the pins plus the largest other weight: heavy eviction among the rest.
    let budget = pinned + largest();
    let dev = emu(1, GIB4);
    let cache = WeightCache::new(dev.clone(), gguf_source(), CacheConfig::new(budget)).unwrap();
    for p in pins {
        cache.pin(p).unwrap();
    }
    let mut iova: HashMap<&str, u64> = HashMap::new();
    let mut rng = Rng(7);
    for _ in 0..600 {
        let (name, _) = &ws[rng.below(ws.len() as u64) as usize];
        let lease = cache.get(name).unwrap();
        if let Some(p) = pins.iter().find(|p| **p == name.as_str()) {
            // Same buffer every time: it was never freed and re-created.
            let first = *iova.entry(p).or_insert(lease.buffer.iova());
            assert_eq!(first, lease.buffer.iova(), "pinned {p} moved");
        }
        drop(lease);
        for p in iova.keys() {
            assert!(cache.is_resident(p), "pinned {p} was evicted");
        }
        assert!(cache.resident()[0] <= budget);
    }
    assert_eq!(iova.len(), pins.len(), "every pin was used");
    let st = cache.stats();
    assert!(
        st.evictions > 100,
        "the sequence must exercise eviction: {st:?}"
    );
    assert!(dev.stats().peak_resident <= budget);
}

#[test]
fn a_leased_weight_is_never_evicted_while_another_thread_churns() {
    let ws = weights();
    let budget = largest() * 2 + 8192;
    let dev = emu(1, GIB4);
    let cache =
        Arc::new(WeightCache::new(dev.clone(), gguf_source(), CacheConfig::new(budget)).unwrap());
    let held = "blk.1.ffn_up.weight";
    let lease = cache.get(held).unwrap();
    let (iova, bytes) = (lease.buffer.iova(), hash_bytes(lease.buffer.as_slice()));
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (cache, stop, ws) = (Arc::clone(&cache), Arc::clone(&stop), ws.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(11);
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) || n < 200 {
                let (name, _) = &ws[rng.below(ws.len() as u64) as usize];
                if name != held {
                    cache.get(name).unwrap();
                }
                n += 1;
            }
        })
    };
    for _ in 0..200 {
        assert!(cache.is_resident(held));
        assert_eq!(lease.buffer.iova(), iova);
        std::thread::sleep(Duration::from_micros(50));
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    assert_eq!(hash_bytes(lease.buffer.as_slice()), bytes);
    assert!(cache.stats().evictions > 50);
    assert!(dev.stats().peak_resident <= budget);
    drop(lease);
    // Once released it is an ordinary LRU candidate again.
    for (name, _) in ws.iter().filter(|(n, _)| n != held) {
        cache.get(name).unwrap();
    }
    assert!(!cache.is_resident(held));
}

// ---------------------------------------------------------------------------------------------
// 4. Wall hits: a window smaller than the budget
// ---------------------------------------------------------------------------------------------

#[test]
fn a_window_smaller_than_the_budget_costs_wall_hits_not_failures() {
    let schedule = names();
    let reference = reference_outputs(3);
    // The budget holds the whole model; the window (one reserved page at 0) only about a third.
    let window = largest() + ACT_BYTES + 160 * KIB;
    assert!(window < total());
    let dev = emu(1, window);
    let cache = Arc::new(
        WeightCache::new(
            dev.clone(),
            pack_source(&clean_pack_path(), false),
            CacheConfig::new(total()),
        )
        .unwrap(),
    );
    let dm = DeviceMatmul::new(Arc::clone(&cache), None);
    let outs = run_passes(&dm, &schedule, 3).unwrap();
    assert_eq!(outs, reference, "outputs with wall hits differ");
    let st = cache.stats();
    assert!(st.wall_hits > 0, "{st:?}");
    assert!(st.evictions >= st.wall_hits);
    assert!(dev.stats().peak_resident <= window);
    // The cache's accounting still matches the device (activations aside).
    assert_eq!(
        dev.stats().resident_total(),
        cache.resident()[0] + ACT_BYTES
    );

    // A window big enough: no wall hit, no eviction.
    let dev = emu(1, GIB4);
    let cache = Arc::new(
        WeightCache::new(
            dev,
            pack_source(&clean_pack_path(), false),
            CacheConfig::new(total()),
        )
        .unwrap(),
    );
    let dm = DeviceMatmul::new(Arc::clone(&cache), None);
    assert_eq!(run_passes(&dm, &schedule, 3).unwrap(), reference);
    let st = cache.stats();
    assert_eq!((st.wall_hits, st.evictions), (0, 0));
    assert_eq!(st.loads, schedule.len() as u64);
    assert_eq!(st.hits, 2 * schedule.len() as u64);
}

#[test]
fn a_full_window_with_nothing_evictable_is_window_exhausted() {
    let ws: HashMap<String, u64> = weights().into_iter().collect();
    let (a, b, c) = (
        "token_embd.weight",
        "blk.0.ffn_gate.weight",
        "blk.0.ffn_up.weight",
    );
    // Room for a and b (plus the reserved page), not for c as well.
    let window = ws[a] + ws[b] + 4096 + 8192;
    let cache = WeightCache::new(emu(1, window), gguf_source(), CacheConfig::new(total())).unwrap();
    let la = cache.get(a).unwrap();
    let lb = cache.get(b).unwrap();
    match cache.get(c) {
        Err(ResidencyError::WindowExhausted { name, source }) => {
            assert_eq!(name, c);
            assert!(matches!(source, DeviceError::WindowFull { .. }));
        }
        other => panic!("expected WindowExhausted, got {:?}", other.map(|_| ())),
    }
    assert!(cache.is_resident(a) && cache.is_resident(b));
    assert_eq!(
        cache.resident()[0],
        ws[a] + ws[b],
        "the refused weight left nothing reserved"
    );
    drop(lb);
    // Now b can go: a wall hit, then success.
    let before = cache.stats().wall_hits;
    cache.get(c).unwrap();
    assert!(cache.stats().wall_hits > before);
    assert!(!cache.is_resident(b));
    drop(la);
}

// ---------------------------------------------------------------------------------------------
// 5. / 6. Sources: .orkpack vs GGUF, and a corrupt blob
// ---------------------------------------------------------------------------------------------

#[test]
fn the_caches_id_of_a_weight_is_the_manifests_whatever_order_it_is_named_in() {
    let m = manifest();
    for source in [gguf_source(), pack_source(&clean_pack_path(), false)] {
        let cache = WeightCache::new(emu(1, GIB4), source, CacheConfig::new(total())).unwrap();
        // Named last-first: an id handed out in first-named order would differ.
        for w in m.weights().iter().rev() {
            assert_eq!(cache.id(&w.key).unwrap(), w.id, "{}", w.key);
            assert_eq!(cache.name(w.id).as_deref(), Some(w.key.as_str()));
            assert_eq!(cache.layout(w.id).unwrap().k, w.k);
        }
    }
}

#[test]
fn a_pack_whose_weights_are_not_the_manifests_is_refused_naming_the_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let untied = Arc::new(GgufFile::from_bytes("untied.gguf", model_bytes(true)).unwrap());
    let path = dir.path().join("untied.orkpack");
    ensure(&untied, &path, &ConvertOptions::new(PackDtype::I8)).expect("ensure");
    // The pack has `output.weight`, the (tied) model does not.
    let open = |path: &std::path::Path, m: Arc<Manifest>| {
        WeightSource::pack(Orkpack::open(path).expect("open pack"), m, None, true)
    };
    match open(&path, manifest()) {
        Err(ResidencyError::PackMismatch {
            path: p, tensor, ..
        }) => {
            assert_eq!(
                (p.as_path(), tensor.as_str()),
                (path.as_path(), "output.weight")
            )
        }
        other => panic!("expected a pack mismatch, got {other:?}"),
    }
    // The (untied) model has `output.weight`, the pack of the tied one does not.
    let err = open(&clean_pack_path(), manifest_of(&untied)).unwrap_err();
    assert!(
        matches!(&err, ResidencyError::PackMismatch { tensor, .. } if tensor == "output.weight"),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("fixture.orkpack") && msg.contains("output.weight"),
        "{msg}"
    );
}

#[test]
fn orkpack_and_gguf_sources_give_identical_device_bytes_and_outputs() {
    let schedule = names();
    let from_pack = WeightCache::new(
        emu(1, GIB4),
        pack_source(&clean_pack_path(), false),
        CacheConfig::new(total()),
    )
    .unwrap();
    let from_gguf =
        WeightCache::new(emu(1, GIB4), gguf_source(), CacheConfig::new(total())).unwrap();
    for name in &schedule {
        let (p, g) = (from_pack.get(name).unwrap(), from_gguf.get(name).unwrap());
        assert_eq!(p.layout, g.layout, "{name}");
        assert!(
            p.buffer.as_slice() == g.buffer.as_slice(),
            "{name}: device bytes differ"
        );
        assert_eq!(p.scales, g.scales, "{name}");
    }
    let n = schedule.len() as u64;
    let (sp, sg) = (from_pack.stats(), from_gguf.stats());
    assert_eq!((sp.loads, sp.packs), (n, 0));
    assert_eq!((sg.loads, sg.packs), (0, n));
    let blob_total: u64 = schedule
        .iter()
        .map(|w| from_pack.layout(w).unwrap().blob_bytes() as u64)
        .sum();
    assert_eq!(sp.bytes_moved, blob_total);
    assert_eq!(sg.bytes_moved, blob_total);

    let a = DeviceMatmul::new(Arc::new(from_pack), None);
    let b = DeviceMatmul::new(Arc::new(from_gguf), None);
    assert_eq!(
        run_passes(&a, &schedule, 1).unwrap(),
        run_passes(&b, &schedule, 1).unwrap()
    );
}

/// A copy of the clean pack with one byte flipped in `tensor`'s blob.
fn corrupt_pack(dir: &std::path::Path, tensor: &str) -> PathBuf {
    let clean = clean_pack_path();
    let path = dir.join("corrupt.orkpack");
    std::fs::copy(&clean, &path).unwrap();
    let (offset, size) = Orkpack::open(&clean)
        .unwrap()
        .entry(tensor)
        .expect("entry")
        .blob_range();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(offset + size / 3) as usize] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_flipped_blob_byte_is_repacked_from_the_model_or_named_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let bad = "blk.1.attn_output.weight";
    let path = corrupt_pack(dir.path(), bad);
    let schedule = names();
    let reference = reference_outputs(2);

    // With the model: repacked, outputs identical to a clean run.
    let cache = Arc::new(
        WeightCache::new(
            emu(1, GIB4),
            pack_source(&path, true),
            CacheConfig::new(total()),
        )
        .unwrap(),
    );
    let clean = WeightCache::new(emu(1, GIB4), gguf_source(), CacheConfig::new(total())).unwrap();
    {
        let (got, want) = (cache.get(bad).unwrap(), clean.get(bad).unwrap());
        assert!(got.buffer.as_slice() == want.buffer.as_slice());
        assert_eq!(got.scales, want.scales);
    }
    let dm = DeviceMatmul::new(Arc::clone(&cache), None);
    assert_eq!(run_passes(&dm, &schedule, 2).unwrap(), reference);
    let st = cache.stats();
    assert_eq!(st.packs, 1, "only the corrupt weight is repacked: {st:?}");
    assert_eq!(st.loads, schedule.len() as u64 - 1);

    // Without the model: the load fails naming the tensor, and nothing is left reserved.
    let cache = WeightCache::new(
        emu(1, GIB4),
        pack_source(&path, false),
        CacheConfig::new(total()),
    )
    .unwrap();
    match cache.get(bad) {
        Err(ResidencyError::Store(StoreError::CorruptBlob { tensor, .. })) => {
            assert_eq!(tensor, bad)
        }
        other => panic!("expected CorruptBlob, got {:?}", other.map(|_| ())),
    }
    assert_eq!(cache.resident(), vec![0]);
    assert_eq!(cache.device().stats().buffers_live, 0);
}

#[test]
fn a_pack_truncated_mid_run_is_repacked_from_the_model_or_named_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.orkpack");
    std::fs::copy(clean_pack_path(), &path).unwrap();
    let schedule = names();
    let last = schedule.last().unwrap().clone();
    let (offset, _) = Orkpack::open(&path)
        .unwrap()
        .entry(&last)
        .unwrap()
        .blob_range();
    let with_model = Arc::new(
        WeightCache::new(
            emu(1, GIB4),
            pack_source(&path, true),
            CacheConfig::new(total()),
        )
        .unwrap(),
    );
    let without = WeightCache::new(
        emu(1, GIB4),
        pack_source(&path, false),
        CacheConfig::new(total()),
    )
    .unwrap();
    // Both caches opened (and validated) the whole file; now another process cuts it short
    // in place, inside the last weight's blob.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(offset + 100)
        .unwrap();
    // With the model: the unreadable weight is packed from the source, outputs unchanged.
    let dm = DeviceMatmul::new(
        Arc::clone(&with_model),
        Some((with_model.ids(&schedule).unwrap(), 4)),
    );
    assert_eq!(run_passes(&dm, &schedule, 2).unwrap(), reference_outputs(2));
    assert!(with_model.stats().packs >= 1, "{:?}", with_model.stats());
    // Without it: a typed error naming the tensor, never SIGBUS, nothing left reserved.
    match without.get(&last) {
        Err(ResidencyError::Store(StoreError::BlobUnreadable { tensor, .. })) => {
            assert_eq!(tensor, last)
        }
        other => panic!("expected BlobUnreadable, got {:?}", other.map(|_| ())),
    }
    assert_eq!(without.resident(), vec![0]);
}

#[test]
fn a_corrupt_blob_met_by_the_prefetcher_fails_the_run_cleanly_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let bad = "blk.0.ffn_up.weight";
    let path = corrupt_pack(dir.path(), bad);
    let schedule = names();
    let result = with_deadline(Duration::from_secs(30), move || {
        let cache = Arc::new(
            WeightCache::new(
                emu(1, GIB4),
                pack_source(&path, false),
                CacheConfig::new(total()),
            )
            .unwrap(),
        );
        let dm = DeviceMatmul::new(
            Arc::clone(&cache),
            Some((cache.ids(&schedule).unwrap(), SLOTS)),
        );
        let r = run_passes(&dm, &schedule, 1);
        drop(dm); // joins the prefetch thread: no fill is running any more
        let ok = resident_matches_slots(&cache);
        (r.map(|_| ()), ok)
    });
    match result.0 {
        Err(ResidencyError::Store(StoreError::CorruptBlob { tensor, .. })) => {
            assert_eq!(tensor, bad)
        }
        other => panic!("expected CorruptBlob, got {other:?}"),
    }
    assert!(result.1, "a failed prefetch left bytes reserved");
}

// ---------------------------------------------------------------------------------------------
// 7. Prefetch correctness
// ---------------------------------------------------------------------------------------------

/// Outputs and counters of `passes` passes through a jittery device at `budget`.
fn jitter_run(
    budget: u64,
    prefetch: bool,
    passes: usize,
    seed: u64,
) -> (Vec<Vec<u32>>, CacheStats, Arc<Jitter>) {
    let schedule = names();
    let dev = Arc::new(Jitter::new(
        emu_config(1, GIB4),
        2000,
        budget + ACT_BYTES,
        seed,
    ));
    let cache = Arc::new(
        WeightCache::new(
            dev.clone(),
            pack_source(&clean_pack_path(), false),
            CacheConfig::new(budget),
        )
        .unwrap(),
    );
    let dm = DeviceMatmul::new(
        Arc::clone(&cache),
        prefetch.then(|| (cache.ids(&schedule).unwrap(), SLOTS)),
    );
    assert_eq!(dm.prefetching(), prefetch);
    let outs = run_passes(&dm, &schedule, passes).unwrap();
    assert!(cache.resident()[0] <= budget);
    drop(dm);
    let st = cache.stats();
    assert!(resident_matches_slots(&cache));
    drop(cache);
    assert_eq!(dev.stats().buffers_live, 0, "leaked buffers");
    (outs, st, dev)
}

#[test]
fn prefetch_on_and_off_give_bit_identical_outputs_at_every_budget() {
    let passes = 3;
    let reference = reference_outputs(passes);
    let tight = largest() + 4096;
    let budgets = [tight, (tight + total()) / 3, (tight + total()) / 2, total()];
    let mut prefetched = 0;
    for (i, &budget) in budgets.iter().enumerate() {
        for prefetch in [false, true] {
            let (outs, st, dev) = jitter_run(budget, prefetch, passes, 100 + i as u64);
            assert_eq!(outs, reference, "budget {budget} prefetch {prefetch}");
            assert_eq!(
                dev.over_limit.load(Ordering::Relaxed),
                0,
                "budget {budget}: device over budget"
            );
            assert_eq!(
                dev.torn.load(Ordering::Relaxed),
                0,
                "a weight changed under a task"
            );
            assert!(st.peak_resident <= budget);
            if !prefetch {
                assert_eq!(st.prefetched, 0);
            }
            prefetched += st.prefetched;
        }
    }
    assert!(
        prefetched > 0,
        "the prefetch thread never brought a weight in"
    );
}

/// Streaming reuses evicted weights' device buffers: when the weight the policy would evict
/// first has a buffer of another size, a weight of the incoming size among its next picks goes
/// instead, so nearly every load after the first pass takes a buffer instead of allocating one
/// (allocating costs page faults on the emulator and a new mapping on the board). Outputs stay
/// those of the resident run. (Before this choice, 23 of the 45 later loads reused one here.)
#[test]
fn streaming_reuses_buffers_of_the_incoming_size() {
    let passes = 4;
    let reference = reference_outputs(passes);
    let budget = (largest() + 4096 + total()) / 3;
    let (outs, st, _dev) = jitter_run(budget, false, passes, 7);
    assert_eq!(outs, reference);
    let first_pass = names().len() as u64;
    let later = st.loads + st.packs - first_pass;
    assert!(later > 0, "the budget must make the run stream: {st:?}");
    assert!(
        st.buffers_reused * 10 >= later * 9,
        "{} of {later} later loads reused a buffer: {st:?}",
        st.buffers_reused
    );
}

/// At a budget of one weight, compute must evict what the prefetcher just brought in; a
/// prefetched weight must never look leased to it. This was a race (the prefetch path held a
/// second `Arc` for a moment after publishing, and a woken compute thread failed with
/// `BudgetTooSmall`); the window is a few instructions wide, so this stress test catches a
/// regression only sometimes — `prefetch_on_and_off_…` caught the original about once in 18 runs.
#[test]
fn at_a_one_weight_budget_compute_always_evicts_fresh_prefetches() {
    let schedule = names();
    let reference = reference_outputs(1);
    let budget = largest() + 4096;
    for seed in 0..4 {
        let dev = Arc::new(Jitter::new(
            emu_config(1, GIB4),
            0,
            budget + ACT_BYTES,
            seed,
        ));
        let cache = Arc::new(
            WeightCache::new(
                dev.clone(),
                pack_source(&clean_pack_path(), false),
                CacheConfig::new(budget),
            )
            .unwrap(),
        );
        let dm = DeviceMatmul::new(
            Arc::clone(&cache),
            Some((cache.ids(&schedule).unwrap(), SLOTS)),
        );
        for pass in 0..30 {
            assert_eq!(
                run_passes(&dm, &schedule, 1).unwrap(),
                reference,
                "seed {seed} pass {pass}"
            );
        }
        assert_eq!(dev.over_limit.load(Ordering::Relaxed), 0);
    }
}

/// Announcements beyond the prefetch slots (the whole next pass, or wrong guesses) and block-order
/// eviction ([`LayerOrder`], used for MoE models) change which weights are resident, never the
/// outputs; the cache stays within its budget.
#[test]
fn announced_weights_beyond_the_slots_and_block_order_eviction_keep_outputs_identical() {
    let schedule = names();
    let reference = reference_outputs(1);
    for budget in [largest() + 4096, total() / 2, total() - 4096] {
        let cache = Arc::new(
            WeightCache::new(
                emu(1, GIB4),
                pack_source(&clean_pack_path(), false),
                CacheConfig::new(budget),
            )
            .unwrap()
            .with_policy(Box::new(LayerOrder { n_layer: BLOCKS })),
        );
        let dm = DeviceMatmul::new(
            Arc::clone(&cache),
            Some((cache.ids(&schedule).unwrap(), SLOTS)),
        );
        for pass in 0..6 {
            // Even passes announce the pass in order (right), odd ones backwards (mostly wrong).
            let mut announced: Vec<&str> = schedule.iter().map(String::as_str).collect();
            if pass % 2 == 1 {
                announced.reverse();
            }
            dm.upcoming(&announced);
            assert_eq!(
                run_passes(&dm, &schedule, 1).unwrap(),
                reference,
                "budget {budget} pass {pass}"
            );
            assert!(cache.resident().iter().sum::<u64>() <= budget);
        }
        let stats = cache.stats();
        assert!(stats.loads > 0, "budget {budget}: {stats:?}");
        assert_eq!(stats.wall_hits, 0);
    }
}

#[test]
fn compute_waits_for_a_weight_the_prefetcher_is_loading_and_counts_it() {
    let schedule = names();
    let reference = reference_outputs(1);
    let (dev, cache, trace) = {
        let dev = Arc::new(Jitter::new(emu_config(1, GIB4), 0, u64::MAX, 1).gated());
        let trace = Arc::new(Trace::new());
        let cache = Arc::new(
            WeightCache::new(dev.clone(), gguf_source(), CacheConfig::new(total()))
                .unwrap()
                .with_trace(Arc::clone(&trace)),
        );
        (dev, cache, trace)
    };
    let result = {
        let (dev, cache, schedule) = (Arc::clone(&dev), Arc::clone(&cache), schedule.clone());
        with_deadline(Duration::from_secs(30), move || {
            let dm =
                DeviceMatmul::new(Arc::clone(&cache), Some((cache.ids(&schedule).unwrap(), 1)));
            // Weight 0 on demand; the prefetcher starts on weight 1 and is held at the gate,
            // with its slot reserved.
            let mut outs = run_passes(&dm, &schedule[..1], 1).unwrap();
            assert!(eventually(Duration::from_secs(10), || dev
                .arrived
                .load(Ordering::SeqCst)
                >= 1));
            // Open the gate only once compute is waiting for weight 1.
            let opener = {
                let (dev, cache) = (Arc::clone(&dev), Arc::clone(&cache));
                std::thread::spawn(move || {
                    let waited = eventually(Duration::from_secs(10), || cache.stats().waits >= 1);
                    dev.open_gate();
                    waited
                })
            };
            let l = cache.layout(&schedule[1]).unwrap();
            let mut y = vec![0f32; M * l.n];
            dm.matmul(&schedule[1], &input(&schedule[1], l.k), M, &mut y)
                .unwrap();
            outs.push(y.iter().map(|v| v.to_bits()).collect());
            assert!(opener.join().unwrap(), "compute never waited");
            outs.extend(run_passes(&dm, &schedule[2..], 1).unwrap());
            outs
        })
    };
    assert_eq!(result, reference);
    let st = cache.stats();
    assert!(st.waits >= 1 && st.prefetched >= 1, "{st:?}");
    assert!(st.stall_seconds > 0.0);
    let events = trace.events();
    assert!(events
        .iter()
        .any(|e| e.tid == Lane::Wait as u32 && e.name == schedule[1]));
    assert!(events
        .iter()
        .any(|e| e.tid == Lane::Prefetch as u32 && e.name == schedule[1] && e.cat == "pack"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.json");
    trace.write(&file, &[]).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert!(doc["traceEvents"].as_array().unwrap().len() >= events.len());
}

// ---------------------------------------------------------------------------------------------
// 8. A prefetch thread that panics
// ---------------------------------------------------------------------------------------------

/// Defined behaviour: a panic inside a prefetch fill drops that slot and wakes its waiters; the
/// compute path then fetches on demand (here: every weight), outputs stay identical, and the
/// dead thread is reported by `prefetching()`.
#[test]
fn a_panicking_prefetch_thread_does_not_hang_the_run() {
    let schedule = names();
    let reference = reference_outputs(2);
    for gated in [false, true] {
        let schedule = schedule.clone();
        let (outs, st, alive, consistent) = with_deadline(Duration::from_secs(30), move || {
            let mut dev = Jitter::new(emu_config(1, GIB4), 500, u64::MAX, 5);
            dev.panic_in_prefetch = true;
            let dev = Arc::new(if gated { dev.gated() } else { dev });
            let budget = total() / 2;
            let cache = Arc::new(
                WeightCache::new(dev.clone(), gguf_source(), CacheConfig::new(budget)).unwrap(),
            );
            let dm = DeviceMatmul::new(
                Arc::clone(&cache),
                Some((cache.ids(&schedule).unwrap(), SLOTS)),
            );
            let mut outs = run_passes(&dm, &schedule[..1], 1).unwrap();
            if gated {
                // Make compute wait on the slot the thread is about to panic in.
                assert!(eventually(Duration::from_secs(10), || dev
                    .arrived
                    .load(Ordering::SeqCst)
                    >= 1));
                let opener = {
                    let (dev, cache) = (Arc::clone(&dev), Arc::clone(&cache));
                    std::thread::spawn(move || {
                        eventually(Duration::from_secs(10), || cache.stats().waits >= 1);
                        dev.open_gate();
                    })
                };
                outs.extend(run_passes(&dm, &schedule[1..2], 1).unwrap());
                opener.join().unwrap();
                outs.extend(run_passes(&dm, &schedule[2..], 1).unwrap());
            } else {
                outs.extend(run_passes(&dm, &schedule[1..], 1).unwrap());
            }
            outs.extend(run_passes(&dm, &schedule, 1).unwrap());
            assert!(eventually(Duration::from_secs(10), || !dm.prefetching()));
            let alive = dm.prefetching();
            drop(dm);
            (outs, cache.stats(), alive, resident_matches_slots(&cache))
        });
        assert_eq!(outs, reference, "gated {gated}");
        assert!(!alive);
        assert!(consistent, "the panicked fill left bytes reserved");
        assert_eq!(st.prefetched, 0);
        if gated {
            assert_eq!(st.waits, 1);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 9. Planner: resident across domains, or streamed
// ---------------------------------------------------------------------------------------------

#[test]
fn resident_plan_spreads_consecutive_layers_over_domains_and_runs_there() {
    let ws = weights();
    let window = 256 * KIB;
    let p = plan(&PlanInput {
        weights: ws.clone(),
        budget_bytes: window,
        window_bytes: window,
        domains: 4,
        slots: SLOTS,
    });
    assert_eq!(p.mode, Mode::Resident);
    assert!(p.runnable);
    assert_eq!(p.model_bytes, total());
    assert_eq!(p.resident_bytes, total());
    assert_eq!(p.streamed_bytes_per_pass, 0);
    assert!(p.domains_used > 1 && p.domains_used <= 4, "{p:?}");
    assert_eq!(p.switches_per_pass, p.domains_used);
    // Consecutive: domains never go back along the execution order, each within its window.
    let mut per_domain = [0u64; 4];
    for (pl, (name, bytes)) in p.placement.iter().zip(&ws) {
        assert_eq!((&pl.name, pl.bytes), (name, *bytes));
        assert!(pl.resident);
        per_domain[pl.domain as usize] += pl.bytes;
    }
    assert!(p.placement.windows(2).all(|w| w[0].domain <= w[1].domain));
    assert!(per_domain.iter().all(|&b| b <= window));

    // Run it: the device's windows hold the weights and one activation buffer per used domain.
    let dev = emu(4, window + ACT_BYTES + 4096);
    let config = CacheConfig {
        domains: p.domains_used,
        ..CacheConfig::new(window)
    };
    let cache = Arc::new(
        WeightCache::new(dev.clone(), pack_source(&clean_pack_path(), false), config)
            .unwrap()
            .with_placement(domain_map(&p, &manifest()).expect("placed weights")),
    );
    for pl in p.pinned() {
        cache.pin(&pl.name).unwrap();
    }
    let dm = DeviceMatmul::new(Arc::clone(&cache), None);
    let schedule = names();
    let reference = reference_outputs(1);
    assert_eq!(run_passes(&dm, &schedule, 1).unwrap(), reference);
    let after_first = dev.stats().domain_switches;
    // The device starts attached to domain 0: the first pass skips the wrap-around switch.
    assert_eq!(after_first, u64::from(p.domains_used) - 1);
    for pass in 1..4u64 {
        assert_eq!(run_passes(&dm, &schedule, 1).unwrap(), reference);
        assert_eq!(
            dev.stats().domain_switches - after_first,
            pass * u64::from(p.switches_per_pass)
        );
    }
    let used = p.domains_used as usize;
    let resident = cache.resident();
    let device = dev.stats().resident_per_domain;
    for d in 0..4 {
        assert_eq!(resident[d], per_domain[d], "domain {d}");
        let act = if d < used { ACT_BYTES } else { 0 };
        assert_eq!(device[d], per_domain[d] + act, "domain {d}");
    }
    let st = cache.stats();
    assert_eq!(
        st.loads,
        schedule.len() as u64,
        "zero churn after the first pass"
    );
    assert_eq!((st.evictions, st.wall_hits), (0, 0));
    assert_eq!(st.hits, 3 * schedule.len() as u64);
}

#[test]
fn streamed_plan_pins_what_fits_and_streams_the_rest_within_the_budget() {
    let ws = weights();
    let budget = total() - 64 * KIB;
    let p = plan(&PlanInput {
        weights: ws.clone(),
        budget_bytes: budget,
        window_bytes: GIB4,
        domains: 1,
        slots: SLOTS,
    });
    assert_eq!(p.mode, Mode::Streamed);
    assert!(p.runnable && p.decode_bandwidth_bound());
    assert_eq!(p.resident_bytes + p.streamed_bytes_per_pass, total());
    assert_eq!(p.switches_per_pass, 0);
    // The pins leave room for the working set: the SLOTS + 1 largest weights.
    let mut sizes: Vec<u64> = ws.iter().map(|w| w.1).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let working: u64 = sizes.iter().take(SLOTS + 1).sum();
    assert!(p.resident_bytes + working <= budget);
    assert!(p.resident_bytes > 0);
    assert!(p.streamed_bytes_per_prefill_token(512) * 512.0 == p.streamed_bytes_per_pass as f64);

    let dev = emu(1, GIB4);
    let cache = Arc::new(
        WeightCache::new(
            dev.clone(),
            pack_source(&clean_pack_path(), false),
            CacheConfig::new(budget),
        )
        .unwrap()
        .with_placement(domain_map(&p, &manifest()).expect("placed weights")),
    );
    for pl in p.pinned() {
        cache.pin(&pl.name).unwrap();
    }
    let schedule = names();
    // Without prefetch, so that no fetch is wasted and the planned figure is an upper bound.
    let dm = DeviceMatmul::new(Arc::clone(&cache), None);
    let reference = reference_outputs(1);
    assert_eq!(run_passes(&dm, &schedule, 1).unwrap(), reference);
    let mut moved = cache.stats().bytes_moved;
    for _ in 0..3 {
        assert_eq!(run_passes(&dm, &schedule, 1).unwrap(), reference);
        let now = cache.stats().bytes_moved;
        assert!(
            now - moved <= p.streamed_bytes_per_pass,
            "moved {} > planned {}",
            now - moved,
            p.streamed_bytes_per_pass
        );
        moved = now;
        for pl in p.pinned() {
            assert!(cache.is_resident(&pl.name), "pinned {} evicted", pl.name);
        }
    }
    assert!(cache.stats().evictions > 0);
    assert!(dev.stats().peak_resident <= budget + ACT_BYTES);
}

// ---------------------------------------------------------------------------------------------
// 10. Execution order
// ---------------------------------------------------------------------------------------------

#[test]
fn execution_order_is_blocks_in_role_order_then_the_output() {
    let roles = [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ];
    let blocks: Vec<String> = (0..BLOCKS)
        .flat_map(|b| roles.iter().map(move |r| format!("blk.{b}.{r}.weight")))
        .collect();

    // Tied: token_embd is the output projection, last.
    let mut want = blocks.clone();
    want.push("token_embd.weight".into());
    let order = execution_order(&ork_manifest::Manifest::from_gguf(&model()).unwrap());
    assert_eq!(order.iter().collect::<HashSet<_>>().len(), order.len());
    assert_eq!(order, want);

    // Separate output: it comes last and token_embd (a lookup, not a matmul) is left out.
    let untied = GgufFile::from_bytes("untied.gguf", model_bytes(true)).unwrap();
    let mut want = blocks;
    want.push("output.weight".into());
    assert_eq!(
        execution_order(&ork_manifest::Manifest::from_gguf(&untied).unwrap()),
        want
    );
}

// ---------------------------------------------------------------------------------------------
// Activations
// ---------------------------------------------------------------------------------------------

#[test]
fn non_finite_activations_and_bad_shapes_are_refused() {
    let cache = WeightCache::new(emu(1, GIB4), gguf_source(), CacheConfig::new(total())).unwrap();
    let dm = DeviceMatmul::new(Arc::new(cache), None);
    let name = "blk.0.attn_v.weight";
    let l = dm.cache().layout(name).unwrap();
    let mut y = vec![0f32; M * l.n];
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = input(name, l.k);
        x[l.k + 3] = bad;
        assert!(
            matches!(
                dm.matmul(name, &x, M, &mut y),
                Err(ResidencyError::Shape { .. })
            ),
            "{bad} accepted"
        );
    }
    let x = input(name, l.k);
    assert!(matches!(
        dm.matmul(name, &x[1..], M, &mut y),
        Err(ResidencyError::Shape { .. })
    ));
    assert!(matches!(
        dm.matmul(name, &x, M, &mut y[1..]),
        Err(ResidencyError::Shape { .. })
    ));
    let mut q = vec![0i8; 4];
    assert!(ork_residency::quantize_row_i8(&[1.0, f32::NAN, 0.5, 0.0], &mut q).is_nan());
    assert_eq!(ork_residency::quantize_row_i8(&[0.0; 4], &mut q), 0.0);
    assert_eq!(
        ork_residency::quantize_row_i8(&[-2.0, 1.0, 0.0, 2.0], &mut q),
        2.0 / 127.0
    );
    assert_eq!(q, [-127, 64, 0, 127]);
}

// ---------------------------------------------------------------------------------------------
// fp16 activations (w8a16 / w4a16)
// ---------------------------------------------------------------------------------------------

/// Activations with an outlier channel: `rows × k` values in [-1, 1), channel 5 at ±30
/// (max/rms ≈ 50, beyond what SmolLM2's post-norm activations show).
fn outlier_input(rows: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..rows * k)
        .map(|i| {
            if i % k == 5 {
                if (i / k).is_multiple_of(2) {
                    30.0
                } else {
                    -30.0
                }
            } else {
                rng.f32()
            }
        })
        .collect()
}

/// `y = x · Wᵀ` in f64 from the weight the device holds, dequantized by `ork_pack::untile`.
fn f64_reference(cache: &WeightCache, name: &str, x: &[f32], rows: usize) -> Vec<f64> {
    let lease = cache.get(name).expect("lease");
    let packed = ork_pack::PackedWeight {
        layout: lease.layout,
        data: lease.buffer.as_slice().to_vec(),
        scales: lease.scales.clone(),
        group: lease.group,
    };
    let w = ork_pack::untile(&packed).expect("untile");
    let (k, n) = (lease.layout.k, lease.layout.n);
    (0..rows * n)
        .map(|o| {
            let (i, j) = (o / n, o % n);
            (0..k)
                .map(|kk| f64::from(x[i * k + kk]) * f64::from(w[j * k + kk]))
                .sum()
        })
        .collect()
}

/// Root-mean-square of `got - want`, relative to the root-mean-square of `want`.
fn rel_rms(got: &[f32], want: &[f64]) -> f64 {
    let e: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).powi(2))
        .sum();
    let r: f64 = want.iter().map(|w| w * w).sum();
    (e / r).sqrt()
}

#[test]
fn f16_activations_match_the_f32_reference_and_beat_int8_on_outliers() {
    for dtype in [PackDtype::I8, PackDtype::I4] {
        let source =
            || WeightSource::gguf(model(), manifest(), dtype, ork_pack::ScaleGroup::PerChannel);
        let int8 = DeviceMatmul::new(
            Arc::new(WeightCache::new(emu_rk3576(), source(), CacheConfig::new(total())).unwrap()),
            None,
        );
        let fp16 = DeviceMatmul::new(
            Arc::new(WeightCache::new(emu_rk3576(), source(), CacheConfig::new(total())).unwrap()),
            None,
        )
        .with_activations(ActPrecision::F16);
        assert_eq!(int8.activations(), ActPrecision::Int8);
        assert_eq!(fp16.activations(), ActPrecision::F16);
        // Both partitions of the emulator: decode-sized and prefill-sized M.
        for (rows, name) in [(3, "blk.0.attn_q.weight"), (40, "blk.1.ffn_down.weight")] {
            let l = fp16.cache().layout(name).unwrap();
            let x = outlier_input(rows, l.k, 77);
            let want = f64_reference(fp16.cache(), name, &x, rows);
            let mut y16 = vec![0f32; rows * l.n];
            let mut y8 = vec![0f32; rows * l.n];
            fp16.matmul(name, &x, rows, &mut y16).unwrap();
            int8.matmul(name, &x, rows, &mut y8).unwrap();
            let (e16, e8) = (rel_rms(&y16, &want), rel_rms(&y8, &want));
            // fp16 rounding of x (relative 2⁻¹¹) is the only error besides f32 summation.
            assert!(e16 < 5e-4, "{dtype:?} {name}: fp16 relative error {e16}");
            assert!(
                e16 * 20.0 < e8,
                "{dtype:?} {name}: fp16 error {e16} not well below int8 error {e8}"
            );
        }
        assert_eq!(fp16.clamped_activations(), 0);
    }
}

#[test]
fn f16_activations_clamp_overflow_and_refuse_nan() {
    let dm = DeviceMatmul::new(
        Arc::new(WeightCache::new(emu_rk3576(), gguf_source(), CacheConfig::new(total())).unwrap()),
        None,
    )
    .with_activations(ActPrecision::F16);
    let name = "blk.0.attn_v.weight";
    let l = dm.cache().layout(name).unwrap();
    let mut x = outlier_input(2, l.k, 3);
    let mut clamped_x = x.clone();
    x[7] = 1e6;
    x[l.k + 9] = -7e4;
    clamped_x[7] = 65504.0;
    clamped_x[l.k + 9] = -65504.0;
    let mut y = vec![0f32; 2 * l.n];
    let mut want = vec![0f32; 2 * l.n];
    dm.matmul(name, &x, 2, &mut y).unwrap();
    assert_eq!(dm.clamped_activations(), 2);
    dm.matmul(name, &clamped_x, 2, &mut want).unwrap();
    assert_eq!(y, want);
    assert_eq!(dm.clamped_activations(), 2);
    for bad in [f32::NAN, f32::INFINITY] {
        x[3] = bad;
        assert!(matches!(
            dm.matmul(name, &x, 2, &mut y),
            Err(ResidencyError::Shape { .. })
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// One budget per device, shared by every cache on it
// ---------------------------------------------------------------------------------------------

/// Two caches (say a model and its draft) on one device share one `DeviceBudget`: with random
/// leases from a thread per cache, the bytes they hold together never exceed the budget, and each
/// cache still gets every weight it asks for (it evicts its own entries, or the other cache gives
/// room back through the ledger).
#[test]
fn two_caches_on_one_device_share_the_budget_and_both_progress() {
    let device = emu(1, GIB4);
    let largest = weights().iter().map(|w| w.1).max().unwrap();
    let total: u64 = weights().iter().map(|w| w.1).sum();
    // Holds a lease and a fetch of each cache at once, but far from both models.
    let budget_bytes = 4 * largest;
    assert!(2 * total > 2 * budget_bytes, "the test must force sharing");
    let budget = ork_residency::DeviceBudget::new(budget_bytes, 1);
    let make = |seed| {
        let cache = Arc::new(
            WeightCache::with_budget(
                device.clone() as Arc<dyn Device>,
                pack_source(&clean_pack_path(), false),
                CacheConfig::new(1), // ignored: the ledger's budget rules
                Arc::clone(&budget),
            )
            .unwrap(),
        );
        budget.register(&cache);
        (cache, seed)
    };
    let caches = [make(1u64), make(2u64)];
    let names = names();
    let over = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    for (cache, seed) in caches.iter().cloned() {
        let (names, budget, over, tx) = (
            names.clone(),
            Arc::clone(&budget),
            Arc::clone(&over),
            tx.clone(),
        );
        std::thread::spawn(move || {
            let mut rng = Rng(seed);
            let mut done = 0;
            for _ in 0..300 {
                let name = &names[rng.below(names.len() as u64) as usize];
                let lease = cache.get(name).expect("a weight within the budget");
                if budget.used(DomainId(0)) > budget.budget() {
                    over.store(true, Ordering::Relaxed);
                }
                assert_eq!(lease.layout, cache.layout(name).unwrap());
                drop(lease);
                done += 1;
            }
            tx.send(done).unwrap();
        });
    }
    drop(tx);
    for _ in 0..2 {
        let done = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("both caches make progress");
        assert_eq!(done, 300);
    }
    assert!(!over.load(Ordering::Relaxed), "the ledger went over budget");
    let together: u64 = caches.iter().map(|(c, _)| c.resident()[0]).sum();
    assert_eq!(together, budget.used(DomainId(0)));
    assert!(together <= budget_bytes);
    // Each cache on its own would have peaked at most at the budget; both had to evict.
    for (c, _) in &caches {
        let s = c.stats();
        assert!(s.peak_resident <= budget_bytes, "{s:?}");
        assert!(s.evictions > 0, "{s:?}");
    }
}

/// Pins of all caches on a device count against its one budget.
#[test]
fn pins_of_two_caches_count_against_one_budget() {
    let device = emu(1, GIB4);
    let ws = weights();
    let (name, bytes) = ws.iter().max_by_key(|w| w.1).unwrap().clone();
    let budget = ork_residency::DeviceBudget::new(bytes + bytes / 2, 1);
    let cache = |_| {
        WeightCache::with_budget(
            device.clone() as Arc<dyn Device>,
            pack_source(&clean_pack_path(), false),
            CacheConfig::new(1),
            Arc::clone(&budget),
        )
        .unwrap()
    };
    let (a, b) = (cache(0), cache(1));
    a.pin(&name).unwrap();
    assert!(matches!(
        b.pin(&name),
        Err(ResidencyError::BudgetTooSmall { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// 8. Schedule sources
// ---------------------------------------------------------------------------------------------

/// Names the prefetch thread loaded, in order, from the cache's trace.
fn prefetched_in_order(trace: &Trace) -> Vec<String> {
    trace
        .events()
        .into_iter()
        .filter(|e| e.tid == Lane::Prefetch as u32 && e.cat == "load")
        .map(|e| e.name)
        .collect()
}

#[test]
fn the_prefetcher_loads_announced_weights_in_the_announced_order() {
    let schedule = names();
    // Not the plan order: every other weight, the last first (a router's choice).
    let announced: Vec<String> = schedule.iter().rev().step_by(2).cloned().collect();
    assert!(announced.len() >= 3);
    let trace = Arc::new(Trace::new());
    let cache = Arc::new(
        WeightCache::new(
            emu(1, GIB4),
            pack_source(&clean_pack_path(), false),
            CacheConfig::new(total()),
        )
        .unwrap()
        .with_trace(Arc::clone(&trace)),
    );
    let dm = DeviceMatmul::new(
        Arc::clone(&cache),
        Some((cache.ids(&schedule).unwrap(), schedule.len())),
    );
    let refs: Vec<&str> = announced.iter().map(String::as_str).collect();
    dm.upcoming(&refs);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !announced.iter().all(|n| cache.is_resident(n)) {
        assert!(Instant::now() < deadline, "announced weights never loaded");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(dm); // joins the thread: nothing else is loading
              // Compute never ran, so the plan order contributed nothing: exactly the announcement.
    assert_eq!(prefetched_in_order(&trace), announced);
    assert_eq!(cache.stats().prefetched, announced.len() as u64);
}

/// A source that ignores where compute is and always names the plan backwards.
struct Backwards(Vec<WeightId>);

impl ScheduleSource for Backwards {
    fn advance(&mut self, _id: WeightId) -> usize {
        0
    }
    fn ahead(&self, i: usize) -> Option<WeightId> {
        self.0.iter().rev().nth(i).copied()
    }
}

#[test]
fn any_schedule_source_or_announcement_keeps_outputs_bit_identical() {
    let passes = 2;
    let reference = reference_outputs(passes);
    let schedule = names();
    let tight = largest() + 4096;
    for budget in [tight, (tight + total()) / 2] {
        let cache = |trace: &Arc<Trace>| {
            Arc::new(
                WeightCache::new(
                    emu(1, GIB4),
                    pack_source(&clean_pack_path(), false),
                    CacheConfig::new(budget),
                )
                .unwrap()
                .with_trace(Arc::clone(trace)),
            )
        };
        // A wrong source: it costs loads, never a wrong output.
        let trace = Arc::new(Trace::new());
        let c = cache(&trace);
        let dm = DeviceMatmul::with_schedule(
            Arc::clone(&c),
            Box::new(Backwards(c.ids(&schedule).unwrap())),
            SLOTS,
        );
        assert_eq!(run_passes(&dm, &schedule, passes).unwrap(), reference);
        drop(dm);
        assert!(c.resident()[0] <= budget);
        assert!(resident_matches_slots(&c));

        // The plan order with announcements of the next weights in reverse before each one.
        let trace = Arc::new(Trace::new());
        let c = cache(&trace);
        let dm = DeviceMatmul::new(Arc::clone(&c), Some((c.ids(&schedule).unwrap(), SLOTS)));
        let mut outs = Vec::new();
        for _ in 0..passes {
            for (i, name) in schedule.iter().enumerate() {
                let next: Vec<&str> = schedule[i + 1..]
                    .iter()
                    .take(3)
                    .rev()
                    .map(String::as_str)
                    .collect();
                dm.upcoming(&next);
                let l = c.layout(name).unwrap();
                let mut y = vec![0f32; M * l.n];
                dm.matmul(name, &input(name, l.k), M, &mut y).unwrap();
                outs.push(y.iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
            }
        }
        drop(dm);
        assert!(resident_matches_slots(&c));
        assert_eq!(outs, reference, "budget {budget} with announcements");
    }
}

// ---------------------------------------------------------------------------------------------
// Chip-sized parts (docs/chip.md): weights beyond the RK3588's limits run split
// ---------------------------------------------------------------------------------------------

/// A model whose `token_embd` (the tied lm head) has N = 8288 > 4096 (N-chunks 4096 + 4096 +
/// 96) and whose one `ffn_down` has K = 11008 > 10240 (K-segments 8192 + 2816).
fn over_limit_model() -> Arc<GgufFile> {
    let mut rng = Rng(0x0BE7);
    let mut builder = GgufBuilder::new().kv(
        "general.architecture",
        ork_gguf::MetaValue::String("llama".into()),
    );
    for (name, dims, ty) in [
        ("token_embd.weight", vec![64u64, 8288], GgmlType::Q8_0),
        ("blk.0.ffn_down.weight", vec![11008, 96], GgmlType::F32),
    ] {
        let count: u64 = dims.iter().product();
        let values: Vec<f32> = (0..count).map(|_| rng.f32() * 0.5).collect();
        builder = builder
            .tensor_f32(name, &dims, ty, &values)
            .expect("fixture tensor");
    }
    Arc::new(
        GgufFile::from_bytes("over-limit.gguf", builder.to_bytes().expect("model")).expect("parse"),
    )
}

/// The unsplit reference: the whole weight on an emulator that does not enforce the limits,
/// with the activations quantized as `DeviceMatmul` quantizes them.
fn unsplit_reference(model: &GgufFile, name: &str, x: &[f32], m: usize) -> Vec<f32> {
    unsplit_reference_grouped(model, name, x, m, None)
}

fn unsplit_reference_grouped(
    model: &GgufFile,
    name: &str,
    x: &[f32],
    m: usize,
    group: Option<usize>,
) -> Vec<f32> {
    let dev = EmuDevice::with_config(EmuConfig {
        enforce_limits: false,
        ..emu_config(1, GIB4)
    })
    .expect("emu");
    let t = model.tensor(name).expect("tensor");
    let rows = ork_pack::GgufRows::new(model, t).expect("rows");
    let pw = match group {
        None => ork_pack::pack(&rows, PackDtype::I8).expect("pack"),
        Some(g) => ork_pack::pack_grouped(&rows, PackDtype::I8, g).expect("pack grouped"),
    };
    let w = ork_device::upload(&dev, &pw, DomainId(0)).expect("upload whole");
    let k = pw.layout.k;
    let mut q = vec![0i8; m * k];
    let sa: Vec<f32> = q
        .chunks_mut(k)
        .zip(x.chunks(k))
        .map(|(q, x)| ork_residency::quantize_row_i8(x, q))
        .collect();
    let mut y = vec![0f32; m * pw.layout.n];
    let task = MatmulTask {
        m,
        activations: ork_device::Activations::Host(&q),
        act_scales: &sa,
        weight: w.as_weight(),
        cores: ork_device::CoreMask::AUTO,
    };
    dev.matmul(&task, &mut y).expect("whole matmul");
    y
}

#[test]
fn weights_beyond_the_chip_limits_run_as_parts_and_match_the_unsplit_result() {
    let model = over_limit_model();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("over-limit.orkpack");
    ensure(&model, &path, &ConvertOptions::new(PackDtype::I8)).expect("ensure");
    let sources = both_sources(&model, &path, ork_pack::ScaleGroup::PerChannel);
    let mut from_sources = Vec::new();
    for source in sources {
        // The default emulator models the RK3588 and enforces its limits.
        let dev = emu(1, GIB4);
        let cache = Arc::new(WeightCache::new(dev, source, CacheConfig::new(GIB4)).expect("cache"));
        let head = cache.parts("token_embd.weight").expect("parts");
        assert_eq!(
            head.iter().map(|p| p.n.len()).collect::<Vec<_>>(),
            [4096, 4096, 96]
        );
        let down = cache.parts("blk.0.ffn_down.weight").expect("parts");
        assert_eq!(
            down.iter().map(|p| p.k.clone()).collect::<Vec<_>>(),
            [0..8192, 8192..11008]
        );
        let dm = DeviceMatmul::new(Arc::clone(&cache), None);
        let mut outs = Vec::new();
        for name in ["token_embd.weight", "blk.0.ffn_down.weight"] {
            let l = cache.layout(name).expect("layout");
            for m in [1, M] {
                let x = input(name, l.k)[..m * l.k].to_vec();
                let mut y = vec![0f32; m * l.n];
                dm.matmul(name, &x, m, &mut y).expect("split matmul");
                let want = unsplit_reference(&model, name, &x, m);
                if l.k <= 10240 {
                    // N-chunks: every output is computed alone either way, bit for bit.
                    assert!(
                        y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{name} m={m}: N-chunks differ from the whole weight"
                    );
                } else {
                    // K-segments: integer partial sums added in f32, within rounding.
                    let mag = want.iter().fold(0f32, |a, v| a.max(v.abs()));
                    for (a, b) in y.iter().zip(&want) {
                        assert!((a - b).abs() <= mag * 1e-5, "{name} m={m}: {a} vs {b}");
                    }
                }
                outs.push(y);
            }
        }
        // Nothing beyond the RK3588's limits reached the device.
        let (k, n) = dm.max_submitted();
        assert!(k <= 10240 && n <= 4096, "submitted K {k}, N {n}");
        assert_eq!((k, n), (8192, 4096));
        from_sources.push(outs);
    }
    // The pack (native order, rearranged at fill) and the GGUF give the same bits.
    assert_eq!(from_sources[0], from_sources[1]);
}

#[test]
fn grouped_scales_from_the_pack_or_the_gguf_run_split_and_match_the_unsplit_result() {
    use ork_pack::ScaleGroup;
    let model = over_limit_model();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("g128.orkpack");
    let mut opts = ConvertOptions::new(PackDtype::I8);
    opts.group = ScaleGroup::Group(128);
    ensure(&model, &path, &opts).expect("ensure");
    let name = "blk.0.ffn_down.weight"; // K = 11008 = 86 · 128, in segments 8192 + 2816
    let mut outs = Vec::new();
    for source in both_sources(&model, &path, ScaleGroup::Group(128)) {
        let cache = Arc::new(
            WeightCache::new(emu(1, GIB4), source, CacheConfig::new(GIB4)).expect("cache"),
        );
        assert_eq!(cache.group(name).expect("group"), ScaleGroup::Group(128));
        // token_embd has K = 64: per channel.
        assert_eq!(
            cache.group("token_embd.weight").expect("group"),
            ScaleGroup::PerChannel
        );
        let dm = DeviceMatmul::new(Arc::clone(&cache), None);
        let x = input(name, 11008);
        let mut y = vec![0f32; M * 96];
        dm.matmul(name, &x, M, &mut y)
            .expect("grouped split matmul");
        let want = unsplit_reference_grouped(&model, name, &x, M, Some(128));
        let whole_pc = unsplit_reference(&model, name, &x, M);
        let mag = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (a, b) in y.iter().zip(&want) {
            assert!((a - b).abs() <= mag * 1e-5, "{a} vs {b}");
        }
        // And it is the grouped result, not the per-channel one.
        assert!(y
            .iter()
            .zip(&whole_pc)
            .any(|(a, b)| (a - b).abs() > mag * 1e-4));
        outs.push(y);
    }
    assert_eq!(outs[0], outs[1]);
}

/// `DeviceMatmul::matmul_many` (one input, several weights: q/k, gate/up) gives the outputs of
/// `matmul` on each weight alone, bit for bit, at M = 1 (one device batch for the resident
/// weights) and M = 3, at a one-weight budget (the rest run one by one after the batch) and with
/// everything resident, with and without prefetch; a shape mismatch names the weight.
#[test]
fn matmul_many_equals_one_by_one_at_every_budget() {
    let groups: Vec<Vec<String>> = (0..BLOCKS)
        .flat_map(|b| {
            [
                vec![
                    format!("blk.{b}.attn_q.weight"),
                    format!("blk.{b}.attn_k.weight"),
                ],
                vec![
                    format!("blk.{b}.ffn_gate.weight"),
                    format!("blk.{b}.ffn_up.weight"),
                    format!("blk.{b}.attn_output.weight"),
                ],
            ]
        })
        .collect();
    let run = |dm: &DeviceMatmul, m: usize, many: bool| -> Vec<Vec<u32>> {
        let mut outs = Vec::new();
        for _pass in 0..2 {
            for g in &groups {
                let k = dm.cache().layout(&g[0]).unwrap().k;
                let x: Vec<f32> = input(&g[0], k)[..m * k].to_vec();
                let mut ys: Vec<Vec<f32>> = g
                    .iter()
                    .map(|n| vec![f32::NAN; m * dm.cache().layout(n).unwrap().n])
                    .collect();
                if many {
                    let names: Vec<&str> = g.iter().map(String::as_str).collect();
                    let mut refs: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[..]).collect();
                    dm.matmul_many(&names, &x, m, &mut refs).unwrap();
                } else {
                    for (n, y) in g.iter().zip(&mut ys) {
                        dm.matmul(n, &x, m, y).unwrap();
                    }
                }
                outs.extend(ys.iter().map(|y| y.iter().map(|v| v.to_bits()).collect()));
            }
        }
        outs
    };
    let schedule = names();
    for m in [1, M] {
        let reference = {
            let cache =
                WeightCache::new(emu(1, GIB4), gguf_source(), CacheConfig::new(total())).unwrap();
            run(&DeviceMatmul::new(Arc::new(cache), None), m, false)
        };
        for budget in [largest() + 4096, total()] {
            for prefetch in [false, true] {
                let cache = Arc::new(
                    WeightCache::new(emu(1, GIB4), gguf_source(), CacheConfig::new(budget))
                        .unwrap(),
                );
                let dm = DeviceMatmul::new(
                    Arc::clone(&cache),
                    prefetch.then(|| (cache.ids(&schedule).unwrap(), SLOTS)),
                );
                assert_eq!(
                    run(&dm, m, true),
                    reference,
                    "m {m} budget {budget} prefetch {prefetch}"
                );
                assert!(cache.stats().peak_resident <= budget);
            }
        }
    }
    let cache = WeightCache::new(emu(1, GIB4), gguf_source(), CacheConfig::new(total())).unwrap();
    let dm = DeviceMatmul::new(Arc::new(cache), None);
    let x = vec![0.5f32; 128];
    let (mut q, mut v) = (vec![0f32; 128], vec![0f32; 64]);
    let r = dm.matmul_many(
        &["blk.0.attn_q.weight", "blk.0.attn_v.weight"],
        &x,
        1,
        &mut [&mut q, &mut v],
    );
    assert!(
        matches!(&r, Err(ResidencyError::Shape { name, .. }) if name == "blk.0.attn_v.weight"),
        "{r:?}"
    );
}

/// A resident plan's first-pass loader ([`Warmup`], via [`DeviceMatmul::with_warmup`]) loads every
/// weight once, in order, on its own thread: racing compute through the first pass (compute waits
/// for a weight being loaded, or fetches one the loader has not reached) and run alone to the end
/// it gives the outputs of a run without it, loads each weight once and evicts nothing.
#[test]
fn a_resident_first_pass_loader_loads_each_weight_once_and_changes_no_output() {
    let schedule = names();
    let reference = reference_outputs(2);
    for race in [true, false] {
        for pinned in [true, false] {
            let cache = Arc::new(
                WeightCache::new(
                    emu(1, GIB4),
                    pack_source(&clean_pack_path(), false),
                    CacheConfig::new(total()),
                )
                .unwrap(),
            );
            if pinned {
                for n in &schedule {
                    cache.pin(n).unwrap();
                }
            }
            let dm = if race {
                DeviceMatmul::new(Arc::clone(&cache), None)
                    .with_warmup(cache.ids(&schedule).unwrap())
            } else {
                Warmup::start(Arc::clone(&cache), cache.ids(&schedule).unwrap()).join();
                let st = cache.stats();
                assert_eq!(st.prefetched, schedule.len() as u64, "{st:?}");
                assert!(schedule.iter().all(|n| cache.is_resident(n)));
                DeviceMatmul::new(Arc::clone(&cache), None)
            };
            assert_eq!(
                run_passes(&dm, &schedule, 2).unwrap(),
                reference,
                "race {race} pinned {pinned}"
            );
            let st = cache.stats();
            assert_eq!(
                st.loads + st.packs,
                schedule.len() as u64,
                "each weight loaded once (race {race} pinned {pinned}): {st:?}"
            );
            assert_eq!(st.evictions, 0, "{st:?}");
            if !race {
                assert_eq!(st.hits as usize, 2 * schedule.len(), "{st:?}");
            }
        }
    }
}

/// The loaders (the first-pass [`Warmup`] here, and the streamed prefetcher) pack on a rayon pool
/// of their own. Every worker of rayon's global pool is taken: one computes (packing what the
/// loader has not reached, waiting for what it is packing), the others are held until compute is
/// done. Before the loaders had pools of their own, their packing was queued on that global pool,
/// so compute waited for a weight whose packing waited for compute: a hang.
#[test]
fn a_loader_packing_from_the_gguf_never_waits_for_the_compute_pool() {
    let reference = reference_outputs(2);
    for round in 0..4 {
        let outs = with_deadline(Duration::from_secs(120), || {
            let schedule = names();
            // As many device threads as the global pool has workers, so that compute runs its
            // tasks on the worker it is called from (as `ork run` does), not on a second pool
            // whose waits would let that worker pick up the loader's work.
            let device = EmuDevice::with_config(EmuConfig {
                threads: rayon::current_num_threads(),
                ..emu_config(1, GIB4)
            })
            .expect("emu config");
            let cache = Arc::new(
                WeightCache::new(Arc::new(device), gguf_source(), CacheConfig::new(total()))
                    .expect("cache"),
            );
            let dm = DeviceMatmul::new(Arc::clone(&cache), None)
                .with_warmup(cache.ids(&schedule).unwrap());
            let done = AtomicBool::new(false);
            let outs = Mutex::new(None);
            rayon::broadcast(|ctx| {
                if ctx.index() == 0 {
                    let r = run_passes(&dm, &schedule, 2);
                    *outs.lock().unwrap() = Some(r);
                    done.store(true, Ordering::SeqCst);
                } else {
                    while !done.load(Ordering::SeqCst) {
                        std::thread::yield_now();
                    }
                }
            });
            let st = cache.stats();
            assert_eq!(st.packs, schedule.len() as u64, "{st:?}");
            outs.into_inner().unwrap().expect("ran")
        });
        assert_eq!(outs.expect("run"), reference, "round {round}");
    }
}
