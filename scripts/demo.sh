#!/usr/bin/env bash
# The main job: fetch SmolLM2-135M, build ork, then run one prompt twice on the emulated NPU with a
# weight budget below the model's packed size. The first pass converts (packs every weight and
# writes the .orkpack), the second reloads the pre-tiled weights from it. Both stats lines print.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$(./scripts/fetch-model.sh)"
cargo build --release --locked -p ork-cli
ORK="${CARGO_TARGET_DIR:-target}/release/ork"
PACK="${ORK_DEMO_PACK:-.cache/demo.orkpack}"
BUDGET_MB="${ORK_DEMO_BUDGET_MB:-40}"
PROMPT="${ORK_DEMO_PROMPT:-The capital of France is}"
rm -f "$PACK"
echo "== plan: $MODEL with a ${BUDGET_MB} MiB budget"
"$ORK" plan --model "$MODEL" --budget-mb "$BUDGET_MB"
echo
echo "== pass 1 (CONVERT: no .orkpack yet)"
"$ORK" run --model "$MODEL" --pack "$PACK" --budget-mb "$BUDGET_MB" --device emu --prompt "$PROMPT" -n 32
echo
echo "== pass 2 (RELOAD: pre-tiled weights from $PACK)"
"$ORK" run --model "$MODEL" --pack "$PACK" --budget-mb "$BUDGET_MB" --device emu --prompt "$PROMPT" -n 32
