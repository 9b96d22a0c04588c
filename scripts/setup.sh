#!/usr/bin/env bash
# Install everything ACE needs on a fresh machine of this kind, idempotently:
# what `make test` runs, and the other targets' tools.
#
#   - what the demo needs (scripts/setup-demo.sh, sourced first: the
#     wasm32-wasip1 build path, a C compiler, a real Envoy 1.40.0);
#   - cmake, g++ and libclang-dev for the HiGHS solver (planner full mode);
#   - wrk and h2load (nghttp2-client) for load tests;
#   - PostgreSQL and headless Chromium for the ledger's tests;
#   - wasm-bindgen-cli, at the wasm-bindgen crate's version, for the policy
#     playground (which builds for wasm32-unknown-unknown by the same route);
#   - the published proxy-wasm package's examples for the differential suite.
#
# Each step checks before it installs, so a second run does nothing and
# prints one line per component.
set -euo pipefail

# Steps 1 (cargo), 2 (wasm32-wasip1), 3 (a C compiler) and 4 (Envoy), and
# the helpers `say` and `apt_install`.
. "$(dirname "${BASH_SOURCE[0]}")/setup-demo.sh"

# 5. Native build tools: cmake, a C++ compiler and libclang build the HiGHS
#    MILP solver that the planner's full mode links; wrk and h2load drive load tests.
apt_install wrk nghttp2-client make cmake g++ libclang-dev

# 6. The ledger's tests: a real PostgreSQL (started by the tests themselves
#    in a temp dir) and headless Chromium to check the HTML report's charts.
apt_install postgresql chromium

# 7. The policy playground (playground/): wasm-bindgen-cli turns its
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

# 8. Filters we did not write: the differential suite builds the cdylib
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
