#!/usr/bin/env python3
"""Reference numbers for ork's gemma3, computed by llama.cpp (llama-cpp-python 0.3.36, CPU).

Usage:
    python3 scripts/gemma3_golden.py [.cache/gemma-3-270m-q4_k_m.gguf] \\
        > crates/ork-exec/tests/golden/gemma3_logits.json

Writes (tokens are recorded as ids, so ork's tests do not depend on a tokenizer):
- `tiny`: a small random gemma3 model written here with gguf-py
  (crates/ork-exec/tests/golden/gemma3_tiny.gguf: 6 layers, every 6th global, a sliding window of
  4, QK-norm, post-norms, tied output, final logit soft-cap 3), its logits at every position of
  a 20-token sequence (one batch from position 0, F32 KV cache): checks the computation itself,
  the sliding window included, which a short sequence on the real model never reaches.
- `model`: the real Gemma 3 270M file's sha256; `logits`: top-5 ids and logits at every position
  of a fixed text (BOS first, F16 KV cache as llama.cpp's default); `greedy`: three prompts and
  llama.cpp's first 16 greedy tokens for each, with the gap between its two best logits at each
  step (a step whose gap is below quantization noise is a tie); `perplexity`: llama-perplexity's protocol on
  /usr/share/common-licenses/GPL-3 (n_ctx 512, BOS replacing each chunk's first token, second
  half of each chunk scored), with the negative log-likelihood summed per chunk so that a test can
  compare the first chunks alone.
"""
import hashlib
import json
import math
import os
import sys

import numpy as np
import gguf
import llama_cpp

GGML_TYPE_F32 = 0
HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "crates", "ork-exec", "tests", "golden")
TINY = os.path.join(GOLDEN, "gemma3_tiny.gguf")

TEXT = (
    "The river runs past the old mill, where the miller's daughter keeps the accounts in a green "
    "ledger. Every morning she walks to the bridge, counts the barges, and writes their names. "
    "def mean(values):\n    return sum(values) / len(values)\n"
)
PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def fibonacci(n):",
]
N_GREEDY = 16
PPL_CTX = 512
GPL = "/usr/share/common-licenses/GPL-3"


def top5(rows):
    out = []
    for row in rows:
        ids = np.argsort(-row, kind="stable")[:5]
        out.append({"ids": [int(i) for i in ids], "logits": [float(row[i]) for i in ids]})
    return out


def write_tiny(path):
    """A random gemma3 model: 6 layers (5 local, 1 global), window 4, tied output."""
    rng = np.random.default_rng(3)
    n_layer, d, ff, n_head, n_kv, hd = 6, 32, 48, 2, 1, 16
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + [
        "\u2581the", "\u2581a", "\u2581mill", "\u2581river", "\u2581runs", "\u2581old",
        "\u2581bridge", "\u2581ledger", "\u2581green", "\u2581she", "\u2581writes", "\u2581names",
    ]
    types = [3, 3, 3, 2] + [6] * 256 + [1] * 12
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    w.add_sliding_window(4)
    w.add_final_logit_softcapping(3.0)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)

    def t(name, shape, scale, offset=0.0):
        # gguf-py takes numpy shapes (outermost first): a [K, N] GGUF tensor is (N, K).
        w.add_tensor(name, (rng.uniform(-scale, scale, size=shape) + offset).astype(np.float32))

    t("token_embd.weight", (len(tokens), d), 1.0)
    for i in range(n_layer):
        b = f"blk.{i}."
        t(b + "attn_norm.weight", (d,), 0.2, 1.0)
        t(b + "attn_q.weight", (n_head * hd, d), 1.5 / math.sqrt(d))
        t(b + "attn_k.weight", (n_kv * hd, d), 1.5 / math.sqrt(d))
        t(b + "attn_v.weight", (n_kv * hd, d), 1.5 / math.sqrt(d))
        t(b + "attn_q_norm.weight", (hd,), 0.2, 1.0)
        t(b + "attn_k_norm.weight", (hd,), 0.2, 1.0)
        t(b + "attn_output.weight", (d, n_head * hd), 1.5 / math.sqrt(n_head * hd))
        t(b + "post_attention_norm.weight", (d,), 0.2, 1.0)
        t(b + "ffn_norm.weight", (d,), 0.2, 1.0)
        t(b + "ffn_gate.weight", (ff, d), 1.5 / math.sqrt(d))
        t(b + "ffn_up.weight", (ff, d), 1.5 / math.sqrt(d))
        t(b + "ffn_down.weight", (d, ff), 1.5 / math.sqrt(ff))
        t(b + "post_ffw_norm.weight", (d,), 0.2, 1.0)
    t("output_norm.weight", (d,), 0.2, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return len(tokens)


def tiny():
    vocab = write_tiny(TINY)
    rng = np.random.default_rng(7)
    seq = [2] + [int(x) for x in rng.integers(4, vocab, size=19)]
    llm = llama_cpp.Llama(model_path=TINY, n_ctx=64, n_batch=64, logits_all=True, verbose=False,
                          n_threads=2, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    llm.reset()
    llm.eval(seq)
    logits = np.array(llm.scores[: len(seq)], dtype=np.float32)
    with open(TINY, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return {"sha256": sha, "tokens": seq, "logits": [[float(x) for x in row] for row in logits]}


def real(path):
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    llm = llama_cpp.Llama(model_path=path, n_ctx=PPL_CTX, n_batch=PPL_CTX, logits_all=True,
                          verbose=False, n_threads=2)
    seq = llm.tokenize(TEXT.encode("utf-8"), add_bos=True, special=False)
    llm.reset()
    llm.eval(seq)
    logits = top5(np.array(llm.scores[: len(seq)], dtype=np.float32))

    greedy = []
    for p in PROMPTS:
        prompt = llm.tokenize(p.encode("utf-8"), add_bos=True, special=False)
        llm.reset()
        llm.eval(prompt)
        out, gaps = [], []
        for _ in range(N_GREEDY):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            best = np.argsort(-row, kind="stable")[:2]
            t = int(best[0])
            out.append(t)
            gaps.append(float(row[best[0]] - row[best[1]]))
            llm.eval([t])
        greedy.append({"prompt": p, "tokens": [int(t) for t in prompt], "greedy": out, "gaps": gaps})

    with open(GPL, "rb") as f:
        text = f.read()
    toks = llm.tokenize(text, add_bos=True, special=False)
    bos = llm.token_bos()
    n_chunk = len(toks) // PPL_CTX
    first = PPL_CTX // 2
    chunks = []
    for c in range(n_chunk):
        chunk = list(toks[c * PPL_CTX:(c + 1) * PPL_CTX])
        chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        sc = np.array(llm.scores[:PPL_CTX], dtype=np.float32)
        nll = 0.0
        for j in range(first, PPL_CTX - 1):
            row = sc[j].astype(np.float64)
            m = row.max()
            lse = m + math.log(np.exp(row - m).sum())
            nll += lse - row[chunk[j + 1]]
        chunks.append(nll)
        print(f"chunk {c + 1}/{n_chunk}: ppl so far {math.exp(sum(chunks) / (len(chunks) * (PPL_CTX - 1 - first))):.4f}",
              file=sys.stderr)
    scored = n_chunk * (PPL_CTX - 1 - first)
    return {
        "sha256": sha,
        "tokens": [int(t) for t in seq],
        "top5": logits,
        "greedy": greedy,
        "perplexity": {
            "file": GPL,
            "n_ctx": PPL_CTX,
            "tokens": [int(t) for t in toks],
            "chunk_nll": chunks,
            "scored_per_chunk": PPL_CTX - 1 - first,
            "ppl": math.exp(sum(chunks) / scored),
        },
    }


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", ".cache", "gemma-3-270m-q4_k_m.gguf")
    out = {
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, CPU",
        "tiny": tiny(),
        "model": real(path),
    }
    json.dump(out, sys.stdout, indent=None)


if __name__ == "__main__":
    main()
