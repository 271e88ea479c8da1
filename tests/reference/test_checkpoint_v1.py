"""A GPT-2 checkpoint written before the model-layer redesign (tests/data/checkpoint_v1) still
works: `trellis eval` gives the loss an independent PyTorch GPT-2 computes from the same file (to
1e-5), `trellis sample` runs on it, and training resumes from it (step 4 on, with its optimizer
state)."""
import json
import os
import shutil
import subprocess

import torch

from reference.torch_gpt import gpt_loss, load_model
from reference.torch_ref import read_tokens, windows
from trellis_test import BIN, SOURCE, TMP, check, fresh_dir, metrics, run, write_text_corpus

old = os.path.join(SOURCE, "tests", "data", "checkpoint_v1")
corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
shard = os.path.join(data, "val_000000.bin")

out, _ = run(["eval", "--checkpoint", old, "--data", shard, "--seq-len", 16, "--batch-size", 2,
              "--batches", 3])
got = json.loads(out)["loss"]
params, cfg = load_model(old, dtype=torch.float64)
x, y = windows(read_tokens(shard), 16, range(6))
with torch.no_grad():
    want = gpt_loss(params, cfg, x, y).item()
check(abs(got - want) / want <= 1e-5,
      f"eval of the old checkpoint equals PyTorch's loss ({got:.6f} vs {want:.6f})")

# A 3-step model samples arbitrary bytes: read them as bytes, not text.
p = subprocess.run([BIN, "sample", "--checkpoint", old, "--prompt", "the", "--tokens", "8",
                    "--temperature", "0"], capture_output=True, timeout=120)
check(p.returncode == 0 and len(p.stdout) >= 8, "sampling from the old checkpoint works")

resumed = fresh_dir("resumed")
shutil.copytree(old, os.path.join(resumed, "step_00000003"))
run(["train", "--model", "tiny", "--n-embd", 16, "--batch-size", 2, "--seq-len", 16,
     "--steps", 5, "--data", data, "--resume", "--out", resumed, "--quiet",
     "--tensorboard=false", "--val-every", 0])
train, _ = metrics(resumed)
check([r["step"] for r in train] == [4, 5], "training resumes from the old checkpoint at step 4")
with open(os.path.join(resumed, "step_00000005", "index.json")) as f:
    states = json.load(f)["states"]
check(states == ["params", "exp_avg", "exp_avg_sq"],
      "and writes a new (sharded) checkpoint with optimizer state")
