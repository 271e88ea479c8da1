"""A cluster of network namespaces for multi-node tests: the python face of
scripts/netns_cluster.sh (which does all the work: up, run, down).

    with NetnsCluster(nodes=4, slots=2) as c:
        before = c.traffic()
        c.mpirun(2, ["train", ...], map_by="node")         # as trellis_test.mpirun
        moved = c.traffic_since(before)                     # {node: (bytes in, bytes out)}

Each cluster is named after this process's pid, so parallel tests do not collide. It is taken
down on leaving the `with` block, whatever the test did (failed check, exception, SIGTERM), and
clusters left behind by a process that was killed outright (SIGKILL from a ctest timeout) are
reaped by the next NetnsCluster. Not being able to build one (no root, no iproute2) fails the
test with a message saying so: a multi-node test that cannot run must not pass."""
import os
import signal
import subprocess

from trellis_test import SOURCE, fail, mpirun

SCRIPT = os.path.join(SOURCE, "scripts", "netns_cluster.sh")
STATE = "/run/trellis-netns"


def _script(*args, check=True):
    p = subprocess.run([SCRIPT] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, OWNER_PID=str(os.getpid())))
    if check and p.returncode != 0:
        fail(f"{SCRIPT} {' '.join(map(str, args))}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    return p


class NetnsCluster:
    def __init__(self, nodes, slots=2, rate=None, name=None):
        self.nodes, self.slots, self.rate = nodes, slots, rate
        self.name = name or f"t{os.getpid()}"

    def __enter__(self):
        if os.geteuid() != 0:
            fail("multi-node tests need root: they build network namespaces, veth pairs and a "
                 "bridge (run as root, or in a container with CAP_NET_ADMIN and CAP_SYS_ADMIN)")
        _script("reap", check=False)
        args = ["up", self.nodes, "--name", self.name, "--slots", self.slots]
        if self.rate:
            args += ["--rate", self.rate]
        p = _script(*args, check=False)
        if p.returncode != 0:
            fail(f"cannot build a {self.nodes}-node network-namespace cluster "
                 f"(needs root, iproute2 and veth/bridge support in the kernel):\n"
                 f"{p.stdout}{p.stderr}")
        with open(os.path.join(STATE, self.name, "nodes")) as f:
            self.hosts = [line.split() for line in f if line.strip()]  # ip, namespace, veth
        # A ctest timeout or ^C: leave through __exit__ so the namespaces go.
        self._old_term = signal.signal(signal.SIGTERM, _raise_exit)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGTERM, self._old_term)
        _script("down", "--name", self.name, check=False)
        return False

    def leftovers(self):
        """Namespaces and links of this cluster still present (should be none after exit)."""
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        found = [w.split("@")[0].rstrip(":") for w in (ns + links).split()
                 if w.startswith(self.name) and not w[len(self.name):len(self.name) + 1].isdigit()]
        return sorted(set(found)) + ([os.path.join(STATE, self.name)]
                                     if os.path.exists(os.path.join(STATE, self.name)) else [])

    def launcher(self, np_, timeout, map_by=None):
        """The command in front of trellis: mpirun inside node 1 over TCP between the namespaces,
        killed after `timeout` seconds."""
        cmd = [SCRIPT, "run", "--name", self.name, "--timeout", str(timeout), "--",
               "-np", str(np_)]
        return cmd + (["--map-by", map_by] if map_by else [])

    def mpirun(self, np_, args, expect=0, timeout=300, map_by=None):
        """trellis_test.mpirun across the nodes. Ranks fill each node's slots in turn unless
        map_by="node" (round robin over the nodes). The job's own bound is 15 s shorter than
        the Python one, so mpirun is stopped by its `timeout` and can clean up."""
        return mpirun(np_, args, expect=expect, timeout=timeout,
                      launcher=self.launcher(np_, max(timeout - 15, 1), map_by))

    def shape(self, rate):
        """Shapes every link to `rate` (tc's notation: 10gbit, 5mbit; "none" lifts it)."""
        _script("shape", "--name", self.name, "--rate", rate)

    def traffic(self):
        """{namespace: (bytes into the node, bytes out of it)} so far, from the counters of the
        host end of its veth (tx there = into the node)."""
        out = {}
        for _, ns, veth in self.hosts:
            base = f"/sys/class/net/{veth}/statistics/"
            with open(base + "tx_bytes") as f_in, open(base + "rx_bytes") as f_out:
                out[ns] = (int(f_in.read()), int(f_out.read()))
        return out

    def traffic_since(self, before):
        now = self.traffic()
        return {ns: (now[ns][0] - before[ns][0], now[ns][1] - before[ns][1]) for ns in now}


def _raise_exit(signum, frame):
    raise SystemExit(f"signal {signum}")
