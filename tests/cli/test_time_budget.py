"""time_budget: a run that must end within a wall-clock budget is cut to the steps that fit, and
its learning-rate schedule ends where it does.

With TRELLIS_TEST_STEP_SECONDS (tests only: a fixed step time, no time spent) the decision is
reproducible:
  - a budget of 24 steps' worth of time on a 300-step run ends the run early, at the step the
    header line names; from the decision on, every step's learning rate is bitwise that of a run
    configured with that many steps (the schedule was refitted, not cut off), the last at min_lr;
  - after each tenth of the run it is re-timed: when steps take twice as long after the first
    decision ("0.0625,0.125"), the next line names the step and the shorter run, later ones keep
    it, and the run ends there with the learning rates of a run configured with that many steps;
    with a steady clock every re-timing keeps the first decision;
  - a budget larger than the run changes nothing: bitwise the run without a budget;
  - stopped after the decision and resumed with a step time ten times longer, the run keeps the
    decision it saved (state.json's budget_steps): bitwise the run never stopped;
  - a negative budget: exit 2, one line naming time_budget."""
import json
import os

from trellis_test import (TMP, check, expect_error, fresh_dir, metrics, run, same_checkpoint,
                          write_text_corpus)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
base = ["train", "--model", "tiny", "--data", data, "--batch-size", 4, "--seq-len", 32,
        "--lr", 3e-3, "--min-lr", 3e-4, "--steps", 300, "--val-every", 0, "--val-batches", 1,
        "--threads", 1, "--tensorboard", "false", "--log-every", 1000]
STEP = "0.05"  # seconds a step, as the tests' clock says
env = dict(os.environ, TRELLIS_TEST_STEP_SECONDS=STEP)


def train(name, extra, step_seconds=STEP):
    out = fresh_dir(name)
    stdout, _ = run(base + extra + ["--out", out],
                    env=dict(os.environ, TRELLIS_TEST_STEP_SECONDS=step_seconds))
    rows, _ = metrics(out)
    return stdout, rows, out


# 1.2 s at 0.05 s a step, less the final evaluation: far fewer than the 300 steps.
out, rows, budget_dir = train("budget", ["--time-budget", 0.02])
lines = [l for l in out.splitlines() if l.startswith("trellis: time_budget")]
check(len(lines) == 1 and " of 300 steps fit at 50 ms a step" in lines[0],
      f"one line names the decision: {lines}")
last = int(lines[0].split("min: ", 1)[1].split(" of ", 1)[0])
check(22 < last < 50, f"the run is cut to {last} steps, after the 22 timed ones")
decided = 2 + 20  # the warm and timed steps (train/time_budget.h)
check([r["step"] for r in rows] == list(range(1, last + 1)), f"steps 1..{last} trained")
_, plain_rows, _ = train("plain", ["--steps", last])
check([r["lr"] for r in rows][decided:] == [r["lr"] for r in plain_rows][decided:] and
      len(plain_rows) == last,
      f"after step {decided} the learning rates are bitwise those of a {last}-step run")
check(abs(rows[-1]["lr"] - 3e-4) < 3e-4 * 1e-6,  # min_lr as the float the run holds
      f"the last step is at min_lr ({rows[-1]['lr']})")
with open(os.path.join(budget_dir, f"step_{last:08d}", "state.json")) as f:
    check(json.load(f)["budget_steps"] == last, "state.json records budget_steps")

# Re-timed after each tenth of the run: 12 s at 1/16 s a step would fit ~190 steps, but after
# the first decision steps take 1/8 s (binary fractions: the decisions are exact), so the run is
# cut at the first re-timing and every later one confirms it.
out, slow_rows, slow_dir = train("retimed", ["--time-budget", 0.2], step_seconds="0.0625,0.125")
lines = [l for l in out.splitlines() if l.startswith("trellis: time_budget")]
first = int(lines[0].split("min: ", 1)[1].split(" of ", 1)[0])
steps_at = [(int(l.split("re-timed at step ", 1)[1].split(":", 1)[0]),
             int(l.split("re-timed at step ", 1)[1].split(": ", 1)[1].split(" of ", 1)[0]))
            for l in lines[1:]]
check(len(lines) >= 3 and " fit at 62 ms a step" in lines[0] and
      all(" fit at 125 ms a step" in l for l in lines[1:]), f"one line per decision: {lines}")
at, final = steps_at[0]
check(at == decided + max(20, first // 10) and at < final < first,
      f"re-timed a tenth of the way into {first} steps (step {at}): cut to {final}")
check(all(n == final for _, n in steps_at) and
      all(b - a == max(20, final // 10) for (a, _), (b, _) in zip(steps_at, steps_at[1:])) and
      steps_at[-1][0] + 20 + max(20, final // 10) > final,
      f"re-timed after each tenth of the {final} steps until the last 20, each keeping it: {steps_at}")
check([r["step"] for r in slow_rows] == list(range(1, final + 1)), f"steps 1..{final} trained")
_, plain_rows, _ = train("plain_final", ["--steps", final])
check([r["lr"] for r in slow_rows][at:] == [r["lr"] for r in plain_rows][at:] and
      abs(slow_rows[-1]["lr"] - 3e-4) < 3e-4 * 1e-6,
      f"after step {at} the learning rates are those of a {final}-step run, the last at min_lr")
out, _, _ = train("steady", ["--time-budget", 0.2], step_seconds="0.0625")
lines = [l for l in out.splitlines() if l.startswith("trellis: time_budget")]
check(len(lines) >= 3 and all(f": {first} of 300 steps" in l for l in lines),
      f"a steady clock: every re-timing keeps the first decision ({lines})")

# A budget the whole run fits in: the run without a budget, bitwise.
_, roomy_rows, roomy = train("roomy", ["--steps", 40, "--time-budget", 60])
_, none_rows, none = train("none", ["--steps", 40])
check(len(roomy_rows) == 40 and [r["loss"] for r in roomy_rows] == [r["loss"] for r in none_rows]
      and same_checkpoint(os.path.join(roomy, "step_00000040"), os.path.join(none, "step_00000040")),
      "a budget the run fits in: bitwise the run without one")

# Stopped after the decision and resumed on a clock ten times slower: the saved decision holds.
split = fresh_dir("split")
run(base + ["--time-budget", 0.02, "--stop-at", 30, "--out", split], env=env)
run(base + ["--time-budget", 0.02, "--resume", "--out", split],
    env=dict(os.environ, TRELLIS_TEST_STEP_SECONDS="0.5"))
s_rows, _ = metrics(split)
check([r["step"] for r in s_rows] == list(range(1, last + 1)) and
      [r["loss"] for r in s_rows] == [r["loss"] for r in rows],
      f"resumed: steps 1..{last} once, losses bitwise equal")
check(same_checkpoint(os.path.join(budget_dir, f"step_{last:08d}"),
                      os.path.join(split, f"step_{last:08d}")),
      "resumed: final parameters and optimizer state bitwise equal")

expect_error(base + ["--time-budget", -1, "--out", fresh_dir("bad")], "time_budget", "-1",
             what="a negative time_budget")
print("time_budget: all checks passed")
