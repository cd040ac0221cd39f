#!/usr/bin/env python3
"""Golden tokenizer ids for ork-exec, made with llama.cpp itself (through llama-cpp-python).

Usage:  pip install llama-cpp-python   (builds llama.cpp from source)
        python3 scripts/tokenizer_golden.py [MODEL.gguf] > crates/ork-exec/tests/golden/tokenizer.json

For each text it records llama.cpp's ids (llama_tokenize with add_special=False and the given
parse_special) and llama.cpp's detokenization of those ids with special tokens rendered. The Rust
test checks both directions against these.
"""
import hashlib
import json
import os
import sys

import llama_cpp

TEXTS = [
    "The capital of France is",
    "Hello world! 123 4567 89012 3.14159 1,000,000 -42 1e-5",
    "  multiple   spaces\tand\ttabs  ",
    "line one\nline two\r\n\n\nend\n",
    "\n",
    " leading space",
    "trailing space ",
    "a                    b",
    "\n\n\n\n    \n\t\t",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    'fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!("{:?}", v.len()); // Rust\n}\n',
    "It's they're we've I'm you'll he'd DON'T Can'T",
    "Café déjà vu, naïve façade, Ångström, Øre, Straße",
    "日本語のテキスト、中文文本和한국어 텍스트",
    "Emoji: 😀👍🏽 🇫🇷 👨‍👩‍👧 ✨",
    "∑_{i=1}^{n} x_i² ≤ ∞ — “quotes” ‘single’ …",
    "Ünïcödé ＦＵＬＬＷＩＤＴＨ ١٢٣ Ⅻ ½",
    "URL: https://example.com/path?q=1&r=two#frag <a href=\"x\">link</a>",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text<file_sep>more<|im_end|><|im_end|>",
    "",
]


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", ".cache", "SmolLM2-135M-Instruct.Q4_1.gguf")
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    cases = []
    for text in TEXTS:
        for parse_special in (False, True):
            if not parse_special and "<" not in text and text != TEXTS[0]:
                # Without special-token texts both modes agree; keep one copy (and one check
                # of the plain mode on an ordinary sentence).
                continue
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=parse_special)
            decoded = llm.detokenize(ids, special=True).decode("utf-8")
            cases.append({"text": text, "parse_special": parse_special, "ids": ids, "decoded": decoded})
    out = {
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (llama_tokenize, add_special=false)",
        "model": os.path.basename(path),
        "model_sha256": sha,
        "cases": cases,
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
