//! A chat template is Jinja source read from the GGUF (or `--chat-template-file`): untrusted.
//! Parse arbitrary template text and render it over messages taken from the input, under the
//! bounds the server sets (an output bound, the render's fuel and nesting limit). Any panic or
//! output past the bound is a bug: a hostile template must come back as `ExecError::ChatTemplate`
//! or `ExecError::ChatTemplateLimit`. Time and memory are libFuzzer's limits — run with
//! `-timeout=10 -rss_limit_mb=2048` so that a render that outlives the fuel's promise (seconds)
//! or allocates without bound is reported as a finding (docs/serve.md, "Chat templates").
//! Input: template source, then NUL-separated message contents (roles alternate user/assistant).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ork_exec::{ChatMessage, ChatTemplate, ExecError};

/// The output bound of the fuzzed renders (the server's is what its context holds).
const MAX_BYTES: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let source = parts.next().unwrap_or_default();
    let messages: Vec<ChatMessage> = parts
        .take(16)
        .enumerate()
        .map(|(i, c)| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, c))
        .collect();
    if let Ok(t) = ChatTemplate::new(source, "<s>", "</s>") {
        let t = t.with_max_bytes(MAX_BYTES);
        for add_generation_prompt in [true, false] {
            match t.render(&messages, add_generation_prompt) {
                Ok(out) => assert!(out.len() <= MAX_BYTES, "{} bytes rendered", out.len()),
                Err(ExecError::ChatTemplate { .. } | ExecError::ChatTemplateLimit { .. }) => {}
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
    }
});
