#!/usr/bin/env bash
# The test command: fetch the real model once (cached), then run every test of the workspace,
# real-model tests included. Tests build with optimisation ([profile.test] in Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
ORK_MODEL="$(./scripts/fetch-model.sh)"
export ORK_MODEL
cargo test --workspace --locked "$@"
