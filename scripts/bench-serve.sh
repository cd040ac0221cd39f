#!/usr/bin/env bash
# Benchmark `ork serve` (release build): aggregate decode tok/s with 1, 2, 4, 8 concurrent
# streams and the time to first token beside 7 decoding streams, resident and at a quarter
# budget. Usage: scripts/bench-serve.sh [MODEL.gguf] [extra bench_serve.py args]
# Not part of the tests. Figures: README.md and docs/serve.md.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-$(./scripts/fetch-model.sh)}"
shift || true
# ORK_BIN: an ork binary already built (default: build the release one).
if [ -n "${ORK_BIN:-}" ]; then
  ORK="$ORK_BIN"
else
  cargo build --release -p ork-cli >&2
  ORK=target/release/ork
fi
PACK=.cache/bench-serve.orkpack
for budget in 1024 33; do
  log=$(mktemp)
  "$ORK" serve --model "$MODEL" --pack "$PACK" --device emu --budget-mb "$budget" --port 0 --max-seqs 8 2>"$log" &
  pid=$!
  for _ in $(seq 600); do grep -q "serving" "$log" && break; sleep 0.1; done
  line=$(grep -m1 "serving" "$log") || { cat "$log" >&2; kill "$pid"; exit 1; }
  url=${line##* on }
  id=${line#\[ork\] serving }; id=${id%% on *}
  echo "== budget $budget MiB" >&2
  python3 scripts/bench_serve.py "$url" "$id" "$@" | sed "s/^/{\"budget_mb\": $budget, \"result\": /; s/\$/}/"
  kill -TERM "$pid"; wait "$pid" || true
  rm -f "$log"
done
