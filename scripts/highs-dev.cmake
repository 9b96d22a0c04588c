# CMake toolchain file for the C and C++ that cargo builds through CMake:
# today HiGHS, the planner's MILP solver (highs-sys asks CMake for a Release
# build whatever cargo's profile). Set for every cargo command in this
# repository by .cargo/config.toml.
#
# In cargo's dev profile (OPT_LEVEL 0: clippy, `cargo test`, `make test`)
# Release means -O1 instead of -O3: HiGHS compiles in about two thirds of
# the time (measured on three of its largest files, 14.6 s against 21.9 s),
# and HiGHS's C++ build is on `make test`'s critical path. The tests check
# plans and proofs, not solve times. A release build (`--release`, the
# benches, `make demo`) keeps CMake's -O3.
if("$ENV{OPT_LEVEL}" STREQUAL "0")
  set(CMAKE_C_FLAGS_RELEASE "-O1 -DNDEBUG" CACHE STRING "" FORCE)
  set(CMAKE_CXX_FLAGS_RELEASE "-O1 -DNDEBUG" CACHE STRING "" FORCE)
endif()
