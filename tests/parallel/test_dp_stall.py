"""A rank that stops answering mid-run (SIGSTOP: alive, so mpirun sees nothing) ends the job through
trellis's own timeout: the other rank gives up within comm_timeout + 5 s of the stop, printing
trellis's message that names itself, the operation, the communicator and the stalled peer (the
send/recv peer, or a collective's other members), and aborts the job with exit 1. Run for a
data-parallel layout (the survivor waits in a gradient all-reduce) and a pipeline one (it
usually waits in a send or recv to the stalled stage). The stopped rank is resumed and killed
afterwards, even when a check fails."""
import os
import signal
import time

from rank_procs import (COMM_ERROR, alive, cleanup, output_of, start, wait_training,
                        watch_exits)
from trellis_test import check, fresh_dir, run, write_text_corpus, TMP

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])

TIMEOUT = 5  # --comm-timeout, seconds
LIMIT = TIMEOUT + 5  # every other rank must have exited this long after the stop
common = ["train", "--model", "tiny", "--data", data, "--seq-len", 32, "--threads", 1, "--quiet",
          "--tensorboard", "false", "--val-every", 0, "--steps", 100000,
          "--comm-timeout", TIMEOUT]
layouts = {
    "dp2": ["--dp", 2, "--batch-size", 8],
    "pp2": ["--pp", 2, "--batch-size", 8, "--micro-batch-size", 2],
}
stalled, survivor = 1, 0

for name, layout in layouts.items():
    out = fresh_dir(f"stall_{name}")
    p = start(2, common + layout + ["--out", out])
    stopped = []
    try:
        ranks = wait_training(p, out, 2)
        check(ranks is not None, f"{name}: 2-rank job is training (ranks {ranks})")
        os.kill(ranks[stalled], signal.SIGSTOP)
        t0 = time.time()
        stopped.append(ranks[stalled])
        gone, ended = watch_exits(p, [ranks[survivor]], t0, LIMIT + 20)
        output = output_of(p, timeout=5)
        t_exit = gone[ranks[survivor]]
        check(t_exit is not None and t_exit <= LIMIT,
              f"{name}: rank {survivor} exited {t_exit:.1f} s after rank {stalled} stopped "
              f"(comm_timeout {TIMEOUT} s + 5 s = {LIMIT} s)" if t_exit is not None
              else f"{name}: rank {survivor} exited within {LIMIT + 20} s of the stop")
        check(ended is not None and ended <= LIMIT,
              f"{name}: the job ended {ended:.1f} s after the stop" if ended is not None
              else f"{name}: the job ended within {LIMIT + 20} s of the stop")
        check(p.returncode == 1,
              f"{name}: job exits 1, the code trellis aborts with (exit {p.returncode})")
        msgs = [m for m in COMM_ERROR.finditer(output) if int(m["rank"]) == survivor]
        check(bool(msgs), f"{name}: rank {survivor} printed trellis's timeout message: "
              + (msgs[0].group(0) if msgs else f"none in\n{output[-2000:]}"))
        m = msgs[0]
        check(m["timeout"] is not None and float(m["timeout"]) == TIMEOUT,
              f"{name}: it timed out after comm_timeout = {TIMEOUT} s (not an MPI error)")
        if m["op"] in ("send", "recv"):
            peer = f"{'to' if m['op'] == 'send' else 'from'} rank {stalled}"
            check(peer in m["what"], f"{name}: the {m['op']} it waited in names the stalled "
                  f"peer ({peer})")
        else:  # a collective of two ranks: the other member is the stalled peer
            line = output[m.start():output.find("\n", m.start())]
            check(f"waiting for world rank {stalled}" in line,
                  f"{name}: the collective's timeout names the stalled peer: {line}")
        time.sleep(0.5)
        check(not alive(ranks[stalled]),
              f"{name}: the stopped rank did not outlive the job (the abort took it down)")
    finally:
        cleanup(p, out, stopped)
