#!/usr/bin/env bash
# The test command: fetch the real model once (cached), then run every test of the workspace,
# real-model tests included, and the rknn backend's tests against the stand-in runtime. Tests build with optimisation ([profile.test] in Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
ORK_MODEL="$(./scripts/fetch-model.sh)"
export ORK_MODEL
# The CI stand-in of the vendor NPU runtime (a shared library the rknn tests dlopen, as ork
# dlopens librknnrt.so on a board). Built here, before the tests, with the test profile (so its
# kernels run optimised), and named to the tests through ORK_RKNN_LIB; a test that needs it and
# does not find it fails naming this step (ork_testkit::rknn_standin).
cargo build -p ork-rknn-standin --profile test --locked
ORK_RKNN_LIB="$PWD/target/debug/libork_rknn_standin.so"
export ORK_RKNN_LIB
cargo test --workspace --locked "$@"
