#!/usr/bin/env python3
"""Time to first token of a conversation's second turn, reused prefix vs cold, against a running
`ork serve` (standard library only; not part of the tests).

Usage: bench_prefix.py BASE_URL MODEL_ID [--facts 90] [--rounds 3]

Each round builds a conversation whose first turn is a ~1,000-token system message (--facts
numbered sentences, with a per-round tag at its start so no earlier round's cache matches) and a
question, and streams three chat requests, 16 tokens each, temperature 0:
  1. turn 1 (cold: nothing cached shares its tokens);
  2. turn 2 = turn 1 + the answer + a new question: served from turn 1's cached prefix;
  3. the same turn 2 under another tag: the same length, nothing to reuse (cold).
TTFT is the time from sending the request to the first streamed chunk carrying text. Prints one
JSON object: per round the TTFTs and the cached token counts, and the median ratio of (2) to (3).

Across a restart (`ork serve --prefix-cache-dir DIR`): `--save FILE` runs only each round's turn 1
and writes the conversations to FILE; stop the server (SIGTERM: it writes its prefix cache), start
it again with the same options, and `--resume FILE` runs each round's turn 2, reused (from the
file the server read at start) and cold, as above.
"""
import argparse
import json
import statistics
import time
import urllib.request

COLOURS = ["red", "green", "blue", "amber", "violet", "silver", "golden", "white"]
THINGS = ["lantern", "river", "mountain", "library", "garden", "harbour", "bridge", "tower"]


def system_text(tag, facts):
    lines = [f"[{tag}] You are a careful assistant. Remember these facts."]
    for i in range(facts):
        lines.append(f"Fact {i}: the {COLOURS[i % 8]} {THINGS[(i * 3) % 8]} is number {i * 7 % 101}.")
    return " ".join(lines)


def chat(base, model, messages):
    """(ttft seconds, text, usage) of one streamed chat request."""
    body = json.dumps({
        "model": model, "messages": messages, "max_tokens": 16, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    }).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, text, usage = None, "", None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                piece = c["delta"].get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter() - t0
                    text += piece
    return first, text, usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("model")
    ap.add_argument("--facts", type=int, default=90)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--save", help="run turn 1 of each round only; write the conversations here")
    ap.add_argument("--resume", help="run turn 2 of the conversations --save wrote")
    a = ap.parse_args()
    stamp = time.time_ns()
    saved = None
    if a.resume:
        with open(a.resume) as f:
            saved = json.load(f)
        stamp, a.rounds, a.facts = saved["stamp"], len(saved["rounds"]), saved["facts"]
    rounds = []
    for r in range(a.rounds):
        def turn1(tag):
            return [{"role": "system", "content": system_text(tag, a.facts)},
                    {"role": "user", "content": "Which thing is number 14?"}]
        if saved:
            t1, answer = saved["rounds"][r]["turn1_ttft_s"], saved["rounds"][r]["answer"]
        else:
            t1, answer, u1 = chat(a.base, a.model, turn1(f"run {stamp} round {r}"))
        if a.save:
            rounds.append({"turn1_ttft_s": t1, "answer": answer})
            continue
        second = [{"role": "assistant", "content": answer},
                  {"role": "user", "content": "And which colour has the tower?"}]
        warm, _, u2 = chat(a.base, a.model, turn1(f"run {stamp} round {r}") + second)
        cold, _, u3 = chat(a.base, a.model, turn1(f"run {stamp} cold {r}") + second)
        rounds.append({
            "turn1_ttft_s": round(t1, 4),
            "turn2_reused_ttft_s": round(warm, 4),
            "turn2_cold_ttft_s": round(cold, 4),
            "turn2_prompt_tokens": u2["prompt_tokens"],
            "turn2_cached_tokens": u2.get("prompt_tokens_details", {}).get("cached_tokens"),
            "cold_cached_tokens": u3.get("prompt_tokens_details", {}).get("cached_tokens"),
        })
    if a.save:
        with open(a.save, "w") as f:
            json.dump({"stamp": stamp, "facts": a.facts, "rounds": rounds}, f)
        print(json.dumps({"saved": a.save, "rounds": len(rounds)}))
        return
    ratio = statistics.median(x["turn2_reused_ttft_s"] / x["turn2_cold_ttft_s"] for x in rounds)
    print(json.dumps({"rounds": rounds, "median_reused_over_cold": round(ratio, 3)}, indent=1))


if __name__ == "__main__":
    main()
