//! The row split (`--decode-device split`, `--prefill-device split`): each matmul's output rows
//! of that phase cut in two, rows `0..r` computed by the device (its int8 … weights from the
//! `.orkpack` and the weight cache) and rows `r..n` by the CPU engine (the GGUF's blocks at the
//! file's bits), both at once, so that on a board both engines read DDR (decode) or compute
//! (prefill) together. Each phase has its own shares and its own [`SplitLinear`]. The board clock projects it
//! (`ork_board::split`, `docs/board-model.md`); this is the code that projection describes.
//!
//! - `r` is the device's share of the rows ([`split_row`]), one share for every dense weight
//!   ([`SplitRows::All`], `--split-rows F`) or one per weight ([`SplitRows::PerWeight`],
//!   `--split-rows auto`: the board clock's best share for that weight's type and size,
//!   `ork_board::split::split_shares` for decode, `split_prefill` for prefill), on the device's N-tiles, so that
//!   the device computes whole tiles of the resident weight in place
//!   ([`ork_residency::DeviceMatmul::matmul_rows`]); `K` stays whole. A weight whose share
//!   rounds to no tile stays on the CPU, one whose share rounds to all of it on the device.
//! - MoE expert slices stay on the CPU (routed experts come from the GGUF's pages, as the
//!   projection assumes).
//! - Each engine keeps its own numerics: the device quantizes the activations its way, the CPU
//!   its way (`docs/cpu.md`), each for the rows it computes. Every row is computed once, by one
//!   engine.
//! - The device's calls run on the calling thread while the CPU engine's workers compute their
//!   rows ([`ork_cpu::CpuPool::beside`]).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ork_cpu::GgufLinear;
use ork_exec::{ExecError, Linear, WeightId};
use ork_manifest::Manifest;

use crate::{EngineConfig, EngineLinear, PhaseEngine, RuntimeError};

/// The device's rows of a weight of `n` rows for a share `share` of them, on tiles of `tile`
/// rows: that share of the weight's tiles (its last one may be partial), rounded to the nearest
/// whole tile; the rows they hold. 0: the CPU alone; `n`: the device alone.
pub fn split_row(n: usize, share: f64, tile: usize) -> usize {
    let tile = tile.max(1);
    let tiles = (share.clamp(0.0, 1.0) * n.div_ceil(tile) as f64).round() as usize;
    (tiles * tile).min(n)
}

/// The device's share of the dense weights' rows in a row split.
#[derive(Clone, Debug, PartialEq)]
pub enum SplitRows {
    /// One share for every dense weight, strictly between 0 and 1 (`--split-rows F`).
    All(f64),
    /// One share per weight of the model's manifest, by [`WeightId`] index, each in [0, 1]
    /// (0: that weight on the CPU alone, 1: on the device alone): `--split-rows auto`, the
    /// board clock's best share for each weight (expert slices' entries are not used: they
    /// stay on the CPU).
    PerWeight(Vec<f64>),
}

impl SplitRows {
    /// The share asked for weight `id`.
    fn of(&self, id: WeightId) -> f64 {
        match self {
            SplitRows::All(f) => *f,
            SplitRows::PerWeight(v) => v.get(id.index()).copied().unwrap_or(0.0),
        }
    }

    /// The shares, in words (`rows 50%`; `rows per weight 0-63%`).
    pub fn describe(&self) -> String {
        match self {
            SplitRows::All(f) => format!("rows {:.0}%", 100.0 * f),
            SplitRows::PerWeight(v) => {
                let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!("rows per weight {:.0}-{:.0}%", 100.0 * lo, 100.0 * hi)
            }
        }
    }

    /// Why these shares cannot run a split, `None` when they can.
    fn refusal(&self) -> Option<String> {
        match self {
            SplitRows::All(f) if !(*f > 0.0 && *f < 1.0) => Some(format!(
                "--split-rows {f}: the device's share of the rows must lie strictly between 0 \
                 and 1"
            )),
            SplitRows::PerWeight(v) if v.iter().any(|f| !(0.0..=1.0).contains(f)) => Some(
                "a per-weight share outside [0, 1] (or not a number): each is the device's \
                 share of that weight's rows"
                    .to_owned(),
            ),
            SplitRows::PerWeight(v) if !v.iter().any(|&f| f > 0.0) => Some(
                "the per-weight shares give the device no rows: a split that is the CPU alone; \
                 use cpu for that phase"
                    .to_owned(),
            ),
            _ => None,
        }
    }
}

/// What a row-split engine computed so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SplitStats {
    /// Matmul calls (one weight each) whose rows were shared by the two engines.
    pub split_calls: u64,
    /// Calls computed by the device alone (its share covered the weight).
    pub device_calls: u64,
    /// Calls computed by the CPU alone (expert slices; a share below one tile).
    pub cpu_calls: u64,
    /// Output rows (× activation rows) the device computed.
    pub device_rows: u64,
    /// Output rows (× activation rows) the CPU engine computed.
    pub cpu_rows: u64,
}

/// The engine of `--decode-device split` or `--prefill-device split` (see the module
/// documentation).
pub struct SplitLinear {
    device: Arc<EngineLinear>,
    cpu: Arc<GgufLinear>,
    /// Per manifest id: the device's rows `r` and the weight's rows `n`.
    rows: Vec<(usize, usize)>,
    shares: SplitRows,
    counts: [AtomicU64; 5],
}

impl std::fmt::Debug for SplitLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplitLinear")
            .field("shares", &self.shares.describe())
            .finish_non_exhaustive()
    }
}

impl SplitLinear {
    /// Split every dense weight of `manifest` at the device's share of its rows `shares`
    /// gives it, on `tile`-row tiles (the device dtype's N-tile); expert slices on the CPU.
    ///
    /// # Errors
    /// Per-weight shares not one per weight of `manifest`.
    pub fn new(
        device: Arc<EngineLinear>,
        cpu: Arc<GgufLinear>,
        manifest: &Manifest,
        shares: SplitRows,
        tile: usize,
    ) -> Result<SplitLinear, RuntimeError> {
        let weights = manifest.weights().len();
        if let SplitRows::PerWeight(v) = &shares {
            if v.len() != weights {
                return Err(RuntimeError::Phases {
                    what: format!(
                        "the decode split has {} per-weight shares for a model of {weights} \
                         weights (shares made for another model?)",
                        v.len()
                    ),
                });
            }
        }
        let mut rows = vec![(0, 0); weights];
        for w in manifest.weights() {
            let r = if w.expert.is_some() {
                0
            } else {
                split_row(w.n, shares.of(w.id), tile)
            };
            if let Some(slot) = rows.get_mut(w.id.index()) {
                *slot = (r, w.n);
            }
        }
        Ok(SplitLinear {
            device,
            cpu,
            rows,
            shares,
            counts: Default::default(),
        })
    }

    /// The shares it was made with.
    pub fn shares(&self) -> &SplitRows {
        &self.shares
    }

    /// The device's rows `r` of weight `id` (`0..r` on the device, `r..n` on the CPU) and its
    /// rows `n`.
    pub fn rows_of(&self, id: WeightId) -> Option<(usize, usize)> {
        self.rows.get(id.index()).copied()
    }

    /// What it computed so far.
    pub fn stats(&self) -> SplitStats {
        let c = |i: usize| self.counts[i].load(Ordering::Relaxed);
        SplitStats {
            split_calls: c(0),
            device_calls: c(1),
            cpu_calls: c(2),
            device_rows: c(3),
            cpu_rows: c(4),
        }
    }

    fn count(&self, i: usize, by: u64) {
        self.counts[i].fetch_add(by, Ordering::Relaxed);
    }

    fn split_of(&self, id: WeightId) -> Result<(usize, usize), ExecError> {
        self.rows_of(id).ok_or_else(|| ExecError::UnknownWeight {
            weight: id.to_string(),
        })
    }

    /// Each weight's split, once `ys` are one `m × n` output per weight.
    fn check(
        &self,
        weights: &[WeightId],
        m: usize,
        ys: &[&mut [f32]],
    ) -> Result<Vec<(usize, usize)>, ExecError> {
        let bad = |what: String| ExecError::MatmulShape {
            weight: weights
                .iter()
                .map(WeightId::to_string)
                .collect::<Vec<_>>()
                .join(","),
            what,
        };
        if weights.len() != ys.len() {
            return Err(bad(format!(
                "{} outputs for {} weights",
                ys.len(),
                weights.len()
            )));
        }
        let splits = weights
            .iter()
            .map(|&w| self.split_of(w))
            .collect::<Result<Vec<_>, _>>()?;
        for (y, &(_, n)) in ys.iter().zip(&splits) {
            if m.checked_mul(n) != Some(y.len()) {
                return Err(bad(format!(
                    "y has {} values, expected m·N = {m}·{n}",
                    y.len()
                )));
            }
        }
        Ok(splits)
    }

    /// The device's rows of each weight of `ws` (`(weight, rows)`) on this thread, into `outs`
    /// (one per entry).
    fn device_part(
        &self,
        ws: &[(WeightId, Range<usize>)],
        x: &[f32],
        m: usize,
        outs: Vec<&mut [f32]>,
    ) -> Result<(), ExecError> {
        for ((id, rows), y) in ws.iter().zip(outs) {
            self.device.matmul_rows(*id, rows.clone(), x, m, y)?;
        }
        Ok(())
    }
}

impl Linear for SplitLinear {
    fn matmul(
        &self,
        weight: WeightId,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), ExecError> {
        self.matmul_many(&[weight], x, m, &mut [y])
    }

    /// The weights' device rows on the device, their CPU rows on the CPU engine in one round of
    /// its pool, both at once; a weight wholly on one engine runs there alone. With one
    /// activation row each engine writes its half of `y` in place; with several, rows of its
    /// own, interleaved into `y` afterwards.
    fn matmul_many(
        &self,
        weights: &[WeightId],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
    ) -> Result<(), ExecError> {
        let splits = self.check(weights, m, ys)?;
        let gathered = m > 1;
        let (mut dev_ws, mut cpu_ws, mut cpu_rows) = (Vec::new(), Vec::new(), Vec::new());
        let (mut dev_bufs, mut cpu_bufs) = (Vec::new(), Vec::new());
        for (&w, &(r, n)) in weights.iter().zip(&splits) {
            self.count(
                if r == 0 {
                    2
                } else if r == n {
                    1
                } else {
                    0
                },
                1,
            );
            self.count(3, (r * m) as u64);
            self.count(4, ((n - r) * m) as u64);
            if r > 0 {
                dev_ws.push((w, 0..r));
                dev_bufs.push(vec![0.0; if gathered { m * r } else { 0 }]);
            }
            if r < n {
                cpu_ws.push(w);
                cpu_rows.push(r..n);
                cpu_bufs.push(vec![0.0; if gathered { m * (n - r) } else { 0 }]);
            }
        }
        let (dev_outs, cpu_outs): (Vec<&mut [f32]>, Vec<&mut [f32]>) = if gathered {
            (
                dev_bufs.iter_mut().map(Vec::as_mut_slice).collect(),
                cpu_bufs.iter_mut().map(Vec::as_mut_slice).collect(),
            )
        } else {
            let (mut d, mut c) = (Vec::new(), Vec::new());
            for (y, &(r, n)) in ys.iter_mut().zip(&splits) {
                let (a, b) = y.split_at_mut(r);
                if r > 0 {
                    d.push(a);
                }
                if r < n {
                    c.push(b);
                }
            }
            (d, c)
        };
        let mut cpu_result = Ok(());
        let device_result = if cpu_ws.is_empty() {
            self.device_part(&dev_ws, x, m, dev_outs)
        } else {
            let (cpu, result) = (&self.cpu, &mut cpu_result);
            let (cpu_ws, cpu_rows) = (&cpu_ws, &cpu_rows);
            let mut cpu_outs = cpu_outs;
            cpu.pool().beside(
                move || *result = cpu.matmul_rows(cpu_ws, cpu_rows, x, m, &mut cpu_outs),
                || self.device_part(&dev_ws, x, m, dev_outs),
            )
        };
        device_result?;
        cpu_result?;
        if gathered {
            gather(&splits, m, ys, dev_bufs, cpu_bufs);
        }
        Ok(())
    }

    /// Each engine is told of the weights it computes rows of: the device's prefetcher of those
    /// with device rows (never an expert slice: those stay on the CPU), the CPU engine's expert
    /// readahead of the others.
    fn upcoming(&self, weights: &[WeightId]) {
        let on_device: Vec<WeightId> = weights
            .iter()
            .copied()
            .filter(|&w| self.rows_of(w).is_some_and(|(r, _)| r > 0))
            .collect();
        if !on_device.is_empty() {
            self.device.upcoming(&on_device);
        }
        self.cpu.upcoming(weights);
    }

    /// Kept by the device's recorder, as the device engine's.
    fn record(&self, event: ork_board::Event) {
        self.device.record(event);
    }
}

/// Interleave each weight's device rows (`m × r`) and CPU rows (`m × (n − r)`) into its `y`
/// (`m × n`), in the order [`SplitLinear::matmul_many`] made the buffers.
fn gather(
    splits: &[(usize, usize)],
    m: usize,
    ys: &mut [&mut [f32]],
    dev: Vec<Vec<f32>>,
    cpu: Vec<Vec<f32>>,
) {
    let (mut dev, mut cpu) = (dev.into_iter(), cpu.into_iter());
    for (y, &(r, n)) in ys.iter_mut().zip(splits) {
        let d = (r > 0).then(|| dev.next()).flatten();
        let c = (r < n).then(|| cpu.next()).flatten();
        for i in 0..m {
            let row = &mut y[i * n..(i + 1) * n];
            if let Some(d) = &d {
                row[..r].copy_from_slice(&d[i * r..(i + 1) * r]);
            }
            if let Some(c) = &c {
                row[r..].copy_from_slice(&c[i * (n - r)..(i + 1) * (n - r)]);
            }
        }
    }
}

/// The row split of `config`'s `phase`, when that phase's engine is [`PhaseEngine::Split`]:
/// `device`'s and `cpu`'s matmuls, at the phase's shares on the device dtype's N-tiles.
///
/// # Errors
/// As [`SplitLinear::new`].
pub(crate) fn open_split(
    config: &EngineConfig,
    phase: ork_exec::Phase,
    (device, cpu): (&Arc<EngineLinear>, &Arc<GgufLinear>),
    manifest: &Manifest,
) -> Result<Option<Arc<SplitLinear>>, RuntimeError> {
    let Some(shares) = phase_rows(config, phase)
        .cloned()
        .filter(|_| config.engines().of(phase) == PhaseEngine::Split)
    else {
        return Ok(None);
    };
    Ok(Some(Arc::new(SplitLinear::new(
        Arc::clone(device),
        Arc::clone(cpu),
        manifest,
        shares,
        config.dtype.n_tile(),
    )?)))
}

/// The shares `config` gives `phase`'s split.
fn phase_rows(config: &EngineConfig, phase: ork_exec::Phase) -> Option<&SplitRows> {
    match phase {
        ork_exec::Phase::Prefill => config.prefill_split_rows.as_ref(),
        ork_exec::Phase::Decode => config.split_rows.as_ref(),
    }
}

/// A split the config cannot run, refused before anything is opened: a split phase without its
/// shares or with shares that cannot split, shares for a phase that does not split.
pub(crate) fn check_split(config: &EngineConfig) -> Result<(), RuntimeError> {
    for (phase, flag) in [
        (ork_exec::Phase::Prefill, "--prefill-device"),
        (ork_exec::Phase::Decode, "--decode-device"),
    ] {
        let split = config.engines().of(phase) == PhaseEngine::Split;
        let what = match (split, phase_rows(config, phase)) {
            (true, None) => format!(
                "{flag} split needs the device's share of the rows: --split-rows FRACTION, or \
                 --split-rows auto with a board"
            ),
            (true, Some(s)) => match s.refusal() {
                Some(why) => format!("{flag} split: {why}"),
                None => continue,
            },
            (false, Some(s)) => format!("--split-rows ({}) needs {flag} split", s.describe()),
            (false, None) => continue,
        };
        return Err(RuntimeError::Phases { what });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_rows_are_whole_tiles_or_the_whole_weight() {
        for n in [1, 31, 32, 33, 576, 1536, 49152] {
            for i in 0..=20 {
                let share = i as f64 / 20.0;
                let r = split_row(n, share, 32);
                assert!(r <= n);
                assert!(r == n || r.is_multiple_of(32), "n {n} share {share}: r {r}");
                // Never a tile and a half from the asked share (half a tile of rounding, and
                // the partial last tile counted as a whole one).
                let want = share * n as f64;
                assert!((r as f64 - want).abs() < 48.0, "n {n} share {share}: r {r}");
            }
        }
        assert_eq!(split_row(576, 0.0, 32), 0);
        assert_eq!(split_row(576, 1.0, 32), 576);
        assert_eq!(split_row(576, 0.5, 32), 288);
        assert_eq!(split_row(100, 0.99, 32), 100);
        assert_eq!(split_row(100, 0.5, 32), 64);
        assert_eq!(split_row(192, 0.03, 32), 0);
    }

    #[test]
    fn a_split_needs_a_share_in_the_open_unit_interval_for_its_phase() {
        let split = |prefill, share: Option<f64>| {
            let mut c = EngineConfig::new("m.gguf");
            c.cpu = Some(ork_cpu::CpuOptions::default());
            c.phases = Some(crate::PhaseEngines {
                prefill,
                decode: PhaseEngine::Split,
            });
            c.split_rows = share.map(SplitRows::All);
            check_split(&c)
        };
        assert!(split(PhaseEngine::Device, Some(0.5)).is_ok());
        assert!(split(PhaseEngine::Cpu, Some(0.25)).is_ok());
        for bad in [None, Some(0.0), Some(1.0), Some(-0.5), Some(f64::NAN)] {
            assert!(matches!(
                split(PhaseEngine::Device, bad),
                Err(RuntimeError::Phases { .. })
            ));
        }
        // Per weight: each in [0, 1] (0 and 1 keep a weight on one engine), some rows on the
        // device.
        let per = |v: Vec<f64>| {
            let mut c = EngineConfig::new("m.gguf");
            c.cpu = Some(ork_cpu::CpuOptions::default());
            c.phases = Some(crate::PhaseEngines {
                prefill: PhaseEngine::Device,
                decode: PhaseEngine::Split,
            });
            c.split_rows = Some(SplitRows::PerWeight(v));
            check_split(&c)
        };
        assert!(per(vec![0.0, 1.0, 0.5]).is_ok());
        for bad in [vec![0.0, 0.0], vec![0.5, 1.5], vec![f64::NAN, 0.5], vec![]] {
            assert!(per(bad.clone()).is_err(), "{bad:?}");
        }
        assert_eq!(SplitRows::All(0.5).describe(), "rows 50%");
        assert_eq!(
            SplitRows::PerWeight(vec![0.0, 0.6, 0.25]).describe(),
            "rows per weight 0-60%"
        );
        let mut c = EngineConfig::new("m.gguf");
        c.split_rows = Some(SplitRows::All(0.5));
        assert!(check_split(&c).is_err(), "a share without a split");
        c.split_rows = None;
        c.phases = Some(crate::PhaseEngines {
            prefill: PhaseEngine::Split,
            decode: PhaseEngine::Cpu,
        });
        assert!(
            check_split(&c).is_err(),
            "a prefill split without its shares"
        );
        c.prefill_split_rows = Some(SplitRows::All(0.5));
        assert!(check_split(&c).is_ok(), "a prefill split");
        c.split_rows = Some(SplitRows::All(0.5));
        assert!(
            check_split(&c).is_err(),
            "decode shares without a decode split"
        );
        c.phases = Some(crate::PhaseEngines::one(PhaseEngine::Split));
        assert!(check_split(&c).is_ok(), "both phases split");
        c.prefill_split_rows = Some(SplitRows::All(1.0));
        assert!(check_split(&c).is_err(), "a prefill share of 1");
    }
}
