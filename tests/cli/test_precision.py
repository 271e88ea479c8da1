"""--precision and TRELLIS_ISA on the command line.

(a) Resume is bitwise under bf16: 20 steps in one go == 10 steps, --stop-at, --resume for 10
    more (as test_resume): per-step losses, learning rates, validation losses, final
    parameters and optimizer state equal.
(b) TRELLIS_ISA=avx2 (a CPU without AVX512-BF16) with --precision bf16: trellis's one-line
    notice (naming AVX512-BF16 and the emulated matrix products) on stderr, once also with 2
    ranks; the header says bf16, the MFU is of the fp32 FMA peak "bf16 GEMMs emulated", and the
    run is bf16: it differs from fp32 from step 1. Where this CPU has no AVX512-BF16 it equals
    the uncapped bf16 run bitwise (both emulated); where it has, the emulated weights after 20
    steps are nearer the native bf16 run's than half the fp32 run's distance to them (the
    same products, only the order of their fp32 sums differs).
(c) TRELLIS_ISA=bogus and --precision fp16: exit 2, one line naming the bad value.
(d) --precision bf16 on this CPU: the header says bf16 and the run differs from fp32 from
    step 1; the summary's MFU is of the "measured bf16 dot-product peak" with no notice, or, on a
    CPU without AVX512-BF16 (decided from /proc/cpuinfo, not from trellis or TRELLIS_ISA), the
    emulation's notice and the fp32 FMA peak.
(e) --precision auto: under TRELLIS_ISA=avx512 fp32 without a notice (equal to --precision fp32
    under that cap); uncapped, the same run as --precision bf16 where the CPU has AVX512-BF16,
    else as fp32, silently either way.
TRELLIS_ISA from the environment is cleared: every cap here is set by the test."""
import os

import numpy as np

from trellis_test import (TMP, check, checkpoint_bytes, checkpoint_tensors, cpu_has_bf16, fresh_dir,
                          metrics, mpirun, run, write_text_corpus)

os.environ.pop("TRELLIS_ISA", None)
HAS_BF16 = cpu_has_bf16()
print(f"this CPU {'has' if HAS_BF16 else 'lacks'} AVX512-BF16 (/proc/cpuinfo)")

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["--model", "tiny", "--data", data, "--steps", 20, "--batch-size", 4,
          "--micro-batch-size", 2, "--seq-len", 32, "--lr", 3e-3, "--warmup-steps", 3,
          "--val-every", 5, "--threads", 2, "--log-every", 10, "--tensorboard", "false"]


def capped(isa):
    return dict(os.environ, TRELLIS_ISA=isa) if isa else dict(os.environ)


def train(name, precision, isa=None):
    """A run of `common` (not --quiet: the header and summary are checked) as TMP/name; returns
    (stdout, stderr, out dir)."""
    out = fresh_dir(name)
    stdout, stderr = run(["train"] + common + ["--precision", precision, "--out", out],
                         env=capped(isa))
    return stdout, stderr, out


def read(path):
    with open(path, "rb") as f:
        return f.read()


def result(out):
    """Per-step losses, validation losses, final weights (bytes)."""
    train_rows, val_rows = metrics(out)
    return ([r["loss"] for r in train_rows], [v["val_loss"] for v in val_rows],
            checkpoint_bytes(os.path.join(out, "step_00000020")))


def header_precision(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("trellis: world ")]
    if len(lines) != 1 or "threads/rank, " not in lines[0]:
        return None
    return lines[0].split("threads/rank, ", 1)[1].split(" |", 1)[0]


def summary(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("trellis: done |")]
    return lines[0] if len(lines) == 1 else ""


def notices(stderr):
    return [line for line in stderr.splitlines() if "AVX512-BF16" in line]


def one_notice(stderr, what):
    lines = notices(stderr)
    check(len(lines) == 1 and lines[0].startswith("trellis: ") and "bf16" in lines[0] and
          "emulated" in lines[0], f"{what}: one notice line naming AVX512-BF16 and emulation: {lines}")


EMULATED = "(measured fp32 FMA peak, bf16 GEMMs emulated)"


def distance(a_dir, b_dir):
    """L2 distance between two runs' final weights (all parameters)."""
    a = checkpoint_tensors(os.path.join(a_dir, "step_00000020"))
    b = checkpoint_tensors(os.path.join(b_dir, "step_00000020"))
    check(a.keys() == b.keys() and len(a) > 0, "the two checkpoints hold the same tensors")
    return float(np.sqrt(sum(np.sum((a[k].astype(np.float64) - b[k]) ** 2) for k in a)))


# ---- fp32 references, uncapped and under TRELLIS_ISA=avx512 ----
f_out, _, f_dir = train("fp32", "fp32")
fp32 = result(f_dir)
check(header_precision(f_out) == "fp32" and "(measured fp32 FMA peak)" in summary(f_out),
      "--precision fp32: header says fp32, MFU of the measured fp32 FMA peak")
check(len(fp32[0]) == 20 and len(set(fp32[0])) == 20 and len(fp32[1]) == 4,
      "the fp32 run logs 20 distinct losses and 4 validation losses")
fc_out, fc_err, fc_dir = train("fp32_avx512", "fp32", isa="avx512")
fp32_capped = result(fc_dir)
check(header_precision(fc_out) == "fp32" and not notices(fc_err),
      "--precision fp32 under TRELLIS_ISA=avx512: fp32, no notice")

# ---- (d) --precision bf16 on this CPU; (a) resume ----
b_out, b_err, b_dir = train("bf16_full", "bf16")
bf16 = result(b_dir)
check(header_precision(b_out) == "bf16", f"(d) header says bf16: {header_precision(b_out)}")
check(bf16[0][0] != fp32[0][0] and bf16[2] != fp32[2],
      f"(d) bf16 differs from fp32 from step 1 ({bf16[0][0]!r} vs {fp32[0][0]!r})")
if HAS_BF16:
    check("(measured bf16 dot-product peak)" in summary(b_out),
          f"(d) summary: MFU of the measured bf16 dot-product peak: {summary(b_out)[:160]}")
    check(not notices(b_err), "(d) no notice")
else:
    one_notice(b_err, "(d) CPU without AVX512-BF16, --precision bf16")
    check(EMULATED in summary(b_out),
          f"(d) MFU of the fp32 FMA peak, emulated: {summary(b_out)[:160]}")

split = fresh_dir("bf16_split")
run(["train"] + common + ["--precision", "bf16", "--stop-at", 10, "--out", split, "--quiet"])
check(os.path.isdir(os.path.join(split, "step_00000010")) and
      not os.path.isdir(os.path.join(split, "step_00000020")),
      "(a) stopped at step 10 with a checkpoint")
r_out, _ = run(["train"] + common + ["--precision", "bf16", "--resume", "--out", split])
check(header_precision(r_out) == header_precision(b_out) and "resumed from" in r_out,
      f"(a) the resumed run says {header_precision(r_out)} as the straight one, resumed")
a_rows, a_val = metrics(b_dir)
s_rows, s_val = metrics(split)
check([r["step"] for r in s_rows] == list(range(1, 21)), "(a) steps 1..20 logged once each")
check([r["loss"] for r in a_rows] == [r["loss"] for r in s_rows],
      "(a) --precision bf16: losses bitwise equal over 20 steps")
check([r["lr"] for r in a_rows] == [r["lr"] for r in s_rows], "(a) learning rates equal")
check(len(a_val) == 4 and [v["val_loss"] for v in a_val] == [v["val_loss"] for v in s_val],
      "(a) validation losses at steps 5, 10, 15, 20 equal")
for f in ("params", "optimizer"):
    check(checkpoint_bytes(os.path.join(b_dir, "step_00000020"), f) ==
          checkpoint_bytes(os.path.join(split, "step_00000020"), f), f"(a) final {f} bitwise equal")

# ---- (b) TRELLIS_ISA=avx2 + --precision bf16: emulated matrix products ----
c_out, c_err, c_dir = train("bf16_avx2", "bf16", isa="avx2")
one_notice(c_err, "(b) TRELLIS_ISA=avx2 --precision bf16")
check(header_precision(c_out) == "bf16" and EMULATED in summary(c_out),
      f"(b) header says bf16, MFU of the fp32 FMA peak, emulated: {summary(c_out)[:160]}")
emulated = result(c_dir)
check(emulated[0][0] != fp32[0][0] and emulated[2] != fp32[2],
      "(b) the emulated run is bf16: it differs from fp32 from step 1")
if HAS_BF16:
    near, far = distance(c_dir, b_dir), distance(f_dir, b_dir)
    check(0 < far and near <= 0.5 * far,
          f"(b) emulated weights {near:.3g} from native bf16's, fp32's {far:.3g}: within half")
else:
    check(emulated == bf16, "(b) on this CPU the capped run equals the uncapped one (both emulated)")
os.environ["TRELLIS_ISA"] = "avx2"  # mpirun passes its environment on to the ranks
try:
    m_out, m_err = mpirun(2, ["train"] + common + ["--steps", 2, "--dp", 2, "--precision", "bf16",
                                                   "--out", fresh_dir("bf16_avx2_dp2")])
finally:
    del os.environ["TRELLIS_ISA"]
one_notice(m_err, "(b) 2 ranks under TRELLIS_ISA=avx2: printed once")
check(header_precision(m_out) == "bf16", "(b) 2 ranks: header says bf16")

# ---- (c) bad values: exit 2, one line naming them ----
for what, args, isa, names in (
        ("TRELLIS_ISA=bogus", ["--precision", "bf16"], "bogus", ("TRELLIS_ISA", "bogus")),
        ("--precision fp16", ["--precision", "fp16"], None, ("precision", "fp16"))):
    out = fresh_dir("bad")
    _, err = run(["train"] + common + args + ["--out", out], expect=2, env=capped(isa))
    lines = err.strip().splitlines()
    check(len(lines) == 1 and lines[0].startswith("trellis: error:") and
          all(n in lines[0] for n in names), f"(c) {what}: exit 2, one line: {lines}")
    check(not os.path.exists(os.path.join(out, "metrics.jsonl")), f"(c) {what}: nothing trained")

# ---- (e) --precision auto ----
e_out, e_err, e_dir = train("auto_avx512", "auto", isa="avx512")
check(header_precision(e_out) == "fp32" and not e_err.strip(),
      f"(e) auto under TRELLIS_ISA=avx512: fp32, stderr empty (no notice): {e_err.strip()[:200]!r}")
check(result(e_dir) == fp32_capped, "(e) ... the same run as --precision fp32 under the cap")
u_out, u_err, u_dir = train("auto", "auto")
want = "bf16" if HAS_BF16 else "fp32"
check(header_precision(u_out) == want and not notices(u_err),
      f"(e) auto uncapped on this CPU: {want}, no notice")
check(result(u_dir) == (bf16 if HAS_BF16 else fp32),
      f"(e) ... the same run as --precision {want}")
