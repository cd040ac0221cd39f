//! A chat template is Jinja source read from the GGUF: untrusted. Parse arbitrary template text
//! and render it over messages taken from the input. Any panic, hang or runaway allocation is a
//! bug: a hostile template must come back as `ExecError::ChatTemplate`.
//! Input: template source, then NUL-separated message contents (roles alternate user/assistant).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ork_exec::{ChatMessage, ChatTemplate};

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
        let _ = t.render(&messages, true);
        let _ = t.render(&messages, false);
    }
});
