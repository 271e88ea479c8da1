"""--precision and TRELLIS_ISA on the command line.

(a) Resume is bitwise under bf16: 20 steps in one go == 10 steps, --stop-at, --resume for 10
    more (as test_resume): per-step losses, learning rates, validation losses, final
    parameters and optimizer state equal.
(b) TRELLIS_ISA=avx512 (a CPU without AVX512-BF16) with --precision bf16: trellis's one-line
    notice (naming AVX512-BF16 and fp32) on stderr, once also with 2 ranks, and the run is
    exactly --precision fp32 under the same cap (losses, validation losses, final weights).
(c) TRELLIS_ISA=bogus and --precision fp16: exit 2, one line naming the bad value.
(d) --precision bf16 on this CPU: the header says bf16 and the summary's MFU is of the
    "measured bf16 dot-product peak", and the run differs from fp32 from step 1. On a CPU
    without AVX512-BF16 (decided from /proc/cpuinfo, not from trellis or TRELLIS_ISA) it checks
    the fallback instead: the notice, a header saying fp32, the "measured fp32 FMA peak", and
    the run equal to --precision fp32.
(e) --precision auto: under TRELLIS_ISA=avx512 fp32 without a notice (equal to --precision fp32
    under that cap); uncapped, the same run as --precision bf16 where the CPU has AVX512-BF16,
    else as fp32, silently either way.
TRELLIS_ISA from the environment is cleared: every cap here is set by the test."""
import os

from trellis_test import (TMP, check, checkpoint_bytes, cpu_has_bf16, fresh_dir, metrics, mpirun, run,
                          write_text_corpus)

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
          "fp32" in lines[0], f"{what}: one notice line naming AVX512-BF16 and fp32: {lines}")


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
if HAS_BF16:
    check(header_precision(b_out) == "bf16", f"(d) header says bf16: {header_precision(b_out)}")
    check("(measured bf16 dot-product peak)" in summary(b_out),
          f"(d) summary: MFU of the measured bf16 dot-product peak: {summary(b_out)[:160]}")
    check(not notices(b_err), "(d) no fallback notice")
    check(bf16[0][0] != fp32[0][0] and bf16[2] != fp32[2],
          f"(d) bf16 differs from fp32 from step 1 ({bf16[0][0]!r} vs {fp32[0][0]!r})")
else:
    one_notice(b_err, "(d) CPU without AVX512-BF16, --precision bf16")
    check(header_precision(b_out) == "fp32" and "(measured fp32 FMA peak)" in summary(b_out),
          f"(d) the fallback's header says fp32, its MFU is of the measured fp32 FMA peak: "
          f"{header_precision(b_out)}, {summary(b_out)[:160]}")
    check(bf16 == fp32, "(d) the fallback run equals --precision fp32")

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

# ---- (b) TRELLIS_ISA=avx512 + --precision bf16: the fallback ----
c_out, c_err, c_dir = train("bf16_avx512", "bf16", isa="avx512")
one_notice(c_err, "(b) TRELLIS_ISA=avx512 --precision bf16")
check(header_precision(c_out) == "fp32" and "(measured fp32 FMA peak)" in summary(c_out),
      "(b) header says fp32, MFU of the measured fp32 FMA peak")
check(result(c_dir) == fp32_capped,
      "(b) losses, validation losses and final weights equal --precision fp32 (same cap)")
os.environ["TRELLIS_ISA"] = "avx512"  # mpirun passes its environment on to the ranks
try:
    m_out, m_err = mpirun(2, ["train"] + common + ["--steps", 2, "--dp", 2, "--precision", "bf16",
                                                   "--out", fresh_dir("bf16_avx512_dp2")])
finally:
    del os.environ["TRELLIS_ISA"]
one_notice(m_err, "(b) 2 ranks under TRELLIS_ISA=avx512: printed once")
check(header_precision(m_out) == "fp32", "(b) 2 ranks: header says fp32")

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
