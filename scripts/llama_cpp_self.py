#!/usr/bin/env python3
"""How far llama.cpp's CPU results on a file are from themselves, for docs/cpu.md ("Where the gap
comes from"): the floor under any comparison with llama.cpp that is not bit for bit.

Usage:  python3 scripts/llama_cpp_self.py MODEL.gguf [MODEL.gguf ...]

For each model, llama.cpp (llama-cpp-python 0.3.36, CPU, 2 threads, f16 cache, as
scripts/cpu_golden.py runs it) evaluates the golden text of scripts/exec_logits_golden.py twice:
in one batch (`n_batch` 256) and one token at a time (`n_batch` 1), each followed by the
perplexity of scripts/cpu_golden.py (scripts/llama_cpp_perplexity.py's `chunk_nlls`). It prints
the worst and the mean over positions of max |batch - one at a time| / the row's spread (the
measure of crates/ork-cpu/tests/cpu/llama_cpp.rs), and both perplexities. Nothing is written.
"""
import math
import sys

import numpy as np
import llama_cpp

from exec_logits_golden import N_CTX, TEXT
from llama_cpp_perplexity import chunk_nlls

THREADS = 2


def evaluate(path: str, n_batch: int):
    """Logits of every position of the golden text and its perplexity, `n_batch` at a time."""
    llm = llama_cpp.Llama(
        model_path=path, n_ctx=256, n_batch=n_batch, n_ubatch=n_batch, logits_all=True,
        verbose=False, n_threads=THREADS, n_threads_batch=THREADS,
    )
    add_bos = bool(llm._model.add_bos_token())
    tokens = llm.tokenize(TEXT.encode("utf-8"), add_bos=add_bos, special=False)
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    n_chunk = len(tokens) // N_CTX
    nlls = [v for chunk in chunk_nlls(llm, tokens, N_CTX, add_bos, n_chunk) for v in chunk]
    return logits, math.exp(sum(nlls) / len(nlls))


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n\n")[1])
    for path in sys.argv[1:]:
        batch, ppl_batch = evaluate(path, 256)
        single, ppl_single = evaluate(path, 1)
        spread = batch.max(axis=1) - batch.min(axis=1)
        rel = np.abs(batch - single).max(axis=1) / spread
        print(
            f"{path.rsplit('/', 1)[-1]}: one batch vs one token at a time: worst {rel.max():.2e} "
            f"mean {rel.mean():.2e} of the spread; perplexity {ppl_batch:.4f} vs {ppl_single:.4f} "
            f"({(ppl_single / ppl_batch - 1) * 100:+.2f} %)",
            flush=True,
        )


if __name__ == "__main__":
    main()
