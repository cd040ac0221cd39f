#!/usr/bin/env python3
"""Reference log probabilities for `ork serve`, computed by llama.cpp (llama-cpp-python).

Usage:  python3 scripts/serve_logprobs_golden.py [MODEL.gguf] > crates/ork-server/tests/golden/smollm2_logprobs.json

Greedy-decodes a fixed prompt with llama.cpp (CPU, all logits) and records, for each generated
token, its id and text, its log probability and the top-5 alternatives (ids, texts, log
probabilities): the log-softmax of llama.cpp's logits at temperature 1, which is what
`create_completion(..., logprobs=5)` reports. Only the leading steps whose top-1 leads the
top-2 by at least MARGIN nats are kept, so that quantization noise cannot flip the greedy token
and make the two runs diverge. The Rust test (crates/ork-server/tests/server/logprobs.rs) asks
ork serve for the same completion and compares within a stated tolerance.
"""
import hashlib
import json
import os
import sys

import numpy as np
import llama_cpp

PROMPT = "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. January, February, March,"
MAX_STEPS = 16
MIN_STEPS = 6
MARGIN = 0.5
TOP = 5


def log_softmax(row):
    row = row.astype(np.float64)
    m = row.max()
    return row - m - np.log(np.exp(row - m).sum())


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", ".cache", "SmolLM2-135M-Instruct.Q4_1.gguf")
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_batch=512, logits_all=True, verbose=False, n_threads=2)
    add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else False
    prompt = llm.tokenize(PROMPT.encode("utf-8"), add_bos=bool(add_bos), special=False)
    llm.reset()
    llm.eval(prompt)
    steps = []
    for _ in range(MAX_STEPS):
        lp = log_softmax(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        ids = np.argsort(-lp, kind="stable")[:TOP]
        if lp[ids[0]] - lp[ids[1]] < MARGIN:
            break
        tok = int(ids[0])
        if tok == llm.token_eos():
            break
        text = lambda t: llm.detokenize([int(t)]).decode("utf-8", "replace")
        steps.append({
            "id": tok,
            "token": text(tok),
            "logprob": float(lp[tok]),
            "top": [{"id": int(i), "token": text(i), "logprob": float(lp[i])} for i in ids],
        })
        llm.eval([tok])
    assert len(steps) >= MIN_STEPS, f"only {len(steps)} confident greedy steps: change PROMPT"
    out = {
        "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, CPU, log-softmax of all logits",
        "model_sha256": sha,
        "prompt": PROMPT,
        "prompt_tokens": [int(t) for t in prompt],
        "margin": MARGIN,
        "steps": steps,
    }
    json.dump(out, sys.stdout, indent=None)
    print()


if __name__ == "__main__":
    main()
