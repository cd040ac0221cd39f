//! Speculative decoding on the real model through the engine: a batched verifier pass gives the
//! logits of single-token decodes bit for bit; greedy speculative output is plain greedy output
//! for each draft kind, streamed at a quarter budget and resident; drafts that cannot be used are
//! typed errors.

mod common;
use common::run_greedy;
use std::path::{Path, PathBuf};

use ork_exec::{
    generate_speculative, Draft, ExecError, GenerateOptions, LookupDraft, ModelDraft, Sampler,
    SpeculativeOptions, StandardAcceptance,
};
use ork_gguf::{writer::GgufBuilder, GgufFile, MetaValue};
use ork_runtime::{DeviceKind, DraftSource, Engine, EngineConfig, PackChoice, RuntimeError};
use ork_testkit::model_path;

/// A quarter of SmolLM2-135M's 135 MB of int8 weights (as `ork bench stream` streams it).
const QUARTER_MB: u64 = 33;
const RESIDENT_MB: u64 = 1024;

fn config(pack: &Path, budget_mb: u64, draft: Option<DraftSource>) -> EngineConfig {
    let mut c = EngineConfig::new(model_path());
    c.pack = PackChoice::Path(pack.to_path_buf());
    c.budget_bytes = Some(budget_mb << 20);
    c.device = DeviceKind::Emu;
    c.draft = draft;
    c
}

/// SmolLM2 cut to its first `blocks` blocks, written into `dir`, with metadata `overrides`.
fn derived_model(dir: &Path, blocks: u32, overrides: &[(&str, MetaValue)]) -> PathBuf {
    let src = GgufFile::open(&model_path()).unwrap();
    let path = dir.join(format!("smollm2-{blocks}-blocks-{}.gguf", overrides.len()));
    let keep = |name: &str| match name.strip_prefix("blk.") {
        Some(rest) => rest
            .split('.')
            .next()
            .and_then(|i| i.parse::<u32>().ok())
            .is_some_and(|i| i < blocks),
        None => true,
    };
    let mut all = vec![("llama.block_count", MetaValue::U32(blocks))];
    all.extend(overrides.iter().cloned());
    GgufBuilder::from_file(&src, keep, &all)
        .write(&path)
        .unwrap();
    path
}

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat, the",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
];

fn greedy_options(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        stop_tokens: Vec::new(),
    }
}

fn plain_greedy(engine: &Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    run_greedy(engine.session(), prompt, n)
}

#[test]
fn a_batched_pass_gives_the_logits_of_single_token_decodes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    for budget in [QUARTER_MB, RESIDENT_MB] {
        let engine = Engine::open(config(&dir.path().join("m.orkpack"), budget, None)).unwrap();
        let prompt = engine.tokenizer().encode(PROMPTS[0], true, false).unwrap();
        let next = plain_greedy(&engine, &prompt, 7);
        let vocab = engine.model().config().vocab_size;

        let mut single = engine.session();
        single.prefill(&prompt).unwrap();
        let singles: Vec<Vec<f32>> = next.iter().map(|&t| single.decode(t).unwrap()).collect();

        let mut batched = engine.session();
        batched.prefill(&prompt).unwrap();
        let rows = batched.forward_all(&next).unwrap();
        for (i, s) in singles.iter().enumerate() {
            let b = &rows[i * vocab..][..vocab];
            let same = s.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "budget {budget} MiB: position {i} differs");
        }
        // Rolled back to two accepted tokens, then a new batch: still the single-token logits.
        batched.truncate(prompt.len() + 2).unwrap();
        let rows = batched.forward_all(&next[2..]).unwrap();
        for (i, s) in singles[2..].iter().enumerate() {
            let b = &rows[i * vocab..][..vocab];
            assert!(
                s.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "budget {budget} MiB: after truncate, position {i} differs"
            );
        }
    }
}

fn speculative_greedy(
    engine: &Engine,
    draft: &mut dyn Draft,
    prompt: &[u32],
    n: usize,
    k: usize,
    tree_nodes: Option<usize>,
) -> ork_exec::SpeculativeGeneration {
    generate_speculative(
        &mut engine.session(),
        draft,
        prompt,
        &greedy_options(n),
        &SpeculativeOptions {
            draft_max: k,
            adaptive: true,
            tree_nodes,
        },
        &mut Sampler::greedy(),
        &mut StandardAcceptance,
        |_| Ok(()),
    )
    .unwrap()
}

#[test]
fn greedy_speculative_output_is_plain_greedy_for_each_draft_kind_streamed_and_resident() {
    let dir = tempfile::tempdir().unwrap();
    let draft_path = derived_model(dir.path(), 2, &[]);
    const N: usize = 12;
    // (draft, budget): the draft model keeps ~34 MiB resident, so its streamed case gives the
    // model a quarter of its size beside it.
    let cases = [
        (None, QUARTER_MB),
        (None, RESIDENT_MB),
        (Some(DraftSource::SelfLayers(None)), QUARTER_MB),
        (Some(DraftSource::SelfLayers(Some(4))), RESIDENT_MB),
        (
            Some(DraftSource::Model(draft_path.clone())),
            QUARTER_MB + 36,
        ),
        (Some(DraftSource::Model(draft_path)), RESIDENT_MB),
    ];
    for (source, budget) in cases {
        let engine = Engine::open(config(
            &dir.path().join("m.orkpack"),
            budget,
            source.clone(),
        ))
        .unwrap();
        let streamed =
            engine.plan().expect("a device engine").mode == ork_residency::Mode::Streamed;
        assert_eq!(streamed, budget < RESIDENT_MB, "{source:?} at {budget} MiB");
        if let Some(d) = engine.draft() {
            // The draft's bytes are out of the model's budget.
            assert!(d.bytes() > 0);
            assert!(
                engine
                    .device_budget()
                    .expect("a device engine")
                    .pinned(ork_device::DomainId(0))
                    <= budget << 20,
                "{source:?}"
            );
        }
        for text in PROMPTS {
            let prompt = engine.tokenizer().encode(text, true, false).unwrap();
            let want = plain_greedy(&engine, &prompt, N);
            // Lookup also verifies trees (several branches per pass).
            let trees: &[Option<usize>] = if source.is_none() {
                &[None, Some(5), Some(16)]
            } else {
                &[None]
            };
            for k in [2, 6] {
                for &tree in trees {
                    let mut draft: Box<dyn Draft> = match engine.draft() {
                        Some(d) => Box::new(ModelDraft::new(d.session(), Sampler::greedy(), 0.0)),
                        None => Box::new(LookupDraft::default()),
                    };
                    let got = speculative_greedy(&engine, draft.as_mut(), &prompt, N, k, tree);
                    assert_eq!(
                        got.generation.tokens, want,
                        "{source:?}, budget {budget} MiB, k {k}, tree {tree:?}, prompt {text:?}"
                    );
                    assert!(got.stats.passes <= N);
                }
            }
        }
        // Used for every verifier pass: the device budget still holds.
        assert!(
            engine
                .device_budget()
                .expect("a device engine")
                .used(ork_device::DomainId(0))
                <= budget << 20
        );
    }
}

#[test]
fn unusable_drafts_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.orkpack");
    // A vocabulary that differs in one (special) token's text, and one whose EOS differs.
    let src = GgufFile::open(&model_path()).unwrap();
    let mut tokens = src
        .metadata("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .unwrap()
        .to_vec();
    tokens[7] = MetaValue::String("<not_gh_stars>".into());
    let eos = src
        .metadata("tokenizer.ggml.eos_token_id")
        .and_then(|v| v.as_u64())
        .unwrap();
    for overrides in [
        vec![("tokenizer.ggml.tokens", MetaValue::Array(tokens))],
        vec![(
            "tokenizer.ggml.eos_token_id",
            MetaValue::U32(eos as u32 + 1),
        )],
    ] {
        let path = derived_model(dir.path(), 1, &overrides);
        match Engine::open(config(&pack, RESIDENT_MB, Some(DraftSource::Model(path)))) {
            Err(RuntimeError::DraftModel {
                source: ExecError::DraftVocabMismatch { .. },
                ..
            }) => {}
            other => panic!("expected a vocabulary mismatch, got {other:?}"),
        }
    }
    // A draft model that does not fit beside the model's largest weight (27 MiB each).
    let draft = derived_model(dir.path(), 1, &[]);
    assert!(matches!(
        Engine::open(config(&pack, QUARTER_MB, Some(DraftSource::Model(draft)))),
        Err(RuntimeError::DraftTooLarge { .. })
    ));
    // A self draft of every block cannot leave room for streaming at a quarter budget.
    assert!(matches!(
        Engine::open(config(
            &pack,
            QUARTER_MB,
            Some(DraftSource::SelfLayers(Some(30)))
        )),
        Err(RuntimeError::DraftTooLarge { .. })
    ));
    assert!(matches!(
        Engine::open(config(
            &pack,
            QUARTER_MB,
            Some(DraftSource::SelfLayers(Some(31)))
        )),
        Err(RuntimeError::Model {
            source: ExecError::InvalidDraft { .. },
            ..
        })
    ));
}
