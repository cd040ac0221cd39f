#!/usr/bin/env python3
"""Golden Gemma chat prompts for ork-exec's built-in Gemma template (crates/ork-exec/src/chat.rs).

Usage:  python3 scripts/chat_golden.py [GEMMA.gguf] > crates/ork-exec/tests/golden/chat_gemma3.json

The Gemma 3 270M GGUF carries no `tokenizer.chat_template`, so ork ships Gemma 3's template
(google/gemma-3-*-it, tokenizer_config.json; read here from chat.rs). For a few conversations
(a 3-turn one with a system message among them) this records:
- `hf`: that template rendered by Jinja2 as Hugging Face transformers renders chat templates
  (sandboxed environment, trim_blocks and lstrip_blocks, `raise_exception`);
- `llama_cpp`: llama.cpp's own built-in "gemma" format (llama_chat_apply_template), which leaves
  BOS to the tokenizer;
- `ids`: llama.cpp's tokens of BOS + the llama.cpp prompt (llama_tokenize, add_special and
  parse_special on), what the model is fed.
"""
import ctypes
import hashlib
import json
import os
import sys

import jinja2.sandbox
import llama_cpp

def ork_template() -> str:
    """GEMMA3_TEMPLATE from crates/ork-exec/src/chat.rs: Gemma 3's template (google/gemma-3-*-it,
    tokenizer_config.json "chat_template", the same for 270m-it..27b-it), as ork ships it."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "crates", "ork-exec", "src", "chat.rs"), encoding="utf-8") as f:
        src = f.read()
    start = src.index('pub const GEMMA3_TEMPLATE: &str = r#"') + len('pub const GEMMA3_TEMPLATE: &str = r#"')
    return src[start : src.index('"#;', start)]


GEMMA3_TEMPLATE = ork_template()

CONVERSATIONS = [
    [
        {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "  And of Japan?\n"},
    ],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "日本語で答えて 😀"},
    ],
]


def hf_render(messages, add_generation_prompt):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(GEMMA3_TEMPLATE).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token="<bos>", eos_token="<eos>"
    )


def llama_cpp_render(messages, add_generation_prompt):
    keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
    arr = (llama_cpp.llama_chat_message * len(keep))(
        *[llama_cpp.llama_chat_message(role=r, content=c) for r, c in keep]
    )
    size = 4096
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(b"gemma", arr, len(keep), add_generation_prompt, buf, size)
    assert 0 < n <= size, n
    return buf.raw[:n].decode("utf-8")


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", ".cache", "gemma-3-270m-q4_k_m.gguf")
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    assert "tokenizer.chat_template" not in llm.metadata, "this GGUF has its own template"
    cases = []
    for messages in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            lc = llama_cpp_render(messages, add_generation_prompt)
            ids = llm.tokenize(lc.encode("utf-8"), add_bos=True, special=True)
            cases.append(
                {
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "hf": hf_render(messages, add_generation_prompt),
                    "llama_cpp": lc,
                    "ids": ids,
                }
            )
    out = {
        "reference": f"Jinja2 {jinja2.__version__} (as transformers renders templates); "
        f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (llama_chat_apply_template 'gemma', llama_tokenize)",
        "model": os.path.basename(path),
        "model_sha256": sha,
        "template": GEMMA3_TEMPLATE,
        "cases": cases,
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
