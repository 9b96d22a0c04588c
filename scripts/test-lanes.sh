#!/usr/bin/env bash
# Run every test `make test` runs (what `cargo test --workspace --tests`
# and `cargo test --workspace --doc` run), in two lanes at once.
#
# Why: cargo runs test binaries one after another, and the long ones (the
# policy verifier's planted faults, the real-Envoy suite, the simulator's
# CLI runs, the browser test, the proxy-wasm host's differential tests)
# each keep about one core busy: on a 2-core CI machine the other core
# idles for most of the ten minutes they take. Two cargo processes over the
# same build (already compiled by `cargo test --no-run`) fill both.
#
# The lanes split by test target name, and the second takes every name the
# first does not, so a new test file runs without being listed here. Both
# lanes select from the whole workspace, so features resolve as for the
# build and nothing is compiled again. Libraries built with `test = false`
# (the example proxy-wasm filters) are left out as `--tests` leaves them.
# The first lane takes the tests that need what `scripts/prebuild.sh`
# builds in the background (the wasm filters, the dynamic modules, the
# playground's page) and waits for it before they start; the second needs
# none of it and starts at once, so no core idles while the prebuild ends.
# Each line is prefixed with its lane; the exit status is the first
# lane's failure, after both have run to the end.
#
#   scripts/test-lanes.sh            # CARGO=... to run another cargo
set -uo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}

# The first lane: the test targets that load the prebuilt artifacts (the
# real-Envoy suite, the browser test, the proxy-wasm host's differential
# tests, the conformance suite's Wasm host). It waits for the prebuild
# first, so the second lane takes the rest, the simulator's CLI runs
# included, to even the lanes out (BENCHMARKS.md, "The test suite": each
# lane's time).
FIRST=(envoy playground differential conformance)

METADATA=$("$CARGO" metadata --no-deps --format-version 1) || {
    echo "test-lanes: cargo metadata failed" >&2
    exit 1
}
# Every integration test target's name, and the packages `--tests` tests
# nothing of, one per line each.
read_metadata() {
    python3 -c '
import json, sys
m = json.load(sys.stdin)
want = sys.argv[1]
out = set()
for p in m["packages"]:
    for t in p["targets"]:
        if want == "tests" and "test" in t["kind"]:
            out.add(t["name"])
    # A package none of whose targets `--tests` would test: `--lib` would.
    built = [t for t in p["targets"] if "custom-build" not in t["kind"]]
    if want == "untested" and built and not any(t.get("test", True) for t in built):
        out.add(p["name"])
print("\n".join(sorted(out)))
' "$1" <<<"$METADATA"
}
mapfile -t ALL < <(read_metadata tests)
mapfile -t UNTESTED < <(read_metadata untested)
if [ "${#ALL[@]}" -eq 0 ]; then
    echo "test-lanes: found no test targets in cargo metadata" >&2
    exit 1
fi

first_args=()
second_args=(--lib --bins)
for name in "${ALL[@]}"; do
    if [[ " ${FIRST[*]} " == *" $name "* ]]; then
        first_args+=(--test "$name")
    else
        second_args+=(--test "$name")
    fi
done
for p in "${UNTESTED[@]}"; do
    [ -n "$p" ] && second_args+=(--exclude "$p")
done

lane() {
    local tag=$1
    shift
    "$@" 2>&1 | sed -u "s/^/[$tag] /"
}

echo "test-lanes: lane 1: ${first_args[*]}, after the prebuild"
echo "test-lanes: lane 2: ${second_args[*]} and the doc tests"
(
    s=0
    lane 1 bash scripts/prebuild.sh wait
    lane 1 "$CARGO" test --workspace --no-fail-fast "${first_args[@]}" || s=$?
    echo "test-lanes: lane 1 done after $SECONDS s (exit $s)"
    exit $s
) &
one=$!
two=0
lane 2 "$CARGO" test --workspace --no-fail-fast "${second_args[@]}" || two=$?
lane 2 "$CARGO" test --workspace --no-fail-fast --doc || two=$?
echo "test-lanes: lane 2 done after $SECONDS s (exit $two)"
wait "$one"
one=$?
[ "$one" -ne 0 ] && exit "$one"
exit "$two"
