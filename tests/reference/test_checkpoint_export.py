"""`trellis export`: a sharded checkpoint written under tp2 x dp2 (vocabulary padded for tp = 2)
becomes a Hugging Face directory that PyTorch reads on its own (safetensors parsed by the
reference's reader, the GPT-2 forward written from torch ops): its tensors equal the checkpoint's,
and its eval loss in torch equals `trellis eval` of the checkpoint and of the export (<= 1e-5).
Above --max-shard-bytes the export is sharded with model.safetensors.index.json; torch reads that
too, and `train --init-from` starts from exactly those weights. The old whole-file checkpoint
exports to its own model.safetensors tensors."""
import json
import os

import numpy as np
import torch

from reference.torch_gpt import gpt_loss, load_model
from reference.torch_ref import load_safetensors, read_tokens, windows
from trellis_test import (SOURCE, TMP, check, checkpoint_tensors, fresh_dir, mpirun, run,
                          write_text_corpus)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
shard = os.path.join(data, "val_000000.bin")
common = ["--model", "tiny", "--data", data, "--batch-size", 4, "--seq-len", 16,
          "--vocab-multiple", 96, "--threads", 1, "--quiet", "--tensorboard", "false",
          "--val-every", 0]

out = fresh_dir("train")
mpirun(4, ["train"] + common + ["--steps", 3, "--tp", 2, "--dp", 2, "--zero", 1, "--out", out])
ck = os.path.join(out, "step_00000003")
want = checkpoint_tensors(ck)

hf = fresh_dir("hf")
run(["export", "--checkpoint", ck, "--out", hf])
check(sorted(os.listdir(hf)) == ["config.json", "model.safetensors"],
      "export writes config.json and model.safetensors")
params, cfg = load_model(hf, dtype=torch.float64, requires_grad=False)
check(sorted(params) == sorted(want) and
      all(np.array_equal(params[k].numpy().astype(np.float32), want[k]) for k in want),
      f"torch reads the export: the checkpoint's {len(want)} tensors, bitwise")

evalcmd = ["eval", "--data", shard, "--seq-len", 16, "--batch-size", 2, "--batches", 3]
got_ck = json.loads(run(evalcmd + ["--checkpoint", ck])[0])["loss"]
got_hf = json.loads(run(evalcmd + ["--checkpoint", hf])[0])["loss"]
x, y = windows(read_tokens(shard), 16, range(6))
with torch.no_grad():
    ref = gpt_loss(params, cfg, x, y).item()
check(abs(got_ck - ref) / ref <= 1e-5 and abs(got_hf - ref) / ref <= 1e-5,
      f"eval loss: torch on the export {ref:.6f}, trellis on the checkpoint {got_ck:.6f}, "
      f"on the export {got_hf:.6f}")

# The sharded form: files of at most ~20 kB, listed by model.safetensors.index.json.
hf2 = fresh_dir("hf_sharded")
run(["export", "--checkpoint", ck, "--out", hf2, "--max-shard-bytes", 20000])
files = sorted(f for f in os.listdir(hf2) if f.endswith(".safetensors"))
check(len(files) >= 3 and "model.safetensors" not in files and
      os.path.exists(os.path.join(hf2, "model.safetensors.index.json")),
      f"above --max-shard-bytes the export is sharded ({len(files)} files + index)")
with open(os.path.join(hf2, "model.safetensors.index.json")) as f:
    index = json.load(f)
got = {}
for name, file in index["weight_map"].items():
    got[name] = load_safetensors(os.path.join(hf2, file))[name]
total = sum(a.nbytes for a in got.values())
check(index["metadata"]["total_size"] == total and sorted(got) == sorted(want) and
      all(np.array_equal(got[k], want[k]) for k in want),
      f"torch reads the sharded export through its weight_map ({total} bytes)")
check(all(os.path.getsize(os.path.join(hf2, f)) <= 20000 + 4096 or
          len(load_safetensors(os.path.join(hf2, f))) == 1 for f in files),
      "each file holds at most --max-shard-bytes (or one larger tensor)")

init = fresh_dir("init")
run(["train"] + common[2:] + ["--init-from", hf2, "--steps", 0, "--out", init])
started = checkpoint_tensors(os.path.join(init, "step_00000000"))
check(sorted(started) == sorted(want) and all(np.array_equal(started[k], want[k]) for k in want),
      "--init-from the sharded export starts from exactly its weights")

# A whole-file checkpoint of an older trellis exports too.
old = os.path.join(SOURCE, "tests", "data", "checkpoint_v1")
hf3 = fresh_dir("hf_v1")
run(["export", "--checkpoint", old, "--out", hf3])
a = load_safetensors(os.path.join(old, "model.safetensors"))
b = load_safetensors(os.path.join(hf3, "model.safetensors"))
check(sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a),
      "the whole-file checkpoint_v1 exports to its own tensors")
