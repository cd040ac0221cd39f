#!/usr/bin/env python3
"""Golden tokenizer ids for ork-exec, made with llama.cpp itself (through llama-cpp-python).

Usage:  pip install llama-cpp-python   (builds llama.cpp from source)
        python3 scripts/tokenizer_golden.py [MODEL.gguf] > crates/ork-exec/tests/golden/tokenizer.json
        python3 scripts/tokenizer_golden.py .cache/gemma-3-270m-q4_k_m.gguf \
            > crates/ork-exec/tests/golden/tokenizer_gemma3.json

For each text it records llama.cpp's ids (llama_tokenize with the given add_special and
parse_special) and llama.cpp's detokenization of those ids (llama_detokenize, remove_special=false,
unparse_special=true). The Rust test checks both directions against these. A SentencePiece
(`tokenizer.ggml.model = llama`) vocabulary gets extra texts: byte-fallback characters, the
model's own special tokens, and BOS added as the file asks.

A wider check, not committed (the test that reads it is #[ignore]d; docs/models.md):
        python3 scripts/tokenizer_golden.py MODEL.gguf --random 3000 --text FILE > /tmp/wide.json
        ORK_TOKENIZER_GOLDEN=/tmp/wide.json ORK_TOKENIZER_MODEL=MODEL.gguf \
            cargo test -p ork-exec --test ork_exec -- --ignored tokenizer_golden::wide
records random strings drawn from many scripts, whitespace, byte-fallback characters and the
model's special texts (seeded), and FILE cut into 4,000-character pieces, both with
parse_special off and on.
"""
import random
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

# Extra texts for SentencePiece vocabularies (Gemma 3): characters outside the vocabulary (byte
# fallback), right-to-left scripts, combining marks, runs the vocabulary holds as user-defined
# tokens (spaces, newlines, tabs, HTML tags), and Gemma's control tokens.
SPM_TEXTS = [
    "Rare: 𠀀𓀀 🧌 ꙮ 𝔘 \u00a0nbsp \r\n crlf",
    "שלום עולם — مرحبا بالعالم (RTL) ١٢٣",
    "e\u0301 a\u0308 n\u0303 Z\u0335\u0310a\u0337lgo combining",
    "ZWJ 👩\u200d💻 and VS16 ❤\ufe0f, flags 🇯🇵🇺🇸",
    "\t\ttab\t run\t\t\t\t",
    "  two  spaces   three    four",
    "trailing newlines\n\n\n\n\n",
    "<table><tr><td>cell</td></tr></table> <b>bold</b>",
    "<start_of_turn>user\nWrite a haiku.<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> <unk> <pad> <mask> [multimodal] <unused0> <start_of_image>",
    "<start_of_turn><end_of_turn><start_of_turn>",
    "▁already▁escaped ▁",
    "Hello",
    " Hello",
    "x" * 300,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]

# (text, add_special) pairs also recorded with BOS/EOS as the file's flags ask.
ADD_SPECIAL_TEXTS = ["The capital of France is", "", "<start_of_turn>user\nHi<end_of_turn>\n", " leading space"]


def detokenize(llm, ids) -> str:
    """llama_detokenize(remove_special=false, unparse_special=true): the C API, not the Python
    wrapper (which reads each piece into a 32-byte buffer and strips a space after BOS)."""
    import ctypes

    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, True)
    assert 0 <= n <= size, n
    return buf.raw[:n].decode("utf-8")


# Building blocks of the random texts.
ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    " " * 8 + "\n" * 4 + "\t" * 3 + "\r\u00a0\u3000\u2581",
    ".,;:!?'\"()[]{}<>/\\|@#$%^&*-_=+~`",
    "的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明",
    "ひらがなカタカナ한국어텍스트",
    "😀👍🏽🇫🇷👨‍👩‍👧✨🧌🫠❤️",
    "\u0301\u0308\u0303\u0335\u200d\ufe0f",
    "שלוםעולםمرحبابالعالم١٢٣",
    "𠀀𓀀ꙮ𝔘\x01\x7f\ue000",
    "éèêëàâäôöûüçñßøåæœ",
]


def random_text(rng: random.Random, specials) -> str:
    out = []
    for _ in range(rng.randint(0, 40)):
        r = rng.random()
        if r < 0.1 and specials:
            out.append(rng.choice(specials))
        elif r < 0.2:
            out.append(rng.choice(["  ", "   ", "\n\n", "\t\t", " \n ", "    "]))
        else:
            a = rng.choice(ALPHABETS)
            out.append("".join(rng.choice(a) for _ in range(rng.randint(1, 8))))
        if rng.random() < 0.4:
            out.append(" ")
    return "".join(out)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    args = sys.argv[1:]
    n_random = 0
    text_file = None
    if "--random" in args:
        i = args.index("--random")
        n_random = int(args[i + 1])
        del args[i : i + 2]
    if "--text" in args:
        i = args.index("--text")
        text_file = args[i + 1]
        del args[i : i + 2]
    path = args[0] if args else os.path.join(here, "..", ".cache", "SmolLM2-135M-Instruct.Q4_1.gguf")
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    spm = llm.metadata.get("tokenizer.ggml.model") == "llama"
    texts = TEXTS + (SPM_TEXTS if spm else [])
    cases = []

    def case(text, parse_special, add_special):
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)
        c = {"text": text, "parse_special": parse_special, "ids": ids, "decoded": detokenize(llm, ids)}
        if add_special:
            c["add_special"] = True
        cases.append(c)

    for text in texts:
        for parse_special in (False, True):
            if not parse_special and "<" not in text and text != TEXTS[0]:
                # Without special-token texts both modes agree; keep one copy (and one check
                # of the plain mode on an ordinary sentence).
                continue
            case(text, parse_special, False)
    if n_random or text_file:
        # The wide check replaces the committed corpus.
        cases.clear()
        # Special texts of Gemma and SmolLM2 (a text that is not a token in one vocabulary is
        # just text there).
        specials = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<unk>", "<pad>", "<|im_start|>",
                    "<|im_end|>", "<|endoftext|>", "[multimodal]", "<td>", "<start_of_image>", "<unused5>"]
        rng = random.Random(20261205)
        for _ in range(n_random):
            t = random_text(rng, specials)
            for ps in (False, True):
                case(t, ps, False)
        if text_file:
            with open(text_file, encoding="utf-8") as f:
                whole = f.read()
            for at in range(0, len(whole), 4000):
                for ps in (False, True):
                    case(whole[at : at + 4000], ps, False)
    elif spm:
        for text in ADD_SPECIAL_TEXTS:
            case(text, True, True)
    out = {
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (llama_tokenize, llama_detokenize)",
        "model": os.path.basename(path),
        "model_sha256": sha,
        "cases": cases,
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
