#!/usr/bin/env bash
# ork's CPU engine (`ork bench cpu`, i.e. `--device cpu`) against llama.cpp's CPU backend
# (llama-cpp-python 0.3.36, scripts/llama_cpp_speed.py) on the same GGUF files, the same threads,
# the same prompt tokens and decode lengths, alternating ork and llama.cpp round by round in one
# run, so that every ratio shares the machine's state. Prints one line per round and file, then
# per file the median (min–max) tok/s of each engine and the median (min–max) of the per-round
# ratios ork ÷ llama.cpp, with the load average seen. A measurement tool: it asserts nothing.
#
# Each side reports the best of 3 passes inside a round (ork after one untimed warm-up pass;
# llama.cpp's first pass is its warm-up). Both prefill the same tokens: the sentence of
# llama_cpp_speed.py repeated, without BOS, in one batch; decode feeds the prompt's tokens back.
#
# Usage: scripts/bench-cpu.sh [--rounds R] [--threads T] [--prompt-tokens P] [--gen-tokens G]
#                             [--ork target/release/ork] MODEL.gguf...
# Defaults: 5 rounds, 2 threads, P 128, G 64, and the four files of issue 37 (SmolLM2 Q4_0, Q4_1,
# Q4_K_M, Q8_0 in ${ORK_CACHE:-.cache}, made by scripts/requantize.py).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=5 threads=2 prompt=128 gen=64 ork=target/release/ork
models=()
while (($#)); do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --prompt-tokens) prompt="$2"; shift 2 ;;
    --gen-tokens) gen="$2"; shift 2 ;;
    --ork) ork="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "bench-cpu: unknown flag $1" >&2; exit 2 ;;
    *) models+=("$1"); shift ;;
  esac
done
if ((${#models[@]} == 0)); then
  c="${ORK_CACHE:-.cache}/SmolLM2-135M-Instruct"
  models=("$c.Q4_0.gguf" "$c.Q4_1.gguf" "$c.Q4_K_M.gguf" "$c.Q8_0.gguf")
fi
for m in "${models[@]}"; do
  [[ -f "$m" ]] || { echo "bench-cpu: $m: no such file (scripts/requantize.py makes the copies)" >&2; exit 2; }
done
[[ -x "$ork" ]] || { echo "bench-cpu: $ork: not built (cargo build --release -p ork-cli)" >&2; exit 2; }
exec python3 - "$rounds" "$threads" "$prompt" "$gen" "$ork" "${models[@]}" <<'PY'
import json, os, statistics, subprocess, sys

rounds, threads, prompt, gen = map(int, sys.argv[1:5])
ork, models = sys.argv[5], sys.argv[6:]
here = os.path.join(os.getcwd(), "scripts")


def run(cmd):
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def ork_side(model):
    d = run([ork, "bench", "cpu", "--model", model, "--threads", str(threads), "--prompt-tokens",
             str(prompt), "--gen-tokens", str(gen), "--rounds", "3", "--json"])
    return d["prefill_best"], d["decode_best"]


def llama_side(model):
    d = run([sys.executable, os.path.join(here, "llama_cpp_speed.py"), model, str(prompt),
             str(gen), str(threads)])
    return d["prefill_tok_s"], d["decode_tok_s"]


def span(xs):
    return f"{statistics.median(xs):7.2f} ({min(xs):.2f}–{max(xs):.2f})"


rows = {m: {"ork": [], "llama.cpp": []} for m in models}
loads = []
for r in range(rounds):
    for m in models:
        loads.append(os.getloadavg()[0])
        rows[m]["ork"].append(ork_side(m))
        rows[m]["llama.cpp"].append(llama_side(m))
        o, l = rows[m]["ork"][-1], rows[m]["llama.cpp"][-1]
        print(f"round {r + 1} load {loads[-1]:5.2f} {os.path.basename(m):36} prefill ork "
              f"{o[0]:7.1f} llama.cpp {l[0]:7.1f} | decode ork {o[1]:6.1f} llama.cpp {l[1]:6.1f}",
              flush=True)
print(f"\n{rounds} rounds, {threads} threads, {prompt} prompt tokens, {gen} decoded; "
      f"load average {min(loads):.2f}–{max(loads):.2f}; tok/s and ratios: median (min–max)")
print(f"{'file':36} {'ork prefill':>22} {'llama.cpp prefill':>22} {'prefill ×':>22} "
      f"{'ork decode':>22} {'llama.cpp decode':>22} {'decode ×':>22}")
for m in models:
    o, l = rows[m]["ork"], rows[m]["llama.cpp"]
    pr = [a[0] / b[0] for a, b in zip(o, l)]
    dr = [a[1] / b[1] for a, b in zip(o, l)]
    print(f"{os.path.basename(m):36} {span([x[0] for x in o]):>22} {span([x[0] for x in l]):>22} "
          f"{span(pr):>22} {span([x[1] for x in o]):>22} {span([x[1] for x in l]):>22} "
          f"{span(dr):>22}")
PY
