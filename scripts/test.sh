#!/usr/bin/env bash
# The test command: fetch the real models once (cached), then run every test of the workspace,
# real-model tests included, and the rknn backend's tests against the stand-in runtime. Tests build with optimisation ([profile.test] in Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
ORK_MODEL="$(./scripts/fetch-model.sh)"
export ORK_MODEL
# The second real model, Gemma 3 270M (Q4_K_M), for the gemma3 architecture's checks.
ORK_GEMMA3="$(./scripts/fetch-model.sh gemma3)"
export ORK_GEMMA3
# The CI stand-in of the vendor NPU runtime (a shared library the rknn tests dlopen, as ork
# dlopens librknnrt.so on a board). Built here, before the tests, with the test profile (so its
# kernels run optimised), and named to the tests through ORK_RKNN_LIB; a test that needs it and
# does not find it fails naming this step (ork_testkit::rknn_standin).
cargo build -p ork-rknn-standin --profile test --locked
ORK_RKNN_LIB="$PWD/target/debug/libork_rknn_standin.so"
export ORK_RKNN_LIB
# The official openai Python client, for crates/ork-server's client test (installed once, quietly).
if command -v python3 >/dev/null 2>&1 && ! python3 -c "import openai" >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check openai >&2 \
    || echo "warning: 'pip install openai' failed; the openai client test will say so" >&2
fi
cargo test --workspace --locked "$@"
