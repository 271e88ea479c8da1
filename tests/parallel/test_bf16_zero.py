"""Mixed-precision model state (parallel/working_weights.h): in bf16, ZeRO-1/2/3 keep the fp32
master weights only in each rank's shard and gather bf16 working weights (plus the fp32 values of
the tensors the kernels read in fp32). Checked here, for GPT-2 (tiny: biases, a tied head) and
LLaMA (llama-tiny: an untied head, no biases):

(a) dp2 ZeRO-1, 2 and 3 in bf16 equal dp2 ZeRO-0 in bf16 (whole fp32 replicas and the model's own
    bf16 copies): losses, validation losses and final parameters to test_bf16_layouts' tolerance
    (5e-3, LayoutCheck's rule), and the all-parameter distance at most half of what separates the
    bf16 run from the fp32 one (test_bf16_layouts explains both). The working weights are the
    bits ZeRO-0's copies round to, so in practice only the reduction order differs.
(b) A bf16 ZeRO-1 and ZeRO-3 run stopped and resumed from its checkpoint (the fp32 masters,
    gathered from the shards) is bitwise the uninterrupted run.
(c) A bf16 ZeRO-3 checkpoint resumes in one process (ZeRO-0) and at dp2 ZeRO-1: both go on as
    the uninterrupted dp2 ZeRO-3 run, to the same tolerance.
(d) With bf16_embeddings (the lookups read the tables' bf16 working weights, and no rank keeps
    their fp32 values) dp2 ZeRO-1, 2 and 3 equal one bf16 process with the key, as (a) checks
    the stages (its checkpoint records the key), and so do tp2 with sequence parallelism (each
    rank's vocabulary slice of the table) and pp2 (GPT-2's tied head, on the last stage, keeps its
    own copy of the table); test_memory_prediction checks the pages it saves.

On a CPU without AVX512-BF16 --precision bf16 runs the emulated bf16 GEMM: what is checked here is
the state's layout, not the GEMM's speed."""
import json
import os

from trellis_test import (LayoutCheck, TMP, bf16_layout_models, check, compare_params, fresh_dir,
                          metrics, mpirun, run, stop_and_resume)

os.environ.pop("TRELLIS_ISA", None)

TOL = 5e-3  # test_bf16_layouts' tolerance
GAP_FRACTION = 0.5
STEPS = 20

models = bf16_layout_models(STEPS, ["--quiet"])


for model, args in models.items():
    fp32_out = fresh_dir(f"{model}_fp32")
    run(args + ["--precision", "fp32", "--dp", 1, "--out", fp32_out])
    # The reference: dp2 ZeRO-0 in bf16 (LayoutCheck runs its baseline as one process, so it is
    # given mpirun here).
    bf16 = args + ["--precision", "bf16", "--dp", 2]
    ref = LayoutCheck.__new__(LayoutCheck)
    ref.args, ref.n_embd, ref.steps, ref.tol, ref.param_step = bf16, 32, STEPS, TOL, STEPS
    ref_out = fresh_dir(f"{model}_zero0")
    mpirun(2, bf16 + ["--zero", 0, "--out", ref_out])
    ref.base = ref._result(ref_out)
    fp32_params = ref._result(fp32_out)[2]
    _, _, gap = compare_params(ref.base[2], fp32_params, 32)
    check(gap > 0, f"{model}: bf16 dp2 ZeRO-0 differs from fp32 ({gap:.1e})")
    for zero in (1, 2, 3):
        name = f"{model}_zero{zero}"
        ref.check(name, 2, ["--zero", zero])
        params = ref._result(os.path.join(TMP, name))[2]
        _, _, whole = compare_params(params, ref.base[2], 32)
        check(whole <= GAP_FRACTION * gap,
              f"{name}: all parameters {whole:.1e} from ZeRO-0, {whole / gap:.2f} of the fp32 "
              f"run's distance {gap:.1e} (<= {GAP_FRACTION})")

    # (d) bf16_embeddings: one process against dp2 ZeRO-1/2/3, tp2 + SP and pp2
    keyed = LayoutCheck(args + ["--precision", "bf16", "--bf16-embeddings", "true"], n_embd=32,
                        steps=STEPS, tol=TOL, name=f"{model}_emb")
    with open(os.path.join(TMP, f"{model}_emb", f"step_{STEPS:08d}", "config.json")) as f:
        check(json.load(f)["trellis"].get("bf16_embeddings") is True,
              f"{model}_emb: the checkpoint records bf16_embeddings")
    _, _, gap = compare_params(keyed.base[2], fp32_params, 32)
    for name, extra in [(f"zero{z}", ["--dp", 2, "--zero", z]) for z in (1, 2, 3)] + [
            ("tp2_sp", ["--tp", 2, "--sequence-parallel"]), ("pp2", ["--pp", 2])]:
        name = f"{model}_emb_{name}"
        keyed.check(name, 2, extra)
        _, _, whole = compare_params(keyed._result(os.path.join(TMP, name))[2], keyed.base[2], 32)
        check(whole <= GAP_FRACTION * gap,
              f"{name}: all parameters {whole:.1e} from one process, {whole / gap:.2f} of the "
              f"fp32 run's distance {gap:.1e} (<= {GAP_FRACTION})")

    # (b) bitwise resume
    for zero in (1, 3):
        stop_and_resume(bf16 + ["--zero", zero], 10, STEPS, f"{model}_resume_zero{zero}",
                        launch=lambda a: mpirun(2, a))

    # (c) another layout resumes a ZeRO-3 checkpoint
    src = os.path.join(TMP, f"{model}_zero3")
    for name, ranks, layout in (("dp1", 1, ["--dp", 1]), ("dp2_zero1", 2, ["--zero", 1])):
        out = fresh_dir(f"{model}_reshard_{name}")
        stopped = args + ["--precision", "bf16", "--dp", 2, "--zero", 3, "--out", out]
        mpirun(2, stopped + ["--stop-at", 10])
        resumed = args + ["--precision", "bf16"] + layout + ["--out", out, "--resume"]
        if ranks == 1:
            run(resumed)
        else:
            mpirun(2, resumed + ["--dp", 2])
        got, want = metrics(out)[0], metrics(src)[0]
        check([r["step"] for r in got] == list(range(1, STEPS + 1)),
              f"{model}_reshard_{name}: steps 1..{STEPS} logged once")
        worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, want))
        check(worst <= TOL, f"{model}_reshard_{name}: the resumed losses follow the dp2 ZeRO-3 run "
              f"(worst {worst:.1e})")
        p = ref._result(out)[2]
        worst_p, where, whole = compare_params(p, ref._result(src)[2], 32)
        check(worst_p <= TOL and whole <= TOL,
              f"{model}_reshard_{name}: final parameters match (worst tensor {worst_p:.1e} in "
              f"{where}, all {whole:.1e})")
