"""A real Slurm cluster for tests: the python face of scripts/slurm_cluster.sh (munged, slurmctld
and one slurmd per network-namespace node, from Debian's packages).

    with SlurmCluster(nodes=2) as c:
        c.login(["sbatch", "--wait", script], timeout=120)   # on the login node (node 1)
        c.login_cmd(60) + ["srun", ...]                       # for a Popen of your own

As NetnsCluster (tests/netns.py, whose traffic counters and leftover check it shares): named
after this process's pid, taken down on leaving the `with` block whatever the test did (daemons,
jobs, namespaces and state all go), clusters of killed tests reaped by the next one. Not being
able to build one (no root, Slurm or munge not installed, a daemon that does not start) fails
the test with the script's message and the daemons' log tails: a test that cannot run must not
pass."""
import os
import signal
import subprocess

from netns import NetnsCluster, _raise_exit
from trellis_test import SOURCE, fail

SCRIPT = os.path.join(SOURCE, "scripts", "slurm_cluster.sh")


def _script(*args, timeout=120):
    # /usr/sbin holds the daemons; a test runner's PATH may lack it.
    env = dict(os.environ, OWNER_PID=str(os.getpid()),
               PATH=os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin")
    return subprocess.run([SCRIPT] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=env)


class SlurmCluster(NetnsCluster):
    def __init__(self, nodes, cpus=2, name=None):
        super().__init__(nodes, slots=cpus, name=name)

    def __enter__(self):
        if os.geteuid() != 0:
            fail("Slurm tests need root: they build network namespaces and run slurmd/slurmctld "
                 "(run as root, or in a container with CAP_NET_ADMIN and CAP_SYS_ADMIN)")
        _script("reap")
        p = _script("up", self.nodes, "--name", self.name, "--cpus", self.slots)
        if p.returncode != 0:
            fail(f"cannot start a {self.nodes}-node Slurm cluster (scripts/setup.sh --tests "
                 f"installs slurmctld slurmd slurm-client munge):\n{p.stdout}{p.stderr}")
        self.started = p.stdout.strip()
        with open(os.path.join("/run/trellis-netns", self.name, "nodes")) as f:
            self.hosts = [line.split() for line in f if line.strip()]  # ip, namespace, veth
        self._old_term = signal.signal(signal.SIGTERM, _raise_exit)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGTERM, self._old_term)
        _script("down", "--name", self.name)
        return False

    def login_cmd(self, timeout):
        """The command prefix that runs a command on the login node (node 1) with this cluster's
        SLURM_CONF, killed after `timeout` seconds."""
        return [SCRIPT, "exec", "--name", self.name, "--timeout", str(timeout), "--"]

    def logs(self, lines=30):
        """Tails of munged's, slurmctld's and every slurmd's log."""
        return _script("logs", "--name", self.name, "--lines", lines).stdout

    def login(self, cmd, timeout=120, expect=0, env=None):
        """Runs cmd on the login node; fails the test (with its output and the daemons' log
        tails) unless it exits with `expect`. Returns (stdout, stderr)."""
        full = self.login_cmd(timeout) + [str(a) for a in cmd]
        p = subprocess.run(full, capture_output=True, text=True, timeout=timeout + 20, env=env)
        if expect is not None and p.returncode != expect:
            fail(f"{' '.join(full)}\n  exit {p.returncode}, expected {expect}\n"
                 f"  stdout: {p.stdout[-2000:]}\n  stderr: {p.stderr[-2000:]}\n{self.logs()}")
        return p.stdout, p.stderr
