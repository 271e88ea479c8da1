"""Sharded checkpoints reshard on load: save at step K under layout A, resume under layout B, and
the continued run equals the uninterrupted run under B to <= 1e-5 relative: losses of steps
K+1..N, final parameters and final optimizer moments (exp_avg, exp_avg_sq). The data position
resumes with the step (invariant 2), so equal losses also say the same batches were read.

PAIRS is the list to extend: name -> (A, B), each a (ranks, args) layout. They include the pairs
of issue 12 (dp2 zero3 -> 1 process, 1 process -> dp4 zero3, tp2 x pp2 -> dp2 zero2, 3D -> tp4,
pp4 -> pp2 interleaved, dp4 zero1 -> dp2 zero3). Pair names given as arguments run only those.

Also: what each rank wrote (its pieces only, ~1/world of the model), and the old whole-file
checkpoint as a source (tests/reference/test_checkpoint_v1.py covers its eval and sampling)."""
import json
import os
import shutil
import sys

from trellis_test import (TMP, check, checkpoint_tensors, compare_params, fresh_dir, metrics,
                          mpirun, run, write_text_corpus)

N, K = 6, 3
corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
# 4 blocks and 4 heads so that tp4, pp4 and pp2 x 2 virtual stages all divide the model;
# micro-batches of 2 everywhere (a pipeline accumulates; so does every other layout here).
ARGS = ["train", "--model", "tiny", "--n-layer", 4, "--n-head", 4, "--data", data, "--steps", N,
        "--batch-size", 8, "--micro-batch-size", 2, "--seq-len", 32, "--lr", 3e-3,
        "--warmup-steps", 2, "--val-every", 0, "--threads", 1, "--quiet", "--tensorboard", "false",
        # the vocabulary padding then differs between tp 1 (288 rows), 2 and 4 (384)
        "--vocab-multiple", 96]
ONE = (1, [])
DP4 = (4, ["--dp", 4])
DP2 = (2, ["--dp", 2])
TP2_PP2 = (4, ["--tp", 2, "--pp", 2])
DP2_ZERO1 = (2, ["--dp", 2, "--zero", 1])
THREE_D = (8, ["--dp", 2, "--tp", 2, "--pp", 2])
TP4 = (4, ["--tp", 4])
PP4 = (4, ["--pp", 4])
PP2_INTERLEAVED = (2, ["--pp", 2, "--schedule", "interleaved", "--virtual-stages", 2])
DP4_ZERO1 = (4, ["--dp", 4, "--zero", 1])
DP2_ZERO2 = (2, ["--dp", 2, "--zero", 2])
DP2_ZERO3 = (2, ["--dp", 2, "--zero", 3])
DP4_ZERO3 = (4, ["--dp", 4, "--zero", 3])
PAIRS = {
    "1_to_dp4": (ONE, DP4),
    "tp2pp2_to_dp2zero1": (TP2_PP2, DP2_ZERO1),
    "3d_to_tp4": (THREE_D, TP4),
    "pp4_to_pp2interleaved": (PP4, PP2_INTERLEAVED),
    "dp4zero1_to_dp2": (DP4_ZERO1, DP2),
    "dp2_to_1": (DP2, ONE),
    "dp2zero3_to_1": (DP2_ZERO3, ONE),
    "1_to_dp4zero3": (ONE, DP4_ZERO3),
    "tp2pp2_to_dp2zero2": (TP2_PP2, DP2_ZERO2),
    "dp4zero1_to_dp2zero3": (DP4_ZERO1, DP2_ZERO3),
    "dp2zero3_to_tp2pp2": (DP2_ZERO3, TP2_PP2),
}
only = sys.argv[1:]


def launch(layout, extra, out):
    ranks, args = layout
    if ranks == 1:
        return run(ARGS + args + extra + ["--out", out])
    return mpirun(ranks, ARGS + args + extra + ["--out", out])


def step_dir(out, step):
    return os.path.join(out, f"step_{step:08d}")


uninterrupted = {}


def reference(layout):
    key = json.dumps(layout)
    if key not in uninterrupted:
        out = fresh_dir(f"uninterrupted_{len(uninterrupted)}")
        launch(layout, [], out)
        uninterrupted[key] = out
    return uninterrupted[key]


def compare(name, resumed, ref):
    got, _ = metrics(resumed)
    want, _ = metrics(ref)
    got = {r["step"]: r["loss"] for r in got}
    want = {r["step"]: r["loss"] for r in want}
    steps = list(range(K + 1, N + 1))
    check(all(s in got for s in steps), f"{name}: the resumed run logged steps {K + 1}..{N}")
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in steps)
    check(len(steps) > 0 and worst <= 1e-5,
          f"{name}: losses of {len(steps)} resumed steps match the uninterrupted run "
          f"(worst {worst:.1e})")
    compared = 0
    for state in ("params", "exp_avg", "exp_avg_sq"):
        a = checkpoint_tensors(step_dir(resumed, N), state)
        b = checkpoint_tensors(step_dir(ref, N), state)
        check(a.keys() == b.keys() and len(a) > 0, f"{name}: {state}: the same {len(a)} tensors")
        worst_t, where, whole = compare_params(a, b, n_embd=32)
        check(worst_t <= 1e-5 and whole <= 1e-5,
              f"{name}: final {state} match (worst tensor {worst_t:.1e} in {where}, "
              f"all {whole:.1e})")
        compared += len(a)
    check(compared > 0, f"{name}: compared {compared} tensors")


for name, (a, b) in PAIRS.items():
    if only and name not in only:
        continue
    saved = fresh_dir(f"{name}_a")
    launch(a, ["--stop-at", K], saved)
    resumed = fresh_dir(f"{name}_b")
    shutil.copytree(step_dir(saved, K), step_dir(resumed, K))
    stdout, _ = launch(b, ["--resume"], resumed)
    compare(name, resumed, reference(b))

# What each rank wrote: its pieces only. Replicas (dp4) and ZeRO shards (dp4 zero1) write 1/4 of
# the model each; every element is written exactly once (checkpoint_tensors checks that). The
# checkpoints are those the pairs above wrote under these layouts (the step K of a saving run, the
# last step of an uninterrupted one): a run of its own per layout would write the same files.
written = () if only else (
    ("dp4", DP4, step_dir(reference(DP4), N)),
    ("dp4zero1", DP4_ZERO1, step_dir(os.path.join(TMP, "dp4zero1_to_dp2_a"), K)),
    ("dp4zero3", DP4_ZERO3, step_dir(reference(DP4_ZERO3), N)),
    ("3d", THREE_D, step_dir(os.path.join(TMP, "3d_to_tp4_a"), K)))
for name, layout, d in written:
    with open(os.path.join(d, "index.json")) as f:
        index = json.load(f)
    ranks = layout[0]
    files = sorted(f for f in os.listdir(d) if f.startswith("shard_"))
    check(len(files) == ranks and set(files) == set(index["files"]),
          f"{name}: one shard file per rank ({len(files)}), all in the index")
    total = sum(index["files"][f]["elements"] for f in files)
    model = sum(v.size for v in checkpoint_tensors(d).values())
    padding = sum(t["shape"][0] - t["export_rows"] for t in index["tensors"].values()
                  if t["export_rows"] >= 0) * 32
    check(total == model + padding,
          f"{name}: the ranks wrote {total} elements per state: the model's {model} once "
          f"(+ {padding} of vocabulary padding)")
    biggest = max(index["files"][f]["elements"] for f in files)
    if name != "3d":  # pipeline stages differ in size; replicas and shards do not
        check(biggest <= total / ranks * 1.01 + 64,
              f"{name}: each rank wrote ~1/{ranks} of the model (largest {biggest} of {total})")
    else:
        check(biggest < total / 2,
              f"{name}: no rank wrote half the model (largest {biggest} of {total})")
    for f in files:
        size = os.path.getsize(os.path.join(d, f))
        check(size == index["files"][f]["bytes"], f"{name}: {f} has the {size} bytes the index says")
