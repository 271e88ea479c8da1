"""Pipeline parallelism (GPipe, 1F1B, interleaved 1F1B, zero-bubble zb1) and full 3D layouts under
mpirun equal the 1-process run: per-step losses over 20 steps and final parameters to <= 1e-5
relative. zb1 also resumes bitwise at pp 2.

A pipeline always accumulates gradients over micro-batches, so each layout is compared with the
1-process run that accumulates over the same micro-batches. (With this 8-layer model, 20 AdamW
steps with and without accumulation already differ by ~1e-5 in some LayerNorm biases: summation
order alone, amplified by Adam; test_dp_equivalence shows accumulation itself is exact.)"""
import json
import os

from trellis_test import LayoutCheck, check, fresh_dir, metrics, mpirun, run, write_text_corpus, TMP

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
# 8 layers so that pp = 4 x 2 virtual stages still gives every chunk a block; 4 heads for tp = 2.
common = ["train", "--model", "tiny", "--n-layer", 8, "--n-head", 4, "--data", data, "--steps", 20,
          "--batch-size", 8, "--seq-len", 32, "--lr", 3e-3, "--warmup-steps", 4,
          "--val-every", 10, "--threads", 1, "--quiet", "--tensorboard", "false"]
baselines = {micro: LayoutCheck(common + ["--micro-batch-size", micro], n_embd=32, steps=20,
                                name=f"baseline_micro{micro}") for micro in (1, 2, 4)}

for pp in (2, 4):
    # zb1 at pp 4 only (its weight parts lag by up to 3 there); pp 2 resumes below.
    for schedule in ("gpipe", "1f1b", "interleaved") + (("zb1",) if pp == 4 else ()):
        args = ["--pp", pp, "--schedule", schedule, "--micro-batch-size", 2]
        if schedule == "interleaved":
            args += ["--virtual-stages", 2]
        baselines[2].check(f"pp{pp}_{schedule}", pp, args)

# Full 3D on 8 ranks (oversubscribed), with ZeRO-1 and sequence parallelism.
baselines[1].check("dp2_tp2_pp2_1f1b_zero1_sp", 8,
              ["--dp", 2, "--tp", 2, "--pp", 2, "--micro-batch-size", 1, "--zero", 1,
               "--sequence-parallel"])

# Deadlock-prone: more stages than micro-batches and an uneven split; it must simply work.
baselines[4].check("pp4_1f1b_m2_uneven", 4,
              ["--pp", 4, "--micro-batch-size", 4, "--layer-split", "1,4,2,1"])

# Metrics report the bubble next to theory; 1F1B keeps at most pp micro-batches alive.
out = fresh_dir("bubble")
mpirun(2, common + ["--pp", 2, "--micro-batch-size", 1, "--out", out, "--steps", 3,
                    "--trace", os.path.join(out, "trace.json"), "--trace-steps", 2])
last = metrics(out)[0][-1]
check(abs(last["bubble_theory"] - 1 / 9) < 1e-12 and 0 <= last["bubble"] < 1,
      f"bubble {last['bubble']:.2f} reported next to theory {last['bubble_theory']:.3f}")
check(last["peak_micro_batches"] <= 2, "1F1B keeps at most pp micro-batches alive on a stage")
with open(os.path.join(out, "trace.json")) as f:
    events = json.load(f)["traceEvents"]
ops = [e for e in events if e["ph"] == "X"]
check(len(ops) == 2 * 2 * 8 * 2 and {e["tid"] for e in ops} == {0, 1},
      "Chrome trace holds every F/B of 2 steps on both ranks")

# zb1 resumes bitwise: 4 steps in one go == 2, --stop-at, --resume for 2 more (pp 2, m 4).
zb1 = common + ["--pp", 2, "--schedule", "zb1", "--micro-batch-size", 2, "--steps", 4,
                "--val-every", 0]
whole, parts = fresh_dir("zb1_whole"), fresh_dir("zb1_parts")
mpirun(2, zb1 + ["--out", whole])
mpirun(2, zb1 + ["--out", parts, "--stop-at", 2])
mpirun(2, zb1 + ["--out", parts, "--resume"])
want = [r["loss"] for r in metrics(whole)[0]]
got = {r["step"]: r["loss"] for r in metrics(parts)[0]}
check(len(want) == 4 and [got.get(s) for s in range(1, 5)] == want,
      f"zb1 pp2: stopped at 2 and resumed, the 4 losses are bitwise the uninterrupted run's")

# Impossible combinations are refused before any work.
_, err = mpirun(2, common + ["--pp", 2, "--schedule", "zb1", "--recompute", "full",
                             "--out", fresh_dir("bad_zb1")], expect=2)
check("schedule zb1 needs recompute none" in err, "zb1 with recompute is refused naming the key")
_, err = mpirun(2, common + ["--pp", 2, "--schedule", "interleaved", "--virtual-stages", 2,
                             "--micro-batch-size", 8, "--out", fresh_dir("bad1")], expect=2)
check("multiple of pp" in err, "interleaved with micro-batches not a multiple of pp is refused")
_, err = mpirun(4, common + ["--pp", 4, "--n-layer", 2, "--out", fresh_dir("bad2")], expect=2)
check("need at least as many layers" in err, "more stages than layers is refused")
_, err = mpirun(2, common + ["--pp", 2, "--layer-split", "4,3", "--out", fresh_dir("bad3")],
                expect=2)
check("layer_split sums to 7" in err, "a layer split that does not cover the model is refused")
