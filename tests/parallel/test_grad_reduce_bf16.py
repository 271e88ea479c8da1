"""grad_reduce_dtype = bf16: gradients cross the data-parallel group as bf16 (rounded, summed in
fp32, each partial sum rounded) and are widened back; ZeRO-0 and ZeRO-1 also keep them as bf16
(each micro-batch's fp32 gradients added into the bf16 buffer, rounded once), ZeRO-2/3 accumulate
fp32 shards. The arithmetic of the sums is checked bit for bit by tests/mpi/comm_check.cpp; here
the wiring into every ZeRO stage, on tiny GPT-2, fp32 compute:

(a) At dp2 with one micro-batch each element's reduced gradient is the same rounded sum in every
    stage (two ranks: one order; the bf16 gradient storage rounds the same micro-batch sum once),
    so dp2 ZeRO-1, 2 and 3 equal dp2 ZeRO-0 with the same key to the fp32 layout tolerance (1e-5:
    only the optimizer's and the norm's summation order differs). With accumulation ZeRO-0 and
    ZeRO-1 add each micro-batch into their bf16 gradients (one more rounding each) and still agree
    to 1e-5, while ZeRO-2 accumulates in fp32: it differs, within bf16's layout tolerance (below).
    The same equality on LLaMA (untied head: a root piece above the blocks, which a block's fold
    must add before ZeRO-0's bucket above it is sent) and the encoder-decoder (root pieces between
    the encoder's and the decoder's blocks): ZeRO-0 and ZeRO-1 against ZeRO-2, which keeps no bf16
    gradients.
(b) bf16 reduction changes the run (the comparison compares something) and stays within bf16's
    layout tolerance of the fp32 reduction (5e-3, test_bf16_layouts' rule), at dp2 and dp4.
(c) One process has nothing to reduce: the key leaves it bitwise unchanged.
(d) A run with bf16 reduction resumes bitwise (ZeRO-0's and ZeRO-1's bf16 gradients, ZeRO-2's
    per-unit reductions).
(e) An unknown type exits 2 with one line naming the key."""
import os

from trellis_test import (LayoutCheck, TMP, check, compare_params, expect_error, fresh_dir,
                          mpirun, run, same_checkpoint, stop_and_resume, write_text_corpus)

STEPS = 20
TOL_BF16 = 5e-3  # test_bf16_layouts' tolerance for bf16 roundings of the same size

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["train", "--model", "tiny", "--data", data, "--steps", STEPS, "--batch-size", 8,
          "--seq-len", 32, "--lr", 3e-3, "--warmup-steps", 4, "--val-every", 10, "--threads", 1,
          "--quiet", "--tensorboard", "false"]
# Buckets of 16 KiB: several a block, so ZeRO-0 sends some while backward still runs (one bucket
# for the whole model would wait for the end of backward and hide a bucket sent too early).
bf16 = ["--grad-reduce-dtype", "bf16", "--bucket-mb", 1 / 64]

# (a) every stage against ZeRO-0, all with bf16 reduction
ref = LayoutCheck.__new__(LayoutCheck)
ref.args, ref.n_embd, ref.steps, ref.tol, ref.param_step = common + bf16, 32, STEPS, 1e-5, STEPS
zero0 = fresh_dir("dp2_zero0")
mpirun(2, common + bf16 + ["--dp", 2, "--out", zero0])
ref.base = ref._result(zero0)
for zero in (1, 2, 3):
    ref.check(f"dp2_zero{zero}", 2, ["--dp", 2, "--zero", zero])
micro = ["--micro-batch-size", 2]
zero0_micro = fresh_dir("dp2_zero0_micro2")
mpirun(2, common + bf16 + micro + ["--dp", 2, "--out", zero0_micro])
ref.base = ref._result(zero0_micro)
ref.check("dp2_zero1_micro2", 2, ["--dp", 2, "--zero", 1] + micro)
ref.tol = TOL_BF16
ref.check("dp2_zero2_micro2", 2, ["--dp", 2, "--zero", 2] + micro)
_, _, gap = compare_params(ref._result(os.path.join(TMP, "dp2_zero2_micro2"))[2], ref.base[2], 32)
check(gap > 0, f"dp2_zero2_micro2: ZeRO-2 accumulates in fp32 ({gap:.1e} from ZeRO-0's bf16 "
      "gradients)")

for model, extra in (("llama", ["--model", "llama-tiny", "--n-layer", 4, "--n-head", 4,
                                 "--n-kv-head", 2]),
                     ("encdec", ["--model", "encdec-tiny", "--n-head", 4, "--n-kv-head", 2])):
    other = LayoutCheck.__new__(LayoutCheck)
    other.args, other.n_embd, other.steps = common + bf16 + extra, 32, STEPS
    other.tol, other.param_step = 1e-5, STEPS
    zero2 = fresh_dir(f"{model}_dp2_zero2")
    mpirun(2, other.args + ["--dp", 2, "--zero", 2, "--out", zero2])
    other.base = other._result(zero2)
    for zero in (0, 1):
        other.check(f"{model}_dp2_zero{zero}", 2, ["--dp", 2, "--zero", zero])

# (b) against the fp32 reduction
for dp in (2, 4):
    fp32_ref = LayoutCheck.__new__(LayoutCheck)
    fp32_ref.args, fp32_ref.n_embd, fp32_ref.steps = common, 32, STEPS
    fp32_ref.tol, fp32_ref.param_step = TOL_BF16, STEPS
    fp32_out = fresh_dir(f"dp{dp}_fp32_reduce")
    mpirun(dp, common + ["--dp", dp, "--out", fp32_out])
    fp32_ref.base = fp32_ref._result(fp32_out)
    name = f"dp{dp}_bf16_vs_fp32"
    fp32_ref.check(name, dp, bf16 + ["--dp", dp, "--zero", 2 if dp == 4 else 0])
    _, _, gap = compare_params(fp32_ref._result(os.path.join(TMP, name))[2], fp32_ref.base[2], 32)
    check(gap > 0, f"{name}: bf16 reduction changed the parameters ({gap:.1e} from fp32's)")

# (c) one process
one_fp32, one_bf16 = fresh_dir("dp1_fp32"), fresh_dir("dp1_bf16")
run(common + ["--out", one_fp32])
run(common + bf16 + ["--out", one_bf16])
last = f"step_{STEPS:08d}"
check(same_checkpoint(os.path.join(one_fp32, last), os.path.join(one_bf16, last)),
      "dp1: grad_reduce_dtype = bf16 leaves a one-process run bitwise unchanged")

# (d) bitwise resume
for zero in (0, 1, 2):
    stop_and_resume(common + bf16 + ["--dp", 2, "--zero", zero], 10, STEPS, f"resume_zero{zero}",
                    launch=lambda a: mpirun(2, a))

# (e) a bad value
expect_error(common + ["--grad-reduce-dtype", "fp16", "--out", fresh_dir("bad")],
             "grad_reduce_dtype", "fp16", what="unknown grad_reduce_dtype")
print("PASS")
