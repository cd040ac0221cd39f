#!/usr/bin/env python3
"""Reference greedy tokens and logits of the MoE test models, computed by llama.cpp
(llama-cpp-python 0.3.36) with an F32 KV cache.

Usage:  python3 scripts/moe_golden.py > crates/ork-exec/tests/golden/moe_logits.json

The models are made by ork's own generator (crates/ork-testkit/src/moe.rs) from the real
SmolLM2 model; this script asks cargo for their paths (making them if needed):
    cargo run -q --release -p ork-testkit --example moe_fixtures
For each of the perturbed upcycled llama, the qwen3moe and the qwen2moe fixture it records the
file's size, the prompt tokens, 16 greedy tokens, and per position of prompt + greedy tokens the
top-5 token ids with their logits (one evaluation of the whole sequence from position 0).
"""
import json
import os
import subprocess
import sys

import numpy as np
import llama_cpp

PROMPT = "The capital of France is"
N_GREEDY = 16
GGML_TYPE_F32 = 0


def fixtures() -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        ["cargo", "run", "-q", "--release", "-p", "ork-testkit", "--example", "moe_fixtures"],
        cwd=os.path.join(here, ".."), check=True, capture_output=True, text=True,
    ).stdout
    return dict(line.split(" ", 1) for line in out.strip().splitlines())


def golden(path: str) -> dict:
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=256, logits_all=True, verbose=False,
                          n_threads=2, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    prompt = llm.tokenize(PROMPT.encode("utf-8"), add_bos=False, special=False)
    llm.reset()
    llm.eval(prompt)
    greedy = []
    for _ in range(N_GREEDY):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy.append(t)
        llm.eval([t])
    tokens = list(prompt) + greedy
    # Logits of the whole sequence in one batch from position 0.
    llm.reset()
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    top = []
    for row in logits:
        ids = np.argsort(-row, kind="stable")[:5]
        top.append({"ids": [int(i) for i in ids], "logits": [float(row[i]) for i in ids]})
    return {
        "file": os.path.basename(path),
        "size": os.path.getsize(path),
        "prompt": [int(t) for t in prompt],
        "greedy": greedy,
        "top5": top,
    }


def main() -> None:
    paths = fixtures()
    out = {
        "llama_cpp_python": llama_cpp.__version__,
        "kv_cache": "f32",
        "models": {name: golden(paths[name]) for name in ["perturbed", "qwen3moe", "qwen2moe"]},
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
