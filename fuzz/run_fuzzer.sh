#!/usr/bin/env bash
# Runs one libFuzzer target as ctest does: every file of its seed corpus (the regression inputs of
# past finds included) once, then SECONDS of fuzzing from it. Exit status non-zero on any find;
# the crashing input is left in WORK.
#   fuzz/run_fuzzer.sh BINARY CORPUS_DIR WORK_DIR SECONDS [libFuzzer flags...]
set -euo pipefail
bin=$1 corpus=$2 work=$3 seconds=$4
shift 4
rm -rf "$work"
mkdir -p "$work/new"
# Targets whose parsers read files write each input to a scratch file: on tmpfs that is ~4x more
# executions per second than on this machine's disk. libFuzzer ends with _Exit, so the scratch
# directory is removed here, not by the target.
base=${TMPDIR:-/dev/shm}
[[ -d $base && -w $base ]] || base=/tmp
scratch=$(mktemp -d "$base/trellis-fuzz-run-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
# The first directory receives new inputs; the checked-in corpus is only read.
TMPDIR=$scratch "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work/new" "$corpus"
