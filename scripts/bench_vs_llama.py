#!/usr/bin/env python3
"""Prefill and decode tok/s of `ork run` variants against llama.cpp (llama-cpp-python) on the
same GGUF, interleaved round by round in one run, so that the ratios share the machine's state.

Usage:
  python3 scripts/bench_vs_llama.py MODEL.gguf [MODEL.gguf ...] [--rounds 5] [--decode 64]
      [--threads 2] [--repeat 8] [--ork target/release/ork] [--variant 'NAME=ORK RUN FLAGS'] ...

Each variant is `ork run --model MODEL --pack .cache/bench-<NAME>.orkpack --prompt-file P
-n DECODE --threads T --json` plus its flags (default: one variant, `w8a8`, no extra flags). A
name of the form `NAME@PATH` runs the `ork` binary at PATH instead of --ork, for an A/B of two
builds in one run (`--variant 'old@/tmp/ork-old=' --variant 'new='`); the pack is named
after NAME alone. A variant whose flags contain `--device cpu` (the CPU engine, computing from
the GGUF's own blocks) gets no `--pack`. With several models, each round runs llama.cpp and every
variant on each model in turn, and the summary has one table per model. Each ork run's peak
anonymous RSS (RssAnon in /proc/PID/status, polled every 5 ms) is reported too. A warm-up run per variant builds its pack first. The prompt is the sentence of
scripts/llama_cpp_speed.py repeated REPEAT times (16·REPEAT + 1 tokens with SmolLM2's tokenizer:
129 by default, 897 with `--repeat 56`); llama.cpp reports the best of 3 warm passes inside each
round (prefill of the same sentence's first 16·REPEAT tokens, DECODE decode steps).
Prints one line per round and a summary: median (min–max) tok/s and the median of the per-round
ratios to llama.cpp. Not part of the tests.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

SENTENCE = "The history of computing is a story of machines that outgrew their memory. "


def rss_anon_kib(pid):
    """RssAnon of a running process in KiB, or None once it has gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def ork_run(ork, model, name, flags, prompt_file, decode, threads):
    name, _, binary = name.partition("@")
    split = shlex.split(flags)
    cpu = "--device cpu" in " ".join(split) or "--device=cpu" in split
    pack = [] if cpu else ["--pack", f".cache/bench-{name}.orkpack"]
    cmd = [binary or ork, "run", "--model", model] + pack + [
           "--prompt-file", prompt_file, "-n", str(decode), "--threads", str(threads),
           "--json"] + split
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as errf:
        proc = subprocess.Popen(cmd, stdout=out, stderr=errf, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, rss_anon_kib(proc.pid) or 0)
            time.sleep(0.005)
        errf.seek(0)
        err = errf.read()
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} exited {proc.returncode}: {err}")
        out.seek(0)
        d = json.loads(out.read())
    return d["prefill_tok_s"], d["decode_tok_s"], d.get("wall_hits", 0), peak / 1024


def llama(model, prompt_tokens, decode, threads):
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, os.path.join(here, "llama_cpp_speed.py"), model,
                          str(prompt_tokens), str(decode), str(threads)], check=True,
                         capture_output=True,
                         text=True).stdout
    d = json.loads(out)
    return d["prefill_tok_s"], d["decode_tok_s"], 0, 0.0


def fmt(xs):
    return f"{statistics.median(xs):7.1f} ({min(xs):.1f}–{max(xs):.1f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="+")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--ork", default="target/release/ork")
    ap.add_argument("--variant", action="append", default=[])
    a = ap.parse_args()
    if a.rounds < 1 or a.decode < 1 or a.threads < 1:
        sys.exit("--rounds, --decode and --threads must be at least 1")
    if not 1 <= a.repeat <= 64:
        sys.exit("--repeat must be 1..64 (llama_cpp_speed.py's text holds 64 sentences)")
    variants = []
    for v in a.variant or ["w8a8="]:
        if "=" not in v:
            sys.exit(f"--variant {v!r}: expected NAME=FLAGS")
        name, flags = v.split("=", 1)
        variants.append((name, flags))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(SENTENCE * a.repeat)
        prompt = f.name
    # The packs live in .cache/ (under the working directory), which a fresh clone lacks.
    os.makedirs(".cache", exist_ok=True)
    try:
        for model in a.model:
            for name, flags in variants:  # warm-up: builds each pack
                ork_run(a.ork, model, name, flags, prompt, 4, a.threads)
        rows = {m: {"llama.cpp": [], **{name: [] for name, _ in variants}} for m in a.model}
        loads = []
        for r in range(a.rounds):
            loads.append(os.getloadavg()[0])
            for model in a.model:
                rows[model]["llama.cpp"].append(llama(model, 16 * a.repeat, a.decode, a.threads))
                for name, flags in variants:
                    rows[model][name].append(ork_run(a.ork, model, name, flags, prompt, a.decode,
                                                     a.threads))
                print(f"round {r + 1}: load {loads[-1]:.2f} {os.path.basename(model)}  " + "  ".join(
                    f"{k} {v[-1][0]:.1f}/{v[-1][1]:.1f}" for k, v in rows[model].items()), flush=True)
        print(f"\n{a.rounds} rounds, {a.threads} threads, load average {min(loads):.2f}–"
              f"{max(loads):.2f}; prefill = `ork run`'s one cold pass, llama.cpp's best of 3")
        for model in a.model:
            print(f"\n{os.path.basename(model)}")
            print(f"{'':24} {'prefill tok/s':>22} {'×':>6} {'decode tok/s':>22} {'×':>6} {'wall':>5}"
                  f" {'RssAnon MiB':>11}")
            base = rows[model]["llama.cpp"]
            for k, v in rows[model].items():
                pr = [x[0] / b[0] for x, b in zip(v, base)]
                dr = [x[1] / b[1] for x, b in zip(v, base)]
                rss = f"{max(x[3] for x in v):11.1f}" if k != "llama.cpp" else f"{'—':>11}"
                print(f"{k:24} {fmt([x[0] for x in v]):>22} {statistics.median(pr):6.2f} "
                      f"{fmt([x[1] for x in v]):>22} {statistics.median(dr):6.2f} "
                      f"{max(x[2] for x in v):5d} {rss}")
    finally:
        os.unlink(prompt)


if __name__ == "__main__":
    main()
