#!/usr/bin/env bash
# Runs the whole test suite: unit tests (GoogleTest), CLI and failure-path tests, the PyTorch
# oracle and the multi-rank equivalence tests under mpirun. Installs test dependencies first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Every test has its own timeout (ctest TIMEOUT property); this bounds the whole run as well.
timeout 1500 ctest --test-dir build --output-on-failure -j 2 "$@"
