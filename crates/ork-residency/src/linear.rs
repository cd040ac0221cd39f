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
    DeviceWeight, MatmulTask, WeightRef,
};
use rayon::prelude::*;
use zerocopy::FromBytes;

use crate::cache::{Requester, WeightCache};
use crate::parts::operands;
use crate::prefetch::{Prefetcher, ScheduleSource};
use crate::trace::{Lane, Trace};
use crate::ResidencyError;

/// Quantize one row of activations to int8 with a symmetric per-row scale
/// (`scale = max|x| / 127`, `q = round(x / scale)`); returns the scale (0 for an all-zero row,
/// NaN when the row holds a NaN or an infinity).
pub fn quantize_row(x: &[f32], q: &mut [i8]) -> f32 {
    // `f32::max` ignores NaN, so NaN is looked for separately (`v != v`), in the same pass.
    let (amax, nan) = x.iter().fold((0f32, false), |(a, nan), v| {
        (a.max(v.abs()), nan | v.is_nan())
    });
    if nan || !amax.is_finite() {
        q.fill(0);
        return f32::NAN;
    }
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let scale = amax / 127.0;
    let inv = 127.0 / amax;
    for (o, v) in q.iter_mut().zip(x) {
        *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    scale
}

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

/// `y = x · Wᵀ` for named weights on the device: quantizes `x` per token (int8, the default) or
/// converts it to fp16 ([`DeviceMatmul::with_activations`]), leases the weight from the cache
/// (fetching it if needed), tells the prefetcher where compute is, and submits the task with the
/// activations in a device buffer of the weight's domain.
pub struct DeviceMatmul {
    cache: Arc<WeightCache>,
    prefetcher: Option<Prefetcher>,
    /// One activation buffer per domain, grown on demand.
    activations: Mutex<Vec<Option<DeviceBuffer>>>,
    trace: Option<Arc<Trace>>,
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
    /// `slots` weights ahead along `schedule`.
    /// The schedule is the plan order with announced weights first ([`Prefetcher::start`]).
    pub fn new(cache: Arc<WeightCache>, prefetch: Option<(Vec<String>, usize)>) -> Self {
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

    fn build(cache: Arc<WeightCache>, prefetcher: Option<Prefetcher>) -> Self {
        let domains = cache.device().info().domains as usize;
        DeviceMatmul {
            cache,
            prefetcher,
            activations: Mutex::new((0..domains).map(|_| None).collect()),
            trace: None,
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

    /// The cache.
    pub fn cache(&self) -> &Arc<WeightCache> {
        &self.cache
    }

    /// Tell the prefetcher (if any) that `names` are the weights used next, in this order (a
    /// router's expert choice, a draft's batch); its [`ScheduleSource`] decides what to do with
    /// them.
    pub fn upcoming(&self, names: &[&str]) {
        if let Some(p) = &self.prefetcher {
            p.announce(names);
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
        self.max_k.fetch_max(weight.layout.k, Ordering::Relaxed);
        self.max_n.fetch_max(weight.layout.n, Ordering::Relaxed);
        let task = MatmulTask {
            m,
            activations: match self.precision {
                ActPrecision::Int8 => Activations::Device(view),
                ActPrecision::F16 => Activations::DeviceF16(view),
            },
            act_scales: scales,
            weight,
            cores: CoreMask::AUTO,
        };
        self.cache.device().matmul(&task, out).map(drop)
    }

    /// Run a weight stored as chip-sized `parts` (see `docs/chip.md`): each N-chunk's output is
    /// its columns of `y`; the K-segments of a chunk are partial sums added in f32, in segment
    /// order. `buf` holds the whole activations (`m × K`) at offset 0, with room for one
    /// segment's columns after them.
    fn matmul_parts(
        &self,
        weight: &DeviceWeight,
        parts: &[Part],
        buf: &mut DeviceBuffer,
        m: usize,
        scales: &[f32],
        y: &mut [f32],
    ) -> Result<(), DeviceError> {
        let (k, n) = (weight.layout.k, weight.layout.n);
        let vb = self.precision.bytes();
        let need = (m * k * vb) as u64;
        let operands = operands(weight, parts)?;
        let (mut chunk, mut partial) = (Vec::new(), Vec::new());
        let mut synced = false;
        for (i, (part, op)) in parts.iter().zip(&operands).enumerate() {
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

    /// `y[m, n] = Σ_k x[m, k] · W[n, k]` for weight `name` (GGUF dims `[K, N]`).
    pub fn matmul(
        &self,
        name: &str,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ResidencyError> {
        let layout = self.cache.layout(name)?;
        let (k, n) = (layout.k, layout.n);
        let shape = |what: String| ResidencyError::Shape {
            name: name.to_owned(),
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
        if let Some(p) = &self.prefetcher {
            p.advance(name);
        }
        let parts = self.cache.parts(name)?;
        let weight = self.cache.get(name)?;
        let domain = weight.buffer.domain();
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
        // A weight cut into K-segments needs room for one segment's columns after the whole
        // activations.
        let segmented = parts.iter().any(|p| p.k.len() != k);
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
                    .for_each(|((q, x), s)| *s = quantize_row(x, q));
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
        let device_err = |source| ResidencyError::Device {
            name: name.to_owned(),
            source,
        };
        let t0 = Instant::now();
        if parts.len() == 1 {
            buf.sync_to_device().map_err(device_err)?;
            let view = buf.view(0, need).map_err(device_err)?;
            self.submit(view, &scales, weight.as_weight(), m, y)
                .map_err(device_err)?;
        } else {
            self.matmul_parts(&weight, &parts, buf, m, &scales, y)
                .map_err(device_err)?;
        }
        if let Some(tr) = &self.trace {
            tr.span(Lane::Compute, "compute", name, t0, t0.elapsed());
        }
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
        Ok(())
    }
}
