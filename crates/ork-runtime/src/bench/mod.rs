//! Benchmark drivers: each opens what it measures, times it and returns a typed report; front
//! ends (`ork bench …`) only parse their flags and print the report.
//!
//! Speed figures mean something only as ratios measured in the same run against another engine
//! or a baseline on the same machine (`scripts/bench-cpu.sh`, `docs/benchmarks.md`); nothing
//! here asserts a time.
//!
//! - [`cpu`]: `ork bench cpu`, prefill and decode tok/s of the CPU engine.
//! - [`pack`]: `ork bench pack`, pack, verified load, reload and convert-RSS figures.
//! - [`stream`]: `ork bench stream` (and `--decode`), streamed against resident.
//! - [`spec`]: `ork bench spec`, speculative decoding against plain decoding per budget.
//! - [`project`]: the board clock the stream and spec benchmarks project on.

pub mod cpu;
pub mod pack;
pub mod project;
pub mod spec;
pub mod stream;

pub use cpu::{bench_cpu, CpuBenchOptions, CpuBenchReport, BENCH_SENTENCE};

use std::time::Instant;

/// An error a front end's step reports to a driver (e.g. the child process `ork bench pack`
/// runs), carried as its source.
pub type FrontEndError = Box<dyn std::error::Error + Send + Sync>;

/// The front end's part of the stream and spec benchmarks: opening an engine (it draws the
/// conversion bar unless `quiet`, and says why a pack was rebuilt). An engine that does not open
/// keeps its [`crate::RuntimeError`] as the error when the front end has it (the spec benchmark
/// looks for [`crate::RuntimeError::DraftTooLarge`]).
pub struct EngineFrontEnd<'a> {
    /// Open the engine of `config`.
    pub open: &'a dyn Fn(crate::EngineConfig, bool) -> Result<crate::Engine, FrontEndError>,
}

impl EngineFrontEnd<'_> {
    fn open(&self, config: crate::EngineConfig, quiet: bool) -> Result<crate::Engine, BenchError> {
        (self.open)(config, quiet).map_err(|source| BenchError::FrontEnd {
            what: "opening the engine".into(),
            source,
        })
    }
}

/// What went wrong in a benchmark driver that is not an engine error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The model file.
    #[error(transparent)]
    Gguf(#[from] ork_gguf::GgufError),
    /// The `.orkpack` the benchmark writes and reads back.
    #[error(transparent)]
    Store(#[from] ork_store::StoreError),
    /// Packing a tensor (its name in `what`).
    #[error("{what}")]
    Pack {
        /// What was being packed.
        what: String,
        /// The packer's error (boxed: it is large).
        #[source]
        source: Box<ork_pack::PackError>,
    },
    /// A temp directory or thread pool.
    #[error("{what}")]
    Io {
        /// What was being set up.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The model lacks what the benchmark measures (names the file and what is missing).
    #[error("{what}")]
    Model {
        /// What is missing.
        what: String,
    },
    /// A weight read back from the pack differs from what was packed.
    #[error("{}: tensor '{tensor}' reloaded differently from what was packed", path.display())]
    Mismatch {
        /// The pack.
        path: std::path::PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// The engine or the model (boxed: it is large).
    #[error(transparent)]
    Runtime(Box<crate::RuntimeError>),
    /// A step of a session (boxed: it is large).
    #[error(transparent)]
    Exec(Box<ork_exec::ExecError>),
    /// The board clock's projection.
    #[error(transparent)]
    Board(#[from] ork_board::BoardError),
    /// A step the front end ran for the driver failed.
    #[error("{what}")]
    FrontEnd {
        /// The step.
        what: String,
        /// The front end's error.
        #[source]
        source: FrontEndError,
    },
}

impl From<crate::RuntimeError> for BenchError {
    fn from(e: crate::RuntimeError) -> Self {
        BenchError::Runtime(Box::new(e))
    }
}

impl From<ork_exec::ExecError> for BenchError {
    fn from(e: ork_exec::ExecError) -> Self {
        BenchError::Exec(Box::new(e))
    }
}

/// The upper median of `xs` (the higher middle value for an even count; NaN for none): the
/// stream and spec benchmarks' figure over their rounds.
pub(crate) fn upper_median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Best of `reps` timings of `f` (at least one), and the last run's value.
pub(crate) fn best_of<T, E>(
    reps: usize,
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<(f64, T), E> {
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let v = f()?;
        best = best.min(t.elapsed().as_secs_f64());
        last = Some(v);
    }
    Ok((best, last.expect("at least one repetition")))
}
