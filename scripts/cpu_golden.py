#!/usr/bin/env python3
"""llama.cpp's CPU results on each GGUF file, for crates/ork-cpu/tests/ork_cpu/llama_cpp.rs.

Usage:  python3 scripts/cpu_golden.py OUT_DIR MODEL.gguf [MODEL.gguf ...]

For each model, llama.cpp (llama-cpp-python 0.3.36, CPU, 2 threads) computes, and the script writes
to `OUT_DIR/<model file name>.json` (atomically: a temporary name, then a rename):
- `logits`: the text of scripts/exec_logits_golden.py, tokenized by the model's vocabulary and
  evaluated in one batch from position 0. For every position: the row's min and max, the top-8 ids
  with their logits, and the logits of 24 fixed ids (`probe_ids`, the same for every row, drawn
  once with a seeded generator). The last row is recorded whole.
- `greedy`: a fixed prompt, then 32 greedy tokens decoded one at a time; with each token, the gap
  between llama.cpp's own top two logits at that step (the test exempts near-ties).
- `perplexity`: llama-perplexity's protocol on the same text (scripts/llama_cpp_perplexity.py's
  `chunk_nlls`, chunks of exec_logits_golden.N_CTX tokens).
The JSON records the llama_cpp version, the model's sha256 and the sha256 of this script; a file
whose three still match is kept, anything else is recomputed. Prints one line per model.
"""
import hashlib
import json
import math
import os
import sys
import tempfile

import numpy as np
import llama_cpp

from exec_logits_golden import N_CTX, TEXT
from llama_cpp_perplexity import chunk_nlls

PROMPT = "Once upon a time, in a small village by the sea, there lived"
N_GREEDY = 32
TOP_K = 8
N_PROBE = 24
THREADS = 2


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def logits_section(llm, tokens: list[int]) -> dict:
    llm.reset()
    llm.eval(tokens)
    rows = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    vocab = rows.shape[1]
    probe = np.random.default_rng(37).choice(vocab, N_PROBE, replace=False)
    out_rows = []
    for row in rows:
        top = np.argsort(-row, kind="stable")[:TOP_K]
        out_rows.append({
            "min": float(row.min()),
            "max": float(row.max()),
            "top_ids": [int(i) for i in top],
            "top_logits": [float(row[i]) for i in top],
            "probe_logits": [float(row[i]) for i in probe],
        })
    return {
        "tokens": [int(t) for t in tokens],
        "probe_ids": [int(i) for i in probe],
        "rows": out_rows,
        "last_row": [float(x) for x in rows[-1]],
    }


def greedy_section(llm, prompt: list[int]) -> dict:
    llm.reset()
    llm.eval(prompt)
    tokens, gaps = [], []
    for step in range(N_GREEDY):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        first, second = np.argsort(-row, kind="stable")[:2]
        tokens.append(int(first))
        gaps.append(float(row[first] - row[second]))
        if step + 1 < N_GREEDY:
            llm.eval([int(first)])
    return {"prompt": PROMPT, "prompt_tokens": [int(t) for t in prompt], "tokens": tokens, "top2_gap": gaps}


def golden(path: str, script_sha: str) -> dict:
    llm = llama_cpp.Llama(
        model_path=path, n_ctx=256, n_batch=256, logits_all=True, verbose=False,
        n_threads=THREADS, n_threads_batch=THREADS,
    )
    add_bos = bool(llm._model.add_bos_token())
    tokens = llm.tokenize(TEXT.encode("utf-8"), add_bos=add_bos, special=False)
    prompt = llm.tokenize(PROMPT.encode("utf-8"), add_bos=add_bos, special=False)
    logits = logits_section(llm, tokens)
    greedy = greedy_section(llm, prompt)
    n_chunk = len(tokens) // N_CTX
    nlls = [v for chunk in chunk_nlls(llm, tokens, N_CTX, add_bos, n_chunk) for v in chunk]
    return {
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, CPU, {THREADS} threads",
        "llama_cpp_version": llama_cpp.__version__,
        "model_file": os.path.basename(path),
        "model_sha256": sha256_of(path),
        "script_sha256": script_sha,
        "add_bos": add_bos,
        "bos": int(llm.token_bos()),
        "logits": logits,
        "greedy": greedy,
        "perplexity": {
            "n_ctx": N_CTX, "chunks": n_chunk, "scored": len(nlls), "ppl": math.exp(sum(nlls) / len(nlls)),
        },
    }


def current(out: str, model_sha: str, script_sha: str) -> bool:
    try:
        with open(out, encoding="utf-8") as f:
            g = json.load(f)
    except (OSError, ValueError):
        return False
    return (g.get("llama_cpp_version"), g.get("model_sha256"), g.get("script_sha256")) == (
        llama_cpp.__version__, model_sha, script_sha)


def write_atomic(path: str, value: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".cpu_golden-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    out_dir, models = sys.argv[1], sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    script_sha = sha256_of(os.path.abspath(__file__))
    for path in models:
        if not os.path.isfile(path):
            sys.exit(f"cpu_golden.py: model not found: {path}")
        out = os.path.join(out_dir, os.path.basename(path) + ".json")
        if current(out, sha256_of(path), script_sha):
            print(f"{out}: up to date", flush=True)
            continue
        g = golden(path, script_sha)
        write_atomic(out, g)
        gaps = g["greedy"]["top2_gap"]
        print(f"{out}: ppl {g['perplexity']['ppl']:.4f}, greedy min top-2 gap {min(gaps):.3f}", flush=True)


if __name__ == "__main__":
    main()
