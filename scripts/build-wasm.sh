#!/usr/bin/env bash
# Build a workspace cdylib for wasm32-wasip1 and print the artifact's path and size.
#
#   scripts/build-wasm.sh [PACKAGE]      (default: ace-filter)
#
# Uses a rustup-installed wasm32-wasip1 target when there is one. Otherwise
# it builds with Debian's rustc-web and the standard library from source
# (-Zbuild-std), linking with lld's wasm-ld and wasi-libc: the route that
# works on machines where rustup cannot download targets. The wasm build
# has its own target dir so the two toolchains never fight over fingerprints.
#
# Modules use Wasm SIMD (simd128): the decision core's per-destination
# arithmetic is written as dense lanes for the compiler to vectorise, and
# byte scans (JSON escapes, header names) shrink too: 5 % fewer Wasm
# instructions per request (BENCHMARKS.md, "Per-request cost"). Every
# runtime Envoy ships (V8, wasmtime, WAMR) supports it.
#
# The last line printed on stdout is the absolute path of the .wasm file.
# ACE_WASM_PROFILE, ACE_WASM_TARGET_DIR and ACE_WASM_RUSTFLAGS (extra rustc
# flags, e.g. `-C target-feature=-simd128` for a scalar build) select other
# builds. ACE_WASM_MANIFEST (a package outside the workspace) and
# ACE_WASM_EXAMPLE (one of its cdylib examples) build something other than
# a workspace library: the harness builds a published crate's examples
# this way. ACE_WASM_LINK_ARGS are rustc flags for the artifact alone
# (`cargo rustc -- ...`), not for its dependencies.
#
# A package outside the workspace is built with the workspace's profile
# (passed as `--config`, read from Cargo.toml) into the same target
# directory: with the same profile and flags, the standard library built
# from source for our own filters is reused instead of built again (45 s
# of a core for each such package).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PKG=${1:-ace-filter}
PROFILE=${ACE_WASM_PROFILE:-wasm}
TARGET_DIR=${ACE_WASM_TARGET_DIR:-$ROOT/target/wasm}
LIB=$(echo "$PKG" | tr - _)
FEATURES="-C target-feature=+simd128 ${ACE_WASM_RUSTFLAGS:-}"
SELECT=(-p "$PKG")
[ -z "${ACE_WASM_MANIFEST:-}" ] || SELECT+=(--manifest-path "$ACE_WASM_MANIFEST")
[ -z "${ACE_WASM_EXAMPLE:-}" ] || SELECT+=(--example "$ACE_WASM_EXAMPLE")
# `cargo rustc` when the artifact has flags of its own, else `cargo build`.
BUILD=(build)
LINK=()
if [ -n "${ACE_WASM_LINK_ARGS:-}" ]; then
    BUILD=(rustc)
    read -r -a words <<<"$ACE_WASM_LINK_ARGS"
    LINK=(-- "${words[@]}")
fi
if [ -n "${ACE_WASM_MANIFEST:-}" ]; then
    mapfile -t profile < <(python3 - "$ROOT/Cargo.toml" "$PROFILE" <<'PY'
import sys, tomllib, json
name = sys.argv[2]
with open(sys.argv[1], "rb") as f:
    p = tomllib.load(f).get("profile", {}).get(name)
if p is not None:
    for k, v in p.items():
        print("--config")
        print(f"profile.{name}.{k}={json.dumps(v)}")
PY
    )
    SELECT+=("${profile[@]}")
fi

if rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
    RUSTFLAGS="${RUSTFLAGS:-} $FEATURES" \
        cargo "${BUILD[@]}" -q --profile "$PROFILE" --target wasm32-wasip1 --target-dir "$TARGET_DIR" "${SELECT[@]}" "${LINK[@]}" >&2
else
    WASM_LD=$(ls /usr/lib/llvm-*/bin/wasm-ld 2>/dev/null | sort -V | tail -1 || true)
    if [ ! -x /usr/bin/cargo ] || [ ! -x /usr/bin/rustc ] || [ -z "$WASM_LD" ] || [ ! -d /usr/lib/wasm32-wasi ]; then
        echo "build-wasm: no wasm32-wasip1 toolchain: run 'make setup' (or scripts/setup.sh) first" >&2
        exit 1
    fi
    # Debian's cargo, with the rustup proxies out of the way.
    env -u RUSTUP_TOOLCHAIN \
        RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
        RUSTFLAGS="-C linker=$WASM_LD -L /usr/lib/wasm32-wasi $FEATURES" \
        /usr/bin/cargo "${BUILD[@]}" -q --profile "$PROFILE" --target wasm32-wasip1 \
        -Zbuild-std=std,panic_abort --target-dir "$TARGET_DIR" "${SELECT[@]}" "${LINK[@]}" >&2
fi
OUT="$TARGET_DIR/wasm32-wasip1/$PROFILE/$LIB.wasm"
[ -z "${ACE_WASM_EXAMPLE:-}" ] || OUT="$TARGET_DIR/wasm32-wasip1/$PROFILE/examples/$ACE_WASM_EXAMPLE.wasm"
if [ ! -f "$OUT" ]; then
    echo "build-wasm: expected $OUT after the build, but it is not there" >&2
    exit 1
fi
SIZE=$(stat -c %s "$OUT")
SHA=$(sha256sum "$OUT" | cut -d' ' -f1)
echo "build-wasm: $PKG -> $OUT ($SIZE bytes, $((SIZE / 1024)) KiB, sha256 $SHA)" >&2
echo "$OUT"
