"""`trellis average`: the averaged checkpoint equals a hand average of its inputs (read here with the
test's own reader of the sharded format), one process, tensor-parallel and whole-file; eval reads
it; a resume from it is refused; checkpoints of other shapes, configs or layouts, too few
checkpoints, missing ones and an existing --out are refused with exit 2 and leave nothing
behind."""
import json
import os
import shutil

import numpy as np

from trellis_test import (SOURCE, TMP, check, checkpoint_tensors, fresh_dir, mpirun, run,
                          write_text_corpus)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["train", "--model", "tiny", "--data", data, "--batch-size", 4, "--seq-len", 32,
          "--lr", 3e-3, "--warmup-steps", 1, "--val-every", 0, "--quiet", "--tensorboard", "false"]


def steps(out):
    return [os.path.join(out, f"step_{s:08d}") for s in (1, 2, 3)]


def check_average(inputs, out, what):
    """out's parameters against the mean of the inputs' computed here in float64."""
    got = checkpoint_tensors(out)
    ins = [checkpoint_tensors(d) for d in inputs]
    check(all(ins[0].keys() == x.keys() for x in ins) and got.keys() == ins[0].keys(),
          f"{what}: the averaged checkpoint holds the inputs' tensors")
    check(any(not np.array_equal(ins[0][k], ins[-1][k]) for k in ins[0]),
          f"{what}: the inputs differ (so the average is not one of them)")
    worst, compared = 0.0, 0
    for name, g in got.items():
        want = sum(x[name].astype(np.float64) for x in ins) / len(ins)
        err = np.abs(g.astype(np.float64) - want) / np.maximum(1.0, np.abs(want))
        worst = max(worst, float(err.max()))
        compared += 1
    check(compared > 0 and worst <= 1e-7,
          f"{what}: {compared} tensors equal the hand average (worst {worst:.1e})")


def refused(args, needles, what):
    """exit 2 with one error line holding every needle; --out not created, no temporary left."""
    out = args[args.index("--out") + 1]
    existed = os.path.exists(out)
    before = sorted(os.listdir(os.path.dirname(out)))
    _, err = run(["average"] + args, expect=2)
    lines = err.strip().splitlines()
    check(len(lines) == 1 and all(n in lines[0] for n in needles),
          f"{what}: exit 2, one line naming {needles}: {lines}")
    check(os.path.exists(out) == existed and sorted(os.listdir(os.path.dirname(out))) == before,
          f"{what}: nothing written")


# One process: three checkpoints of one run.
one = fresh_dir("one")
run(common + ["--steps", 3, "--save-every", 1, "--threads", 2, "--out", one])
results = fresh_dir("results")
avg = os.path.join(results, "avg")
out, _ = run(["average", "--checkpoints"] + steps(one) + ["--out", avg])
check("averaged 3 checkpoints" in out, f"average reports what it did: {out.strip()}")
check_average(steps(one), avg, "one process")
with open(os.path.join(avg, "index.json")) as f:
    index = json.load(f)
with open(os.path.join(avg, "state.json")) as f:
    state = json.load(f)
check(index["states"] == ["params"] and index["layout"]["world"] == 1,
      "a single-rank checkpoint without optimizer state")
check([s["step"] for s in state["averaged_from"]] == [1, 2, 3], "state.json lists the inputs")
with open(os.path.join(one, "step_00000001", "config.json")) as f, \
        open(os.path.join(avg, "config.json")) as g:
    check(f.read() == g.read(), "config.json is the first checkpoint's")

out, _ = run(["eval", "--checkpoint", avg, "--data", os.path.join(data, "val_000000.bin"),
              "--seq-len", 32, "--batch-size", 2, "--threads", 2])
loss = json.loads(out)["loss"]
check(np.isfinite(loss) and 0 < loss < 6, f"eval reads the averaged checkpoint (loss {loss:.3f})")

# A resume from it would not be the run it continues: refused, pointing to --init-from.
res = fresh_dir("resume")
shutil.copytree(avg, os.path.join(res, "step_00000003"))
_, err = run(common + ["--steps", 4, "--threads", 2, "--out", res, "--resume"], expect=2)
check("--init-from" in err, f"a resume from an averaged checkpoint is refused: {err.strip()}")

# Tensor parallel: each checkpoint is two ranks' shards, gathered by the loader, written whole.
tp2 = fresh_dir("tp2")
mpirun(2, common + ["--steps", 3, "--save-every", 1, "--threads", 1, "--tp", 2, "--out", tp2])
tp_avg = os.path.join(results, "tp_avg")
run(["average", "--checkpoints"] + steps(tp2) + ["--out", tp_avg])
check_average(steps(tp2), tp_avg, "tp 2")

# A whole-file checkpoint (before sharding) is read whole; stored as a one-rank sharded one is.
v1 = os.path.join(SOURCE, "tests", "data", "checkpoint_v1")
v1_avg = os.path.join(results, "v1_avg")
run(["average", "--checkpoints", v1, v1, "--out", v1_avg])
want, got = checkpoint_tensors(v1), checkpoint_tensors(v1_avg)
check(got.keys() == want.keys() and all(np.array_equal(want[k], got[k]) for k in want),
      "a whole-file checkpoint averaged with itself is itself")
run(["average", "--checkpoints", v1, v1_avg, "--out", os.path.join(results, "v1_mixed")])

# Refusals.
wide = fresh_dir("wide")
run(common + ["--steps", 1, "--threads", 2, "--n-embd", 64, "--out", wide])
a, b = steps(one)[0], os.path.join(wide, "step_00000001")
y = os.path.join(results, "y")
refused(["--checkpoints", a, b, "--out", y], ["'wte.weight'", "[256, 32]", "[256, 64]", a, b],
        "another model size")
refused(["--checkpoints", a, steps(tp2)[0], "--out", y],
        ["'wte.weight'", "tp 2", "layout", a, steps(tp2)[0]], "another layout (tp 2)")
other = os.path.join(fresh_dir("other"), "step_00000001")
shutil.copytree(a, other)
with open(os.path.join(other, "config.json")) as f:
    cfg = json.load(f)
cfg["trellis"]["task"] = {"task": "classify", "classes": ["a", "b"]}
with open(os.path.join(other, "config.json"), "w") as f:
    json.dump(cfg, f)
refused(["--checkpoints", a, other, "--out", y], ["trellis.task", a, other], "another config")
refused(["--checkpoints", a, "--out", y], ["at least 2"], "one checkpoint")
missing = os.path.join(one, "step_00000009")
refused(["--checkpoints", a, missing, "--out", y], [missing, "not found"], "a missing checkpoint")
refused(["--checkpoints", a, steps(one)[1], "--out", avg], [avg, "exists"], "an existing --out")
