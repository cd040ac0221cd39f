#!/usr/bin/env python3
"""Reference logits and perplexity for ork-exec, computed by llama.cpp (llama-cpp-python).

Usage:  python3 scripts/exec_logits_golden.py [MODEL.gguf] > crates/ork-exec/tests/golden/smollm2_logits.json

Evaluates a fixed text with llama.cpp (CPU, all logits) and records, per position, the top-5 token
ids with their logits, plus the perplexity of the text under llama-perplexity's protocol
(chunks of N_CTX with BOS replacing the first token when the vocabulary adds BOS, second half of
each chunk scored). llama.cpp computes Q4_1 matmuls against Q8_1-quantized activations, so the
Rust test compares with tolerances, not bit for bit.
"""
import hashlib
import json
import math
import os
import sys

import numpy as np
import llama_cpp

from llama_cpp_perplexity import chunk_nlls

N_CTX = 64

TEXT = (
    "The river runs past the old mill, where the miller's daughter keeps the accounts in a green "
    "ledger. Every morning she walks to the bridge, counts the barges, and writes their names. "
    "In winter the water freezes at the edges and the barges stop; then she reads the ledger from "
    "the first page, remembering each boat and the people who sailed it. Her brother says the "
    "ledger is useless, since nobody will ever ask how many barges passed in a given year. She "
    "answers that the question does not matter: the counting is a way of paying attention. When "
    "the spring comes, the ice breaks with a sound like a door slamming, and the first barge of "
    "the year is always the one carrying salt from the coast. She writes its name in red ink. "
    "def mean(values):\n    return sum(values) / len(values)\n\nprint(mean([1, 2, 3, 4]))\n"
)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", ".cache", "SmolLM2-135M-Instruct.Q4_1.gguf")
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_batch=512, logits_all=True, verbose=False, n_threads=2)
    add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else False
    tokens = llm.tokenize(TEXT.encode("utf-8"), add_bos=bool(add_bos), special=False)

    # Per-position logits over the whole text (one sequence from position 0).
    llm.reset()
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    top = []
    for row in logits:
        ids = np.argsort(-row, kind="stable")[:5]
        top.append({"ids": [int(i) for i in ids], "logits": [float(row[i]) for i in ids]})

    # llama-perplexity protocol over chunks of N_CTX.
    n_chunk = len(tokens) // N_CTX
    nlls = [v for chunk in chunk_nlls(llm, tokens, N_CTX, bool(add_bos), n_chunk) for v in chunk]
    nll, count = sum(nlls), len(nlls)
    out = {
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, CPU",
        "model_sha256": sha,
        "add_bos": bool(add_bos),
        "tokens": [int(t) for t in tokens],
        "top5": top,
        "perplexity": {"n_ctx": N_CTX, "chunks": n_chunk, "scored": count, "ppl": math.exp(nll / count)},
    }
    json.dump(out, sys.stdout, indent=None)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
