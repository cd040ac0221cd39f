//! The SmolLM2 tokenizer against ids recorded from llama.cpp (scripts/tokenizer_golden.py).
use super::real_model::tokenizer;

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
    ids: Vec<u32>,
    decoded: String,
}

fn golden() -> Golden {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/tokenizer.json");
    let text = std::fs::read_to_string(path).expect("golden file");
    serde_json::from_str(&text).expect("golden JSON")
}

#[test]
fn encode_matches_llama_cpp() {
    let g = golden();
    assert_eq!(g.model_sha256.len(), 64);
    assert!(g.cases.len() >= 20, "{} cases", g.cases.len());
    let tok = tokenizer();
    let mut failures = Vec::new();
    for c in &g.cases {
        let ids = tok.encode(&c.text, false, c.parse_special).unwrap();
        if ids != c.ids {
            failures.push(format!(
                "{:?} (parse_special={}):\n  ork   {:?}\n  {} {:?}",
                c.text, c.parse_special, ids, g.reference, c.ids
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn decode_matches_llama_cpp_and_round_trips() {
    let tok = tokenizer();
    for c in &golden().cases {
        let text = tok.decode(&c.ids, true).unwrap();
        assert_eq!(text, c.decoded, "llama.cpp detokenization of {:?}", c.text);
        assert_eq!(text, c.text, "decode(encode(text)) for {:?}", c.text);
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
        assert_eq!(streamed, c.text);
    }
}
