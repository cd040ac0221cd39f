//! ork's **board clock**: what a run would cost on an RK3588 or RK3576 board, projected by
//! replaying the run's own event stream on a calibrated cost model of the board.
//!
//! - [`events`]: the stream — matmuls (M, K, N, type, domain, calls), loads (bytes, created or
//!   reused buffer, on demand or prefetched, and how far compute was), forward passes and host
//!   operations — recorded by the layers that see them into a [`Recorder`].
//! - [`Chip`] and [`Board`]: the cost model as data, with presets ([`Board::named`]) and board
//!   description files ([`Board::from_json`]; the CLI reads them under its input rule).
//! - [`replay()`]: the stream on simulated resources (compute thread, copy thread, a shared DDR
//!   bus) with the executor's and prefetcher's dependencies; [`Projection`] is what users see.
//! - [`schedule()`]: the planned schedule as a stream, without running (`ork plan --project`); a
//!   model known by its shape alone names its weights with [`shape_names`], the manifest's roles
//!   and keys.
//! - [`moe`] and [`spec`]: planned schedules of a mixture of experts (expert cache, on-demand,
//!   router-driven or speculative expert loads) and of speculative decoding (a resident draft, a
//!   verifier pass of k + 1 rows), for the studies of `docs/board-model.md`.
//! - [`cpu`], [`cpu_fit`], [`engines`] and [`split`]: the CPU as a second engine, its fit, the
//!   pairing of the engines per phase, and a decode step split between them on one DDR bus.
//! - [`options`]: execution choices beside the pairing (core lists, the row split) for judging a
//!   goal against its ceiling.
//! - [`fit`]: the calibration on published figures and the rows it is judged on.
//!
//! Every figure is a projection: see `docs/board-model.md` for each parameter's source, the fit,
//! and predicted against published figures.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cpu;
pub mod cpu_fit;
pub mod engines;
pub mod events;
pub mod fit;
pub mod moe;
pub mod options;
mod params;
mod projection;
mod replay;
pub mod schedule;
pub mod spec;
pub mod split;

pub use events::{Event, EventNames, HostKind, Loader, Model, ModelWeight, Recorder, WeightType};
pub use params::{
    Board, Chip, ChipLimits, ParameterRange, BOARD_FILE_LIMIT, CHIPS, CHIP_LIMITS,
    PARAMETER_RANGES, RK3576_LIMITS, RK3588_LIMITS,
};
pub use projection::Projection;
pub use replay::{replay, replay_warm, Breakdown, PassTime, ReplayOptions, Timeline};
pub use schedule::{
    sampled_passes, schedule, schedule_sampled, shape_names, Dims, ModelShape, Plan, ShapeWeight,
    DECODE_PASSES_REPLAYED,
};

/// The cost model's version, printed with every projection.
pub const MODEL_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "+fit-rk3588-rkllm-1.3.0+rk3576-32bit"
);

/// What can go wrong projecting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BoardError {
    /// `--project` named no known board or chip.
    #[error("unknown board or chip '{name}'; known: {known}")]
    Unknown {
        /// The name given.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A name that is a CPU-only preset (`pi5-16g`) where a board with an NPU is needed.
    #[error(
        "'{name}' has no NPU (a CPU-only preset): the NPU's clock cannot replay on it; \
         `ork plan --project {name}` projects the CPU engine there"
    )]
    NoNpu {
        /// The name given.
        name: String,
    },
    /// A board description lacks a parameter.
    #[error("missing parameter '{field}'")]
    Missing {
        /// The parameter.
        field: String,
    },
    /// A board description's parameter is negative, zero, non-finite or not a number.
    #[error("parameter '{field}' is {why}: {value}")]
    BadValue {
        /// The parameter.
        field: String,
        /// Its value as written.
        value: String,
        /// What is wrong.
        why: String,
    },
    /// A board description is not the expected JSON.
    #[error("{0}")]
    Parse(String),
    /// A board description file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// The error.
        source: std::io::Error,
    },
    /// An error in a board description file.
    #[error("{file}: {source}")]
    InFile {
        /// The file.
        file: String,
        /// The error.
        source: Box<BoardError>,
    },
    /// The event stream cannot be replayed.
    #[error("event stream: {0}")]
    Stream(String),
    /// The replay did not finish within its step bound, or gave a time that is not a finite,
    /// non-negative number of seconds (never printed as a projection).
    #[error("replay: {0}")]
    Replay(String),
}

impl BoardError {
    pub(crate) fn in_file(self, file: &str) -> BoardError {
        BoardError::InFile {
            file: file.to_owned(),
            source: Box::new(self),
        }
    }
}
