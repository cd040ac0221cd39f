#!/usr/bin/env python3
"""Perplexity of a text file with llama.cpp (llama-cpp-python), llama-perplexity's protocol, for
comparison with `cargo run -p ork-exec --example perplexity`.

Usage: python3 scripts/llama_cpp_perplexity.py MODEL.gguf TEXT_FILE [N_CTX] [MAX_CHUNKS]
"""
import math
import sys
import time

import numpy as np
import llama_cpp


def chunk_nlls(llm, tokens, n_ctx: int, add_bos: bool, n_chunk: int):
    """llama-perplexity's protocol: for each of `n_chunk` chunks of `n_ctx` tokens (the first
    replaced by BOS when the vocabulary adds one), evaluated from an empty cache, yields the
    negative log-likelihoods of the tokens of the chunk's second half, in order. `llm` is a
    `llama_cpp.Llama` with `logits_all=True` and a context of at least `n_ctx`."""
    first = n_ctx // 2
    for c in range(n_chunk):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if add_bos:
            chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
        scores = np.array(llm.scores[:n_ctx], dtype=np.float32)
        values = []
        for j in range(first, n_ctx - 1):
            row = scores[j]
            m = float(row.max())
            lse = math.log(float(np.exp((row - m).astype(np.float64)).sum()))
            values.append(-(float(row[chunk[j + 1]]) - m - lse))
        yield values


def main() -> None:
    model, text_path = sys.argv[1], sys.argv[2]
    n_ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    max_chunks = int(sys.argv[4]) if len(sys.argv) > 4 else None
    llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, verbose=False)
    add_bos = bool(llm._model.add_bos_token())
    with open(text_path, encoding="utf-8") as f:
        tokens = llm.tokenize(f.read().encode("utf-8"), add_bos=add_bos, special=False)
    n_chunk = len(tokens) // n_ctx
    if max_chunks is not None:
        n_chunk = min(n_chunk, max_chunks)
    if n_chunk < 2:
        sys.exit(f"need at least {2 * n_ctx} tokens, got {len(tokens)}")
    nll, nll2, count = 0.0, 0.0, 0
    t0 = time.time()
    for c, values in enumerate(chunk_nlls(llm, tokens, n_ctx, add_bos, n_chunk)):
        for v in values:
            nll += v
            nll2 += v * v
            count += 1
        print(f"[{c + 1}]{math.exp(nll / count):.4f},", end="", flush=True)
    print()
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 else 0.0
    print(f"llama.cpp: PPL = {ppl:.4f} +/- {err:.5f} over {n_chunk} chunks of {n_ctx} ({count} scored), {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
