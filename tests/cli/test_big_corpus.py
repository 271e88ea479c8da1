"""Bounded memory at a realistic size (issue 15): a corpus of 1B uint16 tokens (10 shards of 100M,
2 GB, synthetic) trains `--model tiny` with its first step starting in under 5 s of the process's
start and a peak RSS (VmHWM) under 300 MB, both read from metrics.jsonl (`start_s`,
`peak_rss_bytes`). Shards are mapped and
only their headers are read at startup, so neither number grows with the corpus.

The shards are written by numpy (one 100M-token payload written ten times) and removed at the end,
also when a check fails. Skips (exit 0) when the scratch file system lacks the space."""
import atexit
import json
import os
import shutil
import sys
import time

import numpy as np

from trellis_test import TMP, check, metrics, run, write_shard

SHARDS, PER_SHARD = 10, 100_000_000
os.makedirs(TMP, exist_ok=True)
st = os.statvfs(TMP)
need = SHARDS * (1024 + 2 * PER_SHARD) + (1 << 30)
if st.f_bavail * st.f_frsize < need:
    print(f"SKIP: {TMP} has {st.f_bavail * st.f_frsize / 2**30:.1f} GiB free, the test needs "
          f"{need / 2**30:.1f}")
    sys.exit(0)

data = os.path.join(TMP, "big")
out = os.path.join(TMP, "out")
shutil.rmtree(data, ignore_errors=True)
shutil.rmtree(out, ignore_errors=True)
atexit.register(shutil.rmtree, data, True)  # also on a failed check (sys.exit)
os.makedirs(data)

# Byte-level tokens (vocabulary 256, so the model stays tiny): a cheap hash of the position.
# Built in 10M-token pieces, so this process stays small next to the one it measures.
payload = np.empty(PER_SHARD, dtype=np.uint16)
for lo in range(0, PER_SHARD, 10_000_000):
    i = np.arange(lo, min(PER_SHARD, lo + 10_000_000), dtype=np.uint32)
    payload[lo:lo + len(i)] = ((i * np.uint32(2654435761)) >> np.uint32(13)) & np.uint32(255)
    del i
for k in range(SHARDS):
    write_shard(os.path.join(data, f"train_{k:06d}.bin"), payload)
write_shard(os.path.join(data, "val_000000.bin"), payload[:1_000_000])
del payload
with open(os.path.join(data, "meta.json"), "w") as f:
    json.dump({"tokenizer": "byte", "vocab_size": 256}, f)
total = SHARDS * PER_SHARD
check(sum(os.path.getsize(os.path.join(data, n)) for n in os.listdir(data)
          if n.startswith("train")) == SHARDS * (1024 + 2 * PER_SHARD),
      f"wrote {total:,} training tokens in {SHARDS} shards")

# 30 steps of 16 windows scattered over 2 GB: each maps a 2 MB page-cache folio, ~1 GB in all
# unless trellis releases its mappings as it goes.
t0 = time.time()
stdout, _ = run(["train", "--model", "tiny", "--data", data, "--steps", 30, "--batch-size", 16,
                 "--threads", 1, "--val-every", 0, "--val-batches", 1, "--save-every", 0,
                 "--tensorboard=false", "--peak-gflops-per-core", 100, "--out", out],
                timeout=300)
wall = time.time() - t0
check(f"{total:,}".replace(",", "") in stdout.replace(",", ""),
      "the run reports the whole corpus's token count")
train, val = metrics(out)
check([r["step"] for r in train] == list(range(1, 31)), "30 steps logged")
first = train[0]["start_s"]
rss = max(r["peak_rss_bytes"] for r in train)
print(f"first step started {first:.3f} s after start; peak RSS {rss / 2**20:.1f} MiB; "
      f"whole run {wall:.2f} s")
check(first < 5.0, f"the first step starts in under 5 s ({first:.2f} s) on {total:,} tokens")
check(rss < 300 * 2**20, f"peak RSS stays under 300 MB ({rss / 2**20:.0f} MiB)")
check(len(val) == 1 and np.isfinite(val[0]["val_loss"]), "validation reads its fixed subset")
shutil.rmtree(out, ignore_errors=True)
