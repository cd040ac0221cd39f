//! The emulated RK3588 NPU: real IOVA windows, host-memory buffers, tiled matmul on the CPU.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::buffer::{BackendBuffer, SyncDir};
use crate::host_map::HostMap;
use crate::kernel::Isa;
use crate::soc::{ChipLimit, ElemType, Fp16Operand, MatmulShape, Soc};
use crate::task::{is_integer, ActValues};
use crate::window::{footprint, WindowConfig, Windows, WINDOW_BYTES};
use crate::{
    gemm, ActPrecision, BufferIntent, BufferView, Device, DeviceBuffer, DeviceError, DeviceInfo,
    DeviceStats, DomainId, IntegerOracle, MatmulStats, MatmulTask, WeightRef, MAX_DOMAINS,
};
use ork_pack::ScaleGroup;

/// How the emulator spends a domain switch's cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchWait {
    /// `thread::sleep` (cheap for the host; timing is coarse).
    Sleep,
    /// Busy-wait (precise; burns a core like a blocking ioctl would not).
    Spin,
}

/// Configuration of an [`EmuDevice`].
#[derive(Clone, Debug)]
pub struct EmuConfig {
    /// NPU cores to emulate (RK3588: 3). Core masks are checked against it.
    pub cores: u32,
    /// IOMMU domains (1..=16), each with its own window.
    pub domains: u32,
    /// Geometry of every domain's window.
    pub window: WindowConfig,
    /// Time a domain switch (detach, IOMMU flush, attach) costs.
    pub switch_cost: Duration,
    /// How that time is spent.
    pub switch_wait: SwitchWait,
    /// Host worker threads per task at most; 0 = `min(cores, available parallelism)`.
    pub threads: usize,
    /// Kernel ISA; `None` = the best the CPU has ([`Isa::best`]).
    pub isa: Option<Isa>,
    /// The chip modelled (default RK3588). A task whose activation × weight types (or per-group
    /// mode) the chip lacks fails with [`DeviceError::Chip`]; it never runs.
    pub soc: Soc,
    /// Also refuse tasks beyond the chip's K / N limits (K a multiple of 32 and ≤ 10240, N
    /// aligned to the weight type and, on the RK3588, ≤ 4096 for int8 / fp16, ≤ 8192 for int4).
    ///
    /// On by default: the residency layer computes every weight beyond the limits as chip-sized
    /// parts ([`crate::split`], `docs/chip.md`), so nothing over them is ever submitted. Turn it
    /// off only to run a whole over-limit weight as a reference (tests).
    pub enforce_limits: bool,
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig {
            cores: 3,
            domains: MAX_DOMAINS,
            window: WindowConfig::default(),
            switch_cost: Duration::from_micros(50),
            switch_wait: SwitchWait::Sleep,
            threads: 0,
            isa: None,
            soc: Soc::Rk3588,
            enforce_limits: true,
        }
    }
}

struct Gate {
    attached: u32,
    in_flight: u32,
}

/// State shared by the device and all its buffers (a buffer may outlive the `EmuDevice`).
struct Shared {
    residency: Mutex<Windows>,
    gate: Mutex<Gate>,
    drained: Condvar,
    switch_cost: Duration,
    switch_wait: SwitchWait,
    tasks: AtomicU64,
    switches: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves only counters behind; keep going with them.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The emulator's record of one buffer: its anonymous host memory and its window range. It holds
/// the device's shared state, so a buffer may outlive the `EmuDevice`.
struct EmuBuffer {
    map: HostMap,
    shared: Arc<Shared>,
    domain: DomainId,
    iova: u64,
}

impl Drop for EmuBuffer {
    fn drop(&mut self) {
        // A record is only built by `create_buffer`, which allocated this range, and is
        // dropped exactly once.
        lock(&self.shared.residency).free(self.domain, self.iova);
        // `map` is unmapped when the fields drop, right after this.
    }
}

impl BackendBuffer for EmuBuffer {
    fn host(&self) -> &[u8] {
        self.map.as_slice()
    }

    fn host_mut(&mut self) -> &mut [u8] {
        self.map.as_mut_slice()
    }

    fn sync(&self, _dir: SyncDir, _offset: u64, _len: u64) -> Result<(), DeviceError> {
        // Host memory is the device memory here: nothing to flush.
        Ok(())
    }

    fn will_write_all(&mut self) {
        self.map.populate();
    }
}

/// Holds the NPU attached to one domain while a task runs; dropping it lets other domains in.
struct Attached<'a> {
    shared: &'a Shared,
}

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        let mut g = lock(&self.shared.gate);
        g.in_flight -= 1;
        if g.in_flight == 0 {
            self.shared.drained.notify_all();
        }
    }
}

impl Shared {
    /// Attach `domain`, waiting for the current domain's tasks to drain; returns whether a switch
    /// happened.
    fn attach(&self, domain: DomainId) -> (Attached<'_>, bool) {
        let mut g = lock(&self.gate);
        while g.attached != domain.0 && g.in_flight > 0 {
            g = self.drained.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        let switched = g.attached != domain.0;
        if switched {
            match self.switch_wait {
                SwitchWait::Sleep => std::thread::sleep(self.switch_cost),
                SwitchWait::Spin => {
                    let t = Instant::now();
                    while t.elapsed() < self.switch_cost {
                        std::hint::spin_loop();
                    }
                }
            }
            g.attached = domain.0;
            self.switches.fetch_add(1, Ordering::Relaxed);
        }
        g.in_flight += 1;
        (Attached { shared: self }, switched)
    }
}

/// The emulated NPU (the default device). Cheap to share: wrap it in an `Arc` or borrow it.
pub struct EmuDevice {
    shared: Arc<Shared>,
    /// Appended to the name in [`DeviceInfo`] (why [`crate::open`]'s `auto` chose the emulator).
    note: Option<String>,
    cores: u32,
    domains: u32,
    window_bytes: u64,
    max_threads: usize,
    isa: Isa,
    soc: Soc,
    enforce_limits: bool,
    /// Worker pools by thread count (index = threads - 1), built on first use.
    pools: Vec<OnceLock<Option<rayon::ThreadPool>>>,
}

impl std::fmt::Debug for EmuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuDevice")
            .field("cores", &self.cores)
            .field("domains", &self.domains)
            .field("isa", &self.isa)
            .field("soc", &self.soc)
            .field("enforce_limits", &self.enforce_limits)
            .field("max_threads", &self.max_threads)
            .finish()
    }
}

impl Default for EmuDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl EmuDevice {
    /// An emulated RK3588 with the default (board-calibrated) configuration.
    pub fn new() -> Self {
        // The default configuration is valid by construction.
        Self::build(EmuConfig::default())
    }

    /// An emulated NPU with a custom configuration.
    pub fn with_config(config: EmuConfig) -> Result<Self, DeviceError> {
        if config.domains == 0 || config.domains > MAX_DOMAINS {
            return Err(DeviceError::BadConfig {
                reason: "domains must be 1..=16",
            });
        }
        if config.cores == 0 || config.cores > 32 {
            return Err(DeviceError::BadConfig {
                reason: "cores must be 1..=32",
            });
        }
        if config.window.size < crate::window::PAGE_BYTES || config.window.size > WINDOW_BYTES {
            return Err(DeviceError::BadConfig {
                reason: "window size must be 4 KiB..=4 GiB",
            });
        }
        if config.isa.is_none() {
            // An `ORK_KERNEL` this CPU cannot run is refused, not silently replaced.
            Isa::from_env()?;
        }
        if let Some(isa) = config.isa {
            if !Isa::available().contains(&isa) {
                return Err(DeviceError::BadConfig {
                    reason: "this CPU cannot run the requested kernel ISA",
                });
            }
        }
        Ok(Self::build(config))
    }

    fn build(config: EmuConfig) -> Self {
        let host = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let max_threads = match config.threads {
            0 => (config.cores as usize).min(host),
            t => t,
        }
        .max(1);
        let shared = Arc::new(Shared {
            residency: Mutex::new(Windows::new(config.domains, &config.window)),
            gate: Mutex::new(Gate {
                attached: 0,
                in_flight: 0,
            }),
            drained: Condvar::new(),
            switch_cost: config.switch_cost,
            switch_wait: config.switch_wait,
            tasks: AtomicU64::new(0),
            switches: AtomicU64::new(0),
        });
        EmuDevice {
            shared,
            note: None,
            cores: config.cores,
            domains: config.domains,
            window_bytes: config.window.size,
            max_threads,
            isa: config.isa.unwrap_or_else(Isa::best),
            soc: config.soc,
            enforce_limits: config.enforce_limits,
            pools: (0..max_threads).map(|_| OnceLock::new()).collect(),
        }
    }

    /// "RK3588" / "RK3576".
    fn soc_label(&self) -> String {
        self.soc.name().to_ascii_uppercase()
    }

    /// Say in [`DeviceInfo::name`] why this device was chosen.
    pub(crate) fn with_note(mut self, note: String) -> Self {
        self.note = Some(note);
        self
    }

    /// Whether `buf` was created by this device instance.
    fn owns(&self, buf: &DeviceBuffer) -> bool {
        buf.backend::<EmuBuffer>()
            .is_some_and(|b| Arc::ptr_eq(&b.shared, &self.shared))
    }

    /// Check that `view` (operand `what`) is this device's.
    fn check_owned(&self, view: BufferView<'_>, what: &'static str) -> Result<(), DeviceError> {
        if self.owns(view.buffer()) {
            Ok(())
        } else {
            Err(DeviceError::ForeignBuffer { operand: what })
        }
    }

    /// Kernel ISA in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The chip modelled.
    pub fn soc(&self) -> Soc {
        self.soc
    }

    /// Refuse what the modelled chip cannot run: its type pairs and per-group modes always, its
    /// K / N limits when [`EmuConfig::enforce_limits`] is on (per-group scales on fp16 weights,
    /// which no chip has, were refused by [`MatmulTask::check`]).
    fn check_chip(&self, task: &MatmulTask<'_>) -> Result<(), DeviceError> {
        let shape = MatmulShape::of_task(task);
        let l = &task.weight.layout;
        if self.enforce_limits {
            self.soc.check_as_run(&shape, l.k_pad(), l.n_pad())?;
        } else {
            self.soc.check_types(&shape)?;
        }
        self.check_offsets(&shape, task.weight.group, task.weight.scales)
    }

    /// Affine groups: the offsets matmul (fp16 × fp16 → fp32, K = the group count padded to a
    /// multiple of 32) must exist on the chip and fit its limits, and every offset must be an
    /// fp16 value's range (the chip takes them as fp16).
    fn check_offsets(
        &self,
        shape: &MatmulShape,
        group: ScaleGroup,
        scales: &[f32],
    ) -> Result<(), DeviceError> {
        let Some(off) = shape.offsets() else {
            return Ok(());
        };
        self.soc.check_types(&off)?;
        self.soc.check_limits(&off)?;
        let (_, offsets) = group.split(scales);
        if offsets
            .iter()
            .any(|&b| half::f16::from_f32(b).is_infinite())
        {
            return Err(self
                .soc
                .refuse(&off, ChipLimit::Fp16Range(Fp16Operand::Offset)));
        }
        Ok(())
    }

    /// [`ChipLimit::Fp16Range`] for an operand of `task`'s offsets matmul.
    fn fp16_range(&self, task: &MatmulTask<'_>, what: Fp16Operand) -> DeviceError {
        let shape = MatmulShape::of_task(task);
        let off = shape.offsets().unwrap_or(shape);
        self.soc.refuse(&off, ChipLimit::Fp16Range(what))
    }

    /// Host threads a task with all cores uses.
    pub fn max_threads(&self) -> usize {
        self.max_threads
    }

    /// Run `f` on a pool of `threads` workers (falls back to the global pool if the OS refuses
    /// new threads).
    ///
    /// A caller that already runs on a worker of a pool with at most that many threads (the
    /// executor runs its forward pass on one; `--threads` sizes it) keeps `f` on its own pool:
    /// handing it to a second pool costs a cross-pool wake-up per task, and the idle workers of
    /// the caller's pool spin on the same cores meanwhile (measured: decode with M = 1, 211 tasks
    /// per token). A caller's pool smaller than `threads` is the caller's thread limit, so a
    /// 1-thread caller computes on 1 thread; only a pool larger than the task's cores hands
    /// the task to a smaller pool.
    pub(crate) fn run_on<R: Send>(&self, threads: usize, f: impl FnOnce() -> R + Send) -> R {
        let i = threads.clamp(1, self.max_threads) - 1;
        if rayon::current_thread_index().is_some() && rayon::current_num_threads() <= i + 1 {
            return f();
        }
        let pool = self.pools[i].get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(i + 1)
                .build()
                .ok()
        });
        match pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    fn check_domain(&self, domain: DomainId) -> Result<(), DeviceError> {
        if domain.0 >= self.domains {
            return Err(DeviceError::UnknownDomain {
                domain,
                domains: self.domains,
            });
        }
        Ok(())
    }

    /// Validate everything and attach the task's domain; returns the attach guard, whether it
    /// switched, and the worker count.
    fn begin(
        &self,
        task: &MatmulTask<'_>,
        out_len: usize,
    ) -> Result<(Attached<'_>, bool, usize), DeviceError> {
        task.check(out_len)?;
        self.check_chip(task)?;
        let wbuf = task.weight.bytes.buffer();
        self.check_owned(task.weight.bytes, "weight")?;
        if let Some(v) = task.activations.view() {
            self.check_owned(v, "activations")?;
        }
        let mask = task.cores.0;
        if self.cores < 32 && mask >> self.cores != 0 {
            return Err(DeviceError::BadCoreMask {
                mask,
                cores: self.cores,
            });
        }
        let cores = if mask == 0 {
            self.cores
        } else {
            mask.count_ones()
        };
        let (guard, switched) = self.shared.attach(wbuf.domain());
        Ok((guard, switched, cores as usize))
    }

    fn finish(&self, task: &MatmulTask<'_>, switched: bool, t0: Instant) -> MatmulStats {
        self.shared.tasks.fetch_add(1, Ordering::Relaxed);
        let l = task.weight.layout;
        MatmulStats {
            domain: task.weight.bytes.domain(),
            switched,
            macs: (task.m * l.k_pad() * l.n_pad()) as u64,
            elapsed: t0.elapsed(),
            kernel: if is_integer(l.dtype) && task.activations.precision() == ActPrecision::Int8 {
                self.isa.name()
            } else {
                crate::kernel::float_kernel_name(self.isa)
            },
        }
    }
}

impl Device for EmuDevice {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: match &self.note {
                None => format!(
                    "emulated {} NPU ({} kernel)",
                    self.soc_label(),
                    self.isa.name()
                ),
                Some(n) => format!(
                    "emulated {} NPU ({} kernel; {n})",
                    self.soc_label(),
                    self.isa.name()
                ),
            },
            cores: self.cores,
            domains: self.domains,
            window_bytes: self.window_bytes,
            driver_version: None,
            computes: true,
            soc: Some(self.soc),
        }
    }

    fn create_buffer(
        &self,
        size: u64,
        intent: BufferIntent,
        domain: DomainId,
    ) -> Result<DeviceBuffer, DeviceError> {
        self.check_domain(domain)?;
        // The emulator models the vendor driver: the flags it would pass decide the alignment.
        let iova = lock(&self.shared.residency).alloc(size, intent, domain)?;
        // `alloc` accepted the size, so it is ≤ 4 GiB and fits in usize on 64-bit hosts.
        let map_len = footprint(size);
        let map = match usize::try_from(map_len)
            .map_err(|_| std::io::ErrorKind::OutOfMemory.into())
            .and_then(HostMap::anonymous)
        {
            Ok(m) => m,
            Err(source) => {
                lock(&self.shared.residency).free(domain, iova);
                return Err(DeviceError::HostMemory { size, source });
            }
        };
        let record = EmuBuffer {
            map,
            shared: Arc::clone(&self.shared),
            domain,
            iova,
        };
        DeviceBuffer::new(iova, size, domain, intent, Box::new(record))
    }

    fn footprint(&self, size: u64) -> u64 {
        footprint(size)
    }

    /// Nothing to bind on the emulator; checks the weight (ownership, bytes, scales, K limit,
    /// and the chip's K / N limits when they are enforced) so a bad weight fails when it is
    /// loaded rather than at its first task.
    fn prepare_weight(&self, weight: &WeightRef<'_>) -> Result<(), DeviceError> {
        self.check_owned(weight.bytes, "weight")?;
        weight.check(0)?;
        if self.enforce_limits {
            let b = ElemType::of_weight(weight.layout.dtype);
            let shape = MatmulShape {
                a: b,
                b,
                k: weight.layout.k,
                n: weight.layout.n,
                group: weight.group,
            };
            self.soc.check_limits(&submitted(&shape, &weight.layout))?;
        }
        if weight.group.is_affine() {
            let shape = MatmulShape {
                a: ElemType::Fp16,
                b: ElemType::of_weight(weight.layout.dtype),
                k: weight.layout.k,
                n: weight.layout.n,
                group: weight.group,
            };
            self.soc.check_types(&shape)?;
            self.check_offsets(&shape, weight.group, weight.scales)?;
        }
        Ok(())
    }

    fn matmul(&self, task: &MatmulTask<'_>, out: &mut [f32]) -> Result<MatmulStats, DeviceError> {
        let t0 = Instant::now();
        let (guard, switched, cores) = self.begin(task, out.len())?;
        let l = task.weight.layout;
        let (m, w) = (task.m, task.weight.bytes.as_slice());
        let (sa, sw) = (task.act_scales, task.weight.scales);
        let a = task.activation_values();
        let group = task.weight.group.size();
        let (steps, offsets) = task.weight.group.split(sw);
        // Affine groups (fp16 activations only, `begin` made sure): the offsets matmul's A
        // operand, the activations' group sums in fp16.
        let sums = match group {
            Some(g) if task.weight.group.is_affine() => {
                let af = gemm::f32_rows(&a, m, l.k, l.k);
                let sums = crate::kernel::group::group_sums_f16(&af, m, l.k, g)
                    .map_err(|_| self.fp16_range(task, Fp16Operand::GroupSum))?;
                Some(sums)
            }
            _ => None,
        };
        // `out[m, n] = acc · sa[m] · sw[n]`, one run of a row at a time (a loop that vectorizes).
        // Per-group scales on fp16 weights were refused by `begin`.
        self.run_on(cores, || match (&a, group) {
            (ActValues::Int8(a), Some(g)) if is_integer(l.dtype) => {
                gemm::gemm_grouped(self.isa, &l, w, a, m, g, sw, out, |acc, m, _, o| {
                    let s = sa[m];
                    for (o, &acc) in o.iter_mut().zip(acc) {
                        *o = acc * s;
                    }
                })
            }
            (ActValues::Int8(a), _) if is_integer(l.dtype) => {
                gemm::gemm_int(self.isa, &l, w, a, m, out, |acc, m, n0, o| {
                    let s = sa[m];
                    for ((o, &acc), &w) in o.iter_mut().zip(acc).zip(&sw[n0..n0 + acc.len()]) {
                        *o = acc as f32 * s * w;
                    }
                })
            }
            // int8 × fp16 weights: no modelled chip has the pair (`begin` refuses it); the
            // arithmetic stays defined for every operand combination all the same.
            (ActValues::Int8(_), _) => {
                let af = gemm::f32_rows(&a, m, l.k, l.k_pad());
                gemm::gemm_float(self.isa, &l, w, &af, m, out, |acc, m, n0, o| {
                    let s = sa[m];
                    for ((o, &acc), &w) in o.iter_mut().zip(acc).zip(&sw[n0..n0 + acc.len()]) {
                        *o = acc * s * w;
                    }
                })
            }
            // fp16 activations × integer weights with per-group scales (RK3576 w4a16-gN): float
            // partial sums per group; `task.check` made sure the group divides K (no padding).
            // Affine groups add the offsets matmul of the activations' group sums (`kernel::group`).
            (ActValues::F16(_), Some(g)) if is_integer(l.dtype) => {
                let af = gemm::f32_rows(&a, m, l.k, l.k);
                let affine = sums.as_deref().map(|s| (s, offsets));
                gemm::gemm_grouped_float(
                    self.isa,
                    &l,
                    w,
                    &af,
                    m,
                    g,
                    steps,
                    affine,
                    out,
                    |acc, _, _, o| o.copy_from_slice(acc),
                )
            }
            (ActValues::F16(_), _) => {
                let af = gemm::f32_rows(&a, m, l.k, l.k_pad());
                gemm::gemm_float(self.isa, &l, w, &af, m, out, |acc, _, n0, o| {
                    for ((o, &acc), &w) in o.iter_mut().zip(acc).zip(&sw[n0..n0 + acc.len()]) {
                        *o = acc * w;
                    }
                })
            }
        });
        drop(guard);
        Ok(self.finish(task, switched, t0))
    }

    /// Single-row int8 tasks on integer weights with per-channel scales, all in one domain and on
    /// the same cores, run as one parallel pass over the N-tiles of all of them
    /// (`gemm::gemm_int_row_batch`); any other batch runs task by task.
    fn matmul_batch(
        &self,
        tasks: &[MatmulTask<'_>],
        outs: &mut [&mut [f32]],
    ) -> Result<Vec<MatmulStats>, DeviceError> {
        crate::check_batch(tasks, outs)?;
        // Host-visible int8 activations of every task (`None` for fp16 ones).
        let acts: Vec<&[i8]> = tasks.iter().filter_map(|t| t.activation_bytes()).collect();
        let one_pass = tasks.len() > 1
            && acts.len() == tasks.len()
            && tasks.iter().all(|t| {
                t.m == 1
                    && is_integer(t.weight.layout.dtype)
                    && t.weight.group == ScaleGroup::PerChannel
                    && t.weight.bytes.domain() == tasks[0].weight.bytes.domain()
                    && t.cores == tasks[0].cores
            });
        if !one_pass {
            return tasks
                .iter()
                .zip(outs.iter_mut())
                .map(|(t, o)| self.matmul(t, o))
                .collect();
        }
        let t0 = Instant::now();
        // One domain: every attach after the first finds it attached and only counts the task in.
        let mut guards = Vec::with_capacity(tasks.len());
        let mut switched = Vec::with_capacity(tasks.len());
        let mut cores = 1;
        for (t, o) in tasks.iter().zip(outs.iter()) {
            let (guard, sw, c) = self.begin(t, o.len())?;
            guards.push(guard);
            switched.push(sw);
            cores = c;
        }
        let mut rows = Vec::with_capacity(tasks.len());
        for ((t, o), a) in tasks.iter().zip(outs.iter_mut()).zip(acts) {
            rows.push(gemm::RowTask {
                l: t.weight.layout,
                w: t.weight.bytes.as_slice(),
                a,
                sa: t.act_scales[0],
                sw: t.weight.scales,
                out: o,
            });
        }
        self.run_on(cores, || gemm::gemm_int_row_batch(self.isa, rows));
        drop(guards);
        Ok(tasks
            .iter()
            .zip(switched)
            .map(|(t, sw)| self.finish(t, sw, t0))
            .collect())
    }

    fn as_integer(&self) -> Option<&dyn IntegerOracle> {
        Some(self)
    }

    fn stats(&self) -> DeviceStats {
        let r = lock(&self.shared.residency);
        let attached = DomainId(lock(&self.shared.gate).attached);
        DeviceStats {
            buffers_live: r.buffers_live(),
            resident_per_domain: r.resident_per_domain(),
            peak_resident: r.peak(),
            domain_switches: self.shared.switches.load(Ordering::Relaxed),
            tasks: self.shared.tasks.load(Ordering::Relaxed),
            attached,
        }
    }
}

/// The shape the chip is given for a weight: K and N padded to the weight's tiles, as its
/// native blob holds them (the pad is zeros; a backend pads the activations to K and drops the
/// pad's outputs). A weight in ork's layout is therefore always aligned; its maxima are what
/// can be exceeded.
fn submitted(shape: &MatmulShape, layout: &ork_pack::TiledLayout) -> MatmulShape {
    MatmulShape {
        k: layout.k_pad(),
        n: layout.n_pad(),
        ..*shape
    }
}

impl IntegerOracle for EmuDevice {
    fn matmul_raw(
        &self,
        task: &MatmulTask<'_>,
        out: &mut [i32],
    ) -> Result<MatmulStats, DeviceError> {
        let t0 = Instant::now();
        let l = task.weight.layout;
        let (Some(a), true) = (task.activation_bytes(), is_integer(l.dtype)) else {
            return Err(DeviceError::NotInteger {
                dtype: l.dtype,
                activations: task.activations.precision(),
            });
        };
        let (guard, switched, cores) = self.begin(task, out.len())?;
        let w = task.weight.bytes.as_slice();
        self.run_on(cores, || {
            gemm::gemm_int(self.isa, &l, w, a, task.m, out, |acc, _, _, o| {
                o.copy_from_slice(acc)
            })
        });
        drop(guard);
        Ok(self.finish(task, switched, t0))
    }
}
