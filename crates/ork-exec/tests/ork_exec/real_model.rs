//! Tests on the real SmolLM2-135M-Instruct Q4_1 model.
use ork_exec::{
    generate, ChatMessage, ChatTemplate, CpuF32Linear, CpuW8A8Linear, GenerateOptions, Linear,
    Model, Sampler, Session, StopReason, TextStream, Tokenizer,
};
use ork_gguf::GgufFile;
pub use ork_testkit::model_path;
use std::sync::{Arc, OnceLock};

/// The GGUF, opened once for all tests of this module.
pub fn gguf() -> &'static std::sync::Arc<GgufFile> {
    static G: OnceLock<std::sync::Arc<GgufFile>> = OnceLock::new();
    G.get_or_init(|| std::sync::Arc::new(GgufFile::open(&model_path()).expect("open real model")))
}

pub fn model() -> &'static Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| Arc::new(Model::load(gguf()).expect("load real model")))
}

pub fn f32_linear() -> &'static Arc<dyn Linear> {
    static L: OnceLock<Arc<dyn Linear>> = OnceLock::new();
    L.get_or_init(|| {
        Arc::new(CpuF32Linear::from_gguf(gguf(), model().matmul_weights()).expect("dequantize"))
    })
}

pub fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_gguf(gguf()).expect("tokenizer"))
}

/// Greedy continuation of `prompt` as text.
fn greedy(linear: &Arc<dyn Linear>, prompt: &str, n: usize) -> String {
    let tok = tokenizer();
    let ids = tok.encode(prompt, true, false).unwrap();
    let mut session = Session::new(Arc::clone(model()), Arc::clone(linear));
    let mut stream = TextStream::new(tok, false);
    let mut text = String::new();
    let opts = GenerateOptions {
        max_tokens: n,
        stop_tokens: tok.end_of_generation().to_vec(),
    };
    generate(&mut session, &ids, &opts, &mut Sampler::greedy(), |t| {
        text.push_str(&stream.push(t)?);
        Ok(())
    })
    .unwrap();
    text.push_str(&stream.finish());
    text
}

#[test]
fn config_matches_the_model_card() {
    let c = model().config();
    assert_eq!(c.arch, ork_exec::Arch::Llama);
    assert_eq!((c.n_layer, c.n_embd, c.n_ff), (30, 576, 1536));
    assert_eq!((c.n_head, c.n_head_kv, c.head_dim_k), (9, 3, 64));
    assert_eq!(c.rope_base, 100_000.0);
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(
        model().manifest().get(model().output_weight()).key,
        "token_embd.weight",
        "tied embeddings"
    );
    assert!(!tokenizer().add_bos());
}

#[test]
fn greedy_capital_of_france_is_paris() {
    let text = greedy(f32_linear(), "The capital of France is", 8);
    eprintln!("f32 greedy: {text:?}");
    assert!(text.starts_with(" Paris"), "got {text:?}");
}

/// CpuW8A8Linear (per-token int8 activations × per-channel int8 weights) against f32.
///
/// Measured on SmolLM2-135M: the first greedy tokens agree, longer continuations drift (SmolLM2's
/// normed activations have outlier channels, max/rms ≈ 20, so per-token int8 keeps few levels for
/// the rest; attn_v outputs carry up to 10 % relative error). The test pins what holds: the same
/// first three greedy tokens on short prompts (measured: "def fibonacci(n):" diverges at the fourth,
/// " ==" vs " <"), and top-1 agreement on most teacher-forced positions.
#[test]
fn w8a8_reference_tracks_f32() {
    let w8a8: Arc<dyn Linear> =
        Arc::new(CpuW8A8Linear::from_gguf(gguf(), model().matmul_weights()).unwrap());
    let tok = tokenizer();
    for prompt in [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time",
    ] {
        let ids = tok.encode(prompt, true, false).unwrap();
        let run = |linear: &Arc<dyn Linear>| {
            let mut session = Session::new(Arc::clone(model()), Arc::clone(linear));
            let opts = GenerateOptions {
                max_tokens: 3,
                stop_tokens: vec![],
            };
            generate(
                &mut session,
                &ids,
                &opts,
                &mut Sampler::greedy(),
                |_| Ok(()),
            )
            .unwrap()
            .tokens
        };
        let (a, b) = (run(f32_linear()), run(&w8a8));
        eprintln!(
            "{prompt:?}: f32 {:?} / w8a8 {:?}",
            tok.decode(&a, false).unwrap(),
            tok.decode(&b, false).unwrap()
        );
        assert_eq!(
            a, b,
            "w8a8 greedy diverges from f32 within 3 tokens on {prompt:?}"
        );
    }

    let text = "The capital of France is Paris. The quick brown fox jumps over the lazy dog.\n\
                def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n";
    let ids = tok.encode(text, true, false).unwrap();
    let a = Session::new(Arc::clone(model()), Arc::clone(f32_linear()))
        .forward_all(&ids)
        .unwrap();
    let b = Session::new(Arc::clone(model()), Arc::clone(&w8a8))
        .forward_all(&ids)
        .unwrap();
    let v = model().config().vocab_size;
    let agree = (0..ids.len())
        .filter(|&i| {
            let top = |l: &[f32]| ork_exec::ops::argmax(&l[i * v..(i + 1) * v]);
            top(&a) == top(&b)
        })
        .count();
    eprintln!("w8a8 teacher-forced top-1 agreement: {agree}/{}", ids.len());
    assert!(
        agree * 10 >= ids.len() * 8,
        "top-1 agreement {agree}/{} below 80 %",
        ids.len()
    );
}

#[test]
fn chat_prompt_uses_control_tokens_and_stops_at_end_of_turn() {
    let tok = tokenizer();
    let tmpl = ChatTemplate::from_gguf(gguf(), tok)
        .unwrap()
        .expect("SmolLM2 has a chat template");
    let text = tmpl
        .render(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    let ids = tok.encode(&text, true, true).unwrap();
    let im_start = tok.bos().unwrap();
    assert_eq!(ids[0], im_start, "<|im_start|> is one token");
    assert_eq!(ids.iter().filter(|&&t| t == im_start).count(), 3);
    let mut session = Session::new(Arc::clone(model()), Arc::clone(f32_linear()));
    let opts = GenerateOptions {
        max_tokens: 48,
        stop_tokens: tok.end_of_generation().to_vec(),
    };
    let out = generate(
        &mut session,
        &ids,
        &opts,
        &mut Sampler::greedy(),
        |_| Ok(()),
    )
    .unwrap();
    let reply = tok.decode(&out.tokens, false).unwrap();
    eprintln!("chat reply: {reply:?} ({:?})", out.stop);
    assert!(reply.contains("Paris"), "{reply:?}");
    assert_eq!(out.stop, StopReason::EndOfGeneration(tok.eos().unwrap()));
}

#[test]
fn empty_prompt_is_an_error_because_smollm2_adds_no_bos() {
    let tok = tokenizer();
    let ids = tok.encode("", true, false).unwrap();
    assert!(ids.is_empty());
    let mut session = Session::new(Arc::clone(model()), Arc::clone(f32_linear()));
    let opts = GenerateOptions {
        max_tokens: 1,
        stop_tokens: vec![],
    };
    let r = generate(
        &mut session,
        &ids,
        &opts,
        &mut Sampler::greedy(),
        |_| Ok(()),
    );
    assert!(matches!(r, Err(ork_exec::ExecError::EmptyPrompt)));
}
