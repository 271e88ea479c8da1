"""Resume: 20 steps in one go == 10 steps, stop, resume for 10 more (bitwise equal losses)."""
from trellis_test import check, fresh_dir, same_checkpoint, metrics, run, write_text_corpus, TMP
import os

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["--model", "tiny", "--data", data, "--batch-size", 4, "--micro-batch-size", 2,
          "--seq-len", 32, "--lr", 3e-3, "--warmup-steps", 3, "--val-every", 5,
          "--threads", 2, "--quiet"]

full = fresh_dir("full")
run(["train", "--out", full, "--steps", 20] + common)
split = fresh_dir("split")
run(["train", "--out", split, "--steps", 20, "--stop-at", 10, "--save-every", 5] + common)
check(os.path.isdir(os.path.join(split, "step_00000010")), "checkpoint written when stopping (step 10)")
check(os.path.isdir(os.path.join(split, "step_00000005")), "checkpoint written by --save-every 5")
run(["train", "--out", split, "--steps", 20, "--resume"] + common)

a, va = metrics(full)
b, vb = metrics(split)
check([r["step"] for r in b] == list(range(1, 21)), "resumed run logs steps 1..20 once each")
check([r["loss"] for r in a] == [r["loss"] for r in b], "losses bitwise equal over 20 steps")
check([r["lr"] for r in a] == [r["lr"] for r in b], "learning rates equal (schedule resumes)")
check([r["val_loss"] for r in va] == [r["val_loss"] for r in vb], "validation losses equal")
check(same_checkpoint(os.path.join(full, "step_00000020"), os.path.join(split, "step_00000020")),
      "final parameters and optimizer state bitwise equal")
