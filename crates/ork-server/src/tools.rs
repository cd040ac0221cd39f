//! Tool calls: which format a chat template's model writes its calls in, and a parser that
//! turns the generated text into OpenAI `tool_calls` as it streams.
//!
//! The formats and how they are recognised from the template's source follow llama.cpp's
//! `common/chat.cpp` (facts in docs/serve.md, "Tool calls"): a template that mentions
//! `<tool_call>` is Hermes 2 Pro's (Qwen2.5, Qwen3), one with an `ipython` header is Llama
//! 3.x's, one that mentions `[TOOL_CALLS]` is Mistral Nemo's. Output that is not a well-formed call
//! in its model's format is returned as plain content, never an error.
use crate::api::{ChatRequest, Message};
use crate::error::ApiError;
use ork_exec::{ChatMessage, ChatTemplate};
use serde_json::{json, Map, Value};

/// The tool-call formats ork parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes 2 Pro, Qwen2.5, Qwen3: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`,
    /// any number, with text around them.
    Hermes,
    /// Llama 3.1–3.3: the whole reply is `{"name": …, "parameters": {…}}` (several separated by
    /// `;`), or `<|python_tag|>` then such JSON, a built-in tool's `name.call(key=value, …)`, or
    /// code (a call of `python` with `{"code": …}`).
    Llama3,
    /// Mistral Nemo: the reply is `[TOOL_CALLS][{"name": …, "arguments": {…}, "id": …}, …]`.
    MistralNemo,
}

/// What `tool_choice` asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model answers in text; the tools are not shown to it.
    None,
    /// The model decides.
    Auto,
    /// The reply is started as a call (ork has no constrained decoding: the model may still
    /// write something else, which then comes back as content).
    Required,
    /// The reply is started as a call of this function.
    Function(String),
}

impl ToolFormat {
    /// The format of the model whose chat template is `source`, if ork knows it.
    /// The checks and their order are llama.cpp's; Functionary v3.1's Llama-based template
    /// (`<function=` calls), which llama.cpp recognises before Llama 3.x's, is not parsed.
    pub fn detect(source: &str) -> Option<ToolFormat> {
        if source.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if source.contains("<|start_header_id|>") && source.contains("<function=") {
            None
        } else if source.contains("<|start_header_id|>ipython<|end_header_id|>") {
            Some(ToolFormat::Llama3)
        } else if source.contains("[TOOL_CALLS]") {
            Some(ToolFormat::MistralNemo)
        } else {
            None
        }
    }

    /// The format's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "Hermes 2 Pro / Qwen <tool_call>",
            ToolFormat::Llama3 => "Llama 3.x JSON",
            ToolFormat::MistralNemo => "Mistral Nemo [TOOL_CALLS]",
        }
    }

    /// Special tokens of the format whose text the reply must show (they are control tokens in
    /// some vocabularies, which are otherwise not rendered).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &["<tool_call>", "</tool_call>"],
            ToolFormat::Llama3 => &[PYTHON_TAG],
            ToolFormat::MistralNemo => &[MISTRAL_TAG],
        }
    }

    /// Text appended to the prompt after the generation prompt so that the reply begins as a
    /// call, for `required` or a named function ("" otherwise). The parser is fed it first.
    pub fn prefill(self, choice: &ToolChoice) -> String {
        let quoted = |name: &str| Value::String(name.to_owned()).to_string();
        match (self, choice) {
            (_, ToolChoice::None | ToolChoice::Auto) => String::new(),
            (ToolFormat::Hermes, ToolChoice::Required) => "<tool_call>\n".to_owned(),
            (ToolFormat::Hermes, ToolChoice::Function(n)) => {
                format!("<tool_call>\n{{\"name\": {}, \"arguments\": ", quoted(n))
            }
            (ToolFormat::Llama3, ToolChoice::Required) => "{\"name\": \"".to_owned(),
            (ToolFormat::Llama3, ToolChoice::Function(n)) => {
                format!("{{\"name\": {}, \"parameters\": ", quoted(n))
            }
            (ToolFormat::MistralNemo, ToolChoice::Required) => MISTRAL_TAG.to_owned(),
            (ToolFormat::MistralNemo, ToolChoice::Function(n)) => {
                format!("{MISTRAL_TAG}[{{\"name\": {}, \"arguments\": ", quoted(n))
            }
        }
    }
}

/// What a chat request's `tools` and `tool_choice` come to with the server's template.
#[derive(Debug, Default)]
pub(crate) struct ToolPlan {
    /// The `tools` list shown to the template (`None`: none, or `tool_choice` none).
    pub tools: Option<Value>,
    /// The format replies are parsed in (`None`: plain text).
    pub format: Option<ToolFormat>,
    /// The start of the reply put in the prompt ([`ToolFormat::prefill`]).
    pub prefill: String,
}

/// Check a chat request's `tools` and `tool_choice` against `template`: a 400 naming the field
/// when the template cannot show tools to its model or ork cannot read its model's calls.
pub(crate) fn plan(template: &ChatTemplate, req: &ChatRequest) -> Result<ToolPlan, ApiError> {
    let tools: &[Value] = match &req.tools {
        None | Some(Value::Null) => &[],
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(ApiError::invalid(
                Some("tools"),
                format!("tools is {other}: expected a list of {{\"type\": \"function\", …}}"),
            ))
        }
    };
    let mut names = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let name = t
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        match (t.get("type").and_then(Value::as_str), name) {
            (Some("function"), Some(_))
                if t["function"]
                    .get("parameters")
                    .is_some_and(|p| !p.is_object() && !p.is_null()) =>
            {
                return Err(ApiError::invalid(
                    Some(&format!("tools[{i}].function.parameters")),
                    format!(
                        "parameters is {}: expected a JSON Schema object ({{\"type\": \"object\", \
                         \"properties\": {{…}}}})",
                        t["function"]["parameters"]
                    ),
                ))
            }
            (Some("function"), Some(n)) => names.push(n),
            _ => {
                return Err(ApiError::invalid(
                    Some(&format!("tools[{i}]")),
                    "a tool is {\"type\": \"function\", \"function\": {\"name\": …, \
                     \"parameters\": {…}}}",
                ))
            }
        }
    }
    let choice = match &req.tool_choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(v) => match v
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
        {
            Some(n) if v.get("type").and_then(Value::as_str) == Some("function") => {
                if !names.contains(&n) {
                    return Err(ApiError::invalid(
                        Some("tool_choice"),
                        format!("tool_choice names {n:?}, which is not in tools"),
                    ));
                }
                ToolChoice::Function(n.to_owned())
            }
            _ => {
                return Err(ApiError::invalid(
                    Some("tool_choice"),
                    format!(
                        "tool_choice is {v}: expected \"none\", \"auto\", \"required\" or \
                         {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
                    ),
                ))
            }
        },
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::None | ToolChoice::Auto => Ok(ToolPlan::default()),
            _ => Err(ApiError::invalid(
                Some("tool_choice"),
                "tool_choice asks for a call, but tools is empty",
            )),
        };
    }
    if choice == ToolChoice::None {
        return Ok(ToolPlan::default());
    }
    let format = template_format(template, "tools")?;
    Ok(ToolPlan {
        tools: req.tools.clone(),
        format: Some(format),
        prefill: format.prefill(&choice),
    })
}

/// The tool-call format of `template`, or a 400 naming `param` saying why there is none.
fn template_format(template: &ChatTemplate, param: &str) -> Result<ToolFormat, ApiError> {
    if !template.takes_tools() {
        return Err(ApiError::invalid(
            Some(param),
            "the model's chat template has no tools variable, so tools cannot reach the \
             model: serve it with a tool-calling template (ork serve --chat-template-file)",
        ));
    }
    ToolFormat::detect(template.source()).ok_or_else(|| {
        ApiError::invalid(
            Some(param),
            "the model's chat template takes tools, but its tool-call format is none ork \
             parses (Hermes/Qwen <tool_call>, Llama 3.x JSON, Mistral Nemo [TOOL_CALLS])",
        )
    })
}

/// Message `index` of the conversation as the template sees it (`text` its content):
/// `role: "tool"` turns and assistant `tool_calls` only with a template that has a tool-call
/// format (any other would drop them from the prompt without a word); call arguments given
/// as JSON text become objects, as templates expect.
pub(crate) fn chat_message(
    template: &ChatTemplate,
    index: usize,
    m: &Message,
    role: &str,
    text: &str,
) -> Result<ChatMessage, ApiError> {
    let mut out = ChatMessage::new(role, text);
    if role == "tool" {
        template_format(template, &format!("messages[{index}].role"))?;
        if m.tool_call_id.as_deref().is_none_or(str::is_empty) {
            return Err(ApiError::invalid(
                Some(&format!("messages[{index}].tool_call_id")),
                "a tool message answers one call: give the id of the assistant's tool call \
                 it answers (tool_call_id)",
            ));
        }
        out.tool_call_id = m.tool_call_id.clone();
        out.name = m.name.clone();
    }
    let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) else {
        return Ok(out);
    };
    let param = format!("messages[{index}].tool_calls");
    if role != "assistant" {
        return Err(ApiError::invalid(
            Some(&param),
            "only assistant messages carry tool_calls",
        ));
    }
    template_format(template, &param)?;
    let mut list = Vec::with_capacity(calls.len());
    for (j, c) in calls.iter().enumerate() {
        let at = format!("{param}[{j}].function.arguments");
        let arguments = match &c.function.arguments {
            Value::String(s) => serde_json::from_str::<Value>(s).map_err(|e| {
                let why = if e.to_string().contains("recursion limit") {
                    "they nest deeper than 128 levels, the most ork's JSON reader takes".to_owned()
                } else {
                    format!("they are not valid JSON ({e})")
                };
                ApiError::invalid(Some(&at), format!("the arguments cannot be read: {why}"))
            })?,
            v => v.clone(),
        };
        if !arguments.is_object() {
            return Err(ApiError::invalid(
                Some(&at),
                "the arguments are not a JSON object (the chat template shows them as one)",
            ));
        }
        list.push(json!({
            "id": c.id.clone().unwrap_or_else(|| format!("call_{j}")),
            "type": c.kind.clone().unwrap_or_else(|| "function".to_owned()),
            "function": {"name": c.function.name, "arguments": arguments},
        }));
    }
    out.tool_calls = Some(Value::Array(list));
    Ok(out)
}

const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_TAG: &str = "[TOOL_CALLS]";
const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";

/// One parsed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id (`call_…`, or the model's own for Mistral).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments, a JSON object as text.
    pub arguments: String,
}

/// A piece of the reply, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolDelta {
    /// Text for `content`.
    Content(String),
    /// A complete call.
    Call(ToolCall),
}

/// Where the parser is in the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Hermes: text, possibly a call's opening tag at its end.
    Text,
    /// Hermes: inside `<tool_call>`, waiting for the closing tag.
    InCall,
    /// Llama 3 / Mistral: the reply's start is not yet known to be a call or text.
    Undecided,
    /// Llama 3 / Mistral: the reply is a call, parsed at the end.
    Whole,
    /// Llama 3 / Mistral: the reply is text, passed through.
    Passthrough,
}

/// Turns generated text into [`ToolDelta`]s as it arrives: text that cannot be part of a call
/// goes out at once; a call goes out whole once its end is seen.
#[derive(Debug)]
pub struct ToolParser {
    format: ToolFormat,
    state: State,
    /// Text received and not yet given out.
    buf: String,
    /// Whitespace after the last text given out, held: dropped if a call follows.
    held_space: String,
    /// Calls given out so far.
    calls: usize,
    /// No text has been given out since the last call (whitespace there is dropped).
    after_call: bool,
    /// Prefix of the ids ork makes.
    id_prefix: String,
}

impl ToolParser {
    /// A parser for `format`; call ids are `{id_prefix}{n}`.
    pub fn new(format: ToolFormat, id_prefix: &str) -> ToolParser {
        ToolParser {
            format,
            state: match format {
                ToolFormat::Hermes => State::Text,
                ToolFormat::Llama3 | ToolFormat::MistralNemo => State::Undecided,
            },
            buf: String::new(),
            held_space: String::new(),
            calls: 0,
            after_call: false,
            id_prefix: id_prefix.to_owned(),
        }
    }

    /// Calls given out so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feed more generated text; what can be given out already.
    pub fn push(&mut self, text: &str) -> Vec<ToolDelta> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Text => {
                    if let Some(at) = self.buf.find(HERMES_OPEN) {
                        let before: String = self.buf.drain(..at + HERMES_OPEN.len()).collect();
                        self.text(&before[..at], &mut out);
                        self.state = State::InCall;
                        continue;
                    }
                    let keep = partial_suffix(&self.buf, HERMES_OPEN);
                    let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
                    self.text(&ready, &mut out);
                }
                State::InCall => {
                    if let Some(at) = self.buf.find(HERMES_CLOSE) {
                        let body: String = self.buf.drain(..at + HERMES_CLOSE.len()).collect();
                        self.hermes_call(&body[..at], true, &mut out);
                        self.state = State::Text;
                        continue;
                    }
                }
                State::Undecided => {
                    let start = self.buf.trim_start();
                    let tags: &[&str] = match self.format {
                        ToolFormat::Llama3 => &[PYTHON_TAG, "{"],
                        _ => &[MISTRAL_TAG],
                    };
                    if tags.iter().any(|t| start.starts_with(t)) {
                        self.state = State::Whole;
                    } else if start.is_empty() || tags.iter().any(|t| t.starts_with(start)) {
                        // Not enough text yet to tell.
                    } else {
                        self.state = State::Passthrough;
                        continue;
                    }
                }
                State::Passthrough => {
                    let text = std::mem::take(&mut self.buf);
                    self.text(&text, &mut out);
                }
                State::Whole => {}
            }
            return out;
        }
    }

    /// The end of the reply: what is left.
    pub fn finish(mut self) -> Vec<ToolDelta> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Text | State::Passthrough | State::Undecided => self.text(&rest, &mut out),
            // A call the model did not close (it stopped at its end-of-turn token instead):
            // taken if its JSON is whole.
            State::InCall => self.hermes_call(&rest, false, &mut out),
            State::Whole => match self.whole_calls(&rest) {
                Some(calls) => {
                    for (name, arguments, id) in calls {
                        self.call(name, arguments, id, &mut out);
                    }
                }
                None => self.text(&rest, &mut out),
            },
        }
        if self.calls == 0 && !self.held_space.is_empty() {
            out.push(ToolDelta::Content(std::mem::take(&mut self.held_space)));
        }
        out
    }

    /// Give out `text` as content, holding its trailing whitespace; whitespace right after a
    /// call is dropped.
    fn text(&mut self, text: &str, out: &mut Vec<ToolDelta>) {
        if text.is_empty() {
            return;
        }
        let text = if self.after_call {
            text.trim_start()
        } else {
            text
        };
        let body = text.trim_end();
        if body.is_empty() {
            self.held_space.push_str(text);
            return;
        }
        self.after_call = false;
        let mut piece = std::mem::take(&mut self.held_space);
        piece.push_str(body);
        self.held_space = text[body.len()..].to_owned();
        match out.last_mut() {
            Some(ToolDelta::Content(c)) => c.push_str(&piece),
            _ => out.push(ToolDelta::Content(piece)),
        }
    }

    /// A Hermes call's body (between the tags); `closed`: the closing tag was seen.
    fn hermes_call(&mut self, body: &str, closed: bool, out: &mut Vec<ToolDelta>) {
        let parsed = serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| named_call(&v, &["arguments", "parameters"]));
        match parsed {
            Some((name, arguments)) => self.call(name, arguments, None, out),
            None => {
                let close = if closed { HERMES_CLOSE } else { "" };
                let raw = format!("{HERMES_OPEN}{body}{close}");
                self.text(&raw, out);
            }
        }
    }

    /// The calls a whole Llama 3 / Mistral reply holds, or `None` if it is not one.
    #[allow(clippy::type_complexity)]
    fn whole_calls(&self, text: &str) -> Option<Vec<(String, String, Option<String>)>> {
        let text = text.trim();
        match self.format {
            ToolFormat::MistralNemo => {
                let list = text.strip_prefix(MISTRAL_TAG)?.trim();
                let Value::Array(items) = serde_json::from_str::<Value>(list).ok()? else {
                    return None;
                };
                let mut calls = Vec::with_capacity(items.len());
                for item in &items {
                    let (name, arguments) = named_call(item, &["arguments"])?;
                    let id = item.get("id").and_then(Value::as_str).map(str::to_owned);
                    calls.push((name, arguments, id));
                }
                (!calls.is_empty()).then_some(calls)
            }
            ToolFormat::Llama3 => {
                let (tagged, body) = match text.strip_prefix(PYTHON_TAG) {
                    Some(rest) => (true, rest.trim()),
                    None => (false, text),
                };
                if let Some(calls) = json_objects(body) {
                    return Some(calls.into_iter().map(|(n, a)| (n, a, None)).collect());
                }
                if !tagged {
                    return None;
                }
                if let Some((name, arguments)) = builtin_call(body) {
                    return Some(vec![(name, arguments, None)]);
                }
                // Code for the code interpreter, as llama.cpp reads it.
                let mut args = Map::new();
                args.insert("code".to_owned(), Value::String(body.to_owned()));
                Some(vec![(
                    "python".to_owned(),
                    Value::Object(args).to_string(),
                    None,
                )])
            }
            ToolFormat::Hermes => None,
        }
    }

    fn call(
        &mut self,
        name: String,
        arguments: String,
        id: Option<String>,
        out: &mut Vec<ToolDelta>,
    ) {
        self.held_space.clear();
        self.after_call = true;
        let id = id.unwrap_or_else(|| format!("{}{}", self.id_prefix, self.calls));
        self.calls += 1;
        out.push(ToolDelta::Call(ToolCall {
            id,
            name,
            arguments,
        }));
    }
}

/// Bytes at the end of `text` that are a proper prefix of `tag` (held back: the tag may be
/// completing).
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| text.ends_with(&tag[..k]))
        .unwrap_or(0)
}

/// `{"name": string, KEY: object-or-JSON-text}` (KEY the first of `keys` present; Llama 3
/// also writes `"type": "function"`): the name and the arguments as JSON text.
fn named_call(v: &Value, keys: &[&str]) -> Option<(String, String)> {
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let args = keys.iter().find_map(|k| obj.get(*k))?;
    let args = match args {
        Value::Object(_) => args.to_string(),
        // Some models write the arguments as a JSON string, as OpenAI sends them.
        Value::String(s) => match serde_json::from_str::<Value>(s).ok()? {
            o @ Value::Object(_) => o.to_string(),
            _ => return None,
        },
        _ => return None,
    };
    Some((name.to_owned(), args))
}

/// One or more Llama 3 JSON calls, separated by `;` or whitespace.
fn json_objects(text: &str) -> Option<Vec<(String, String)>> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = stream.next()?.ok()?;
        calls.push(named_call(&v, &["parameters", "arguments"])?);
        rest = rest[stream.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// A Llama 3 built-in tool call, `name.call(key=value, …)` with JSON values (single-quoted
/// strings too): the name and the arguments as a JSON object text.
fn builtin_call(text: &str) -> Option<(String, String)> {
    let (name, rest) = text.split_once(".call(")?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let inner = rest.trim_end().strip_suffix(')')?;
    let mut args = Map::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let after = after.trim_start();
        let (value, used) = if let Some(s) = after.strip_prefix('\'') {
            let end = s.find('\'')?;
            (Value::String(s[..end].to_owned()), end + 2)
        } else {
            let mut stream = serde_json::Deserializer::from_str(after).into_iter::<Value>();
            let v = stream.next()?.ok()?;
            (v, stream.byte_offset())
        };
        args.insert(key.to_owned(), value);
        rest = after[used..].trim_start();
        rest = match rest.strip_prefix(',') {
            Some(r) => r.trim_start(),
            None if rest.is_empty() => rest,
            None => return None,
        };
    }
    Some((name.to_owned(), Value::Object(args).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The deltas of `text` fed to a fresh parser in pieces of `step` bytes (at char
    /// boundaries), adjacent content merged.
    fn parse(format: ToolFormat, prefill: &str, text: &str, step: usize) -> Vec<ToolDelta> {
        let mut p = ToolParser::new(format, "call_");
        let mut out = p.push(prefill);
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(step) {
            out.extend(p.push(&piece.iter().collect::<String>()));
        }
        out.extend(p.finish());
        let mut merged: Vec<ToolDelta> = Vec::new();
        for d in out {
            match (merged.last_mut(), d) {
                (Some(ToolDelta::Content(a)), ToolDelta::Content(b)) => a.push_str(&b),
                (_, d) => merged.push(d),
            }
        }
        merged
    }

    /// The same deltas whatever the pieces the text comes in.
    fn parse_all(format: ToolFormat, prefill: &str, text: &str) -> Vec<ToolDelta> {
        let whole = parse(format, prefill, text, usize::MAX);
        for step in [1, 2, 3, 7] {
            assert_eq!(
                parse(format, prefill, text, step),
                whole,
                "step {step}: {text}"
            );
        }
        whole
    }

    fn call(id: &str, name: &str, args: &str) -> ToolDelta {
        ToolDelta::Call(ToolCall {
            id: id.to_owned(),
            name: name.to_owned(),
            arguments: args.to_owned(),
        })
    }

    fn content(s: &str) -> ToolDelta {
        ToolDelta::Content(s.to_owned())
    }

    #[test]
    fn a_conversation_with_calls_renders_through_qwen25s_template() {
        let template = ChatTemplate::new(
            include_str!("../tests/templates/qwen2.5-instruct.jinja"),
            "",
            "<|im_end|>",
        )
        .unwrap();
        let body = br#"{"model": "m", "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object"}}}], "tool_choice": "auto", "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"t\": 21}"}]}"#;
        let (req, _): (ChatRequest, _) = crate::api::parse(body).unwrap();
        let plan = plan(&template, &req).unwrap();
        assert_eq!(
            (plan.format, plan.prefill.as_str()),
            (Some(ToolFormat::Hermes), "")
        );
        let messages: Vec<ChatMessage> = req
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| chat_message(&template, i, m, &m.role, &m.text(i).unwrap()).unwrap())
            .collect();
        let text = template
            .render_with_tools(&messages, plan.tools.as_ref(), true)
            .unwrap();
        for part in [
            "<tools>\n{\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}},\"type\":\"function\"}\n</tools>",
            "<|im_start|>user\nWeather in Paris?<|im_end|>\n",
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call><|im_end|>\n",
            "<|im_start|>user\n<tool_response>\n{\"t\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
    }

    #[test]
    fn formats_are_recognised_from_the_template() {
        assert_eq!(
            ToolFormat::detect("{{ '<tool_call>\\n{\"name\": ...' }}"),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect("{{ '<|start_header_id|>ipython<|end_header_id|>' }}"),
            Some(ToolFormat::Llama3)
        );
        assert_eq!(
            ToolFormat::detect("{{ '[TOOL_CALLS]' }}"),
            Some(ToolFormat::MistralNemo)
        );
        // llama.cpp's order: Hermes first; Functionary's Llama template is not Llama 3.x's.
        assert_eq!(
            ToolFormat::detect("{{ '[TOOL_CALLS]' }} <tool_call>"),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect("<|start_header_id|>ipython<|end_header_id|> <function="),
            None
        );
        assert_eq!(ToolFormat::detect("<|im_start|>{{ m.content }}"), None);
    }

    #[test]
    fn hermes_calls_are_parsed_with_the_text_around_them() {
        let out = parse_all(
            ToolFormat::Hermes,
            "",
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        );
        assert_eq!(
            out,
            vec![
                content("Let me check."),
                call("call_0", "get_weather", r#"{"city":"Paris"}"#),
                call("call_1", "get_time", "{}"),
            ]
        );
        // Qwen3 thinks first; the thought stays content. An unclosed call whose JSON is whole
        // (the model ended its turn instead of closing) is taken.
        let out = parse_all(
            ToolFormat::Hermes,
            "",
            "<think>\nweather\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": \"{\\\"a\\\": 1}\"}\n",
        );
        assert_eq!(
            out,
            vec![
                content("<think>\nweather\n</think>"),
                call("call_0", "w", r#"{"a":1}"#)
            ]
        );
    }

    #[test]
    fn plain_answers_pass_through_unchanged() {
        for f in [
            ToolFormat::Hermes,
            ToolFormat::Llama3,
            ToolFormat::MistralNemo,
        ] {
            for text in ["The capital is Paris.\n", "  a < b {x} <tool", "\n\nHi", ""] {
                let out = parse_all(f, "", text);
                let expect = if text.is_empty() {
                    vec![]
                } else {
                    vec![content(text)]
                };
                assert_eq!(out, expect, "{f:?} {text:?}");
            }
        }
    }

    #[test]
    fn malformed_calls_come_back_as_content() {
        for text in [
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
            "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",
            "<tool_call>\n{\"name\": \"f\", \"argu",
        ] {
            assert_eq!(
                parse_all(ToolFormat::Hermes, "", text),
                vec![content(text)],
                "{text}"
            );
        }
        for text in [
            "{\"name\": \"f\", \"parameters\": {\"a\": 1}",
            "{\"name\": \"f\"}",
            "{\"name\": \"f\", \"parameters\": {}} trailing words",
        ] {
            assert_eq!(
                parse_all(ToolFormat::Llama3, "", text),
                vec![content(text)],
                "{text}"
            );
        }
        let text = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}";
        assert_eq!(
            parse_all(ToolFormat::MistralNemo, "", text),
            vec![content(text)]
        );
    }

    #[test]
    fn llama3_json_and_python_tag_calls() {
        assert_eq!(
            parse_all(
                ToolFormat::Llama3,
                "",
                "{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"
            ),
            vec![call("call_0", "get_weather", r#"{"city":"Paris"}"#)]
        );
        assert_eq!(
            parse_all(
                ToolFormat::Llama3,
                "",
                "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": [1, 2]}}"
            ),
            vec![call("call_0", "a", "{}"), call("call_1", "b", r#"{"x":[1,2]}"#)]
        );
        assert_eq!(
            parse_all(
                ToolFormat::Llama3,
                "",
                "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}"
            ),
            vec![call("call_0", "f", r#"{"q":"x"}"#)]
        );
        assert_eq!(
            parse_all(
                ToolFormat::Llama3,
                "",
                "<|python_tag|>brave_search.call(query=\"weather in Paris\", count=3)"
            ),
            vec![call(
                "call_0",
                "brave_search",
                r#"{"count":3,"query":"weather in Paris"}"#
            )]
        );
        assert_eq!(
            parse_all(
                ToolFormat::Llama3,
                "",
                "<|python_tag|>wolfram_alpha.call(query='2+2')"
            ),
            vec![call("call_0", "wolfram_alpha", r#"{"query":"2+2"}"#)]
        );
        assert_eq!(
            parse_all(ToolFormat::Llama3, "", "<|python_tag|>print(1 + 1)"),
            vec![call("call_0", "python", r#"{"code":"print(1 + 1)"}"#)]
        );
    }

    #[test]
    fn mistral_calls_keep_their_ids() {
        assert_eq!(
            parse_all(
                ToolFormat::MistralNemo,
                "",
                "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abcDEF123\"}, {\"name\": \"g\", \"arguments\": {}}]"
            ),
            vec![call("abcDEF123", "f", r#"{"a":1}"#), call("call_1", "g", "{}")]
        );
    }

    #[test]
    fn tool_choice_prefills_start_the_call() {
        for f in [
            ToolFormat::Hermes,
            ToolFormat::Llama3,
            ToolFormat::MistralNemo,
        ] {
            assert_eq!(f.prefill(&ToolChoice::Auto), "");
            assert_eq!(f.prefill(&ToolChoice::None), "");
            let named = f.prefill(&ToolChoice::Function("get_weather".to_owned()));
            // The model completes the arguments (and the closing).
            let rest = match f {
                ToolFormat::Hermes => "{\"city\": \"Paris\"}}\n</tool_call>",
                ToolFormat::Llama3 => "{\"city\": \"Paris\"}}",
                ToolFormat::MistralNemo => "{\"city\": \"Paris\"}}]",
            };
            assert_eq!(
                parse_all(f, &named, rest),
                vec![call("call_0", "get_weather", r#"{"city":"Paris"}"#)],
                "{f:?}"
            );
            let required = f.prefill(&ToolChoice::Required);
            let rest = match f {
                ToolFormat::Hermes => "{\"name\": \"t\", \"arguments\": {}}\n</tool_call>",
                ToolFormat::Llama3 => "t\", \"parameters\": {}}",
                ToolFormat::MistralNemo => "[{\"name\": \"t\", \"arguments\": {}}]",
            };
            assert_eq!(
                parse_all(f, &required, rest),
                vec![call("call_0", "t", "{}")],
                "{f:?}"
            );
        }
    }
}
