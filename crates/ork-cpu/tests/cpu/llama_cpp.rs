//! `--device cpu` against llama.cpp (issue 37's acceptance; docs/cpu.md, "Correctness against
//! llama.cpp"): ork's CPU engine ([`GgufLinear`] under [`ork_exec::Session`]) on each
//! file against llama.cpp's CPU backend (llama-cpp-python 0.3.36) on the same file.
//!
//! The files: the real SmolLM2-135M-Instruct Q4_1 (`ORK_MODEL`), its copies requantized by
//! llama.cpp's own quantizer (`scripts/requantize.py`, in `ORK_REQUANT_DIR`) and Gemma 3 270M
//! Q4_K_M (`ORK_GEMMA3`). Between them they hold Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K,
//! Q5_K and Q6_K blocks (which tensor gets which: docs/cpu.md). llama.cpp's results are computed on this machine by `scripts/test.sh`
//! (`scripts/cpu_golden.py`, JSON in `ORK_CPU_GOLDEN_DIR`); a missing one fails the test naming
//! the step that did not produce it, never a skip.
//!
//! Per file, three checks, and a fourth on SmolLM2 Q4_1:
//! - logits of the golden text from position 0 in one batch: at every position, for llama.cpp's
//!   top-8 ids and 24 fixed probe ids (the whole row at the last position), ork's logit is within
//!   5e-2 of the row's spread (llama.cpp's max − min) of llama.cpp's;
//! - 32 greedy tokens after a fixed prompt, decoded one at a time: ork's argmax equals llama.cpp's
//!   token at each step, except where llama.cpp's own top two logits are within 0.5 (a near-tie
//!   either side may break). At every step, ork is then fed llama.cpp's token, so the comparison
//!   continues over all 32 steps on the same context;
//! - perplexity under llama-perplexity's protocol within 3 % of llama.cpp's;
//! - for SmolLM2 Q4_1, perplexity over a longer text (3570 scored tokens) within issue 37's
//!   0.3 % of llama.cpp's.
//!
//! **The first three bounds are looser than issue 37's acceptance (1e-2 of the spread, near-ties
//! within 0.1, perplexity within 0.3 %), which llama.cpp itself does not meet against itself:
//! one token at a time against one batch, on these files, it fails the logit bound on all 11,
//! the 93-token perplexity bound on 9 and the near-tie bound on 3 (`scripts/llama_cpp_self.py`,
//! docs/cpu.md).** Measured on the test's files
//! (x86, 2026-12-06): worst logit difference 2.2e-2 (Q8_0) to 3.8e-2 (Q2_K_pure) of the spread;
//! greedy steps that differ where llama.cpp's top two are up to 0.44 apart; perplexity −0.7 %
//! (Q4_0) to +2.2 % (Q3_K_M). That is the size of llama.cpp's own irreproducibility on these
//! files: its logits of the same text in one batch and one token at a time differ by 3.1e-2 of
//! the spread (Q8_0), an f32 instead of an f16 cache moves them by 3.3e-2. A float rounding
//! difference anywhere flips a Q8_0 activation rounding a few layers on and grows from there
//! (traced layer by layer against llama.cpp's tensors: docs/cpu.md, "Where the gap comes
//! from"). The bounds here guard what is measured, with a margin; issue 37's would need ggml's
//! summation order bit for bit.
use ork_cpu::GgufLinear;
use ork_exec::{perplexity, KvType, Linear, Model, Session};
use ork_gguf::GgufFile;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Logits agree within this fraction of the row's spread.
const LOGIT_TOLERANCE: f32 = 5e-2;
/// A greedy step whose top two llama.cpp logits are closer than this may differ.
const NEAR_TIE: f32 = 0.5;
/// Perplexity agrees within this relative difference.
const PPL_TOLERANCE: f64 = 0.03;
/// The same for the two Q2_K files, whose 93 scored tokens make llama.cpp's own perplexity move
/// by up to 3.6 % between x86 machines (measured on the same files: Q2_K 17.809 on an AVX-512
/// Xeon, 17.398 on an AVX2 EPYC; Q2_K_pure 80.420 and 77.593, where ork read 80.046 on both):
/// [`PPL_TOLERANCE`] plus that spread.
const PPL_TOLERANCE_Q2_K: f64 = 0.07;

#[derive(serde::Deserialize)]
struct Golden {
    llama_cpp_version: String,
    model_file: String,
    add_bos: bool,
    bos: u32,
    logits: Logits,
    greedy: Greedy,
    perplexity: Ppl,
    /// llama.cpp's perplexity over a longer text, for SmolLM2 Q4_1 only (`scripts/cpu_golden.py
    /// --long`).
    #[serde(default)]
    long_perplexity: Option<LongPpl>,
}

#[derive(serde::Deserialize)]
struct Logits {
    tokens: Vec<u32>,
    probe_ids: Vec<u32>,
    rows: Vec<Row>,
    last_row: Vec<f32>,
}

#[derive(serde::Deserialize)]
struct Row {
    min: f32,
    max: f32,
    top_ids: Vec<u32>,
    top_logits: Vec<f32>,
    probe_logits: Vec<f32>,
}

#[derive(serde::Deserialize)]
struct Greedy {
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    top2_gap: Vec<f32>,
}

#[derive(serde::Deserialize)]
struct Ppl {
    n_ctx: usize,
    chunks: usize,
    scored: usize,
    ppl: f64,
}

#[derive(serde::Deserialize)]
struct LongPpl {
    text: String,
    tokens: Vec<u32>,
    #[serde(flatten)]
    window: Ppl,
}

/// The directory of `var`, or `.cache/` at the repository root (where scripts/test.sh puts it).
fn dir(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(default))
}

/// How to make what is missing: the failed step scripts/test.sh recorded, else the steps.
fn remedy(golden_dir: &Path) -> String {
    match std::fs::read_to_string(golden_dir.join("ERROR")) {
        Ok(step) => format!("scripts/test.sh reported: {}", step.trim()),
        Err(_) => "run scripts/test.sh (it installs llama-cpp-python 0.3.36, then runs \
                   scripts/requantize.py and scripts/cpu_golden.py), or set ORK_REQUANT_DIR \
                   and ORK_CPU_GOLDEN_DIR"
            .to_owned(),
    }
}

/// The model file and llama.cpp's golden for it.
fn load(model: &Path) -> (PathBuf, Golden) {
    let golden_dir = dir("ORK_CPU_GOLDEN_DIR", "../../.cache/golden");
    assert!(
        model.is_file(),
        "model {} not found: {}",
        model.display(),
        remedy(&golden_dir)
    );
    let name = model.file_name().expect("a file name").to_string_lossy();
    let path = golden_dir.join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "llama.cpp golden {} unreadable ({e}): {}",
            path.display(),
            remedy(&golden_dir)
        )
    });
    let golden: Golden = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("llama.cpp golden {}: {e}", path.display()));
    assert_eq!(golden.model_file, name, "{}", path.display());
    assert_eq!(golden.llama_cpp_version, "0.3.36", "{}", path.display());
    (model.to_path_buf(), golden)
}

fn requantized(kind: &str) -> PathBuf {
    dir("ORK_REQUANT_DIR", "../../.cache").join(format!("SmolLM2-135M-Instruct.{kind}.gguf"))
}

/// ork's CPU engine on `path` (2 workers, as llama.cpp's 2 threads): the model and its
/// `GgufLinear`.
fn open(path: &Path) -> (Arc<Model>, Arc<dyn Linear>) {
    let gguf =
        Arc::new(GgufFile::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display())));
    let model =
        Arc::new(Model::load(&gguf).unwrap_or_else(|e| panic!("load {}: {e}", path.display())));
    let linear = GgufLinear::open(
        Arc::clone(&gguf),
        model.matmul_weights(),
        super::fixtures::pool(2),
    )
    .unwrap_or_else(|e| panic!("--device cpu on {}: {e}", path.display()));
    (model, Arc::new(linear))
}

/// The worst |ork − llama.cpp| / spread over the checked logits, and where.
fn check_logits(model: &Arc<Model>, linear: &Arc<dyn Linear>, g: &Logits, what: &str) -> f32 {
    let v = model.config().vocab_size;
    let all = Session::new(Arc::clone(model), Arc::clone(linear))
        .with_kv_type(KvType::F16)
        .forward_all(&g.tokens)
        .unwrap_or_else(|e| panic!("{what}: forward_all: {e}"));
    assert_eq!(all.len(), g.tokens.len() * v, "{what}: logits shape");
    assert_eq!(g.last_row.len(), v, "{what}: vocabulary size");
    let (mut worst, mut at) = (0.0f32, (0, 0));
    for (p, row) in g.rows.iter().enumerate() {
        let ork = &all[p * v..(p + 1) * v];
        let spread = row.max - row.min;
        let mut pairs: Vec<(u32, f32)> = row
            .top_ids
            .iter()
            .copied()
            .zip(row.top_logits.iter().copied())
            .chain(
                g.probe_ids
                    .iter()
                    .copied()
                    .zip(row.probe_logits.iter().copied()),
            )
            .collect();
        if p + 1 == g.rows.len() {
            pairs = (0..v as u32).zip(g.last_row.iter().copied()).collect();
        }
        for (id, reference) in pairs {
            let rel = (ork[id as usize] - reference).abs() / spread;
            if rel.is_nan() || rel > worst {
                worst = if rel.is_nan() { f32::INFINITY } else { rel };
                at = (p, id);
            }
        }
    }
    eprintln!(
        "{what}: logits over {} positions: worst |ork - llama.cpp| = {worst:.2e} of the spread \
         (position {}, token {})",
        g.rows.len(),
        at.0,
        at.1
    );
    assert!(
        worst <= LOGIT_TOLERANCE,
        "{what}: logit at position {} token {} differs from llama.cpp's by {worst:.3e} of the \
         row's spread (> {LOGIT_TOLERANCE})",
        at.0,
        at.1
    );
    worst
}

/// Greedy steps: ork's argmax against llama.cpp's token, fed llama.cpp's token each step.
fn check_greedy(model: &Arc<Model>, linear: &Arc<dyn Linear>, g: &Greedy, what: &str) {
    let mut session = Session::new(Arc::clone(model), Arc::clone(linear)).with_kv_type(KvType::F16);
    let mut logits = session
        .prefill(&g.prompt_tokens)
        .unwrap_or_else(|e| panic!("{what}: prefill: {e}"));
    let (mut equal, mut exempt) = (0, Vec::new());
    for (step, (&want, &gap)) in g.tokens.iter().zip(&g.top2_gap).enumerate() {
        let got = ork_exec::ops::argmax(&logits).expect("a non-empty row") as u32;
        if got == want {
            equal += 1;
        } else if gap < NEAR_TIE {
            exempt.push(step);
        } else {
            panic!(
                "{what}: greedy step {step}: ork picks {got}, llama.cpp {want} (llama.cpp's top two \
                 differ by {gap:.3} ≥ {NEAR_TIE}); ork's logits there: {got} {:.4}, {want} {:.4}",
                logits[got as usize], logits[want as usize]
            );
        }
        if step + 1 < g.tokens.len() {
            logits = session
                .decode(want)
                .unwrap_or_else(|e| panic!("{what}: decode at step {step}: {e}"));
        }
    }
    eprintln!(
        "{what}: greedy {equal}/{} tokens equal, near-ties that differ at steps {exempt:?}",
        g.tokens.len()
    );
}

/// ork's perplexity of `tokens` (`what` names the file and the text) within `tolerance` of
/// llama.cpp's `p`, over the same windows.
fn check_perplexity(
    model: &Arc<Model>,
    linear: &Arc<dyn Linear>,
    tokens: &[u32],
    bos: Option<u32>,
    p: &Ppl,
    what: &str,
    tolerance: f64,
) {
    let r = perplexity(model, linear, tokens, p.n_ctx, bos, KvType::F16)
        .unwrap_or_else(|e| panic!("{what}: perplexity: {e}"));
    let rel = r.ppl / p.ppl - 1.0;
    eprintln!(
        "{what}: perplexity ({} scored) ork {:.4}, llama.cpp {:.4} ({:+.3} %)",
        r.scored,
        r.ppl,
        p.ppl,
        rel * 100.0
    );
    assert_eq!((r.chunks, r.scored), (p.chunks, p.scored), "{what}: chunks");
    assert!(
        rel.abs() <= tolerance,
        "{what}: perplexity {} vs llama.cpp {} ({:+.3} %, limit {} %)",
        r.ppl,
        p.ppl,
        rel * 100.0,
        tolerance * 100.0
    );
}

/// Issue 37's perplexity bound, 0.3 % of llama.cpp's, over the longer text of the golden's
/// `long_perplexity` (llama-perplexity's windows of 512 tokens, f16 cache, the tokens llama.cpp
/// made of the text). The golden text's 93 scored tokens are too few to hold it: there one
/// logit's rounding flip moves the perplexity by more (docs/cpu.md).
const LONG_PPL_TOLERANCE: f64 = 0.003;

/// All three checks on one file.
fn against_llama_cpp(model_path: PathBuf) {
    against_llama_cpp_within(model_path, PPL_TOLERANCE);
}

/// [`against_llama_cpp`] with the perplexity held within `ppl_tolerance`.
fn against_llama_cpp_within(model_path: PathBuf, ppl_tolerance: f64) {
    let (path, golden) = load(&model_path);
    let what = golden.model_file.clone();
    let (model, linear) = open(&path);
    check_logits(&model, &linear, &golden.logits, &what);
    check_greedy(&model, &linear, &golden.greedy, &what);
    let bos = golden.add_bos.then_some(golden.bos);
    let tokens = &golden.logits.tokens;
    check_perplexity(
        &model,
        &linear,
        tokens,
        bos,
        &golden.perplexity,
        &what,
        ppl_tolerance,
    );
}

#[test]
fn smollm2_q4_1_matches_llama_cpp() {
    against_llama_cpp(ork_testkit::model_path());
}

/// Issue 37's 0.3 % on the real test model, over the longer text; every file's figure:
/// `scripts/cpu-perplexity.sh` (docs/cpu.md, "Perplexity over a longer text").
#[test]
fn smollm2_q4_1_perplexity_over_a_longer_text_is_within_0_3_percent_of_llama_cpp() {
    let (path, golden) = load(&ork_testkit::model_path());
    let (model, linear) = open(&path);
    let long = golden.long_perplexity.as_ref().unwrap_or_else(|| {
        panic!(
            "{}: the golden has no long_perplexity: scripts/test.sh makes it (cpu_golden.py --long)",
            golden.model_file
        )
    });
    let what = format!("{} over {}", golden.model_file, long.text);
    let bos = golden.add_bos.then_some(golden.bos);
    let tokens = &long.tokens;
    check_perplexity(
        &model,
        &linear,
        tokens,
        bos,
        &long.window,
        &what,
        LONG_PPL_TOLERANCE,
    );
}

#[test]
fn smollm2_q4_0_matches_llama_cpp() {
    against_llama_cpp(requantized("Q4_0"));
}

#[test]
fn smollm2_q5_1_matches_llama_cpp() {
    against_llama_cpp(requantized("Q5_1"));
}

#[test]
fn smollm2_q8_0_matches_llama_cpp() {
    against_llama_cpp(requantized("Q8_0"));
}

#[test]
fn smollm2_q2_k_matches_llama_cpp() {
    against_llama_cpp_within(requantized("Q2_K"), PPL_TOLERANCE_Q2_K);
}

/// The only file with Q2_K blocks (ffn_down): see scripts/requantize.py.
#[test]
fn smollm2_q2_k_pure_matches_llama_cpp() {
    against_llama_cpp_within(requantized("Q2_K_pure"), PPL_TOLERANCE_Q2_K);
}

#[test]
fn smollm2_q3_k_m_matches_llama_cpp() {
    against_llama_cpp(requantized("Q3_K_M"));
}

#[test]
fn smollm2_q4_k_m_matches_llama_cpp() {
    against_llama_cpp(requantized("Q4_K_M"));
}

#[test]
fn smollm2_q5_k_m_matches_llama_cpp() {
    against_llama_cpp(requantized("Q5_K_M"));
}

#[test]
fn smollm2_q6_k_matches_llama_cpp() {
    against_llama_cpp(requantized("Q6_K"));
}

#[test]
fn gemma3_q4_k_m_matches_llama_cpp() {
    against_llama_cpp(ork_testkit::gemma3_path());
}
