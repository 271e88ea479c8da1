"""`trellis calibrate` across "nodes": 2 network namespaces of 2 ranks each (tests/netns.py), the
links between them shaped to 1 Gbit/s. The ranks of a node measure the intra-node link (shared
memory in a real node; TCP inside the namespace here, the only transport the cluster allows), the
nodes the inter-node one (TCP through the shaped veths), each with its own fits of
all-reduce, reduce-scatter, all-gather and send/recv; the file says 2 devices per node. A
calibration that did not tell the nodes apart would give both links the same numbers."""
import json
import os

from netns import NetnsCluster
from trellis_test import check, fresh_dir

work = fresh_dir("calibrate_nodes")
out = os.path.join(work, "cluster.json")
with NetnsCluster(nodes=2, slots=2, rate="1gbit") as cluster:
    # One round of the compute measurements (default 3): this test checks the links, and every
    # round times every GEMM shape on all 4 ranks (~7 CPU-seconds a rank here).
    cluster.mpirun(4, ["calibrate", "--out", out, "--seconds", 0.05, "--gemm-size", 256,
                       "--rounds", 1], timeout=240)
m = json.load(open(out))
check(m["devices_per_node"] == 2, f"2 ranks per node: {m['devices_per_node']}")
kinds = ("all_reduce", "reduce_scatter", "all_gather", "send_recv")
for link in ("intra_node", "inter_node"):
    fits = m[link].get("collectives", {})
    check(sorted(fits) == sorted(kinds), f"{link}: every collective fitted: {sorted(fits)}")
    check(all(" 2 ranks" in fits[k]["note"] for k in fits), f"{link}: over pairs of ranks")
intra = m["intra_node"]["collectives"]["all_reduce"]["bandwidth"]
inter = m["inter_node"]["collectives"]["all_reduce"]["bandwidth"]
# 1 Gbit/s is 125 MB/s per direction; the two pairs of nodes share each node's link.
check(inter < 250e6, f"inter-node all-reduce at the shaped rate: {inter / 1e6:.0f} MB/s")
check(intra > 4 * inter, f"intra-node faster: {intra / 1e6:.0f} MB/s vs "
      f"{inter / 1e6:.0f} MB/s")
print("ok")
