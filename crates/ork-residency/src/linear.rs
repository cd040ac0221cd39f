//! Matmuls on the device through the weight cache: w8a8 (activations quantized to int8 per
//! token, the default) or w8a16 (activations converted to fp16, the NPU's fp16 × int8 / int4 →
//! fp32 matmul; no activation quantization, so outlier channels cost nothing).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use half::{f16, slice::HalfFloatSliceExt};
use ork_device::split::Part;
use ork_device::{
    ActPrecision, Activations, BufferIntent, BufferView, CoreMask, DeviceBuffer, DeviceError,
    DomainId, MatmulTask, WeightRef,
};
use ork_manifest::WeightId;
use rayon::prelude::*;
use zerocopy::FromBytes;

use crate::cache::{Entry, Requester, WeightCache, WeightKey, WeightLease};
use crate::parts::{operands, PartOperand};

mod rows;
use crate::prefetch::{Prefetcher, ScheduleSource, Warmup};
use crate::trace::{Lane, Trace};
use crate::ResidencyError;

/// The w8a8 activation quantizer (`ork_kernels::act_i8`: symmetric per-row scale, its NaN rule),
/// shared with the executor's `CpuW8A8Linear`.
pub use ork_kernels::act_i8::quantize_row_i8;

/// Largest finite fp16 value; activations beyond it are clamped to it.
const F16_MAX: f32 = 65504.0;

/// Convert one row of activations to fp16 (round to nearest even), clamping finite values beyond
/// ±65504 to ±65504; returns how many were clamped, or `None` when the row holds a NaN or an
/// infinity (`q` is then unspecified).
pub(crate) fn f16_row(x: &[f32], q: &mut [f16]) -> Option<usize> {
    let (over, bad) = x.iter().fold((0usize, false), |(o, bad), v| {
        (o + usize::from(v.abs() > F16_MAX), bad | !v.is_finite())
    });
    if bad {
        return None;
    }
    if over == 0 {
        q.convert_from_f32_slice(x);
    } else {
        for (o, &v) in q.iter_mut().zip(x) {
            *o = f16::from_f32(v.clamp(-F16_MAX, F16_MAX));
        }
    }
    Some(over)
}

/// `y = x · Wᵀ` for the cache's weights on the device (named by [`WeightKey`]: the id the
/// cache gave a weight, resolved once by the caller, or its name): quantizes `x` per token (int8, the default) or
/// converts it to fp16 ([`DeviceMatmul::with_activations`]), leases the weight from the cache
/// (fetching it if needed), tells the prefetcher where compute is, and submits the task with the
/// activations in a device buffer of the weight's domain.
pub struct DeviceMatmul {
    cache: Arc<WeightCache>,
    prefetcher: Option<Prefetcher>,
    /// The first pass's loads of a resident plan ([`DeviceMatmul::with_warmup`]).
    warmup: Option<Warmup>,
    /// One activation buffer per domain, grown on demand.
    activations: Mutex<Vec<Option<DeviceBuffer>>>,
    trace: Option<Arc<Trace>>,
    /// The board clock's recorder (`docs/board-model.md`).
    events: std::sync::OnceLock<crate::board::Recording>,
    precision: ActPrecision,
    /// fp16 activations clamped to ±65504 so far.
    clamped: AtomicU64,
    /// Largest K and N submitted to the device so far.
    max_k: AtomicUsize,
    max_n: AtomicUsize,
}

impl std::fmt::Debug for DeviceMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMatmul")
            .field("cache", &self.cache)
            .field("prefetcher", &self.prefetcher)
            .field("precision", &self.precision)
            .finish_non_exhaustive()
    }
}

impl DeviceMatmul {
    /// Matmuls through `cache`; with `prefetch = Some((schedule, slots))` a prefetch thread runs
    /// `slots` weights ahead along `schedule` (ids in `cache`, [`WeightCache::ids`]).
    /// The schedule is the plan order with announced weights first ([`Prefetcher::start`]).
    pub fn new(cache: Arc<WeightCache>, prefetch: Option<(Vec<WeightId>, usize)>) -> Self {
        let prefetcher = prefetch
            .map(|(schedule, slots)| Prefetcher::start(Arc::clone(&cache), schedule, slots));
        Self::build(cache, prefetcher)
    }

    /// Matmuls through `cache` with a prefetch thread that runs `slots` weights ahead along
    /// `source`.
    pub fn with_schedule(
        cache: Arc<WeightCache>,
        source: Box<dyn ScheduleSource>,
        slots: usize,
    ) -> Self {
        let prefetcher = Prefetcher::with_source(Arc::clone(&cache), source, slots);
        Self::build(cache, Some(prefetcher))
    }

    /// Load every weight of `schedule` (execution order) once, on a thread of its own, ahead of
    /// compute ([`Warmup`]): for a resident plan, whose first pass would otherwise load each
    /// weight on the compute path while the other cores wait.
    pub fn with_warmup(mut self, schedule: Vec<WeightId>) -> Self {
        self.warmup = Some(Warmup::start(Arc::clone(&self.cache), schedule));
        self
    }

    fn build(cache: Arc<WeightCache>, prefetcher: Option<Prefetcher>) -> Self {
        let domains = cache.device().info().domains as usize;
        DeviceMatmul {
            cache,
            prefetcher,
            warmup: None,
            activations: Mutex::new((0..domains).map(|_| None).collect()),
            trace: None,
            events: std::sync::OnceLock::new(),
            precision: ActPrecision::Int8,
            clamped: AtomicU64::new(0),
            max_k: AtomicUsize::new(0),
            max_n: AtomicUsize::new(0),
        }
    }

    /// Submit activations in `precision`: [`ActPrecision::Int8`] (w8a8, per-token scales; the
    /// default) or [`ActPrecision::F16`] (w8a16: `x` rounded to fp16, finite values beyond
    /// ±65504 clamped and counted in [`DeviceMatmul::clamped_activations`]).
    pub fn with_activations(mut self, precision: ActPrecision) -> Self {
        self.precision = precision;
        self
    }

    /// The activation precision in use.
    pub fn activations(&self) -> ActPrecision {
        self.precision
    }

    /// fp16 activation values clamped to ±65504 since creation (0 for int8).
    pub fn clamped_activations(&self) -> u64 {
        self.clamped.load(Ordering::Relaxed)
    }

    /// Record computes on `trace`.
    pub fn with_trace(mut self, trace: Arc<Trace>) -> Self {
        self.trace = Some(trace);
        self
    }

    /// From now on record matmuls, the cache's loads and the executor's events
    /// ([`DeviceMatmul::record`]) in `events`, for the board clock (`docs/board-model.md`), the
    /// weights keyed as `model`'s (the run's model, or a draft beside it). Returns `false` (and
    /// changes nothing) when a recorder was set before.
    pub fn set_events(&self, events: Arc<ork_board::Recorder>, model: ork_board::Model) -> bool {
        let recording = crate::board::Recording {
            rec: Arc::clone(&events),
            model,
        };
        let set = self.events.set(recording).is_ok();
        if set {
            self.cache.set_events(Some(events), model);
        }
        set
    }

    /// Record `event` (the executor's passes and host operations) if recording.
    pub fn record(&self, event: ork_board::Event) {
        if let Some(r) = self.events.get() {
            r.rec.push(event);
        }
    }

    /// The cache.
    pub fn cache(&self) -> &Arc<WeightCache> {
        &self.cache
    }

    /// Tell the prefetcher (if any) that `weights` are the weights used next, in this order (a
    /// router's expert choice, a draft's batch); its [`ScheduleSource`] decides what to do with
    /// them. Names the cache's source does not hold are left out.
    pub fn upcoming<K: WeightKey>(&self, weights: &[K]) {
        if let Some(p) = &self.prefetcher {
            let ids = weights
                .iter()
                .filter_map(|w| w.weight_id(&self.cache).ok())
                .collect();
            p.announce(ids);
        }
    }

    /// Whether a prefetch thread is attached and alive.
    pub fn prefetching(&self) -> bool {
        self.prefetcher.as_ref().is_some_and(Prefetcher::is_alive)
    }

    /// The largest K and N of any task submitted so far (each the maximum on its own). With a
    /// chip's limits in force these never exceed them: weights beyond them run as parts.
    pub fn max_submitted(&self) -> (usize, usize) {
        (
            self.max_k.load(Ordering::Relaxed),
            self.max_n.load(Ordering::Relaxed),
        )
    }

    /// Submit one task on `weight` with the activations in `view`; `out` is `m × n`.
    fn submit(
        &self,
        view: BufferView<'_>,
        scales: &[f32],
        weight: WeightRef<'_>,
        m: usize,
        out: &mut [f32],
    ) -> Result<(), DeviceError> {
        let task = self.task(view, scales, weight, m);
        self.cache.device().matmul(&task, out).map(drop)
    }

    /// Run a weight stored as chip-sized `parts` with their `operands` (see `docs/chip.md`):
    /// each N-chunk's output is its columns of `y` (`m × n`; the parts' `n` ranges are columns
    /// of `y`); the K-segments of a chunk are partial sums added in f32, in segment order.
    /// `buf` holds the whole activations (`m × k`) at offset 0, with room for one segment's
    /// columns after them.
    #[allow(clippy::too_many_arguments)]
    fn matmul_parts(
        &self,
        (parts, operands): (&[Part], &[PartOperand<'_>]),
        (k, n): (usize, usize),
        buf: &mut DeviceBuffer,
        m: usize,
        scales: &[f32],
        y: &mut [f32],
    ) -> Result<(), DeviceError> {
        let vb = self.precision.bytes();
        let need = (m * k * vb) as u64;
        // One token and N-chunks only (the parts cover the columns in order, each with all of
        // K; SmolLM2's lm head is 12 of them): each chunk's output is a run of `y`, so the
        // chunks go to the device as one batch, written in place.
        let in_order = parts.iter().enumerate().all(|(i, p)| {
            p.k.len() == k && p.n.start == if i == 0 { 0 } else { parts[i - 1].n.end }
        });
        if m == 1 && in_order && parts.last().is_some_and(|p| p.n.end == n) {
            buf.sync_to_device()?;
            let view = buf.view(0, need)?;
            let tasks: Vec<MatmulTask<'_>> = operands
                .iter()
                .map(|op| self.task(view, scales, op.weight(), m))
                .collect();
            let mut outs = Vec::with_capacity(parts.len());
            let mut rest = &mut y[..];
            for p in parts {
                let (out, tail) = rest.split_at_mut(p.n.len());
                outs.push(out);
                rest = tail;
            }
            return self
                .cache
                .device()
                .matmul_batch(&tasks, &mut outs)
                .map(drop);
        }
        let (mut chunk, mut partial) = (Vec::new(), Vec::new());
        let mut synced = false;
        for (i, (part, op)) in parts.iter().zip(operands).enumerate() {
            let nc = part.n.len();
            let first = i == 0 || parts[i - 1].n != part.n;
            let view = if part.k.len() == k {
                if !synced {
                    buf.sync_to_device()?;
                    synced = true;
                }
                buf.view(0, need)?
            } else {
                // Copy the segment's columns of every row after the whole activations.
                let (whole, seg) = buf.as_mut_slice().split_at_mut(need as usize);
                let (c0, c1) = (part.k.start * vb, part.k.end * vb);
                let w = c1 - c0;
                for (r, dst) in seg[..m * w].chunks_exact_mut(w).enumerate() {
                    dst.copy_from_slice(&whole[r * k * vb + c0..r * k * vb + c1]);
                }
                buf.sync_to_device()?;
                synced = true;
                buf.view(need, (m * w) as u64)?
            };
            let out = if first {
                chunk.clear();
                chunk.resize(m * nc, 0f32);
                &mut chunk
            } else {
                partial.clear();
                partial.resize(m * nc, 0f32);
                &mut partial
            };
            self.submit(view, scales, op.weight(), m, out)?;
            if !first {
                for (c, p) in chunk.iter_mut().zip(&partial) {
                    *c += p;
                }
            }
            let last = parts.get(i + 1).is_none_or(|next| next.n != part.n);
            if last {
                for (row, out) in y.chunks_exact_mut(n).zip(chunk.chunks_exact(nc)) {
                    row[part.n.clone()].copy_from_slice(out);
                }
            }
        }
        Ok(())
    }

    /// `y[m, n] = Σ_k x[m, k] · W[n, k]` for the weight (GGUF dims `[K, N]`).
    pub fn matmul(
        &self,
        weight: impl WeightKey,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ResidencyError> {
        let id = weight.weight_id(&self.cache)?;
        let e = self.cache.entry(id)?;
        self.check_shape(&e, x, m, y)?;
        if let Some(p) = &self.prefetcher {
            p.advance(id);
        }
        self.run_one(id, &e, x, m, y)
    }

    /// `ys[i][m, n] = Σ_k x[m, k] · W_i[n, k]` for several weights `weights[i]` that take the same
    /// input `x` (a block's q/k/v or gate/up projections), with the results of
    /// [`DeviceMatmul::matmul`] on each in turn, bit for bit.
    ///
    /// The weights that are resident now, whole (one chip-sized part) and in the domain of the
    /// first of them share one quantization of `x` and go to the device as one batch
    /// ([`ork_device::Device::matmul_batch`]; the emulator runs a single-row batch as one
    /// parallel pass); the others then run one by one as [`DeviceMatmul::matmul`] runs them.
    /// No lease is held while a weight is fetched, so a budget that admits each weight alone
    /// admits the batch.
    pub fn matmul_many<K: WeightKey>(
        &self,
        weights: &[K],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), ResidencyError> {
        if weights.len() != ys.len() {
            let names: Vec<String> = weights
                .iter()
                .map(|w| match self.cache.entry_of(w) {
                    Ok(e) => e.name.to_string(),
                    Err(_) => "?".to_owned(),
                })
                .collect();
            return Err(ResidencyError::Shape {
                name: names.join(","),
                what: format!("{} outputs for {} weights", ys.len(), weights.len()),
            });
        }
        let mut entries = Vec::with_capacity(weights.len());
        for (w, y) in weights.iter().zip(ys.iter()) {
            let id = w.weight_id(&self.cache)?;
            let e = self.cache.entry(id)?;
            self.check_shape(&e, x, m, y)?;
            entries.push((id, e));
        }
        if let Some(p) = &self.prefetcher {
            for (id, _) in &entries {
                p.advance(*id);
            }
        }
        // Lease what is resident and whole; the rest runs after the batch, one by one.
        let mut batch = Vec::with_capacity(entries.len());
        let mut rest = Vec::new();
        for (i, (id, e)) in entries.iter().enumerate() {
            let whole = entries.len() > 1 && self.cache.parts_of(e)?.len() == 1;
            match whole.then(|| self.cache.get_if_resident(*id)).flatten() {
                Some(lease)
                    if batch
                        .first()
                        .is_none_or(|(_, first): &(usize, WeightLease<'_>)| {
                            first.buffer.domain() == lease.buffer.domain()
                        }) =>
                {
                    batch.push((i, lease))
                }
                _ => rest.push(i),
            }
        }
        if !batch.is_empty() {
            self.run_batch(&batch, &entries, x, m, ys)?;
            drop(batch);
        }
        for i in rest {
            let (id, e) = &entries[i];
            self.run_one(*id, e, x, m, ys[i])?;
        }
        Ok(())
    }

    /// The batch of [`Self::matmul_many`]: the leased weights `batch` (their indices into
    /// `names` and `ys`) share one quantization of `x` and run as one device batch.
    fn run_batch(
        &self,
        batch: &[(usize, WeightLease<'_>)],
        entries: &[(WeightId, Arc<Entry>)],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), ResidencyError> {
        // Names for errors and the trace; the board clock keys weights by id.
        let names: Vec<&str> = entries.iter().map(|(_, e)| &*e.name).collect();
        let first = names[batch[0].0];
        let k = batch[0].1.layout.k;
        let domain = batch[0].1.buffer.domain();
        if let Some(rec) = self.events.get() {
            for (j, (i, w)) in batch.iter().enumerate() {
                crate::board::matmul(rec, entries[*i].0, &w.layout, m, domain.0, 1, j == 0);
            }
        }
        let t0 = Instant::now();
        self.with_quantized(first, x, m, k, domain, false, |buf, scales, need| {
            buf.sync_to_device()
                .map_err(|source| ResidencyError::Device {
                    name: first.to_owned(),
                    source,
                })?;
            let view = buf.view(0, need).map_err(|source| ResidencyError::Device {
                name: first.to_owned(),
                source,
            })?;
            let tasks: Vec<MatmulTask<'_>> = batch
                .iter()
                .map(|(_, w)| self.task(view, scales, w.as_weight(), m))
                .collect();
            let mut outs: Vec<&mut [f32]> = Vec::with_capacity(batch.len());
            let mut by_index: Vec<Option<&mut [f32]>> =
                ys.iter_mut().map(|y| Some(&mut **y)).collect();
            for (i, _) in batch {
                outs.extend(by_index[*i].take());
            }
            self.cache
                .device()
                .matmul_batch(&tasks, &mut outs)
                .map(drop)
                .map_err(|source| ResidencyError::Device {
                    name: batch
                        .iter()
                        .map(|(i, _)| names[*i])
                        .collect::<Vec<_>>()
                        .join(","),
                    source,
                })
        })?;
        if let Some(tr) = &self.trace {
            let d = t0.elapsed();
            for (i, _) in batch {
                tr.span(Lane::Compute, "compute", names[*i], t0, d);
            }
        }
        Ok(())
    }

    /// Error unless `x` is `m × K` and `y` is `m × N` for weight `e`.
    fn check_shape(&self, e: &Entry, x: &[f32], m: usize, y: &[f32]) -> Result<(), ResidencyError> {
        let (k, n) = (e.layout.k, e.layout.n);
        let shape = |what: String| ResidencyError::Shape {
            name: e.name.to_string(),
            what,
        };
        if m == 0 || m.checked_mul(k) != Some(x.len()) {
            return Err(shape(format!(
                "x has {} values, expected m·K = {m}·{k}",
                x.len()
            )));
        }
        if m.checked_mul(n) != Some(y.len()) {
            return Err(shape(format!(
                "y has {} values, expected m·N = {m}·{n}",
                y.len()
            )));
        }
        Ok(())
    }

    /// The task for `weight` with the activations in `view`.
    fn task<'a>(
        &self,
        view: BufferView<'a>,
        scales: &'a [f32],
        weight: WeightRef<'a>,
        m: usize,
    ) -> MatmulTask<'a> {
        self.max_k.fetch_max(weight.layout.k, Ordering::Relaxed);
        self.max_n.fetch_max(weight.layout.n, Ordering::Relaxed);
        MatmulTask {
            m,
            activations: match self.precision {
                ActPrecision::Int8 => Activations::Device(view),
                ActPrecision::F16 => Activations::DeviceF16(view),
            },
            act_scales: scales,
            weight,
            cores: CoreMask::AUTO,
        }
    }

    /// [`DeviceMatmul::matmul`] after its checks: lease (or fetch) the weight and compute.
    fn run_one(
        &self,
        id: WeightId,
        e: &Entry,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ResidencyError> {
        let name = &*e.name;
        let k = e.layout.k;
        let parts = self.cache.parts_of(e)?;
        let weight = self.cache.get_entry(id, e)?;
        let domain = weight.buffer.domain();
        if let Some(rec) = self.events.get() {
            let calls = parts.len();
            crate::board::matmul(rec, id, &weight.layout, m, domain.0, calls, true);
        }
        // A weight cut into K-segments needs room for one segment's columns after the whole
        // activations.
        let segmented = parts.iter().any(|p| p.k.len() != k);
        let device_err = |source| ResidencyError::Device {
            name: name.to_owned(),
            source,
        };
        let t0 = Instant::now();
        self.with_quantized(name, x, m, k, domain, segmented, |buf, scales, need| {
            if parts.len() == 1 {
                buf.sync_to_device().map_err(device_err)?;
                let view = buf.view(0, need).map_err(device_err)?;
                self.submit(view, scales, weight.as_weight(), m, y)
                    .map_err(device_err)
            } else {
                let (k, n) = (weight.layout.k, weight.layout.n);
                let ops = operands(&weight, &parts).map_err(device_err)?;
                self.matmul_parts((&parts, &ops), (k, n), buf, m, scales, y)
                    .map_err(device_err)
            }
        })?;
        if let Some(tr) = &self.trace {
            tr.span(Lane::Compute, "compute", name, t0, t0.elapsed());
        }
        Ok(())
    }

    /// Quantize (or convert) `x` (`m × k`) into `domain`'s activation buffer and run
    /// `f(buffer, scales, bytes)` on it; the values sit at offset 0 and fill `bytes`. With
    /// `segmented`, the buffer has room for as many bytes again after them.
    #[allow(clippy::too_many_arguments)]
    fn with_quantized<R>(
        &self,
        name: &str,
        x: &[f32],
        m: usize,
        k: usize,
        domain: DomainId,
        segmented: bool,
        f: impl FnOnce(&mut DeviceBuffer, &[f32], u64) -> Result<R, ResidencyError>,
    ) -> Result<R, ResidencyError> {
        let shape = |what: String| ResidencyError::Shape {
            name: name.to_owned(),
            what,
        };
        let device = self.cache.device();
        // Take the domain's activation buffer out for this call (the lock is not held across the
        // parallel work below: a rayon worker waiting inside it could run another session's
        // forward pass, which would then block on the lock its own stack holds). A concurrent
        // call finds the slot empty and allocates a buffer of its own.
        let mut slot = self
            .activations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(domain.0 as usize)
            .ok_or_else(|| ResidencyError::Placement(format!("domain {domain} out of range")))?
            .take();
        let need = (m * k * self.precision.bytes()) as u64;
        let room = if segmented { 2 * need } else { need };
        if slot.as_ref().is_none_or(|b| b.size() < room) {
            // Round up so a growing prompt does not reallocate every call.
            let size = room.next_power_of_two().max(64 * 1024);
            drop(slot.take()); // free the old one first: its IOVA returns to the window
                               // Activations share the window with the weights but not the budget: when the window
                               // is full, evict weights like a weight allocation would (a wall hit).
            let buffer = loop {
                match device.create_buffer(size, BufferIntent::Activation, domain) {
                    Ok(b) => break b,
                    Err(source @ DeviceError::WindowFull { .. }) => {
                        if !self.cache.relieve_wall(domain, Requester::Compute) {
                            return Err(ResidencyError::WindowExhausted {
                                name: format!("activations for '{name}'"),
                                source,
                            });
                        }
                    }
                    Err(source) => {
                        return Err(ResidencyError::Device {
                            name: format!("activations for '{name}'"),
                            source,
                        })
                    }
                }
            };
            slot = Some(buffer);
        }
        let buf = slot.as_mut().expect("allocated above");
        let bytes = &mut buf.as_mut_slice()[..need as usize];
        let mut scales = Vec::new();
        match self.precision {
            ActPrecision::Int8 => {
                scales = vec![0f32; m];
                // Every byte pattern is a valid i8 and the alignment is 1, so this cannot fail.
                let q = <[i8]>::mut_from_bytes(bytes)
                    .map_err(|_| shape("activation buffer is not byte-addressable".to_owned()))?;
                q.par_chunks_mut(k)
                    .zip(x.par_chunks(k))
                    .zip(scales.par_iter_mut())
                    .for_each(|((q, x), s)| *s = quantize_row_i8(x, q));
                if scales.iter().any(|s| s.is_nan()) {
                    return Err(shape("activations hold NaN or infinity".to_owned()));
                }
            }
            ActPrecision::F16 => {
                // Device buffers are page-aligned, so the 2-byte view cannot fail.
                let q = <[f16]>::mut_from_bytes(bytes)
                    .map_err(|_| shape("activation buffer is not 2-byte aligned".to_owned()))?;
                let clamped = q
                    .par_chunks_mut(k)
                    .zip(x.par_chunks(k))
                    .map(|(q, x)| f16_row(x, q))
                    .try_reduce(|| 0, |a, b| Some(a + b))
                    .ok_or_else(|| shape("activations hold NaN or infinity".to_owned()))?;
                self.clamped.fetch_add(clamped as u64, Ordering::Relaxed);
            }
        }
        let result = f(buf, &scales, need);
        // Put the buffer back for the next call, unless a concurrent call left a larger one.
        let mut acts = self.activations.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(back) = acts.get_mut(domain.0 as usize) {
            if back
                .as_ref()
                .is_none_or(|b| b.size() < slot.as_ref().map_or(0, |s| s.size()))
            {
                *back = slot;
            }
        }
        result
    }
}
