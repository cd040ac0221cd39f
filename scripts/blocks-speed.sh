#!/usr/bin/env bash
# Single-thread speed of ork's block kernels (ork_kernels::blocks) against ggml-cpu's own
# vec_dot (llama-cpp-python 0.3.36's libggml-cpu.so, the build llama.cpp runs here) on the same
# shapes in the same run: GB/s of weight bytes (per second of wall time, and per second of the
# thread's CPU time, which other load on the machine does not dilute) and the ratio ork/ggml. A measurement tool that
# asserts nothing (docs/kernels.md, "Block kernels"). Usage:
#   scripts/blocks-speed.sh [K ROWS M SECONDS [TYPES...]]   (default 4096 1024 1 1 Q4_0 Q4_1 Q8_0)
set -euo pipefail
cd "$(dirname "$0")/.."
K="${1:-4096}" ROWS="${2:-1024}" M="${3:-1}" SECS="${4:-1}"
shift $(( $# < 4 ? $# : 4 ))
TYPES=("${@:-Q4_0 Q4_1 Q8_0}")
read -r -a TYPES <<<"${TYPES[*]}"
LIB="$(python3 -c 'import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.so"))')"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cc -O2 -o "$TMP/ggml_speed" scripts/blocks_speed_ggml.c -ldl
cargo build --release --quiet -p ork-kernels --example blocks_speed
ORK=target/release/examples/blocks_speed
# ggml type id, block length, block bytes, activation block bytes (ggml.h, ggml-common.h)
declare -A GG=([F32]="0 1 4 4" [F16]="1 1 2 2" [BF16]="30 1 2 2" [Q4_0]="2 32 18 34"
  [Q4_1]="3 32 20 36" [Q5_0]="6 32 22 34" [Q5_1]="7 32 24 36" [Q8_0]="8 32 34 34"
  [IQ4_NL]="20 32 18 34")
for t in "${TYPES[@]}"; do
  read -r id blen bbytes abytes <<<"${GG[$t]}"
  o="$(taskset -c 0 "$ORK" "$t" "$K" "$ROWS" "$M" "$SECS")"
  g="$(taskset -c 0 "$TMP/ggml_speed" "$LIB" "$id" "$blen" "$bbytes" "$K" "$ROWS" "$M" "$SECS" "$abytes")"
  python3 - "$o" "$g" <<'PY'
import json, sys
o, g = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f'{o["type"]:6} {o["isa"]:12} k={o["k"]} rows={o["rows"]} m={o["m"]}: '
      f'ork {o["gbps"]:.2f} GB/s ({o["cpu_gbps"]:.2f} per CPU-second), '
      f'ggml {g["ggml_gbps"]:.2f} GB/s ({g["ggml_cpu_gbps"]:.2f}), '
      f'ratio {o["gbps"] / g["ggml_gbps"]:.2f} ({o["cpu_gbps"] / g["ggml_cpu_gbps"]:.2f})')
PY
done
