//! Chat prompts from the model's own `tokenizer.chat_template` (Jinja, as in Hugging Face
//! tokenizer configs).
//!
//! The template is rendered with minijinja rather than matched against known formats: the file's
//! template carries details (SmolLM2's default system prompt, Qwen's tool blocks) that a
//! hand-written ChatML formatter would silently get wrong. Templates that need Python-only string
//! methods fail with [`ExecError::ChatTemplate`].
use crate::tokenizer::Tokenizer;
use crate::ExecError;
use ork_gguf::GgufFile;
use serde::Serialize;

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A turn with the given role.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_owned(),
            content: content.to_owned(),
        }
    }
}

/// A parsed chat template with the special-token texts it may refer to.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

const KEY: &str = "tokenizer.chat_template";

/// Instructions a template may execute in one render (minijinja "fuel"). Real templates spend a
/// few hundred per message; this allows conversations far longer than any context while
/// stopping a template that loops over `range(10**6)` inside another loop.
const TEMPLATE_FUEL: u64 = 20_000_000;

impl ChatTemplate {
    /// The model's template, or `None` if the file has none.
    pub fn from_gguf(
        gguf: &GgufFile,
        tokenizer: &Tokenizer,
    ) -> Result<Option<ChatTemplate>, ExecError> {
        let Some(v) = gguf.metadata(KEY) else {
            return Ok(None);
        };
        let source = v.as_str().ok_or_else(|| ExecError::InvalidMetadata {
            key: KEY.to_owned(),
            what: "not a string".to_owned(),
        })?;
        let text = |id: Option<u32>| -> String {
            id.and_then(|t| tokenizer.token_bytes(t, true))
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        ChatTemplate::new(source, &text(tokenizer.bos()), &text(tokenizer.eos())).map(Some)
    }

    /// Parse `source`; `bos_token` / `eos_token` are the texts the template sees under those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ExecError> {
        let t = ChatTemplate {
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        };
        t.environment()
            .template_from_str(&t.source)
            .map_err(template_error)?;
        Ok(t)
    }

    fn environment(&self) -> minijinja::Environment<'static> {
        let mut env = minijinja::Environment::new();
        // The template is untrusted text from the GGUF: bound the work a render may do, so a
        // hostile loop is an error, not a hang.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env
    }

    /// Render `messages`; with `add_generation_prompt` the text ends where the assistant's reply
    /// begins. Encode the result with `parse_special = true`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ExecError> {
        let env = self.environment();
        env.render_str(
            &self.source,
            minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            },
        )
        .map_err(template_error)
    }
}

fn template_error(e: minijinja::Error) -> ExecError {
    ExecError::ChatTemplate {
        what: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's `tokenizer.chat_template`, verbatim from the GGUF.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_renders_chatml_with_default_system() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let s = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let s = t
            .render(
                &[
                    ChatMessage::new("system", "Be brief."),
                    ChatMessage::new("user", "Hi"),
                ],
                false,
            )
            .unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn broken_and_raising_templates_are_errors() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(ExecError::ChatTemplate { .. })
        ));
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        assert!(matches!(
            t.render(&[], true),
            Err(ExecError::ChatTemplate { .. })
        ));
    }

    #[test]
    fn a_runaway_template_is_stopped_not_run() {
        // 10^12 iterations: only the fuel limit ends this render in finite time.
        let t = ChatTemplate::new(
            "{% for a in range(1000000) %}{% for b in range(1000000) %}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(matches!(
            t.render(&[], true),
            Err(ExecError::ChatTemplate { .. })
        ));
        // A long but real conversation stays well within the limit.
        let t = ChatTemplate::new(SMOLLM2, "", "").unwrap();
        let msgs: Vec<_> = (0..2000)
            .map(|i| ChatMessage::new("user", &i.to_string()))
            .collect();
        assert!(t.render(&msgs, true).is_ok());
    }
}
