//! `ork bench cpu`: prefill and decode tok/s of the CPU engine (`--device cpu`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::{Engine, EngineConfig, RuntimeError};

/// The prompt's sentence, repeated: the same text `scripts/llama_cpp_speed.py` gives llama.cpp,
/// so that both engines prefill the same tokens.
pub const BENCH_SENTENCE: &str =
    "The history of computing is a story of machines that outgrew their memory. ";

/// What `ork bench cpu` measures.
#[derive(Clone, Debug)]
pub struct CpuBenchOptions {
    /// The GGUF model.
    pub model: PathBuf,
    /// Worker threads (`None`: one per chosen core).
    pub threads: Option<usize>,
    /// Cores to run on (`None`: the engine's default choice).
    pub cpus: Option<Vec<usize>>,
    /// Prompt tokens prefilled in one batch.
    pub prompt_tokens: usize,
    /// Tokens decoded one at a time after the prompt.
    pub gen_tokens: usize,
    /// Timed passes (after one untimed warm-up pass).
    pub rounds: usize,
}

/// The timings of `ork bench cpu`: prefill and decode tok/s of the CPU engine (`--device cpu`).
#[derive(Clone, Debug, Serialize)]
pub struct CpuBenchReport {
    /// The GGUF model.
    pub model: PathBuf,
    /// Worker threads.
    pub threads: usize,
    /// The cores the workers run on.
    pub cpus: String,
    /// The weights' block types, as `Q4_1,Q8_0`.
    pub weight_types: String,
    /// Prompt tokens per pass.
    pub prompt_tokens: usize,
    /// Decoded tokens per pass.
    pub gen_tokens: usize,
    /// Prefill tok/s of each timed pass.
    pub prefill_tok_s: Vec<f64>,
    /// Decode tok/s of each timed pass.
    pub decode_tok_s: Vec<f64>,
    /// The best pass's prefill tok/s (as `scripts/llama_cpp_speed.py` reports llama.cpp's).
    pub prefill_best: f64,
    /// The best pass's decode tok/s.
    pub decode_best: f64,
    /// The median pass's prefill tok/s.
    pub prefill_median: f64,
    /// The median pass's decode tok/s.
    pub decode_median: f64,
    /// The 1-minute load average before and after the passes (`/proc/loadavg`), when readable:
    /// the machine's other work, which these figures share.
    pub load_average: Option<(f64, f64)>,
}

/// Times the CPU engine on `options.model`: one untimed warm-up pass, then `rounds` passes, each
/// a prefill of the prompt in one batch from position 0 and `gen_tokens` decode steps, one
/// token at a time. The decode steps feed the prompt's own tokens back (as
/// `scripts/llama_cpp_speed.py` does for llama.cpp): a step's work does not depend on the token.
///
/// # Errors
/// The engine does not open (file, tensor or type errors, as for `ork run --device cpu`), the
/// tokenizer fails, the prompt and generation do not fit the model's context, or a step fails.
pub fn bench_cpu(options: &CpuBenchOptions) -> Result<CpuBenchReport, RuntimeError> {
    let model_error = |source| RuntimeError::Model {
        model: options.model.clone(),
        source,
    };
    let mut config = EngineConfig::new(&options.model);
    config.cpu = Some(ork_cpu::CpuOptions {
        threads: options.threads,
        cpus: options.cpus.clone(),
        ..Default::default()
    });
    let engine = Engine::open(config)?;
    let prompt = bench_prompt(&engine, options.prompt_tokens).map_err(model_error)?;
    let context = options.prompt_tokens + options.gen_tokens + 1;
    let mut session = engine.session_with_context(context).map_err(model_error)?;
    let load_before = load_average();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for pass in 0..=options.rounds {
        session.reset();
        let t0 = Instant::now();
        session.prefill(&prompt).map_err(model_error)?;
        let tp = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        for i in 0..options.gen_tokens {
            session
                .decode(prompt[i % prompt.len()])
                .map_err(model_error)?;
        }
        let td = t0.elapsed().as_secs_f64();
        if pass > 0 {
            prefill.push(rate(prompt.len(), tp));
            decode.push(rate(options.gen_tokens, td));
        }
    }
    let load_after = load_average();
    let linear = engine
        .cpu_linear()
        .expect("an engine opened with `cpu` options computes on the CPU");
    Ok(CpuBenchReport {
        model: options.model.clone(),
        threads: linear.pool().threads(),
        cpus: ork_cpu::topology::format_cpu_list(&linear.pool().choice().cores),
        weight_types: linear
            .type_counts()
            .iter()
            .map(|t| t.ty.name())
            .collect::<Vec<_>>()
            .join(","),
        prompt_tokens: prompt.len(),
        gen_tokens: options.gen_tokens,
        prefill_best: max(&prefill),
        decode_best: max(&decode),
        prefill_median: median(&prefill),
        decode_median: median(&decode),
        prefill_tok_s: prefill,
        decode_tok_s: decode,
        load_average: load_before.zip(load_after),
    })
}

/// [`BENCH_SENTENCE`] repeated and tokenized without BOS, cut to `tokens` (at least 1).
fn bench_prompt(engine: &Engine, tokens: usize) -> Result<Vec<u32>, ork_exec::ExecError> {
    let tokenizer = engine.tokenizer();
    let body = tokenizer.encode(BENCH_SENTENCE, false, false)?;
    let mut out = Vec::with_capacity(tokens);
    while out.len() < tokens.max(1) && !body.is_empty() {
        out.extend_from_slice(&body);
    }
    if out.is_empty() {
        // A vocabulary that encodes the sentence to nothing: token 0, repeated.
        out.push(0);
    }
    out.resize(tokens.max(1), out[0]);
    Ok(out)
}

/// Tokens per second, 0 for a zero duration.
fn rate(n: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

fn max(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(0.0, f64::max)
}

/// The median (the mean of the middle two for an even count); 0 for none.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The 1-minute load average (`/proc/loadavg`), when readable.
pub fn load_average() -> Option<f64> {
    load_average_from(Path::new("/proc/loadavg"))
}

fn load_average_from(path: &Path) -> Option<f64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn rate_of_zero_duration_is_zero() {
        assert_eq!(rate(5, 0.0), 0.0);
        assert_eq!(rate(5, 0.5), 10.0);
    }

    #[test]
    fn load_average_parses_proc_format() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("loadavg");
        std::fs::write(&p, "1.25 0.50 0.10 1/100 42\n").unwrap();
        assert_eq!(load_average_from(&p), Some(1.25));
        std::fs::write(&p, "garbage").unwrap();
        assert_eq!(load_average_from(&p), None);
    }
}
