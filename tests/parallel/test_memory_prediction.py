"""`train --dry-run` predicts each rank's memory (parameters, gradients, optimizer state, ZeRO's
shards, activations); the allocator high-water mark that training measures (alloc_peak_bytes_max
in metrics.jsonl: the largest rank's peak of live heap and buffer bytes) must fall within 10% of the
largest predicted rank, on layouts that cover dp, ZeRO 0-3, tp with sequence parallelism, pp with
accumulation and each recompute policy. ZeRO really shards: over the same dp4 run, the measured
high-water mark falls from stage 1 to 2 to 3 (test_zero_stages checks that ZeRO-2/3 train
correctly); and bf16_embeddings lowers bf16 ZeRO-2/3's by the fp32 tables' bytes the prediction
drops."""
import json
import os

from trellis_test import check, fresh_dir, metrics, mpirun, run

# A 10.8M-parameter model on the built-in corpus: model state and activations dominate.
common = ["train", "--model", "baby", "--batch-size", 8, "--seq-len", 128, "--steps", 2,
          "--threads", 1, "--quiet", "--tensorboard", "false", "--val-every", 0,
          "--val-batches", 1]
layouts = {
    "single": [],
    "dp2_zero1": ["--dp", 2, "--zero", 1],
    "dp2_zero2_selective": ["--dp", 2, "--zero", 2, "--recompute", "selective"],
    "dp4_zero1_micro1": ["--dp", 4, "--zero", 1, "--micro-batch-size", 1],
    "dp4_zero2_micro1": ["--dp", 4, "--zero", 2, "--micro-batch-size", 1],
    "dp4_zero3_micro1": ["--dp", 4, "--zero", 3, "--micro-batch-size", 1],
    "tp2_sp_full": ["--tp", 2, "--sequence-parallel", "true", "--recompute", "full"],
    "tp2_dp2_zero3": ["--tp", 2, "--dp", 2, "--zero", 3],
    "pp2_1f1b_micro2": ["--pp", 2, "--micro-batch-size", 2],
    "pp2_dp2_zero1_gpipe": ["--pp", 2, "--dp", 2, "--zero", 1, "--micro-batch-size", 2,
                            "--schedule", "gpipe"],
}
# Mixed precision (bf16 under ZeRO-1/2/3: fp32 masters only in the shard, bf16 working weights,
# parallel/working_weights.h).
# Without AVX512-BF16 the emulated bf16 GEMM runs them.
os.environ.pop("TRELLIS_ISA", None)
for zero in (0, 1, 2, 3):
    layouts[f"bf16_dp2_zero{zero}"] = ["--dp", 2, "--zero", zero, "--precision", "bf16"]
# grad_reduce_dtype = bf16: ZeRO-0/1 keep 2-byte gradients and fp32 windows of the root and a block.
for zero in (0, 1):
    layouts[f"bf16_dp2_zero{zero}_bf16grads"] = (layouts[f"bf16_dp2_zero{zero}"] +
                                                 ["--grad-reduce-dtype", "bf16"])
# bf16_embeddings: the lookup tables' fp32 pages leave every rank (their working weights serve).
for zero in (2, 3):
    layouts[f"bf16_dp2_zero{zero}_emb"] = (layouts[f"bf16_dp2_zero{zero}"] +
                                           ["--bf16-embeddings", "true"])
peaks, predictions = {}, {}
for name, args in layouts.items():
    world = 1
    for flag in ("--dp", "--tp", "--pp"):
        if flag in args:
            world *= args[args.index(flag) + 1]
    if "--precision" not in args:
        args = args + ["--precision", "fp32"]
    out, _ = run(common + args + ["--dry-run", "--json"])
    ranks = json.loads(out)
    check(len(ranks) == world and all(r["total"] > 0 for r in ranks),
          f"{name}: a prediction for each of the {world} ranks")
    predicted = max(r["total"] for r in ranks)
    predictions[name] = predicted
    out_dir = fresh_dir(name)
    if world == 1:
        run(common + args + ["--out", out_dir])
    else:
        mpirun(world, common + args + ["--out", out_dir])
    train, _ = metrics(out_dir)
    measured = max(r["alloc_peak_bytes_max"] for r in train)
    peaks[name] = measured
    err = measured / predicted - 1
    check(abs(err) <= 0.10, f"{name}: measured peak {measured / 2**20:.1f} MiB within 10% of the "
          f"predicted {predicted / 2**20:.1f} MiB ({100 * err:+.1f}%)")

# dp4 of a 10.8M-parameter model (whose blocks span many pages): sharding gradients, then
# parameters, lowers the largest rank's peak.
z1, z2, z3 = (peaks[f"dp4_zero{z}_micro1"] for z in (1, 2, 3))
check(z3 < z2 < z1, f"allocator high-water mark falls with the stage: zero1 {z1}, zero2 {z2}, "
      f"zero3 {z3} bytes")

# Mixed precision shards the fp32 masters too: at dp2 each bf16 ZeRO stage's peak lies below
# the one before, and bf16 ZeRO-1's below fp32 ZeRO-1's (the same run, fp32 weights replicated
# there).
b = [peaks[f"bf16_dp2_zero{z}"] for z in (0, 1, 2, 3)]
check(b[3] < b[2] < b[1] < b[0], f"bf16 dp2: the high-water mark falls with the stage: {b}")
check(b[1] < peaks["dp2_zero1"],
      f"bf16 dp2 ZeRO-1 peak {b[1]} below fp32 dp2 ZeRO-1's {peaks['dp2_zero1']}")
for zero in (0, 1):
    g = peaks[f"bf16_dp2_zero{zero}_bf16grads"]
    check(g < b[zero], f"bf16 dp2 ZeRO-{zero} peak with bf16 gradients {g} below fp32 "
          f"gradients' {b[zero]}")
# The tables' fp32 pages (baby's 2 x 256 x 384 floats, 0.79 MB) are what bf16_embeddings saves,
# predicted and measured alike (the allocator's peak is the same to the page from run to run).
for zero in (2, 3):
    name = f"bf16_dp2_zero{zero}"
    saved = peaks[name] - peaks[name + "_emb"]
    want = predictions[name] - predictions[name + "_emb"]
    check(want > 0 and abs(saved - want) <= 0.1 * want,
          f"{name}: bf16_embeddings saves {saved} bytes measured, {want} predicted (within 10%)")
