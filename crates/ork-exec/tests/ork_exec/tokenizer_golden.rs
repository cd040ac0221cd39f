//! The SmolLM2 (byte-level BPE) and Gemma 3 (SentencePiece) tokenizers against ids and text
//! recorded from llama.cpp (scripts/tokenizer_golden.py).
use super::real_model::tokenizer;
use ork_exec::Tokenizer;
use std::sync::OnceLock;

#[derive(serde::Deserialize)]
struct Golden {
    reference: String,
    model_sha256: String,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    parse_special: bool,
    /// BOS/EOS added as the file's flags ask (absent: false).
    #[serde(default)]
    add_special: bool,
    ids: Vec<u32>,
    decoded: String,
}

fn golden(name: &str) -> Golden {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("golden file");
    serde_json::from_str(&text).expect("golden JSON")
}

/// The Gemma 3 270M tokenizer (262,144 SentencePiece tokens), built once.
pub fn gemma3() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let gguf = ork_gguf::GgufFile::open(&ork_testkit::gemma3_path()).expect("open Gemma 3");
        Tokenizer::from_gguf(&gguf).expect("Gemma 3 tokenizer")
    })
}

fn check_encode(tok: &Tokenizer, g: &Golden, min_cases: usize) {
    assert_eq!(g.model_sha256.len(), 64);
    assert!(g.cases.len() >= min_cases, "{} cases", g.cases.len());
    let mut failures = Vec::new();
    for c in &g.cases {
        let ids = tok.encode(&c.text, c.add_special, c.parse_special).unwrap();
        if ids != c.ids {
            failures.push(format!(
                "{:?} (add_special={} parse_special={}):\n  ork   {:?}\n  {} {:?}",
                c.text, c.add_special, c.parse_special, ids, g.reference, c.ids
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn check_decode(tok: &Tokenizer, g: &Golden) {
    for c in &g.cases {
        let text = tok.decode(&c.ids, true).unwrap();
        assert_eq!(text, c.decoded, "llama.cpp detokenization of {:?}", c.text);
        // The text comes back, except where llama.cpp's does not either (BOS rendered, a U+2581
        // typed in the input reads back as a space).
        if !c.add_special && !c.text.contains('\u{2581}') {
            assert_eq!(text, c.text, "decode(encode(text)) for {:?}", c.text);
        }
        // Streaming token by token gives the same text, and only valid UTF-8 pieces.
        let mut stream = ork_exec::TextStream::new(tok, true);
        let mut streamed = String::new();
        for &id in &c.ids {
            let piece = stream.push(id).unwrap();
            assert!(
                !piece.contains('\u{FFFD}'),
                "replacement char while streaming {:?}",
                c.text
            );
            streamed.push_str(&piece);
        }
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, c.decoded);
    }
}

#[test]
fn encode_matches_llama_cpp() {
    check_encode(tokenizer(), &golden("tokenizer.json"), 20);
}

#[test]
fn decode_matches_llama_cpp_and_round_trips() {
    check_decode(tokenizer(), &golden("tokenizer.json"));
}

#[test]
fn gemma3_encode_matches_llama_cpp() {
    check_encode(gemma3(), &golden("tokenizer_gemma3.json"), 45);
}

#[test]
fn gemma3_decode_matches_llama_cpp() {
    check_decode(gemma3(), &golden("tokenizer_gemma3.json"));
}

#[test]
fn gemma3_flags_and_end_of_turn() {
    let tok = gemma3();
    // As the file sets them: BOS added, no EOS, no space prefix.
    assert!(tok.add_bos());
    assert_eq!(tok.bos(), Some(2));
    assert_eq!(tok.eos(), Some(1));
    // `<end_of_turn>` (106) ends generation as well as `<eos>` (1), as in llama.cpp.
    assert_eq!(tok.encode("<end_of_turn>", false, true).unwrap(), vec![106]);
    assert_eq!(tok.end_of_generation(), &[1, 106]);
}

/// The wide check (docs/models.md, Tokenizers): thousands of random strings and a long text,
/// recorded by `scripts/tokenizer_golden.py MODEL --random N --text FILE` into
/// `ORK_TOKENIZER_GOLDEN`, for the model at `ORK_TOKENIZER_MODEL`.
#[test]
#[ignore = "needs a golden file written by scripts/tokenizer_golden.py --random (docs/models.md)"]
fn wide() {
    let golden_path = std::env::var("ORK_TOKENIZER_GOLDEN").expect("ORK_TOKENIZER_GOLDEN");
    let model = std::env::var("ORK_TOKENIZER_MODEL").expect("ORK_TOKENIZER_MODEL");
    let text = std::fs::read_to_string(&golden_path).expect("golden file");
    let g: Golden = serde_json::from_str(&text).expect("golden JSON");
    let gguf = ork_gguf::GgufFile::open(std::path::Path::new(&model)).expect("open model");
    let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    check_encode(&tok, &g, 1);
    check_decode(&tok, &g);
    eprintln!("{} cases agree with {}", g.cases.len(), g.reference);
}
