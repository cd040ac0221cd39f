#!/usr/bin/env bash
# The board package: a stripped release `ork` for aarch64 (dynamically linked: it dlopens
# Rockchip's librknnrt.so), as
#   target/ork-VERSION-aarch64-linux-gnu.tar.gz   (ork, the systemd unit, config, udev rule, docs)
#   target/ork_VERSION-1_arm64.deb                (cargo-deb; metadata in crates/ork-cli/Cargo.toml)
# Needs the aarch64 Rust target, aarch64-linux-gnu-gcc (with the arm64 C library), its objdump and
# cargo-deb. All are checked before anything is built; what can be installed is installed, as
# .ci/run does — the Rust target (rustup target add), cargo-deb (cargo install cargo-deb --locked),
# the cross toolchain (apt-get, as root) — and what cannot is listed at once, each with the command
# that installs it. ORK_PACKAGE_NO_INSTALL=1: check and list only. Install and use: docs/board.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET=aarch64-unknown-linux-gnu
export CARGO_TARGET_DIR="${ORK_AARCH64_TARGET_DIR:-$ROOT/target/aarch64}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-aarch64-linux-gnu-gcc}"
OBJDUMP="${ORK_AARCH64_OBJDUMP:-aarch64-linux-gnu-objdump}"
LINKER=$CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER
install=true
[ "${ORK_PACKAGE_NO_INSTALL:-0}" = 1 ] && install=false

problems=()
apt=()
for pair in "$LINKER:gcc-aarch64-linux-gnu" "$OBJDUMP:binutils-aarch64-linux-gnu" tar:tar gzip:gzip; do
  tool=${pair%%:*}
  command -v "$tool" >/dev/null && continue
  case "$tool" in
    aarch64-linux-gnu-gcc | aarch64-linux-gnu-objdump | tar | gzip) apt+=("${pair#*:}") ;;
    *) problems+=("$tool not found (set by the environment; install it or unset the variable)") ;;
  esac
done
[ -f /usr/aarch64-linux-gnu/include/stdio.h ] || [ "$LINKER" != aarch64-linux-gnu-gcc ] ||
  apt+=(libc6-dev-arm64-cross)
if [ ${#apt[@]} -gt 0 ]; then
  if $install && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing ${apt[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt[@]}" ||
      problems+=("apt-get install ${apt[*]} failed")
  else
    problems+=("missing ${apt[*]}: sudo apt-get install ${apt[*]}")
  fi
fi
if ! command -v cargo >/dev/null; then
  problems+=("cargo not found: install Rust with rustup (https://rustup.rs)")
else
  libdir=$(rustc --print target-libdir --target "$TARGET" 2>/dev/null || true)
  if [ -z "$libdir" ] || ! compgen -G "$libdir/libcore-*.rlib" >/dev/null; then
    if $install && command -v rustup >/dev/null && rustup target add "$TARGET"; then
      :
    else
      problems+=("the Rust standard library for $TARGET is missing (cargo would fail with \"can't find crate for \`core\`\"): rustup target add $TARGET")
    fi
  fi
  if ! cargo deb --version >/dev/null 2>&1; then
    if $install && echo "== installing cargo-deb" && cargo install cargo-deb --locked; then
      :
    else
      problems+=("cargo-deb not found: cargo install cargo-deb --locked")
    fi
  fi
fi
if [ ${#problems[@]} -gt 0 ]; then
  echo "error: $0 cannot build the package yet:" >&2
  printf '  - %s\n' "${problems[@]}" >&2
  exit 1
fi

# Stripped, no debug info (the release profile keeps line tables for profiling on a PC).
echo "== building ork for $TARGET (release, stripped)"
CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
  cargo build --locked --release --target "$TARGET" -p ork-cli --bin ork
BIN="$CARGO_TARGET_DIR/$TARGET/release/ork"
file_out=$(file -b "$BIN" 2>/dev/null || true)
case "$file_out" in *"ARM aarch64"*dynamically*|"") ;; *) echo "error: $BIN is not a dynamic aarch64 executable: $file_out" >&2; exit 1 ;; esac

# The glibc it needs must not exceed what the .deb declares (depends = "libc6 (>= X)").
need=$("$OBJDUMP" -T "$BIN" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
declared=$(sed -n 's/^depends = ".*libc6 (>= \([0-9.]*\)).*/\1/p' crates/ork-cli/Cargo.toml)
if [ -z "$declared" ] || [ "$(printf '%s\n%s\n' "$need" "$declared" | sort -V | tail -1)" != "$declared" ]; then
  echo "error: ork needs glibc $need but crates/ork-cli/Cargo.toml declares libc6 (>= ${declared:-?})" >&2
  exit 1
fi
echo "ork needs glibc >= $need (the package declares >= $declared)"

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
echo "== tarball"
STAGE="$CARGO_TARGET_DIR/package/ork-$VERSION-aarch64-linux-gnu"
rm -rf "$STAGE"
mkdir -p "$STAGE"
cp "$BIN" "$STAGE/ork"
cp packaging/ork.service packaging/ork.conf packaging/ork-serve packaging/60-ork-npu.rules \
  docs/board.md docs/serve.md "$STAGE/"
TARBALL="$ROOT/target/ork-$VERSION-aarch64-linux-gnu.tar.gz"
tar -C "$(dirname "$STAGE")" --owner=0 --group=0 --sort=name -czf "$TARBALL" "$(basename "$STAGE")"

echo "== .deb (cargo-deb)"
# --no-build: the binary above; --no-strip: it is stripped already (no aarch64 strip needed).
DEB=$(cargo deb -p ork-cli --target "$TARGET" --no-build --no-strip --output "$ROOT/target/" \
  | tail -1)
[ -f "$DEB" ] || { echo "error: cargo-deb wrote no package ($DEB)" >&2; exit 1; }
if command -v dpkg-deb >/dev/null; then
  arch=$(dpkg-deb -f "$DEB" Architecture)
  [ "$arch" = arm64 ] || { echo "error: $DEB is for $arch, not arm64" >&2; exit 1; }
  dpkg-deb -c "$DEB" | awk '{print $1, $6}'
fi
ls -l "$BIN" "$TARBALL" "$DEB" | awk '{print $5, $9}'
echo "$DEB"
