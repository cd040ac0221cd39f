//! The board clock of the benchmarks: an engine's device work recorded as events and replayed on
//! [`BENCH_BOARD`]'s cost model (docs/board-model.md). The figures are projected, never measured.

use std::sync::Arc;

use ork_board::{replay, Board, BoardError, Projection, Recorder, ReplayOptions};
use ork_residency::Mode;

use crate::Engine;

/// The board `ork bench stream` and `ork bench spec` project on.
pub const BENCH_BOARD: &str = "rk3588";

/// Start recording `engine`'s events when there is a `board` to project on (device engines
/// only: the CPU engine records no device work).
pub fn record(engine: &Engine, board: Option<&Board>) -> Option<Arc<Recorder>> {
    board?;
    let rec = Arc::new(Recorder::new());
    engine
        .linear()?
        .device_matmul()
        .set_events(Arc::clone(&rec), ork_board::Model::Target);
    Some(rec)
}

/// Record `engine`'s events for a benchmark's projection on [`BENCH_BOARD`].
pub fn record_bench(engine: &Engine) -> Option<Arc<Recorder>> {
    record(engine, Board::named(BENCH_BOARD).ok().as_ref())
}

/// Projected prefill tokens per second of the prefill recorded in `rec` (one pass of `tokens`),
/// on [`BENCH_BOARD`]; every load on the clock unless the plan is resident.
///
/// # Errors
/// The board or the replay of the events fails.
pub fn bench_prefill_tok_s(
    engine: &Engine,
    rec: &Recorder,
    tokens: usize,
) -> Result<f64, BoardError> {
    let board = Board::named(BENCH_BOARD)?;
    let timeline = replay(
        &rec.events(),
        &board,
        run_options(
            engine,
            engine.plan().is_some_and(|p| p.mode == Mode::Resident),
        ),
    )?;
    Ok(Projection::new(&timeline, &board, tokens, 1).prefill_tok_s)
}

/// Projected decode seconds of the generations recorded in `rec` on [`BENCH_BOARD`]: the
/// replayed time of every pass after a prefill (a pass at context 0 is a prefill), the drafts'
/// and verifier's passes alike. The recording starts after a warm-up, so every load in it is
/// on the clock. Only device work recorded on `engine`'s own matmul backend is in the stream: a
/// separate draft model's is not (its caller says so).
///
/// # Errors
/// The board or the replay of the events fails.
pub fn bench_decode_s(engine: &Engine, rec: &Recorder) -> Result<f64, BoardError> {
    let board = Board::named(BENCH_BOARD)?;
    let timeline = replay(&rec.events(), &board, run_options(engine, false))?;
    let mut before = 0.0;
    let mut decode = 0.0;
    for p in &timeline.passes {
        if p.context > 0 {
            decode += p.end_s - before;
        }
        before = p.end_s;
    }
    Ok(decode)
}

/// How to replay what `engine` recorded: its device bytes, and the prefetcher's rule when a
/// streamed plan prefetched; `preload`: weights loaded once are the model's load.
pub fn run_options(engine: &Engine, preload: bool) -> ReplayOptions {
    ReplayOptions {
        preload,
        device_bytes: engine.cache_stats().peak_resident as f64,
        prefetch_slots: (engine.config().prefetch
            && engine.plan().is_some_and(|p| p.mode == Mode::Streamed))
        .then(crate::default_slots),
    }
}
