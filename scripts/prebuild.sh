#!/usr/bin/env bash
# Build, ahead of the tests, the artifacts that tests build for themselves
# one at a time while the test runner waits: the filters for wasm32-wasip1
# (ace-filter and the proxy-wasm host's example filters), the dynamic
# modules in release mode, and the playground's page. Each has its own
# target directory (target/wasm, target/dylib, target/playground-wasm), so
# none of this waits on, or is waited on by, the main build.
#
#   scripts/prebuild.sh start   # in the background; returns at once
#   scripts/prebuild.sh wait    # until a started prebuild has finished
#   scripts/prebuild.sh         # in the foreground
#
# Why: most of these builds are link-time optimised with one codegen unit,
# so on a 2-core machine they use one core for minutes; run from inside the
# tests they leave the other core idle, while `make test` starts them here
# at once, so they overlap the formatting check, clippy and the test build.
# The tests run exactly the same commands (scripts/build-wasm.sh,
# `cargo build --release -p PKG --target-dir target/dylib`,
# scripts/build-playground.sh), which find the work done; if a build fails
# here, the test that needs it builds again and fails with its own
# message. This is only an early start: nothing here is required, and its
# output goes to target/prebuild.log. One cargo job, so that the
# foreground build keeps both cores' worth of jobs.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LOCK="$ROOT/target/prebuild.lock"
LOG="$ROOT/target/prebuild.log"
mkdir -p "$ROOT/target"

case "${1:-run}" in
start)
    # flock holds the lock while the builds run; `wait` takes it after them.
    nohup flock "$LOCK" bash "$0" run >"$LOG" 2>&1 </dev/null &
    echo "prebuild: building the tests' wasm filters, dynamic modules and playground in the background ($LOG)"
    # Give flock the lock before anyone waits on it.
    for _ in $(seq 50); do
        flock -n "$LOCK" true 2>/dev/null || exit 0
        sleep 0.1
    done
    exit 0
    ;;
wait)
    flock "$LOCK" true
    ok=$(grep -c '^prebuild: ok' "$LOG" 2>/dev/null || true)
    failed=$(grep -c '^prebuild: FAILED' "$LOG" 2>/dev/null || true)
    echo "prebuild: done (${ok:-0} built, ${failed:-0} failed; $LOG)"
    exit 0
    ;;
run) ;;
*)
    echo "usage: scripts/prebuild.sh [start|wait|run]" >&2
    exit 2
    ;;
esac

export CARGO_BUILD_JOBS=1
CARGO=${CARGO:-cargo}
step() {
    local what=$1
    shift
    local t0=$SECONDS
    if "$@" >/dev/null; then
        echo "prebuild: ok $what ($((SECONDS - t0)) s)"
    else
        echo "prebuild: FAILED $what ($((SECONDS - t0)) s)"
    fi
}
# The longest first: the playground's page (cli/tests/playground.rs).
step "playground page" bash scripts/build-playground.sh
# harness::wasm::build and wasm-host/tests/common: the real-Envoy tests
# and the proxy-wasm host's tests.
for pkg in ace-filter ace-example-header-rewrite ace-example-local-auth \
    ace-example-http-callout ace-example-body-rewrite ace-example-callback-log \
    ace-example-grpc-callout ace-example-metadata-probe; do
    step "$pkg (wasm32-wasip1)" bash scripts/build-wasm.sh "$pkg"
done
# harness::dylib::build: one package per cargo invocation, as there.
for pkg in ace-dynamic ace-bench-dynamic-floor; do
    step "$pkg (dynamic module)" "$CARGO" build --release -q -p "$pkg" --target-dir "$ROOT/target/dylib"
done
exit 0
