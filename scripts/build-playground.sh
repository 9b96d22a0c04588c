#!/usr/bin/env bash
# Build the policy playground: ace-playground for wasm32-unknown-unknown,
# its JavaScript binding with wasm-bindgen, and the static site (the page
# from playground/www/ plus pkg/). Prints the site directory's absolute
# path as the last line on stdout; serve it with `ace playground` or any
# static web server (module scripts and .wasm need http://, not file://).
#
#   scripts/build-playground.sh
#
# Uses a rustup-installed wasm32-unknown-unknown target when there is one,
# otherwise Debian's rustc-web with the standard library built from source
# (-Zbuild-std) and lld's wasm-ld, as scripts/build-wasm.sh does for the
# filter. wasm-bindgen-cli must be the version of the wasm-bindgen crate in
# Cargo.lock (scripts/setup.sh installs it). ACE_PLAYGROUND_TARGET_DIR
# selects another target dir (default target/playground-wasm), whose
# site/ subdirectory receives the page.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TARGET=wasm32-unknown-unknown
PROFILE=wasm
TARGET_DIR=${ACE_PLAYGROUND_TARGET_DIR:-$ROOT/target/playground-wasm}
SITE="$TARGET_DIR/site"

fail() {
    echo "build-playground: $*" >&2
    exit 1
}

WB_VERSION=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
if ! command -v wasm-bindgen >/dev/null; then
    fail "wasm-bindgen-cli is missing (need $WB_VERSION): run 'make setup' (or scripts/setup.sh)"
fi
HAVE=$(wasm-bindgen --version | awk '{print $2}')
if [ "$HAVE" != "$WB_VERSION" ]; then
    fail "wasm-bindgen-cli is $HAVE but the wasm-bindgen crate in Cargo.lock is $WB_VERSION: run 'make setup' (or cargo install wasm-bindgen-cli --version $WB_VERSION)"
fi

# The standard library's own strip would drop the sections wasm-bindgen
# reads; wasm-bindgen removes them itself.
export CARGO_PROFILE_WASM_STRIP=false
if rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
    cargo build -q --profile "$PROFILE" --target "$TARGET" --target-dir "$TARGET_DIR" -p ace-playground >&2
else
    WASM_LD=$(ls /usr/lib/llvm-*/bin/wasm-ld 2>/dev/null | sort -V | tail -1 || true)
    if [ ! -x /usr/bin/cargo ] || [ ! -x /usr/bin/rustc ] || [ -z "$WASM_LD" ] || [ ! -d /usr/lib/rustlib/src/rust ]; then
        fail "no $TARGET toolchain (rustup target, or Debian's rustc-web, rust-web-src and lld): run 'make setup' (or scripts/setup.sh) first"
    fi
    env -u RUSTUP_TOOLCHAIN \
        RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
        RUSTFLAGS="-C linker=$WASM_LD" \
        /usr/bin/cargo build -q --profile "$PROFILE" --target "$TARGET" \
        -Zbuild-std=std,panic_abort --target-dir "$TARGET_DIR" -p ace-playground >&2
fi
WASM="$TARGET_DIR/$TARGET/$PROFILE/ace_playground.wasm"
[ -f "$WASM" ] || fail "expected $WASM after the build, but it is not there"

rm -rf "$SITE.new"
mkdir -p "$SITE.new/pkg"
wasm-bindgen --target web --no-typescript --remove-name-section --remove-producers-section --out-dir "$SITE.new/pkg" "$WASM" >&2
cp -R playground/www/. "$SITE.new/"
# The shipped examples the page starts from, and their index.
mkdir -p "$SITE.new/examples"
SCHEMA=$(cd policies && ls *.cedarschema | head -1)
cp policies/*.cedarschema policies/*.cedar policies/fleet.toml "$SITE.new/examples/"
{
    printf '{"schema": "%s", "manifest": "fleet.toml", "policies": [' "$SCHEMA"
    (cd policies && ls *.cedar) | awk '{ printf "%s\"%s\"", (NR > 1 ? ", " : ""), $0 }'
    printf ']}\n'
} > "$SITE.new/examples/index.json"
rm -rf "$SITE"
mv "$SITE.new" "$SITE"

BG="$SITE/pkg/ace_playground_bg.wasm"
SIZE=$(stat -c %s "$BG")
PAGE=$(find "$SITE" -type f ! -name '*.wasm' -printf '%s\n' | awk '{ s += $1 } END { print s }')
echo "build-playground: $SITE (module $SIZE bytes, $((SIZE / 1024)) KiB; page and glue $PAGE bytes)" >&2
echo "$SITE"
