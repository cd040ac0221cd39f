#!/usr/bin/env bash
# ork on aarch64, built here and run under qemu-user (docs/device.md, "aarch64"): qemu proves
# correctness, never speed. Needs the aarch64 Rust target, aarch64-linux-gnu-gcc with its C
# library (/usr/aarch64-linux-gnu) and qemu-aarch64; .ci/run installs them.
#
#  1. a probe (thread spawn/join, mutex, condvar) decides how test binaries are linked: dynamic
#     (as ork ships; it dlopens librknnrt.so), dynamic with GLIBC_TUNABLES=glibc.pthread.rseq=0
#     if plain dynamic hangs, else static (+crt-static; the rknn stand-in, a dlopened library,
#     cannot run then and its suites are skipped, said below);
#  2. the unit tests of ork-kernels, ork-device, ork-pack and ork-exec (every kernel's property test: each
#     aarch64 twin against its scalar one) under `-cpu cortex-a76` (dotprod, fp16) and
#     `-cpu cortex-a53` (neither), so both sides of each feature dispatch run; whole crates, so
#     new kernel tests are picked up without editing this script;
#  3. the integration tests of ork-gguf, ork-pack and ork-store;
#  4. ork-device's integration tests: the conformance suite on the emulator and, through the
#     rknn stand-in built for aarch64 and dlopened, on the rknn backend;
#  5. the real model's greedy run: the aarch64 `ork run --json` tokens must equal x86's, on the
#     emulated NPU path and on the CPU engine (`--device cpu`), both computed on x86 in this run;
#  6. arch-neutral packs: `ork convert` on aarch64 and on x86 write the same bytes (sha256);
#  7. bad input: ork's CPU check built to assume dotprod, started on a CPU without it, exits 2
#     naming it (no SIGILL).
#
# Every emulated run is wrapped in `timeout` (ORK_QEMU_TIMEOUT seconds, default 1200). The
# target directory is target/aarch64 (ORK_AARCH64_TARGET_DIR). Extra arguments are passed to
# every `cargo test` (e.g. a test-name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET=aarch64-unknown-linux-gnu
TD="${ORK_AARCH64_TARGET_DIR:-$ROOT/target/aarch64}"
QEMU="${ORK_QEMU:-qemu-aarch64}"
TMO="${ORK_QEMU_TIMEOUT:-1200}"
export QEMU_LD_PREFIX="${QEMU_LD_PREFIX:-/usr/aarch64-linux-gnu}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-aarch64-linux-gnu-gcc}"
LINKER="$CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER"
for tool in "$LINKER" "$QEMU" timeout python3 sha256sum; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found (see .ci/run for what to install)" >&2; exit 1; }
done
rustup target list --installed 2>/dev/null | grep -qx "$TARGET" \
  || { echo "error: the Rust target $TARGET is missing: rustup target add $TARGET" >&2; exit 1; }
[ -d "$QEMU_LD_PREFIX/lib" ] || { echo "error: no aarch64 C library at $QEMU_LD_PREFIX (libc6-dev-arm64-cross)" >&2; exit 1; }
ORK_MODEL="$(./scripts/fetch-model.sh)"
export ORK_MODEL
mkdir -p "$TD"
SECONDS=0
step() { echo "== aarch64 [${SECONDS}s]: $*"; }

# ---- 1. link mode --------------------------------------------------------------------------
step "probe: does a dynamically linked aarch64 program that joins threads run under $QEMU?"
PROBE="$TD/probe-dynamic"
rustc --edition 2021 -O --target "$TARGET" -C linker="$LINKER" -o "$PROBE" scripts/aarch64/probe.rs
LINK=dynamic
if timeout 60 "$QEMU" "$PROBE"; then
  echo "dynamic binaries run"
elif GLIBC_TUNABLES=glibc.pthread.rseq=0 timeout 60 "$QEMU" "$PROBE"; then
  echo "dynamic binaries hang or fail, but run with GLIBC_TUNABLES=glibc.pthread.rseq=0: using it"
  export GLIBC_TUNABLES=glibc.pthread.rseq=0
else
  echo "dynamic binaries hang or fail under $QEMU (even with glibc.pthread.rseq=0): linking the test binaries statically"
  PROBE="$TD/probe-static"
  rustc --edition 2021 -O --target "$TARGET" -C linker="$LINKER" -C target-feature=+crt-static \
    -o "$PROBE" scripts/aarch64/probe.rs
  timeout 60 "$QEMU" "$PROBE" || { echo "error: even a static aarch64 probe fails under $QEMU" >&2; exit 1; }
  LINK=static
  TD="$TD-static"
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"
fi
# Tests that re-run their own binary as a child process need the kernel to start an aarch64
# program (binfmt_misc with qemu registered); without it they are skipped, by name.
SKIP_CHILD=()
if timeout 60 "$PROBE" >/dev/null 2>&1; then
  echo "binfmt_misc runs aarch64 programs: the tests that spawn children run too"
else
  SKIP_CHILD=(
    --skip kill_9_mid_write_never_leaves_a_partial_target
    --skip concurrent_writer_processes_both_succeed_and_leave_a_valid_file
    --skip sigint_mid_write_removes_the_temp
    --skip an_application_that_takes_the_signals_is_not_killed_by_the_writer
    --skip rlimit_fsize_write_failure_keeps_target_and_removes_temp
    --skip an_error_code_from_any_call_names_the_call
    --skip an_old_runtime_is_refused
    --skip rk3576_type_pairs_equal_the_emulator
  )
  echo "no binfmt_misc entry for aarch64: skipping the tests that re-run their binary as a child (${SKIP_CHILD[*]//--skip/})"
fi

# cargo test for aarch64 under one qemu CPU model: `atest CPU CARGO-ARGS… -- TEST-ARGS…`.
atest() {
  local cpu=$1
  shift
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="timeout -k 10 $TMO $QEMU -cpu $cpu" \
    cargo test --locked --target "$TARGET" --target-dir "$TD" "$@"
}

# One package set for every `cargo test` below, so that features unify the same way each time
# and the binaries are built once.
PKGS=(-p ork-kernels -p ork-device -p ork-pack -p ork-exec -p ork-io -p ork-gguf -p ork-store)
step "building the test binaries ($LINK)"
cargo test --locked --target "$TARGET" --target-dir "$TD" --no-run "${PKGS[@]}"

# ---- 2. kernels, with and without dotprod / fp16 -------------------------------------------
# ORK_EXPECT_KERNELS makes ork-kernels' `available_kernels_follow_the_cpu` fail if the emulated
# CPU offers other kernels than that model has, so a run meant to test sdot cannot test less.
for cpu in cortex-a76 cortex-a53; do
  case $cpu in
    cortex-a76) expect=scalar,neon,neon-dotprod ;;
    *) expect=scalar,neon ;;
  esac
  step "unit tests (kernel property tests) of ork-kernels, ork-device, ork-pack, ork-exec, ork-io, ork-gguf, ork-store on -cpu $cpu (kernels: $expect)"
  ORK_EXPECT_KERNELS=$expect atest "$cpu" "${PKGS[@]}" --lib -- "$@"
done

# ---- 3. gguf / pack / store ----------------------------------------------------------------
step "integration tests of ork-gguf, ork-pack, ork-store (-cpu cortex-a76)"
atest cortex-a76 "${PKGS[@]}" --test ork-gguf --test ork-pack --test ork-store -- "${SKIP_CHILD[@]}" "$@"

# ---- 4. conformance, emulator and rknn stand-in --------------------------------------------
if [ "$LINK" = dynamic ]; then
  step "the rknn stand-in and ork for aarch64, and ork-device's integration tests through the stand-in (-cpu cortex-a76)"
  # ork (step 5) is built in the same invocation: the stand-in's crates are a subset of ork's, so
  # built apart they would be compiled twice, with two feature sets.
  cargo build --locked --target "$TARGET" --target-dir "$TD" --profile test -p ork-rknn-standin -p ork-cli
  ORK_RKNN_LIB="$TD/$TARGET/debug/libork_rknn_standin.so" \
    atest cortex-a76 "${PKGS[@]}" --test ork-device -- "${SKIP_CHILD[@]}" "$@"
else
  step "ork-device's integration tests without the rknn stand-in (static test binaries cannot dlopen it): skipping rknn_standin*, rknn_backend::*"
  atest cortex-a76 "${PKGS[@]}" --test ork-device -- "${SKIP_CHILD[@]}" --skip rknn_standin --skip rknn_backend "$@"
fi

# ---- 5. the real model, greedy: aarch64 tokens = x86 tokens --------------------------------
step "ork for x86 and aarch64"
# x86: the binary scripts/test.sh's workspace tests built (a no-op after them; `-p ork-cli`
# alone would unify features differently and rebuild the dependencies).
# ORK_X86_ORK names an x86 ork to use instead.
if [ -z "${ORK_X86_ORK:-}" ]; then
  cargo test --locked --workspace --no-run
fi
# On dynamic test binaries a no-op after step 4's build (the same packages, so the same features);
# static ones cannot build the stand-in (a cdylib).
if [ "$LINK" = dynamic ]; then
  cargo build --locked --target "$TARGET" --target-dir "$TD" --profile test -p ork-rknn-standin -p ork-cli
else
  cargo build --locked --target "$TARGET" --target-dir "$TD" --profile test -p ork-cli
fi
X86_ORK="${ORK_X86_ORK:-$ROOT/target/debug/ork}"
A64_ORK="$TD/$TARGET/debug/ork"
WORK="$(mktemp -d "$TD/check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# The emulated NPU path (int8 pack) and the CPU engine (`--device cpu`: the GGUF's own Q4_1
# blocks, ork-kernels' NEON kernels with sdot on cortex-a76 and the plain NEON ones on
# cortex-a53); each device's x86 tokens are computed here, in this run, and are the reference.
for device in emu cpu; do
  RUN=(run --model "$ORK_MODEL" --device "$device" --temp 0 -n 24 --json
    --prompt "The three primary colours are")
  if [ "$device" = emu ]; then RUN+=(--no-pack); fi
  step "greedy run on x86 (--device $device)"
  "$X86_ORK" "${RUN[@]}" >"$WORK/x86-$device.json"
  for cpu in cortex-a76 cortex-a53; do
    step "greedy run on aarch64 (-cpu $cpu, --device $device)"
    timeout -k 10 "$TMO" "$QEMU" -cpu "$cpu" "$A64_ORK" "${RUN[@]}" >"$WORK/a64-$cpu-$device.json"
    python3 - "$WORK/x86-$device.json" "$WORK/a64-$cpu-$device.json" "$cpu --device $device" <<'PY'
import json, sys
x, a = (json.load(open(p)) for p in sys.argv[1:3])
if x["tokens"] != a["tokens"]:
    sys.exit(f"error: aarch64 ({sys.argv[3]}) tokens {a['tokens']} differ from x86 {x['tokens']}")
print(f"same {len(x['tokens'])} tokens as x86: {x['text']!r}")
PY
  done
done

# ---- 6. arch-neutral packs ----------------------------------------------------------------
step "ork convert on x86 and on aarch64: the same bytes"
"$X86_ORK" convert "$ORK_MODEL" -o "$WORK/x86.orkpack" >/dev/null
timeout -k 10 "$TMO" "$QEMU" -cpu cortex-a76 "$A64_ORK" convert "$ORK_MODEL" -o "$WORK/a64.orkpack" >/dev/null
x86_sum=$(sha256sum <"$WORK/x86.orkpack" | cut -d' ' -f1)
a64_sum=$(sha256sum <"$WORK/a64.orkpack" | cut -d' ' -f1)
if [ "$x86_sum" != "$a64_sum" ]; then
  echo "error: ork convert wrote different packs: x86 $x86_sum, aarch64 $a64_sum" >&2
  exit 1
fi
echo "same pack, sha256 $x86_sum"

# ---- 7. a build assuming dotprod, started on a CPU without it --------------------------------
# ork's first act, crates/ork-cli/src/cpu_check.rs, built on its own with +dotprod (a second,
# where rebuilding ork with it would rebuild the crate graph): cortex-a53 must get exit 2 naming
# dotprod, cortex-a76 must pass.
step "the CPU check built with +dotprod: exit 2 naming dotprod on cortex-a53, passes on cortex-a76"
rustc --edition 2021 -O --target "$TARGET" -C linker="$LINKER" -C target-feature=+dotprod \
  -o "$WORK/cpu-check-dotprod" scripts/aarch64/cpu_check_main.rs
timeout -k 10 120 "$QEMU" -cpu cortex-a76 "$WORK/cpu-check-dotprod" >/dev/null
set +e
timeout -k 10 120 "$QEMU" -cpu cortex-a53 "$WORK/cpu-check-dotprod" 2>"$WORK/a53.err"
rc=$?
set -e
if [ "$rc" != 2 ] || ! grep -q "lacks dotprod" "$WORK/a53.err"; then
  echo "error: the +dotprod build on cortex-a53 exited $rc: $(cat "$WORK/a53.err")" >&2
  exit 1
fi
echo "exit 2: $(cat "$WORK/a53.err")"
step "done ($LINK test binaries)"
