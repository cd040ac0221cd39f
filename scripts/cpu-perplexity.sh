#!/usr/bin/env bash
# Perplexity of ork's CPU engine (`ork perplexity --device cpu`) against llama.cpp's CPU backend
# (llama-cpp-python 0.3.36, scripts/llama_cpp_perplexity.py) on the same GGUF files and the same
# text, under llama-perplexity's protocol (ctx 512 windows, second half scored, f16 KV cache on
# both sides). Prints one line per file: both perplexities and ork's relative difference, then
# exits 1 if any file is further than the bound (issue 37: 0.3 %). Perplexity is deterministic,
# so host load changes the time, not the figure. A file takes 1–2 minutes per side on 2 vCPUs.
#
# Usage: scripts/cpu-perplexity.sh [--text FILE] [--bound PCT] [--ork target/release/ork] MODEL.gguf...
# Defaults: /usr/share/common-licenses/GPL-3 (14 windows, 3570 scored tokens), 0.3, and SmolLM2
# Q4_1, its requantized copies (scripts/requantize.py) and Gemma 3 270M in ${ORK_CACHE:-.cache}.
set -euo pipefail
cd "$(dirname "$0")/.."
text=/usr/share/common-licenses/GPL-3 bound=0.3 ork=target/release/ork
models=()
while (($#)); do
  case "$1" in
    --text) text="$2"; shift 2 ;;
    --bound) bound="$2"; shift 2 ;;
    --ork) ork="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "cpu-perplexity: unknown flag $1" >&2; exit 2 ;;
    *) models+=("$1"); shift ;;
  esac
done
if ((${#models[@]} == 0)); then
  c="${ORK_CACHE:-.cache}/SmolLM2-135M-Instruct"
  for q in Q4_0 Q4_1 Q5_1 Q8_0 Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K; do models+=("$c.$q.gguf"); done
  models+=("${ORK_CACHE:-.cache}/gemma-3-270m-q4_k_m.gguf")
fi
[[ -f "$text" ]] || { echo "cpu-perplexity: $text: no such file" >&2; exit 2; }
[[ -x "$ork" ]] || { echo "cpu-perplexity: $ork: not built (cargo build --release -p ork-cli)" >&2; exit 2; }
for m in "${models[@]}"; do
  [[ -f "$m" ]] || { echo "cpu-perplexity: $m: no such file (scripts/requantize.py makes the copies)" >&2; exit 2; }
done
fail=0
for m in "${models[@]}"; do
  o=$("$ork" perplexity --model "$m" --device cpu --file "$text" --ctx 512 --kv-cache f16 --threads 2 2>&1 |
      sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
  l=$(python3 scripts/llama_cpp_perplexity.py "$m" "$text" 512 | sed -n 's/^llama.cpp: PPL = \([0-9.]*\).*/\1/p')
  [[ -n "$o" && -n "$l" ]] || { echo "cpu-perplexity: $m: a run gave no perplexity" >&2; exit 1; }
  if python3 -c "import sys; o,l,b=map(float,sys.argv[1:4]); d=100*(o/l-1); print(f'{sys.argv[4]}: ork {o:.4f}  llama.cpp {l:.4f}  {d:+.2f} %'); sys.exit(abs(d)>b)" \
       "$o" "$l" "$bound" "$(basename "$m")"; then :; else fail=1; fi
done
((fail == 0)) || { echo "cpu-perplexity: a file is further than ${bound} % from llama.cpp" >&2; exit 1; }
