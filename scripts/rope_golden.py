#!/usr/bin/env python3
"""Reference logits of the RoPE-factor and phi3 test models, computed by llama.cpp
(llama-cpp-python 0.3.36) with an F32 KV cache.

Usage:  python3 scripts/rope_golden.py > crates/ork-exec/tests/golden/rope_logits.json

The models are made by ork's own generator (crates/ork-testkit/src/rope.rs, seeded, all F32);
this script asks cargo to write them into a temporary directory:
    cargo run -q -p ork-testkit --example rope_fixtures -- DIR
For each case (a file and the context llama.cpp runs it with) it records the file's size and
the logits of every position of TOKENS, evaluated in one batch from position 0. The LongRoPE
model is run twice: with n_ctx 256 (at most its original context of 512: the short factors)
and with n_ctx 1024 (the long factors).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import llama_cpp

# Token ids (the fixtures' vocabulary has 64 tokens; 1 is <s>).
TOKENS = [1, 5, 17, 33, 60, 9, 9, 42, 3, 27, 51, 14, 8, 63, 30, 22]
GGML_TYPE_F32 = 0
CASES = [
    ("llama-rope-freqs", "llama-rope-freqs", 256),
    ("phi3", "phi3", 256),
    ("phi3-longrope-short", "phi3-longrope", 256),
    ("phi3-longrope-long", "phi3-longrope", 1024),
]


def fixtures(out_dir: str) -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        ["cargo", "run", "-q", "-p", "ork-testkit", "--example", "rope_fixtures", "--", out_dir],
        cwd=os.path.join(here, ".."), check=True, capture_output=True, text=True,
    ).stdout
    return dict(line.split(" ", 1) for line in out.strip().splitlines())


def logits(path: str, n_ctx: int) -> list:
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
                          verbose=False, n_threads=2, type_k=GGML_TYPE_F32,
                          type_v=GGML_TYPE_F32)
    llm.reset()
    llm.eval(TOKENS)
    rows = np.array(llm.scores[: len(TOKENS)], dtype=np.float32)
    # 8 significant digits: within 1e-8 relative of the f32 value, half the file size.
    return [[float(f"{v:.8g}") for v in row] for row in rows]


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        paths = fixtures(d)
        cases = {}
        for case, fixture, n_ctx in CASES:
            path = paths[fixture]
            cases[case] = {
                "file": os.path.basename(path),
                "size": os.path.getsize(path),
                "n_ctx": n_ctx,
                "logits": logits(path, n_ctx),
            }
    out = {
        "llama_cpp_python": llama_cpp.__version__,
        "kv_cache": "f32",
        "tokens": TOKENS,
        "cases": cases,
    }
    json.dump(out, sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
