"""The LLaMA-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU, untied head), the
encoder-decoder (cross-attention, grouped-query) and the bidirectional encoder under every kind of
parallel layout equal the 1-process run: per-step losses over 20 steps, validation losses and
final parameters to <= 1e-5 relative (fp32).

Every layout runs micro-batches of 2, and so does the baseline: a pipeline always accumulates, and
accumulating over other micro-batches changes the summation order (test_pp_equivalence)."""
import os

from trellis_test import LayoutCheck, check, compare_params, fresh_dir, mpirun, run, write_text_corpus, TMP

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["--data", data, "--steps", 20, "--batch-size", 8,
          "--micro-batch-size", 2, "--seq-len", 32, "--lr", 3e-3, "--warmup-steps", 4,
          "--val-every", 10, "--threads", 1, "--quiet", "--tensorboard", "false"]
layouts = {
    "dp2": (2, ["--dp", 2]),
    "tp2": (2, ["--tp", 2]),
    "tp2_sp": (2, ["--tp", 2, "--sequence-parallel"]),
    "pp2_1f1b": (2, ["--pp", 2, "--schedule", "1f1b"]),
    "pp2_interleaved": (2, ["--pp", 2, "--schedule", "interleaved", "--virtual-stages", 2]),
    "dp2_tp2_pp2_zero1": (8, ["--dp", 2, "--tp", 2, "--pp", 2, "--zero", 1,
                              "--sequence-parallel"]),
}
# 4 query heads over 2 key/value heads: tp = 2 splits both.
# 4 blocks each (encoder-decoder: 2 encoder + 2 decoder blocks, so pp2 x 2 virtual stages cuts
# the list at the decoder's start and passes the encoder's output along).
models = {
    "llama": ["train", "--model", "llama-tiny", "--n-layer", 4, "--n-head", 4, "--n-kv-head", 2]
    + common,
    "encdec": ["train", "--model", "encdec-tiny", "--n-head", 4, "--n-kv-head", 2] + common,
    "encoder": ["train", "--model", "encoder-tiny", "--n-layer", 4, "--n-head", 4] + common,
    # every block choice flipped on the gpt2 family: fused c_fc holds gate|up (2 parts per rank)
    "gpt2_flipped": ["train", "--model", "tiny", "--seed", 3, "--n-layer", 4, "--n-head", 4, "--norm",
                     "rmsnorm", "--positions", "rope", "--mlp", "swiglu", "--bias", "false",
                     "--tied-head", "false"] + common,
}
short = {"encoder": ("dp2", "pp2_interleaved"),  # these share code paths with the decoders;
         "gpt2_flipped": ("dp2", "tp2", "pp2_interleaved")}  # keep CI short
checks = {}
for model, args in models.items():
    checks[model] = LayoutCheck(args, n_embd=32, steps=20, name=f"{model}_baseline")
    for name, (ranks, extra) in layouts.items():
        if name in short.get(model, ()):
            continue
        checks[model].check(f"{model}_{name}", ranks, extra)

# tp must divide the key/value heads as well as the query heads.
_, err = mpirun(4, models["llama"] + ["--tp", 4, "--out", fresh_dir("bad_tp")], expect=2)
check("tp=4 does not divide the number of key/value heads 2" in err,
      "tp must divide n_kv_head, refused with one line")

# Checkpoints move between layouts: 10 steps under tp2 x pp2, then resume as 1 process.
out = fresh_dir("llama_moved")
mpirun(4, models["llama"] + ["--tp", 2, "--pp", 2, "--stop-at", 10, "--out", out])
run(models["llama"] + ["--resume", "--out", out])
loss, _, params = checks["llama"]._result(out)
ref_loss, _, ref_params = checks["llama"].base
worst = max(abs(a - b) / abs(b) for a, b in zip(loss, ref_loss))
check(len(loss) == 20 and worst <= 1e-5,
      f"llama tp2 x pp2 checkpoint resumed by 1 process: losses match ({worst:.1e})")
worst_p, where, whole = compare_params(params, ref_params, 32)
check(worst_p <= 1e-5 and whole <= 1e-5,
      f"... and final parameters match (worst {worst_p:.1e} in {where})")
