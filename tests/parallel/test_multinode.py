"""Layouts across "nodes": 4 network namespaces joined by veth pairs to a bridge
(tests/netns.py, scripts/netns_cluster.sh), mpirun over TCP only (--mca btl tcp,self, no shared
memory, no loopback between namespaces). dp2, tp2 and pp2 with one rank on each of 2 nodes, and
dp2 x tp2 x pp2 (ZeRO-1, sequence parallel) with 8 ranks, 2 per node on 4 nodes (the tensor-parallel
pairs share a node, data- and pipeline-parallel peers do not), each equal the 1-process run over
20 steps: losses, validation losses and final parameters to <= 1e-5 relative (fp32).

Every run must also have moved its traffic through the veths: the byte counters of each node's
link, read before and after, must reach a lower bound worked out from what the layout has to
send (below), so a run that silently went through shared memory or loopback fails. Shaping a link
(tc tbf at 5 Mbit/s) must slow a run down to at least what its bytes take at that rate. The
launch itself: each node has its own TMPDIR, and a node whose daemon cannot start ends the
launch at once. The cluster is gone afterwards, also when a check fails."""
import os
import subprocess
import time

from netns import STATE, NetnsCluster
from trellis_test import LayoutCheck, check, fresh_dir, metrics, run, write_text_corpus, TMP

B, T, C, L, STEPS = 8, 32, 32, 4, 20
corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
# Micro-batches of 2 everywhere, baseline included: a pipeline always accumulates, and
# accumulating over other micro-batches changes the summation order (test_pp_equivalence).
common = ["train", "--model", "tiny", "--n-layer", L, "--n-head", 4, "--data", data,
          "--steps", STEPS, "--batch-size", B, "--micro-batch-size", 2, "--seq-len", T,
          "--lr", 3e-3, "--warmup-steps", 4, "--val-every", 10, "--threads", 1, "--quiet",
          "--tensorboard", "false", "--comm-timeout", 120]  # below mpirun's bound: trellis says where
t0 = time.time()
layouts = LayoutCheck(common, n_embd=C, steps=STEPS, name="baseline")
P = sum(v.size for v in layouts.base[2].values())  # parameters
MB = 1e6

# Lower bounds on the bytes each node must send and receive over its link during the 20 steps
# (validation and start-up traffic come on top). An all-reduce of N bytes over 2 ranks sends N
# bytes from each (ring: N/2 reduce-scatter + N/2 all-gather; recursive doubling: N).
# dp2: the whole gradient every step.
# tp2: per block 2 all-reduces of the B x T x C activations forward (attention and MLP outputs)
#      and 2 backward (at the f operators).
# pp2: B x T x C activations forward, their gradients backward.
# 3D:  node 1 (ranks 0, 1: stage 0, dp rank 0) reduce-scatters and all-gathers its stage's
#      gradients with node 2; half of the model's gradient volume / pp is a safe floor for the
#      smaller stage, and every node has some such partner.
bounds = {
    "dp2": STEPS * 4 * P,
    "tp2": STEPS * 4 * L * B * T * C * 4,
    "pp2": STEPS * B * T * C * 4,
    "dp2_tp2_pp2": STEPS * 4 * P / 2 / 2,
}
runs = {
    "dp2": (2, ["--dp", 2], "node", 2),
    "tp2": (2, ["--tp", 2], "node", 2),
    "pp2": (2, ["--pp", 2, "--schedule", "1f1b"], "node", 2),
    "dp2_tp2_pp2": (8, ["--dp", 2, "--tp", 2, "--pp", 2, "--zero", 1, "--sequence-parallel"],
                    None, 4),
}

cluster = NetnsCluster(nodes=4, slots=2)
with cluster as c:
    check(len(c.hosts) == 4, f"4 nodes up: {', '.join(ip + '=' + ns for ip, ns, _ in c.hosts)}")
    # Each node its own TMPDIR, as real nodes have their own /tmp: in one shared /tmp, where
    # OpenMPI's daemons of a launch share a session directory, mpirun now and then waited for ever
    # for a daemon that was gone (scripts/netns_cluster.sh).
    p = subprocess.run(c.launcher(4, 60, "node") + ["sh", "-c", "echo $TMPDIR"],
                       capture_output=True, text=True, timeout=75)
    tmpdirs = sorted(p.stdout.split())
    check(p.returncode == 0 and len(set(tmpdirs)) == 4 and all(
              d.endswith(f"/{c.name}/tmp/{ns}") for d, (_, ns, _) in zip(tmpdirs, c.hosts)),
          f"every node has its own TMPDIR: {', '.join(tmpdirs)}")
    # A daemon that cannot start (node 4's TMPDIR made a file) ends the launch at once with
    # OpenMPI's message, rather than leaving mpirun to wait for it until the timeout.
    node4 = os.path.join(STATE, c.name, "tmp", c.hosts[3][1])
    os.rmdir(node4)
    open(node4, "w").close()
    t = time.time()
    p = subprocess.run(c.launcher(2, 60, "node") + ["true"], capture_output=True, text=True,
                       timeout=75)
    took = time.time() - t
    os.remove(node4)
    os.mkdir(node4, 0o700)
    check(p.returncode not in (0, 124) and took < 20
          and "unable to reliably start one or more daemons" in p.stdout + p.stderr,
          f"a daemon that cannot start ends the launch in {took:.1f} s (exit "
          f"{p.returncode}), not at its timeout")
    for name, (ranks, extra, map_by, nodes) in runs.items():
        before = c.traffic()
        stdout = layouts.check(f"net_{name}", ranks, extra,
                               launch=lambda n, a: c.mpirun(n, a, timeout=240, map_by=map_by))
        moved = c.traffic_since(before)
        used = [ns for _, ns, _ in c.hosts[:nodes]]
        worst = min(min(moved[ns]) for ns in used)
        shown = ", ".join(f"{ns} in {moved[ns][0] / MB:.2f} / out {moved[ns][1] / MB:.2f} MB"
                          for ns in used)
        check(worst >= bounds[name],
              f"net_{name}: every node's link carried >= {bounds[name] / MB:.2f} MB each way "
              f"({shown})")

    # Shaping: at 5 Mbit/s the dp2 run's bytes alone take longer than the whole unshaped run.
    c.shape("5mbit")
    before, t = c.traffic(), time.time()
    out = fresh_dir("net_dp2_5mbit")
    c.mpirun(2, common + ["--dp", 2, "--out", out], timeout=240, map_by="node")
    wall = time.time() - t
    moved = c.traffic_since(before)
    need = max(max(v) for v in moved.values()) * 8 / 5e6
    check(wall >= 0.9 * need and len(metrics(out)[0]) == STEPS,
          f"a 5 Mbit/s link slows dp2 down to its bytes' time: {wall:.1f} s >= {need:.1f} s")

check(not cluster.leftovers(), f"no namespace, veth, bridge or state left of {cluster.name}")
print(f"multi-node checks took {time.time() - t0:.0f} s (P = {P} parameters)")
