"""Validation splits that do not divide evenly over the data-parallel ranks. Each rank evaluates
its share of the items, and under ZeRO-3 every forward pass gathers each block over the dp
communicator (under ZeRO-2 the first forward after an update does), so the ranks must run the same
number of micro-batches even when their shares differ (DESIGN invariant 5). When they did not, a
GPT-2 medium dp2 ZeRO-3 run whose final validation had 57 windows (28 and 29 per rank) ended with
MPI_ERR_IN_STATUS (message truncated) in the dp all_reduce_sum after the last step.

Checked here under mpirun, against the 1-process run to 1e-5 (losses, validation losses, final
parameters), with validation in the middle of the run (training goes on after it) and at the end:
- 5 validation windows over dp2 (2 and 3 per rank), micro-batches of 1 and 2, ZeRO-3 and ZeRO-2;
- 1 validation window over dp2 (none for rank 0), ZeRO-2 and ZeRO-3;
- the reported case's precision: bf16 ZeRO-3 (bf16 working weights gathered) on the 5 windows
  equals bf16 ZeRO-0 at dp2 to test_bf16_zero's tolerance.
Every run checks each collective against the other ranks' (TRELLIS_CHECK_COLLECTIVES=1), so a
rank that runs one micro-batch more than another ends the run with that line, not a stray MPI
error."""
import os

os.environ["TRELLIS_CHECK_COLLECTIVES"] = "1"

from trellis_test import (TMP, LayoutCheck, check, fresh_dir, mpirun, read_shard, run,
                          write_shard, write_text_corpus)

T = 32
corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
full = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", full])


def with_val_windows(windows):
    """A copy of the prepared data whose validation split holds `windows` windows of T tokens."""
    d = fresh_dir(f"data_val{windows}")
    for name in os.listdir(full):
        if name.startswith("val_"):
            continue
        with open(os.path.join(full, name), "rb") as f, open(os.path.join(d, name), "wb") as g:
            g.write(f.read())
    val = read_shard(os.path.join(full, "val_000000.bin"))
    check(len(val) > windows * T + 1, f"the corpus has more than {windows} validation windows")
    # No document index: these runs do not mask documents, and it would describe the whole split.
    write_shard(os.path.join(d, "val_000000.bin"), val[:windows * T + 1])
    return d


# A mismatch ends the job in comm_timeout at the latest, not the test's 300 s.
common = ["train", "--model", "tiny", "--steps", 6, "--batch-size", 8, "--seq-len", T,
          "--lr", 3e-3, "--warmup-steps", 2, "--val-every", 3, "--val-batches", 0, "--threads", 1,
          "--quiet", "--tensorboard", "false", "--comm-timeout", 30]

for windows, layouts in ((5, [(3, 1), (3, 2), (2, 1)]), (1, [(2, 1), (3, 1)])):
    data = with_val_windows(windows)
    base = LayoutCheck(common + ["--data", data], n_embd=32, steps=6, name=f"val{windows}_baseline")
    check(len(base.base[1]) == 2, f"val{windows}: the baseline validates at steps 3 and 6")
    for zero, micro in layouts:
        base.check(f"val{windows}_dp2_zero{zero}_micro{micro}", 2,
                   ["--dp", 2, "--zero", zero, "--micro-batch-size", micro])

# bf16: ZeRO-3 gathers bf16 working weights (and fp32 pieces as uneven all-gathers).
os.environ.pop("TRELLIS_ISA", None)
data = os.path.join(TMP, "data_val5")
bf16 = common + ["--data", data, "--precision", "bf16", "--dp", 2, "--micro-batch-size", 1]
ref = LayoutCheck.__new__(LayoutCheck)
ref.args, ref.n_embd, ref.steps, ref.tol, ref.param_step = bf16, 32, 6, 5e-3, 6
ref_out = fresh_dir("val5_bf16_zero0")
mpirun(2, bf16 + ["--zero", 0, "--out", ref_out])
ref.base = ref._result(ref_out)
ref.check("val5_bf16_zero3", 2, ["--zero", 3])
