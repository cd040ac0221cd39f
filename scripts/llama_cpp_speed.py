#!/usr/bin/env python3
"""Prefill and decode speed of llama.cpp (llama-cpp-python) on a GGUF, for comparison with
`ork run --json` on the same prompt in the same session.

Usage: python3 scripts/llama_cpp_speed.py MODEL.gguf PROMPT_TOKENS DECODE_TOKENS [THREADS]
Prints one JSON object: prefill_tok_s, decode_tok_s (best of 3 runs each).
"""
import json
import sys
import time

import llama_cpp


def main() -> None:
    model = sys.argv[1]
    n_prompt, n_decode = int(sys.argv[2]), int(sys.argv[3])
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    llm = llama_cpp.Llama(model_path=model, n_ctx=n_prompt + n_decode + 8, n_batch=n_prompt,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    text = ("The history of computing is a story of machines that outgrew their memory. " * 64)
    tokens = llm.tokenize(text.encode(), add_bos=False)[:n_prompt]
    best_p, best_d = 0.0, 0.0
    for _ in range(3):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens)
        tp = time.perf_counter() - t0
        t0 = time.perf_counter()
        # Speed only: feed the prompt's tokens back one at a time (the token ids do not change
        # the work of a decode step).
        for i in range(n_decode):
            llm.eval([tokens[i % len(tokens)]])
        td = time.perf_counter() - t0
        best_p = max(best_p, n_prompt / tp)
        best_d = max(best_d, n_decode / td)
    print(json.dumps({"engine": "llama.cpp (llama-cpp-python %s)" % llama_cpp.__version__,
                      "threads": threads, "prompt_tokens": n_prompt, "decode_tokens": n_decode,
                      "prefill_tok_s": best_p, "decode_tok_s": best_d}))


if __name__ == "__main__":
    main()
