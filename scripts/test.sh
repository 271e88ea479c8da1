#!/usr/bin/env bash
# Runs the whole test suite: unit tests (GoogleTest), CLI and failure-path tests, the PyTorch
# oracle and the multi-rank equivalence tests under mpirun. Installs test dependencies first.
# Then two more passes in their own build directories:
#   sanitize: the unit and CLI tests again, built with ASan + UBSan (build-asan, gcc);
#   fuzz:     every libFuzzer target over its seed corpus and a few seconds of fuzzing
#             (build-fuzz, clang).
# Arguments go to the first ctest (e.g. -R cli); TRELLIS_TEST_PASSES="main sanitize fuzz" picks
# the passes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
passes=" ${TRELLIS_TEST_PASSES:-main sanitize fuzz} "
jobs=$(nproc)
t0=$SECONDS

if [[ $passes == *" main "* ]]; then
  # Every test has its own timeout (ctest TIMEOUT property); this bounds the whole run as well.
  timeout 1500 ctest --test-dir build --output-on-failure -j 2 "$@"
  echo "test.sh: main pass $((SECONDS - t0)) s"
fi

if [[ $passes == *" sanitize "* ]]; then
  t=$SECONDS
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRELLIS_SANITIZE=ON >/dev/null
  cmake --build build-asan -j "$jobs" --target trellis trellis_tests
  timeout 900 ctest --test-dir build-asan -L sanitize --output-on-failure -j 2
  echo "test.sh: sanitize pass $((SECONDS - t)) s"
fi

if [[ $passes == *" fuzz "* ]]; then
  t=$SECONDS
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DTRELLIS_FUZZ=ON >/dev/null
  cmake --build build-fuzz -j "$jobs" --target fuzz_all
  timeout 600 ctest --test-dir build-fuzz -L fuzz --output-on-failure -j 2
  echo "test.sh: fuzz pass $((SECONDS - t)) s"
fi
echo "test.sh: all passes $((SECONDS - t0)) s"
