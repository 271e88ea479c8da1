#!/usr/bin/env python3
"""Measures the README's first command against issue 23's four goals for it.

Runs `trellis train --out OUT [ARGS]` (the default job: built-in corpus, default recipe) and
`trellis sample --checkpoint OUT/step_N`, then reports:
  wall_s       the train command's wall time (start-up included);
  spike        the largest step loss after warmup minus the loss at the end of warmup
               (goal: <= 0.5);
  val_loss     the last validation loss, nats per byte (goal: <= 1.6);
  real_words   of the alphabetic words the sample prints, the share that occur in the training
               text (goal: >= 0.8); the training text is the built-in corpus's files, read here
               the way trellis documents it (/usr/share/common-licenses, files in name order,
               the last 10% of the bytes held out).
  real_words_seeds  the same share over the samples of seeds 1..N together (--sample-seeds N,
               default 10): one 200-byte sample holds 20-35 words, so seed 1 alone is noisy.
Usage: default_job.py [--trellis build/trellis] [--out DIR] [--sample-seeds N]
                      [-- extra train args]
Prints one JSON line (and the sample on stderr).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

CORPUS = "/usr/share/common-licenses"


def training_words():
    data = b""
    for name in sorted(os.listdir(CORPUS)):
        path = os.path.join(CORPUS, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as f:
                data += f.read()
    train = data[: len(data) - len(data) // 10].decode("utf-8", "replace")
    return {w.lower() for w in re.findall(r"[A-Za-z]+", train)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trellis", default="build/trellis")
    ap.add_argument("--out", default=None)
    ap.add_argument("--sample-seeds", type=int, default=10)
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="default_job_")
    t0 = time.time()
    subprocess.run([a.trellis, "train", "--out", out, *a.extra], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    steps = [r for r in rows if "loss" in r and "lr" in r]
    vals = [r for r in rows if "val_loss" in r]
    # The end of warmup: the step whose lr is the largest (the peak).
    peak = max(range(len(steps)), key=lambda i: steps[i]["lr"])
    after = [r["loss"] for r in steps[peak + 1:]]
    spike = max(after) - steps[peak]["loss"] if after else 0.0
    last = max(int(d.split("_")[1]) for d in os.listdir(out) if d.startswith("step_"))
    checkpoint = os.path.join(out, f"step_{last:08d}")
    known = training_words()

    def sample_words(seed):
        text = subprocess.run([a.trellis, "sample", "--checkpoint", checkpoint, "--seed", str(seed)],
                              check=True, capture_output=True, text=True).stdout
        return text, [w.lower() for w in re.findall(r"[A-Za-z]+", text)]

    sample, words = sample_words(1)
    print(sample, file=sys.stderr)
    real = sum(w in known for w in words) / len(words) if words else 0.0
    all_words = [w for seed in range(1, a.sample_seeds + 1) for w in sample_words(seed)[1]]
    real_seeds = sum(w in known for w in all_words) / len(all_words) if all_words else 0.0
    print(json.dumps({"wall_s": round(wall, 1), "steps": len(steps),
                      "warmup_end_step": steps[peak]["step"], "spike": round(spike, 3),
                      "val_loss": vals[-1]["val_loss"], "real_words": round(real, 3),
                      "words": len(words), "real_words_seeds": round(real_seeds, 3),
                      "words_seeds": len(all_words), "load_avg": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
