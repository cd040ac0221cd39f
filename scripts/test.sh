#!/usr/bin/env bash
# The test command: fetch the real model once (cached), then run every test of the workspace,
# real-model tests included. Tests build with optimisation ([profile.test] in Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
ORK_MODEL="$(./scripts/fetch-model.sh)"
export ORK_MODEL
# The official openai Python client, for crates/ork-server's client test (installed once, quietly).
if command -v python3 >/dev/null 2>&1 && ! python3 -c "import openai" >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check openai >&2 \
    || echo "warning: 'pip install openai' failed; the openai client test will say so" >&2
fi
cargo test --workspace --locked "$@"
