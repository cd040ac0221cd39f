#!/usr/bin/env bash
# Cycles per 256 weights of each NEON dot-product kernel, ork's beside ggml's, under LLVM's
# Cortex-A76 and Cortex-A55 scheduling models (llvm-mca). An ESTIMATE from a scheduling model,
# not a measurement on a core. Not part of the tests (it downloads a 77 MB source tarball once).
#
# Usage: scripts/kernel-cycles.sh [--json] [--gemm] [--cores rk3576]
#
# `--gemm`: the prefill (M > 1) table instead, in cycles per 256 multiply-adds (weights ×
# activation rows): ork's M > 1 NEON dotprod path beside the kernel llama.cpp runs for prefill on
# the RK3588's A76 (the repacked GEMM of ggml-cpu/arch/arm/repack.cpp where its CPU_REPACK buffer
# takes the type on a dotprod core without i8mm, llamafile's tinyBLAS for F16, else vec_dot row
# by row; kernel_cycles.py's GGML_GEMM says which). `--json` rows always carry both tables
# (`ork_gemm`, `ggml_gemm`, `ggml_gemm_kernel`).
#
# `--cores rk3576`: the RK3576's Cortex-A72/A53 (ARMv8.0-A, no dotprod, no fp16 arithmetic):
# ggml built with `-march=armv8-a` (its plain-NEON paths), ggml's column only.
#
# - ggml: llama.cpp's ggml/src/ggml-cpu/arch/arm/quants.c from llama-cpp-python 0.3.36's source
#   distribution (PyPI, `pip download --no-binary`), compiled with
#   `aarch64-linux-gnu-gcc -O3 -march=armv8.2-a+dotprod+fp16 -S` (the RK3588's A76/A55: ARMv8.2-A
#   with dotprod and fp16 arithmetic, no i8mm); F16 from ggml-cpu/vec.cpp (g++).
# - ork: ork-kernels built for aarch64-unknown-linux-gnu with `-C target-cpu=cortex-a76`
#   (`cargo rustc --release -p ork-kernels --target aarch64-unknown-linux-gnu -- --emit asm`)
#   and `-C symbol-mangling-version=v0`: Rust's default (legacy) mangling leaves generic
#   arguments out of symbol names, so `row_sdot::<Q4_0, 1>` and `row_sdot::<Q8_0, 4>` were
#   indistinguishable and no kernel could be matched to its type (the column was all null).
#   v0 names change no code.
# - scripts/kernel_cycles.py finds each kernel's hot loop and runs llvm-mca on it (how, in its
#   docstring). Deterministic: pinned sources, fixed flags, fixed llvm-mca iteration count.
#
# Installs what it lacks, as root: Debian's llvm (llvm-mca), gcc- and g++-aarch64-linux-gnu (apt), the
# rust aarch64 target (rustup). Work files go to ${ORK_CACHE:-.cache}/kernel-cycles.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work="${ORK_CACHE:-$root/.cache}/kernel-cycles"
mkdir -p "$work"
log() { echo "kernel-cycles: $*" >&2; }

need_apt=()
command -v llvm-mca >/dev/null || need_apt+=(llvm)
command -v aarch64-linux-gnu-gcc >/dev/null || need_apt+=(gcc-aarch64-linux-gnu)
command -v aarch64-linux-gnu-g++ >/dev/null || need_apt+=(g++-aarch64-linux-gnu)
if ((${#need_apt[@]})); then
    log "installing ${need_apt[*]} (apt)"
    apt-get install -y "${need_apt[@]}" >&2 || { apt-get update >&2 && apt-get install -y "${need_apt[@]}" >&2; }
fi

# ggml's sources, from llama-cpp-python's source distribution: a cached tarball of it (an
# earlier version of this script kept one), else pip's download of it.
ver=0.3.36
tarball="$work/llama_cpp_python-$ver.tar.gz"
src="$work/llama_cpp_python-$ver/vendor/llama.cpp/ggml"
if [[ ! -f $src/src/ggml-cpu/arch/arm/quants.c && -s $tarball ]]; then
    tar -xzf "$tarball" -C "$work" --wildcards \
        "llama_cpp_python-$ver/vendor/llama.cpp/ggml/include/*" \
        "llama_cpp_python-$ver/vendor/llama.cpp/ggml/src/*"
fi
if [[ ! -f $src/src/ggml-cpu/arch/arm/quants.c ]]; then
    # pip downloads and unpacks the sdist, then fails to prepare its metadata where CMake is
    # missing and deletes what it unpacked unless told --no-clean; its temporary directory
    # (TMPDIR) is made here, ggml's sources copied out of it, and it is removed after.
    log "downloading llama-cpp-python $ver's source distribution (PyPI)"
    dl=$(mktemp -d)
    TMPDIR="$dl" pip download --no-clean --no-deps --no-binary :all: --no-build-isolation \
        "llama-cpp-python==$ver" -d "$dl/out" >&2 || true
    quants=$(find "$dl" -path "*/vendor/llama.cpp/ggml/src/ggml-cpu/arch/arm/quants.c" | head -1)
    [[ -n $quants ]] || { rm -rf "$dl"; log "the source distribution was not downloaded"; exit 1; }
    got=${quants%/src/ggml-cpu/arch/arm/quants.c}
    mkdir -p "$src.tmp" && cp -r "$got/include" "$got/src" "$src.tmp/" && mv "$src.tmp" "$src"
    rm -rf "$dl"
fi
# The RK3588's cores: ARMv8.2-A with dotprod and fp16 arithmetic, no i8mm (docs/kernels.md);
# the RK3576's (--cores rk3576): ARMv8.0-A.
march=armv8.2-a+dotprod+fp16 tag=""
[[ " $* " == *" rk3576 "* ]] && march=armv8-a tag=-rk3576
flags=(-O3 -march=$march -fno-asynchronous-unwind-tables
    -I"$src/include" -I"$src/src" -I"$src/src/ggml-cpu")
aarch64-linux-gnu-gcc "${flags[@]}" -S "$src/src/ggml-cpu/arch/arm/quants.c" -o "$work/ggml-quants$tag.s"
aarch64-linux-gnu-g++ "${flags[@]}" -S "$src/src/ggml-cpu/vec.cpp" -o "$work/ggml-vec$tag.s"
if [[ -n $tag ]]; then
    exec python3 scripts/kernel_cycles.py --ggml "$work/ggml-quants$tag.s" --ggml "$work/ggml-vec$tag.s" "$@"
fi

# ork's kernels (the column is empty, "-"/null, if ork-kernels has no NEON block kernels).
ork_args=()
if grep -rqs "sdot\|vdotq_s32" crates/ork-kernels/src/blocks/; then
    rustup target list --installed | grep -q aarch64-unknown-linux-gnu \
        || rustup target add aarch64-unknown-linux-gnu >&2
    tdir="$root/target/kernel-cycles"
    CARGO_TARGET_DIR="$tdir" cargo rustc --release -q -p ork-kernels \
        --target aarch64-unknown-linux-gnu -- --emit asm -C target-cpu=cortex-a76 \
        -C symbol-mangling-version=v0 >&2
    ork_s=$(ls -t "$tdir"/aarch64-unknown-linux-gnu/release/deps/ork_kernels-*.s | head -1)
    ork_args=(--ork "$ork_s")
else
    log "ork-kernels has no NEON block kernels yet: the ork column is empty"
fi
# ggml's prefill kernels (`--gemm`): the repacked GEMMs and llamafile's tinyBLAS (built, as
# llama.cpp's CMake does by default, with GGML_USE_LLAMAFILE).
aarch64-linux-gnu-g++ "${flags[@]}" -S "$src/src/ggml-cpu/arch/arm/repack.cpp" -o "$work/ggml-repack.s"
aarch64-linux-gnu-g++ "${flags[@]}" -DGGML_USE_LLAMAFILE -S "$src/src/ggml-cpu/llamafile/sgemm.cpp" \
    -o "$work/ggml-sgemm.s"
python3 scripts/kernel_cycles.py --ggml "$work/ggml-quants.s" --ggml "$work/ggml-vec.s" \
    --ggml "$work/ggml-repack.s" --ggml "$work/ggml-sgemm.s" "${ork_args[@]}" "$@"
