#!/bin/bash
# pp 4, m = 8: 1F1B against zb1, alternating, 3 runs each (bench/RESULTS.md, zero-bubble section).
# Usage: [ZB1_MODEL="--model ... --seq-len N"] bench/zb1_bubble.sh DATA_DIR OUT_DIR
# (DATA_DIR: `trellis prepare` output)
# Then: bench/zb1_replay.py OUT_DIR/t_1f1b.json OUT_DIR/t_zb1.json for the bubble replayed from
# per-op compute times, and metrics.jsonl of each run for bubble / alloc_peak_bytes_max.
set -e
data=$1 out=$2
B=${TRELLIS:-build/trellis}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# ZB1_MODEL: the model and sequence (default a tiny one that runs in seconds).
model=${ZB1_MODEL:-"--model tiny --n-layer 8 --n-embd 128 --n-head 4 --seq-len 64"}
C="train $model --data $data --steps 10 --batch-size 16 --micro-batch-size 2 --threads 1 --quiet
   --tensorboard false --val-every 0 --pp 4"
mkdir -p "$out"
for rep in 1 2 3; do
  for s in 1f1b zb1; do
    trace=()
    [ "$rep" = 1 ] && trace=(--trace "$out/t_$s.json" --trace-steps 5)
    timeout 600 mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np 4 $B $C --schedule $s \
      --out "$out/m_${s}_$rep" "${trace[@]}" > /dev/null
    echo "$s run $rep done, load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
