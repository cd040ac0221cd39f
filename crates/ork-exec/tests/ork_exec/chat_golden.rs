//! The built-in Gemma chat template on the real Gemma 3 GGUF (which carries none) against
//! Hugging Face's rendering and llama.cpp's `gemma` format (scripts/chat_golden.py).
use super::tokenizer_golden::gemma3;
use ork_exec::{ChatMessage, ChatTemplate, GEMMA3_TEMPLATE};

#[derive(serde::Deserialize)]
struct Golden {
    template: String,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    messages: Vec<Message>,
    add_generation_prompt: bool,
    hf: String,
    llama_cpp: String,
    ids: Vec<u32>,
}

#[derive(serde::Deserialize)]
struct Message {
    role: String,
    content: String,
}

#[test]
fn gemma3_builtin_template_matches_hf_and_llama_cpp() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/chat_gemma3.json");
    let g: Golden = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(
        g.template, GEMMA3_TEMPLATE,
        "the golden file's template is ork's"
    );
    let tok = gemma3();
    let gguf = ork_gguf::GgufFile::open(&ork_testkit::gemma3_path()).unwrap();
    assert!(gguf.metadata("tokenizer.chat_template").is_none());
    let template = ChatTemplate::from_gguf(&gguf, tok)
        .unwrap()
        .expect("a Gemma GGUF without a template gets the built-in one");
    assert_eq!(template.source(), GEMMA3_TEMPLATE);
    assert!(g.cases.len() >= 6);
    let mut three_turns_with_system = false;
    for c in &g.cases {
        let messages: Vec<ChatMessage> = c
            .messages
            .iter()
            .map(|m| ChatMessage::new(&m.role, &m.content))
            .collect();
        three_turns_with_system |= messages.len() == 4 && messages[0].role == "system";
        let text = template.render(&messages, c.add_generation_prompt).unwrap();
        assert_eq!(text, c.hf, "Hugging Face's rendering");
        assert_eq!(
            text.strip_prefix("<bos>"),
            Some(c.llama_cpp.as_str()),
            "llama.cpp's gemma format"
        );
        // As ork feeds a chat prompt: no BOS added (the text has it), special tokens parsed.
        assert_eq!(tok.encode(&text, false, true).unwrap(), c.ids);
    }
    assert!(three_turns_with_system);
}
