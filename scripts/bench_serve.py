#!/usr/bin/env python3
"""Benchmark a running `ork serve` (standard library only; not part of the tests).

Usage: bench_serve.py BASE_URL MODEL_ID [--tokens 48] [--streams 1,2,4,8] [--rounds 2]

For each number of concurrent streams S: S streaming completions of --tokens tokens each
(`ignore_eos`, so every stream decodes the same count) start together; the aggregate decode rate
is the number of tokens all streams received between the moment every stream had its first token
and the moment the first stream finished, divided by that window (steady state, all S decoding).
Then the time to first token of one request alone, and of one request arriving while 7 others
decode. Prints one JSON object.
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request


def stream(base, model, prompt, tokens, events, started=None):
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "stream": True, "ignore_eos": True,
    }).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    if started is not None:
        started.append(t0)
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                events.append(time.perf_counter())
    return t0


def aggregate(base, model, s, tokens):
    per = [[] for _ in range(s)]
    threads = [threading.Thread(target=stream, args=(base, model, f"Story {i}: Once upon a time", tokens, per[i]))
               for i in range(s)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = max(p[0] for p in per)
    end = min(p[-1] for p in per)
    n = sum(1 for p in per for t in p if start < t <= end)
    return n / (end - start) if end > start else float("nan")


def ttft(base, model, background, tokens):
    bg = [[] for _ in range(background)]
    threads = [threading.Thread(target=stream, args=(base, model, f"Story {i}: Once upon a time", tokens * 4, bg[i]))
               for i in range(background)]
    for t in threads:
        t.start()
    while background and not all(len(b) >= 2 for b in bg):
        time.sleep(0.01)
    ev, st = [], []
    stream(base, model, "The capital of France is", 4, ev, st)
    first = ev[0] - st[0]
    for t in threads:
        t.join()
    return first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    stream(a.base, a.model, "warm up", 4, [])
    out = {"tokens": a.tokens, "rounds": a.rounds, "aggregate_tok_s": {}}
    for s in [int(x) for x in a.streams.split(",")]:
        rates = [aggregate(a.base, a.model, s, a.tokens) for _ in range(a.rounds)]
        out["aggregate_tok_s"][s] = round(statistics.median(rates), 2)
    one = out["aggregate_tok_s"].get(1)
    if one:
        out["speedup_vs_1"] = {s: round(v / one, 2) for s, v in out["aggregate_tok_s"].items()}
    out["ttft_alone_s"] = round(statistics.median(ttft(a.base, a.model, 0, a.tokens) for _ in range(a.rounds)), 3)
    out["ttft_beside_7_s"] = round(statistics.median(ttft(a.base, a.model, 7, a.tokens) for _ in range(a.rounds)), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
