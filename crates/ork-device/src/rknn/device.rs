//! The `rknn` backend: [`Device`] over the vendor runtime's matmul API (see `docs/rknn.md`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ork_pack::TiledLayout;

use super::sys::{
    self, mm_type, IoAttr, MatmulInfo, MatmulShape as CShape, Mem, RknnContext, RuntimeLib,
};
use crate::buffer::{BackendBuffer, SyncDir};
use crate::soc::{ChipLimit, ElemType, MatmulShape, Soc};
use crate::task::ActValues;
use crate::window::{footprint, WindowConfig, Windows, WINDOW_BYTES};
use crate::OpenOptions;
use crate::{
    BufferIntent, BufferView, Device, DeviceBuffer, DeviceError, DeviceInfo, DeviceStats, DomainId,
    IntegerOracle, MatmulStats, MatmulTask, WeightRef, MAX_DOMAINS,
};

/// The M values a matmul context is created for (`rknn_matmul_create_dynamic_shape`): decode
/// (M = 1) and prefill buckets. A task's M is run in the smallest bucket that holds it (rows
/// past M are ignored); M above the largest bucket runs in blocks of it.
pub const M_BUCKETS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// The oldest runtime that has everything ork uses (per-context IOMMU domains from 2.0.0,
/// dynamic shapes and per-group B scales from 2.1.0).
pub const MIN_RUNTIME: (u32, u32, u32) = (2, 1, 0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The runtime's and driver's versions as `rknn_query` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// Path or name the library was loaded from.
    pub library: String,
    /// Runtime version text, e.g. "2.3.2 (429f97ae6b@2025-04-09T09:09:27)"; "unknown (…)" if
    /// the query failed.
    pub runtime: String,
    /// Driver version text, e.g. "0.9.8".
    pub driver: String,
}

/// `"2.3.2 (…)"` → `(2, 3, 2)`.
pub fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let head = s.split_whitespace().next()?;
    let mut it = head.trim_start_matches('v').split('.');
    let mut num = || -> Option<u32> {
        let p = it.next()?;
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    Some((num()?, num()?, num().unwrap_or(0)))
}

/// What a matmul context is for: one runtime context per key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct CtxKey {
    mm_type: i32,
    group: i16,
    k: usize,
    n: usize,
    domain: u32,
}

/// A cached matmul context with its A and C memory (sized for the largest M bucket) and what is
/// bound to it now.
struct MatCtx {
    lib: Arc<RuntimeLib>,
    ctx: RknnContext,
    attrs: Vec<IoAttr>,
    a: Option<Mem>,
    c: Option<Mem>,
    /// Index into [`M_BUCKETS`] of the shape set now.
    shape: Option<usize>,
    /// Whether A and C are bound for the current shape.
    ac_bound: bool,
    /// The memory id bound as B for the current shape.
    b_bound: Option<u64>,
    core_mask: Option<i32>,
}

impl Drop for MatCtx {
    fn drop(&mut self) {
        // Errors cannot be reported from a drop; the runtime frees what it can.
        for m in [self.a.take(), self.c.take()].into_iter().flatten() {
            let _ = self.lib.destroy_mem(self.ctx, m);
        }
        let _ = self.lib.destroy(self.ctx);
    }
}

/// State shared by the device and every buffer it made.
struct Shared {
    lib: Arc<RuntimeLib>,
    soc: Soc,
    domains: u32,
    version: RuntimeVersion,
    /// One small matmul context per domain, made on first use: memory is created through it so
    /// that it lands in that domain.
    alloc: Mutex<Vec<Option<RknnContext>>>,
    residency: Mutex<Windows>,
    /// Idle matmul contexts by key. A task checks one out for its run and returns it, so tasks
    /// on several threads never wait for each other (nor for a context held across a run that
    /// lets the calling thread pick up another task): a key gets a second context when two tasks
    /// need it at once.
    contexts: Mutex<HashMap<CtxKey, Vec<MatCtx>>>,
    /// Matmul contexts created.
    made: AtomicU64,
    attached: Mutex<u32>,
    tasks: AtomicU64,
    switches: AtomicU64,
    next_mem: AtomicU64,
    /// `rknn_matmul_run` calls and the nanoseconds spent inside them (what the runtime itself
    /// costs; the rest of a task is this backend's overhead).
    runs: AtomicU64,
    run_nanos: AtomicU64,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Matmul contexts (with their A / C memory) first, then the allocation contexts; every
        // buffer is gone by now (each holds an `Arc` of this).
        lock(&self.contexts).clear();
        for ctx in lock(&self.alloc).iter().flatten() {
            let _ = self.lib.destroy(*ctx);
        }
    }
}

fn alloc_info(domain: u32) -> MatmulInfo {
    let mut info = MatmulInfo::zeroed();
    info.m = 1;
    info.k = 32;
    info.n = 32;
    info.mm_type = mm_type::INT8_MM_INT8_TO_INT32;
    info.b_layout = sys::LAYOUT_NATIVE;
    info.ac_layout = sys::LAYOUT_NORM;
    info.iommu_domain_id = domain as i32;
    info
}

impl Shared {
    /// The allocation context of `domain`.
    fn alloc_ctx(&self, domain: DomainId) -> Result<RknnContext, DeviceError> {
        let mut a = lock(&self.alloc);
        let slot = &mut a[domain.0 as usize];
        if let Some(c) = *slot {
            return Ok(c);
        }
        let (ctx, _) = self.lib.create(&mut alloc_info(domain.0))?;
        *slot = Some(ctx);
        Ok(ctx)
    }

    fn mem_id(&self) -> u64 {
        self.next_mem.fetch_add(1, Ordering::Relaxed)
    }
}

/// The backend's record of one buffer: a runtime memory object in its domain, its range in
/// ork's window model, and the N-chunk memory objects made inside it for binding.
struct RknnBuffer {
    mem: Option<Mem>,
    id: u64,
    shared: Arc<Shared>,
    ctx: RknnContext,
    domain: DomainId,
    iova: u64,
    /// Memory objects for byte ranges `(offset, len)` of this buffer bound as B (N-chunks, or a
    /// weight inside an arena), with their ids; destroyed with the buffer.
    chunks: Mutex<HashMap<(u64, u64), (u64, Mem)>>,
}

impl Drop for RknnBuffer {
    fn drop(&mut self) {
        let lib = &self.shared.lib;
        for (_, (_, m)) in lock(&self.chunks).drain() {
            let _ = lib.destroy_mem(self.ctx, m);
        }
        if let Some(m) = self.mem.take() {
            let _ = lib.destroy_mem(self.ctx, m);
        }
        lock(&self.shared.residency).free(self.domain, self.iova);
    }
}

impl BackendBuffer for RknnBuffer {
    fn host(&self) -> &[u8] {
        self.mem.as_ref().map_or(&[], Mem::bytes)
    }

    fn host_mut(&mut self) -> &mut [u8] {
        self.mem.as_mut().map_or(&mut [], Mem::bytes_mut)
    }

    fn sync(&self, dir: SyncDir, _offset: u64, _len: u64) -> Result<(), DeviceError> {
        let Some(m) = &self.mem else { return Ok(()) };
        let mode = match dir {
            SyncDir::ToDevice => sys::SYNC_TO_DEVICE,
            SyncDir::FromDevice => sys::SYNC_FROM_DEVICE,
        };
        // The runtime syncs whole memory objects.
        self.shared.lib.mem_sync(self.ctx, m, mode)
    }
}

impl RknnBuffer {
    /// Call `f` with the memory object (and its id) covering `len` bytes at `offset`: the
    /// buffer's own for the whole buffer, else one made inside it on first use.
    fn with_range<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(u64, &Mem) -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        let mem = self.mem.as_ref().ok_or(DeviceError::Unsupported {
            backend: "rknn",
            what: "a buffer whose memory was released",
        })?;
        if offset == 0 && len == mem.len() as u64 {
            return f(self.id, mem);
        }
        let mut chunks = lock(&self.chunks);
        let (id, sub) = match chunks.entry((offset, len)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let sub = self
                    .shared
                    .lib
                    .create_mem_from_fd(self.ctx, mem, offset, len)?;
                e.insert((self.shared.mem_id(), sub))
            }
        };
        f(*id, sub)
    }
}

/// An NPU through the vendor runtime `librknnrt.so` (or a library with the same C API, such as
/// ork's CI stand-in): weights in runtime memory in their domain, matmul contexts per (type, K,
/// N, domain) with dynamic M, B bound in the native layout. See `docs/rknn.md`.
pub struct RknnDevice {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RknnDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RknnDevice")
            .field("version", &self.shared.version)
            .field("soc", &self.shared.soc)
            .finish_non_exhaustive()
    }
}

/// How a task maps onto the runtime: its matmul type, whether C is i32, the group size.
#[derive(Clone, Copy, Debug)]
struct Plan {
    mm_type: i32,
    int_out: bool,
    group: Option<usize>,
}

impl RknnDevice {
    /// Load the runtime (`ORK_RKNN_LIB`, else the usual names and paths) and open it for
    /// `options.soc`, with `options.domains` IOMMU domains (default 16), so that budgets and
    /// window accounting match an emulator opened with the same options.
    ///
    /// # Errors
    /// [`DeviceError::NotFound`] when no library is found (and `ORK_RKNN_LIB` is unset);
    /// [`DeviceError::Library`], [`DeviceError::RuntimeTooOld`] or [`DeviceError::Runtime`]
    /// when it is found but unusable; [`DeviceError::BadConfig`] for domains outside 1..=16.
    pub fn open(options: &OpenOptions) -> Result<Self, DeviceError> {
        Self::with_lib(RuntimeLib::load_default()?, options)
    }

    /// Open the runtime library at `path` (a path, or a name for the dynamic linker's search).
    ///
    /// # Errors
    /// As [`RknnDevice::open`], with [`DeviceError::Library`] for a library that does not load.
    pub fn open_path(path: &str, options: &OpenOptions) -> Result<Self, DeviceError> {
        Self::with_lib(RuntimeLib::load(path)?, options)
    }

    fn with_lib(lib: RuntimeLib, options: &OpenOptions) -> Result<Self, DeviceError> {
        let soc = options.soc;
        let domains = options.domains.unwrap_or(MAX_DOMAINS);
        if domains == 0 || domains > MAX_DOMAINS {
            return Err(DeviceError::BadConfig {
                reason: "domains must be 1..=16",
            });
        }
        let lib = Arc::new(lib);
        let (ctx0, _) = lib.create(&mut alloc_info(0))?;
        let (runtime, driver) = match lib.sdk_version(ctx0) {
            Ok(v) => v,
            Err(e) => (format!("unknown ({e})"), "unknown".to_string()),
        };
        if let Some(v) = parse_version(&runtime) {
            if v < MIN_RUNTIME {
                let _ = lib.destroy(ctx0);
                return Err(DeviceError::RuntimeTooOld {
                    library: lib.path().to_string(),
                    found: format!("version {runtime}"),
                    needed: "2.1.0",
                });
            }
        }
        let mut alloc = vec![None; domains as usize];
        alloc[0] = Some(ctx0);
        let window = WindowConfig::default();
        let shared = Shared {
            version: RuntimeVersion {
                library: lib.path().to_string(),
                runtime,
                driver,
            },
            lib,
            soc,
            domains,
            alloc: Mutex::new(alloc),
            residency: Mutex::new(Windows::new(domains, &window)),
            contexts: Mutex::new(HashMap::new()),
            made: AtomicU64::new(0),
            attached: Mutex::new(0),
            tasks: AtomicU64::new(0),
            switches: AtomicU64::new(0),
            next_mem: AtomicU64::new(1),
            runs: AtomicU64::new(0),
            run_nanos: AtomicU64::new(0),
        };
        Ok(RknnDevice {
            shared: Arc::new(shared),
        })
    }

    /// The runtime's and driver's versions.
    pub fn version(&self) -> &RuntimeVersion {
        &self.shared.version
    }

    /// `rknn_matmul_run` calls so far and the time spent inside them: a task's time minus this
    /// is the backend's own overhead (context lookup, binding, A/C copies, syncs).
    pub fn run_time(&self) -> (u64, std::time::Duration) {
        (
            self.shared.runs.load(Ordering::Relaxed),
            std::time::Duration::from_nanos(self.shared.run_nanos.load(Ordering::Relaxed)),
        )
    }

    /// Matmul contexts created so far (one per type, K, N-chunk and domain used, more where
    /// tasks of one key ran at the same time).
    pub fn contexts(&self) -> usize {
        self.shared.made.load(Ordering::Relaxed) as usize
    }

    /// An idle context for `key`, or a new one.
    fn checkout(&self, key: CtxKey) -> Result<MatCtx, DeviceError> {
        if let Some(c) = lock(&self.shared.contexts).get_mut(&key).and_then(Vec::pop) {
            return Ok(c);
        }
        self.create_context(key)
    }

    /// Return a context for the next task of its key.
    fn checkin(&self, key: CtxKey, mc: MatCtx) {
        lock(&self.shared.contexts).entry(key).or_default().push(mc);
    }

    /// The record of `buf` if this device made it.
    fn record<'a>(&self, buf: &'a DeviceBuffer) -> Option<&'a RknnBuffer> {
        buf.backend::<RknnBuffer>()
            .filter(|b| Arc::ptr_eq(&b.shared, &self.shared))
    }

    fn owned<'a>(
        &self,
        view: BufferView<'a>,
        operand: &'static str,
    ) -> Result<&'a RknnBuffer, DeviceError> {
        self.record(view.buffer())
            .ok_or(DeviceError::ForeignBuffer { operand })
    }

    /// Output channels per N-chunk of a weight of `dtype`: the chip's N limit in whole tiles, or
    /// all of N.
    fn chunk_n(&self, l: &TiledLayout) -> usize {
        let tn = l.dtype.n_tile();
        self.shared
            .soc
            .n_max(ElemType::of_weight(l.dtype))
            .map_or(l.n_pad(), |max| (max / tn * tn).max(tn))
    }

    /// The chip's limits on what the runtime will see: K padded must fit the chip's K limit
    /// (larger K must be split into K-segments before it reaches the device, `split.rs`).
    fn check_k(&self, s: &MatmulShape, kpad: usize) -> Result<(), DeviceError> {
        let max = self.shared.soc.caps().limits.k_max;
        if kpad > max {
            return Err(DeviceError::Chip {
                soc: self.shared.soc,
                a: s.a,
                b: s.b,
                k: s.k,
                n: s.n,
                limit: ChipLimit::KMax { max },
            });
        }
        Ok(())
    }

    fn plan(&self, task: &MatmulTask<'_>) -> Result<Plan, DeviceError> {
        let shape = MatmulShape::of_task(task);
        self.shared.soc.check_types(&shape)?;
        self.check_k(&shape, task.weight.layout.k_pad())?;
        if task.weight.group.is_affine() {
            return Err(affine_unsupported());
        }
        let group = task.weight.group.size();
        use ElemType::{Fp16, Int4, Int8};
        let (mm_type, int_out) = match (shape.a, shape.b, group) {
            (Int8, Int8, None) => (mm_type::INT8_MM_INT8_TO_INT32, true),
            (Int8, Int8, Some(_)) => (mm_type::INT8_MM_INT8_TO_FLOAT32, false),
            (Int8, Int4, None) => (mm_type::INT8_MM_INT4_TO_INT32, true),
            (Fp16, Fp16, None) => (mm_type::FLOAT16_MM_FLOAT16_TO_FLOAT32, false),
            (Fp16, Int8, None) => (mm_type::FLOAT16_MM_INT8_TO_FLOAT32, false),
            (Fp16, Int4, None) => (mm_type::FLOAT16_MM_INT4_TO_FLOAT32, false),
            _ => {
                return Err(DeviceError::Unsupported {
                    backend: "rknn",
                    what: "this activation × weight type with per-group scales (only int8 × int8 \
                           per-group is wired to the runtime)",
                })
            }
        };
        Ok(Plan {
            mm_type,
            int_out,
            group,
        })
    }

    /// A new context for `key`, with every M bucket and its A and C memory.
    fn create_context(&self, key: CtxKey) -> Result<MatCtx, DeviceError> {
        let lib = &self.shared.lib;
        let mut info = MatmulInfo::zeroed();
        info.m = 1;
        info.k = key.k as i32;
        info.n = key.n as i32;
        info.mm_type = key.mm_type;
        info.b_layout = sys::LAYOUT_NATIVE;
        info.ac_layout = sys::LAYOUT_NORM;
        info.iommu_domain_id = key.domain as i32;
        if key.group > 0 {
            info.b_quant_type = sys::QUANT_PER_GROUP_SYM;
            info.group_size = key.group;
        }
        let mut shapes: Vec<CShape> = M_BUCKETS
            .iter()
            .map(|&m| CShape {
                m: m as i32,
                k: key.k as i32,
                n: key.n as i32,
            })
            .collect();
        let (ctx, attrs) = lib.create_dynamic(&mut info, &mut shapes)?;
        let mut mc = MatCtx {
            lib: Arc::clone(lib),
            ctx,
            attrs,
            a: None,
            c: None,
            shape: None,
            ac_bound: false,
            b_bound: None,
            core_mask: None,
        };
        let last = mc.attrs[M_BUCKETS.len() - 1];
        mc.a = Some(lib.create_mem2(ctx, u64::from(last.a.size), sys::mem_flags::CACHEABLE)?);
        mc.c = Some(lib.create_mem2(ctx, u64::from(last.c.size), sys::mem_flags::CACHEABLE)?);
        self.shared.made.fetch_add(1, Ordering::Relaxed);
        Ok(mc)
    }

    /// Validate a task, then run it chunk by chunk and M-block by M-block, handing each block's
    /// C rows to `emit(row, n0, c_row_bytes)` (`n1 - n0` values of 4 bytes: i32 when the plan's
    /// output is integer, else f32).
    fn execute(
        &self,
        task: &MatmulTask<'_>,
        out_len: usize,
        want_int: Option<bool>,
        mut emit: impl FnMut(&Plan, usize, usize, &[u8]),
    ) -> Result<MatmulStats, DeviceError> {
        let t0 = Instant::now();
        let (plan, wrec) = self.prepare(task, out_len, want_int)?;
        let l = task.weight.layout;
        let domain = task.weight.bytes.domain();
        let switched = self.attach(domain);
        let acts = task.activation_values();
        let kpad = l.k_pad();
        let tn = l.dtype.n_tile();
        let chunk = self.chunk_n(&l);
        let mut scales_buf = Vec::new();
        for n0 in (0..l.n).step_by(chunk) {
            let n1 = (n0 + chunk).min(l.n);
            let cl = TiledLayout::new(l.dtype, l.k, n1 - n0);
            let ch = Chunk {
                task,
                acts: &acts,
                plan,
                wrec,
                mask: task.cores.0 as i32,
                k: l.k,
                kpad,
                elem: task.activations.precision().bytes(),
                n0,
                n1,
                npad: cl.n_pad(),
                boff: task.weight.bytes.offset() + (n0 / tn * l.n_tile_bytes()) as u64,
                blen: cl.blob_bytes() as u64,
            };
            let key = CtxKey {
                mm_type: plan.mm_type,
                group: plan.group.map_or(0, |g| g as i16),
                k: kpad,
                n: ch.npad,
                domain: domain.0,
            };
            let mut held = self.checkout(key)?;
            let r = self.run_chunk(&mut held, &ch, &mut scales_buf, &mut emit);
            self.checkin(key, held);
            r?;
        }
        self.shared.tasks.fetch_add(1, Ordering::Relaxed);
        Ok(MatmulStats {
            domain,
            switched,
            macs: (task.m * kpad * l.n_pad()) as u64,
            elapsed: t0.elapsed(),
            kernel: "rknn",
        })
    }

    /// Check `task` (its shape against `out_len`, integer output when `want_int` asks for it,
    /// its buffers this device's, its core mask the chip's) and plan it; the plan and the
    /// weight's record.
    fn prepare<'a>(
        &self,
        task: &MatmulTask<'a>,
        out_len: usize,
        want_int: Option<bool>,
    ) -> Result<(Plan, &'a RknnBuffer), DeviceError> {
        task.check(out_len)?;
        let l = task.weight.layout;
        let not_integer = || DeviceError::NotInteger {
            dtype: l.dtype,
            activations: task.activations.precision(),
        };
        if want_int == Some(true) {
            let integer = crate::task::is_integer(l.dtype)
                && task.activations.precision() == crate::ActPrecision::Int8;
            if !integer {
                return Err(not_integer());
            }
        }
        let wrec = self.owned(task.weight.bytes, "weight")?;
        if let Some(v) = task.activations.view() {
            self.owned(v, "activations")?;
        }
        let mask = task.cores.0;
        let cores = self.shared.soc.cores();
        if mask >> cores != 0 {
            return Err(DeviceError::BadCoreMask { mask, cores });
        }
        let plan = self.plan(task)?;
        if want_int == Some(true) && (!plan.int_out || plan.group.is_some()) {
            return Err(not_integer());
        }
        Ok((plan, wrec))
    }

    /// Attach the device to `domain`; whether it had to switch.
    fn attach(&self, domain: DomainId) -> bool {
        let mut a = lock(&self.shared.attached);
        let switched = *a != domain.0;
        if switched {
            *a = domain.0;
            self.shared.switches.fetch_add(1, Ordering::Relaxed);
        }
        switched
    }

    /// Run one N-chunk on context `mc`: its core mask and per-group scales set, then M-block by
    /// M-block (the largest M bucket at most), each block's C rows handed to `emit`.
    fn run_chunk(
        &self,
        mc: &mut MatCtx,
        ch: &Chunk<'_, '_>,
        scales_buf: &mut Vec<f32>,
        emit: &mut impl FnMut(&Plan, usize, usize, &[u8]),
    ) -> Result<(), DeviceError> {
        let lib = Arc::clone(&mc.lib);
        if mc.core_mask != Some(ch.mask) {
            lib.set_core_mask(mc.ctx, ch.mask)?;
            mc.core_mask = Some(ch.mask);
        }
        if let Some(g) = ch.plan.group {
            let groups = ch.kpad / g;
            scales_buf.clear();
            scales_buf.extend_from_slice(&ch.task.weight.scales[ch.n0 * groups..ch.n1 * groups]);
            scales_buf.resize(ch.npad * groups, 0.0);
            debug_assert!(ch.kpad.is_multiple_of(g));
            let b = mc.attrs[0].b;
            lib.set_quant_params(mc.ctx, &b, scales_buf)?;
        }
        let m = ch.task.m;
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(M_BUCKETS[M_BUCKETS.len() - 1]);
            mc.bind(ch, rows)?;
            mc.fill_a(ch, r0, rows)?;
            self.run_block(mc, ch, r0, rows, emit)?;
            r0 += rows;
        }
        Ok(())
    }

    /// Run the block of `rows` rows from `r0` whose A is filled: A synced to the device, the
    /// matmul run (timed), C synced back and its rows handed to `emit`.
    fn run_block(
        &self,
        mc: &MatCtx,
        ch: &Chunk<'_, '_>,
        r0: usize,
        rows: usize,
        emit: &mut impl FnMut(&Plan, usize, usize, &[u8]),
    ) -> Result<(), DeviceError> {
        let lib = &mc.lib;
        let a_mem = mc.a.as_ref().ok_or(NO_A_MEMORY)?;
        lib.mem_sync(mc.ctx, a_mem, sys::SYNC_TO_DEVICE)?;
        let t_run = Instant::now();
        lib.run(mc.ctx)?;
        self.shared
            .run_nanos
            .fetch_add(t_run.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.shared.runs.fetch_add(1, Ordering::Relaxed);
        let c_mem = mc.c.as_ref().ok_or(DeviceError::Unsupported {
            backend: "rknn",
            what: "a context without C memory",
        })?;
        lib.mem_sync(mc.ctx, c_mem, sys::SYNC_FROM_DEVICE)?;
        let cbytes = c_mem.bytes();
        let (npad, width) = (ch.npad, ch.n1 - ch.n0);
        for r in 0..rows {
            let row = &cbytes[r * npad * 4..(r * npad + width) * 4];
            emit(&ch.plan, r0 + r, ch.n0, row);
        }
        Ok(())
    }
}

/// A context that lost its A memory.
const NO_A_MEMORY: DeviceError = DeviceError::Unsupported {
    backend: "rknn",
    what: "a context without A memory",
};

/// One N-chunk `n0..n1` of a task: what its blocks need.
struct Chunk<'a, 't> {
    task: &'a MatmulTask<'t>,
    acts: &'a ActValues<'t>,
    plan: Plan,
    /// The weight's record.
    wrec: &'a RknnBuffer,
    mask: i32,
    k: usize,
    kpad: usize,
    /// Bytes per activation value.
    elem: usize,
    n0: usize,
    n1: usize,
    /// `n1 - n0` padded to whole tiles.
    npad: usize,
    /// The chunk's B blob in the weight's buffer.
    boff: u64,
    blen: u64,
}

impl MatCtx {
    /// Set the M bucket that holds `rows` rows (unbinding what the old shape had bound), bind
    /// A and C for it, and the chunk's B blob.
    fn bind(&mut self, ch: &Chunk<'_, '_>, rows: usize) -> Result<(), DeviceError> {
        let lib = Arc::clone(&self.lib);
        let ctx = self.ctx;
        let si = M_BUCKETS.iter().position(|&b| b >= rows).unwrap_or(0);
        if self.shape != Some(si) {
            let s = CShape {
                m: M_BUCKETS[si] as i32,
                k: ch.kpad as i32,
                n: ch.npad as i32,
            };
            lib.set_dynamic_shape(ctx, &s)?;
            self.shape = Some(si);
            self.ac_bound = false;
            self.b_bound = None;
        }
        let attr = self.attrs[si];
        if !self.ac_bound {
            if let (Some(a), Some(c)) = (self.a.as_ref(), self.c.as_ref()) {
                lib.set_io_mem(ctx, a, &attr.a)?;
                lib.set_io_mem(ctx, c, &attr.c)?;
            }
            self.ac_bound = true;
        }
        ch.wrec.with_range(ch.boff, ch.blen, |id, bmem| {
            if self.b_bound != Some(id) {
                lib.set_io_mem(ctx, bmem, &attr.b)?;
                self.b_bound = Some(id);
            }
            Ok(())
        })
    }

    /// A: rows `r0..r0 + rows` of the task, row-major, each padded with zeros to Kpad.
    fn fill_a(&mut self, ch: &Chunk<'_, '_>, r0: usize, rows: usize) -> Result<(), DeviceError> {
        let a_mem = self.a.as_mut().ok_or(NO_A_MEMORY)?;
        let abytes = a_mem.bytes_mut();
        let (k, elem) = (ch.k, ch.elem);
        let row_bytes = ch.kpad * elem;
        for r in 0..rows {
            let dst = &mut abytes[r * row_bytes..(r + 1) * row_bytes];
            let src_r = r0 + r;
            match ch.acts {
                ActValues::Int8(a) => {
                    for (d, &s) in dst.iter_mut().zip(&a[src_r * k..src_r * k + k]) {
                        *d = s as u8;
                    }
                }
                ActValues::F16(a) => {
                    for (d, s) in dst.chunks_exact_mut(2).zip(&a[src_r * k..src_r * k + k]) {
                        d.copy_from_slice(&s.to_le_bytes());
                    }
                }
            }
            dst[k * elem..].fill(0);
        }
        Ok(())
    }
}

fn i32_at(b: &[u8], j: usize) -> i32 {
    i32::from_le_bytes([b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]])
}

fn f32_at(b: &[u8], j: usize) -> f32 {
    f32::from_le_bytes([b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]])
}

impl Device for RknnDevice {
    fn info(&self) -> DeviceInfo {
        let v = &self.shared.version;
        DeviceInfo {
            name: format!(
                "rknn runtime {} ({}, {})",
                v.runtime,
                v.library,
                self.shared.soc.name().to_ascii_uppercase()
            ),
            cores: self.shared.soc.cores(),
            domains: self.shared.domains,
            window_bytes: WINDOW_BYTES,
            driver_version: Some(v.driver.clone()),
            computes: true,
            soc: Some(self.shared.soc),
        }
    }

    fn create_buffer(
        &self,
        size: u64,
        intent: BufferIntent,
        domain: DomainId,
    ) -> Result<DeviceBuffer, DeviceError> {
        if domain.0 >= self.shared.domains {
            return Err(DeviceError::UnknownDomain {
                domain,
                domains: self.shared.domains,
            });
        }
        // The same window model and alignment rules as the emulator, so the budget and the
        // wall-hit accounting match it.
        let iova = lock(&self.shared.residency).alloc(size, intent, domain)?;
        let undo = |shared: &Shared| {
            lock(&shared.residency).free(domain, iova);
        };
        let mem = self.shared.alloc_ctx(domain).and_then(|ctx| {
            self.shared
                .lib
                .create_mem2(ctx, size, sys::mem_flags::CACHEABLE)
                .map(|m| (ctx, m))
        });
        let (ctx, mem) = match mem {
            Ok(x) => x,
            Err(e) => {
                undo(&self.shared);
                return Err(e);
            }
        };
        let record = RknnBuffer {
            mem: Some(mem),
            id: self.shared.mem_id(),
            shared: Arc::clone(&self.shared),
            ctx,
            domain,
            iova,
            chunks: Mutex::new(HashMap::new()),
        };
        DeviceBuffer::new(iova, size, domain, intent, Box::new(record))
    }

    fn footprint(&self, size: u64) -> u64 {
        footprint(size)
    }

    /// Checks the weight (owner, bytes, scales, the chip's K limit) and makes the memory objects
    /// of its N-chunks, so that binding them later costs no allocation.
    fn prepare_weight(&self, weight: &WeightRef<'_>) -> Result<(), DeviceError> {
        let rec = self.owned(weight.bytes, "weight")?;
        weight.check(0)?;
        if weight.group.is_affine() {
            return Err(affine_unsupported());
        }
        let l = weight.layout;
        let b = ElemType::of_weight(l.dtype);
        self.check_k(
            &MatmulShape {
                a: b,
                b,
                k: l.k,
                n: l.n,
                group: weight.group,
            },
            l.k_pad(),
        )?;
        let tn = l.dtype.n_tile();
        let chunk = self.chunk_n(&l);
        for n0 in (0..l.n).step_by(chunk) {
            let cl = TiledLayout::new(l.dtype, l.k, (n0 + chunk).min(l.n) - n0);
            let off = weight.bytes.offset() + (n0 / tn * l.n_tile_bytes()) as u64;
            rec.with_range(off, cl.blob_bytes() as u64, |_, _| Ok(()))?;
        }
        Ok(())
    }

    fn matmul(&self, task: &MatmulTask<'_>, out: &mut [f32]) -> Result<MatmulStats, DeviceError> {
        let n = task.weight.layout.n;
        let (sa, sw) = (task.act_scales, task.weight.scales);
        let int8_acts = task.activations.precision() == crate::ActPrecision::Int8;
        self.execute(task, out.len(), None, |plan, r, n0, c| {
            let o = &mut out[r * n + n0..r * n + n0 + c.len() / 4];
            if plan.int_out {
                let s = sa[r];
                for (j, (o, &w)) in o.iter_mut().zip(&sw[n0..]).enumerate() {
                    *o = i32_at(c, j) as f32 * s * w;
                }
            } else if plan.group.is_some() {
                let s = sa[r];
                for (j, o) in o.iter_mut().enumerate() {
                    *o = f32_at(c, j) * s;
                }
            } else if int8_acts {
                // int8 activations with a float output: no chip table has such a pair today
                // (`plan` refuses it before this runs); kept in the emulator's order.
                let s = sa[r];
                for (j, (o, &w)) in o.iter_mut().zip(&sw[n0..]).enumerate() {
                    *o = f32_at(c, j) * s * w;
                }
            } else {
                for (j, (o, &w)) in o.iter_mut().zip(&sw[n0..]).enumerate() {
                    *o = f32_at(c, j) * w;
                }
            }
        })
    }

    fn as_integer(&self) -> Option<&dyn IntegerOracle> {
        Some(self)
    }

    fn stats(&self) -> DeviceStats {
        let r = lock(&self.shared.residency);
        DeviceStats {
            buffers_live: r.buffers_live(),
            resident_per_domain: r.resident_per_domain(),
            peak_resident: r.peak(),
            domain_switches: self.shared.switches.load(Ordering::Relaxed),
            tasks: self.shared.tasks.load(Ordering::Relaxed),
            attached: DomainId(*lock(&self.shared.attached)),
        }
    }
}

/// The runtime's int32 outputs (int8 × int8 and, on the RK3576, int8 × int4) are the exact
/// accumulators.
impl IntegerOracle for RknnDevice {
    fn matmul_raw(
        &self,
        task: &MatmulTask<'_>,
        out: &mut [i32],
    ) -> Result<MatmulStats, DeviceError> {
        let l = task.weight.layout;
        if !crate::task::is_integer(l.dtype)
            || task.activations.precision() != crate::ActPrecision::Int8
        {
            return Err(DeviceError::NotInteger {
                dtype: l.dtype,
                activations: task.activations.precision(),
            });
        }
        let n = l.n;
        self.execute(task, out.len(), Some(true), |_, r, n0, c| {
            for (j, o) in out[r * n + n0..r * n + n0 + c.len() / 4]
                .iter_mut()
                .enumerate()
            {
                *o = i32_at(c, j);
            }
        })
    }
}

/// Affine int4 weight groups (the RK3576's w4a16-gN with an offset per group, `docs/chip.md`)
/// need a second matmul (the offsets) that this backend does not issue.
fn affine_unsupported() -> DeviceError {
    DeviceError::Unsupported {
        backend: "rknn",
        what: "affine int4 weight groups (RK3576 w4a16-gN, step and offset per group): the \
               second fp16 × fp16 matmul of the offsets is not wired to the runtime; use the \
               emulator",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        assert_eq!(
            parse_version("2.3.2 (429f97ae6b@2025-04-09T09:09:27)"),
            Some((2, 3, 2))
        );
        assert_eq!(parse_version("1.6.0"), Some((1, 6, 0)));
        assert_eq!(parse_version("v2.1"), Some((2, 1, 0)));
        assert_eq!(parse_version("unknown"), None);
        assert!(parse_version("2.0.0b0").unwrap() < MIN_RUNTIME);
        assert!(parse_version("2.1.0").unwrap() >= MIN_RUNTIME);
    }
}
