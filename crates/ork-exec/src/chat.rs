//! Chat prompts from the model's own `tokenizer.chat_template` (Jinja, as in Hugging Face
//! tokenizer configs).
//!
//! The template is rendered with minijinja rather than matched against known formats: the file's
//! template carries details (SmolLM2's default system prompt, Qwen's tool blocks) that a
//! hand-written ChatML formatter would silently get wrong. Templates that need Python-only string
//! methods fail with [`ExecError::ChatTemplate`].
//!
//! A Gemma GGUF without a template (Gemma 3 270M's has none) gets Gemma 3's own template,
//! [`GEMMA3_TEMPLATE`] (docs/models.md, Chat templates).
use crate::tokenizer::{TokenKind, Tokenizer};
use crate::ExecError;
use ork_gguf::GgufFile;
use serde::{Deserialize, Serialize};

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant turn's tool calls, as templates read them (`[{"id", "type": "function",
    /// "function": {"name", "arguments": {…}}}]`, arguments as an object); absent (undefined
    /// in the template) when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` turn's answer is to this call id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` turn's function name, when the client gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A turn with the given role.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_owned(),
            content: content.to_owned(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// A parsed chat template with the special-token texts it may refer to.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
    max_bytes: usize,
}

const KEY: &str = "tokenizer.chat_template";

/// Gemma 3's chat template, verbatim from `google/gemma-3-*-it`'s `tokenizer_config.json`: the
/// system message is folded into the first user turn, `assistant` is called `model`, each turn is
/// `<start_of_turn>ROLE\n…<end_of_turn>\n`, and the text starts with `bos_token` (ork encodes
/// rendered prompts with `add_special = false`). Rendered by ork it equals Hugging Face's
/// rendering, and llama.cpp's built-in `gemma` format after BOS (tests/golden/chat_gemma3.json,
/// from scripts/chat_golden.py).
pub const GEMMA3_TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#;

/// Instructions (minijinja "fuel") a render may execute: [`FUEL_BASE`] plus [`FUEL_PER_ITEM`]
/// for each message and tool. Real templates spend tens of instructions per message (SmolLM2's
/// ~20, Gemma 3's ~50) and a few hundred per tool, so this allows any real conversation with
/// room to spare, while a loop of `range(100000)` stops within its first few thousand turns. Fuel counts
/// instructions, not bytes: a template that grows a string in a loop copies O(n²) bytes in n
/// instructions, and a small fuel is what keeps that to about a second (docs/serve.md, "Templates").
pub const FUEL_BASE: u64 = 10_000;
/// See [`FUEL_BASE`].
pub const FUEL_PER_ITEM: u64 = 1_000;
/// Nesting depth (macros, includes, recursive loops) a template may reach; minijinja's default
/// is 500.
const RECURSION_LIMIT: usize = 100;
/// The output a template may produce when no context is given
/// ([`ChatTemplate::with_max_bytes`] sets it from the context): 64 MiB.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// The longest text, in bytes, that can fit `context` tokens of `tokenizer`: every token covers
/// at most as many bytes of text as its longest piece, so a text longer than that many bytes
/// per token has more tokens than the context. Twice that bound, for normalizers that shorten
/// text before it is split.
pub fn max_text_bytes(tokenizer: &Tokenizer, context: usize) -> usize {
    let longest = (0..tokenizer.vocab_size() as u32)
        .filter_map(|t| tokenizer.token_bytes(t, true).map(<[u8]>::len))
        .max()
        .unwrap_or(1)
        .max(1);
    longest.saturating_mul(context).saturating_mul(2)
}

/// A render's output, refused past `max` bytes: the render stops at the first write beyond.
struct Bounded {
    text: Vec<u8>,
    max: usize,
    exceeded: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len().saturating_add(buf.len()) > self.max {
            self.exceeded = true;
            return Err(std::io::Error::other("the output bound is reached"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// The model's template, or `None` if the file has none. A Gemma model
    /// (`general.architecture` `gemma*` whose vocabulary has the control tokens
    /// `<start_of_turn>` and `<end_of_turn>`) without one gets [`GEMMA3_TEMPLATE`].
    pub fn from_gguf(
        gguf: &GgufFile,
        tokenizer: &Tokenizer,
    ) -> Result<Option<ChatTemplate>, ExecError> {
        let source = match gguf.metadata(KEY) {
            Some(v) => v.as_str().ok_or_else(|| ExecError::InvalidMetadata {
                key: KEY.to_owned(),
                what: "not a string".to_owned(),
            })?,
            None if is_gemma(gguf, tokenizer) => GEMMA3_TEMPLATE,
            None => return Ok(None),
        };
        ChatTemplate::with_tokenizer(source, tokenizer).map(Some)
    }

    /// Parse `source` (a template given instead of the file's) with `tokenizer`'s BOS and EOS
    /// texts.
    pub fn with_tokenizer(source: &str, tokenizer: &Tokenizer) -> Result<ChatTemplate, ExecError> {
        let text = |id: Option<u32>| -> String {
            id.and_then(|t| tokenizer.token_bytes(t, true))
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        ChatTemplate::new(source, &text(tokenizer.bos()), &text(tokenizer.eos()))
    }

    /// Parse `source`; `bos_token` / `eos_token` are the texts the template sees under those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ExecError> {
        let t = ChatTemplate {
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            max_bytes: DEFAULT_MAX_BYTES,
        };
        t.environment(FUEL_BASE)
            .template_from_str(&t.source)
            .map_err(template_error)?;
        Ok(t)
    }

    /// The same template, its renders stopped with [`ExecError::ChatTemplateLimit`] as soon as
    /// their output exceeds `max_bytes` (for a prompt: [`max_text_bytes`] of the context, what
    /// the context can hold).
    pub fn with_max_bytes(mut self, max_bytes: usize) -> ChatTemplate {
        self.max_bytes = max_bytes;
        self
    }

    /// The bound on a render's output ([`ChatTemplate::with_max_bytes`]).
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The Jinja source being rendered (tool-call formats are recognised from it).
    pub fn source(&self) -> &str {
        &self.source
    }

    fn environment(&self, fuel: u64) -> minijinja::Environment<'static> {
        let mut env = minijinja::Environment::new();
        // The template is untrusted text from the GGUF: bound the work a render may do, so a
        // hostile loop is an error, not a hang.
        env.set_fuel(Some(fuel));
        env.set_recursion_limit(RECURSION_LIMIT);
        // Python's str/dict/list methods, which tool-calling templates use.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
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
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with OpenAI's `tools` list (`[{"type": "function", "function":
    /// {…}}]`) in the template's `tools` variable, as Hugging Face's `apply_chat_template` and
    /// llama-server's `--jinja` pass it; `None` leaves `tools` undefined. In a program that
    /// called [`crate::chat_worker::isolate_renders`] the render runs in a child process whose
    /// memory and time are bounded (a bound reached is [`ExecError::ChatTemplateLimit`]).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ExecError> {
        if let Some(exe) = crate::chat_worker::worker() {
            let req = crate::chat_worker::Request {
                source: self.source.clone(),
                bos_token: self.bos_token.clone(),
                eos_token: self.eos_token.clone(),
                max_bytes: self.max_bytes,
                messages: messages.to_vec(),
                tools: tools.cloned(),
                add_generation_prompt,
            };
            return crate::chat_worker::render_in_child(exe, &req);
        }
        self.render_here(messages, tools, add_generation_prompt)
    }

    /// [`ChatTemplate::render_with_tools`] in this process, bounded by fuel and the output
    /// bound only (`crate::chat_worker` bounds memory and time as well).
    pub(crate) fn render_here(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ExecError> {
        let items = messages.len() + tools.and_then(|t| t.as_array()).map_or(0, Vec::len);
        let fuel = FUEL_BASE.saturating_add(FUEL_PER_ITEM.saturating_mul(items as u64));
        let env = self.environment(fuel);
        let base = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        // Without tools the variable stays undefined, as `apply_chat_template` leaves it.
        let ctx = match tools {
            Some(t) => minijinja::context! { tools => t, ..base },
            None => base,
        };
        let template = env
            .template_from_str(&self.source)
            .map_err(template_error)?;
        let mut out = Bounded {
            text: Vec::new(),
            max: self.max_bytes,
            exceeded: false,
        };
        let rendered = template.render_captured_to(ctx, &mut out).map(drop);
        match rendered {
            Ok(_) => String::from_utf8(out.text).map_err(|_| ExecError::ChatTemplate {
                what: "the output is not UTF-8".to_owned(),
            }),
            Err(_) if out.exceeded => Err(ExecError::ChatTemplateLimit {
                what: format!(
                    "its output exceeds {} bytes, more than the context can hold",
                    self.max_bytes
                ),
            }),
            Err(e) => Err(limit_or_template_error(e, fuel)),
        }
    }

    /// Whether the template reads a `tools` variable (without one, tool definitions cannot
    /// reach the prompt).
    pub fn takes_tools(&self) -> bool {
        let env = self.environment(FUEL_BASE);
        env.template_from_str(&self.source)
            .map(|t| t.undeclared_variables(false).contains("tools"))
            .unwrap_or(false)
    }
}

/// Whether `gguf` is a Gemma model whose vocabulary has Gemma's turn markers as control tokens.
fn is_gemma(gguf: &GgufFile, tokenizer: &Tokenizer) -> bool {
    let arch = gguf
        .metadata("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    arch.starts_with("gemma")
        && ["<start_of_turn>", "<end_of_turn>"].iter().all(|marker| {
            matches!(tokenizer.encode(marker, false, true).as_deref(),
                Ok(&[id]) if tokenizer.kind(id) == Some(TokenKind::Control))
        })
}

fn template_error(e: minijinja::Error) -> ExecError {
    ExecError::ChatTemplate {
        what: e.to_string(),
    }
}

/// A render error: a bound (fuel, nesting) is [`ExecError::ChatTemplateLimit`].
fn limit_or_template_error(e: minijinja::Error, fuel: u64) -> ExecError {
    let what = match e.kind() {
        minijinja::ErrorKind::OutOfFuel => format!(
            "it ran more than {fuel} instructions ({FUEL_BASE} and {FUEL_PER_ITEM} per message \
             and tool), far more than a chat template needs"
        ),
        _ if e.to_string().contains("recursion limit") => {
            format!("it nests deeper than {RECURSION_LIMIT} levels")
        }
        _ => return template_error(e),
    };
    ExecError::ChatTemplateLimit { what }
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
    fn gemma3_template_folds_the_system_message_and_checks_roles() {
        let t = ChatTemplate::new(GEMMA3_TEMPLATE, "<bos>", "<eos>").unwrap();
        let s = t
            .render(
                &[
                    ChatMessage::new("system", "Be brief."),
                    ChatMessage::new("user", " Hi\n"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            s,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
        // Two user turns in a row: the template's own raise_exception.
        let r = t.render(
            &[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")],
            true,
        );
        assert!(matches!(r, Err(ExecError::ChatTemplate { .. })));
    }

    #[test]
    fn tools_and_tool_turns_reach_the_template() {
        let src = "{% if tools %}{% for t in tools %}[{{ t.function.name }}:{{ t | tojson }}]{% endfor %}{% endif %}\
                   {% for m in messages %}{{ m.role }}={{ m.content }}\
                   {% if m.tool_calls %}{% for c in m.tool_calls %}<{{ c.function.name }} {{ c.function.arguments.city }}>{% endfor %}{% endif %}\
                   {% if m.tool_call_id is defined %}#{{ m.tool_call_id }}{% endif %};{% endfor %}\
                   {{ 'x'.startswith('x') }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert!(t.takes_tools());
        assert!(!ChatTemplate::new(SMOLLM2, "", "").unwrap().takes_tools());
        let tools = serde_json::json!([{"type": "function", "function": {"name": "weather"}}]);
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = Some(serde_json::json!([
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
        ]));
        let mut answer = ChatMessage::new("tool", "sunny");
        answer.tool_call_id = Some("c1".to_owned());
        let msgs = [ChatMessage::new("user", "Hi"), call, answer];
        let s = t.render_with_tools(&msgs, Some(&tools), true).unwrap();
        assert_eq!(
            s,
            r#"[weather:{"function":{"name":"weather"},"type":"function"}]user=Hi;assistant=<weather Paris>;tool=sunny#c1;True"#
        );
        // No tools: the variable is undefined, and plain turns carry no tool fields.
        let s = t.render(&msgs[..1], true).unwrap();
        assert_eq!(s, "user=Hi;True");
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
        // 10^10 iterations: only the fuel limit ends this render in finite time.
        let t = ChatTemplate::new(
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(matches!(
            t.render(&[], true),
            Err(ExecError::ChatTemplateLimit { .. })
        ));
        // A long but real conversation stays well within the limit.
        let t = ChatTemplate::new(SMOLLM2, "", "").unwrap();
        let msgs: Vec<_> = (0..2000)
            .map(|i| ChatMessage::new("user", &i.to_string()))
            .collect();
        assert!(t.render(&msgs, true).is_ok());
    }

    #[test]
    fn a_template_bomb_is_stopped_at_the_output_bound() {
        // 10 GB of output: stopped as soon as it passes the bound, not after allocating it.
        let t = ChatTemplate::new(
            r#"{% for i in range(100000) %}{{ "y" * 100000 }}{% endfor %}"#,
            "",
            "",
        )
        .unwrap()
        .with_max_bytes(1 << 20);
        let r = t.render(&[ChatMessage::new("user", "Hi")], true);
        assert!(
            matches!(&r, Err(ExecError::ChatTemplateLimit { what }) if what.contains("1048576")),
            "{r:?}"
        );
        // Within the bound: rendered.
        let t = ChatTemplate::new("{{ 'y' * 1000 }}", "", "")
            .unwrap()
            .with_max_bytes(1000);
        assert_eq!(t.render(&[], true).unwrap().len(), 1000);
        let t = t.with_max_bytes(999);
        assert!(matches!(
            t.render(&[], true),
            Err(ExecError::ChatTemplateLimit { .. })
        ));
    }

    #[test]
    fn a_template_that_builds_a_string_in_a_loop_is_stopped_by_its_fuel() {
        let t = ChatTemplate::new(
            r#"{% set ns = namespace(s="") %}{% for i in range(100000) %}{% set ns.s = ns.s ~ "abcdefghij" * 100 %}{% endfor %}{{ ns.s | length }}"#,
            "",
            "",
        )
        .unwrap();
        let started = std::time::Instant::now();
        let r = t.render(&[ChatMessage::new("user", "Hi")], true);
        assert!(
            matches!(&r, Err(ExecError::ChatTemplateLimit { what }) if what.contains("instructions")),
            "{r:?}"
        );
        // Reported, not asserted (timing): the stop comes after at most FUEL_BASE instructions.
        eprintln!("stopped after {:?}", started.elapsed());
        // Endless recursion through a macro: stopped at the nesting bound.
        let t = ChatTemplate::new(
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "",
            "",
        )
        .unwrap();
        let r = t.render(&[], true);
        assert!(
            matches!(&r, Err(ExecError::ChatTemplateLimit { what }) if what.contains("nests")),
            "{r:?}"
        );
    }
}
