# ACE task runner. Every target that needs tools runs `setup` first (`demo`
# runs `setup-demo`, the part of it the demo needs); both are idempotent
# (they check before they install), so running them again is cheap.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: setup setup-demo wasm dynamic demo playground test lint docs fuzz-check fmt bench clean

setup:
	@bash scripts/setup.sh

# What `make demo` runs and nothing more: the wasm32-wasip1 path, a C
# compiler and Envoy. No browser, no playground toolchain, no PostgreSQL,
# no HiGHS build tools: those are the tests' (demo/tests/setup.rs holds
# this target to it).
setup-demo:
	@bash scripts/setup-demo.sh

# Build the filter for wasm32-wasip1 and report its size.
wasm: setup
	@bash scripts/build-wasm.sh ace-filter >/dev/null

# Build ACE as an Envoy dynamic module (a native shared library for Envoy
# 1.40's ABI; see envoy/envoy-dynamic.yaml) and print its path and sha256.
dynamic: setup
	$(CARGO) build --release -q -p ace-dynamic --target-dir target/dylib
	@sha256sum target/dylib/release/libace_dynamic.so

# The main job: a real Envoy with the filter in front of local upstreams.
# `ace-demo` (demo/), a binary of its own so that the `ace` command does not
# link the test harness. Built without the planner's MILP solver, which the
# demo does not use, so a fresh machine does not compile HiGHS first.
demo: setup-demo
	$(CARGO) run -q -p ace-demo --bin ace-demo

# The policy playground: build the page (wasm32-unknown-unknown) and serve it
# on http://127.0.0.1:9920/ (playground/README.md).
playground: setup
	$(CARGO) run -q -p ace-cli --no-default-features --bin ace -- playground

# Formatting, lints with warnings denied, the docs and the fuzz targets
# (both cheap once clippy has checked the dependencies), then every test
# (the real-Envoy tests build the .wasm from source in the same run).
# scripts/prebuild.sh starts the builds the tests would otherwise run one
# at a time (wasm filters, release dynamic modules, the playground's page,
# each in its own target directory) in the background, so that they overlap
# clippy and the test build; the tests that need them run only once it is
# done (the browser test, with the page still building beside it, ran out
# of its time to compile in the page), and build again (a no-op, or their
# own failure) what it did not.
# The tests: every target that has tests (libraries, binaries, tests/),
# and the doc tests, in two lanes at once (scripts/test-lanes.sh: the long
# test binaries each keep one core busy; the lane that needs the prebuild
# waits for it). Examples are not linked here:
# clippy --all-targets has already compiled and checked them with warnings
# denied.
test: setup
	@bash scripts/prebuild.sh start
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@$(MAKE) --no-print-directory docs fuzz-check
	$(CARGO) test --workspace --tests --no-run
	@CARGO="$(CARGO)" bash scripts/test-lanes.sh

lint: setup
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The API docs, private items included, with rustdoc's warnings (broken or
# ambiguous links) denied; every crate's, before it fails.
docs:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --document-private-items --keep-going

# Every fuzz target compiles. The fuzz crates are workspaces of their own
# (the main one never builds libFuzzer), so clippy and test never see them.
# A check on stable, without cargo-fuzz: no libFuzzer link, no nightly. They
# share the main target directory, and so the dependencies clippy checked.
FUZZ_CRATES := fuzz planner/fuzz flow/fuzz
fuzz-check:
	@set -e; for crate in $(FUZZ_CRATES); do \
		echo "$(CARGO) check --manifest-path $$crate/Cargo.toml --bins"; \
		$(CARGO) check --manifest-path $$crate/Cargo.toml --bins \
			--target-dir "$${CARGO_TARGET_DIR:-$(CURDIR)/target}"; \
	done

fmt:
	$(CARGO) fmt --all

bench: setup wasm
	$(CARGO) bench --workspace

clean:
	$(CARGO) clean
