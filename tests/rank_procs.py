"""The rank processes of a `trellis train` job under mpirun, seen through /proc: for the tests that
kill or stop one rank (tests/parallel/test_dp_failure.py, test_dp_stall.py) and watch the others.

A rank process is one whose argv[0] ends with "trellis", whose argv[1] is "train" and whose
arguments include the job's output directory (unique to the test); its MPI rank comes from its
environment (OMPI_COMM_WORLD_RANK, or PMIX_RANK)."""
import os
import re
import signal
import subprocess
import time

from trellis_test import BIN, with_precision

MPIRUN = ["mpirun", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]

# trellis's own message when a communication fails on a rank (src/trellis/comm/mpi_backend.cpp:
# MpiCommunicator::abort, from MpiWork::wait's timeout or check's MPI error):
#   trellis: error: rank R: timed out after Ts in OP #SEQ (N floats[ from/to rank P, tag G])
#   on communicator NAME
#   trellis: error: rank R: MPI_CALL failed in OP #SEQ (...) on communicator NAME: MPI error
COMM_ERROR = re.compile(
    r"^trellis: error: rank (?P<rank>\d+): "
    r"(?:timed out after (?P<timeout>[\d.]+)s|(?P<call>MPI_\w+) failed) in "
    r"(?P<op>all_reduce|all_reduce_sum|all_reduce_max|reduce_scatter|all_gather|broadcast|"
    r"send|recv|barrier|split) #\d+ \((?P<what>[^)]*)\) on communicator (?P<comm>\w+)",
    re.MULTILINE)


def mpirun_env():
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_rmaps_base_oversubscribe="1")


def start(np_, args, wrapper=()):
    """Starts `mpirun -np np_ [wrapper...] trellis args` in the background, output (stdout and
    stderr together) to a pipe."""
    cmd = MPIRUN + ["-np", str(np_)] + list(wrapper) + [BIN] + with_precision(args)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=mpirun_env())


def _argv(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def _rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return None
    for var in (b"OMPI_COMM_WORLD_RANK", b"PMIX_RANK"):
        if var in env:
            return int(env[var])
    return None


def job_pids(out):
    """pids of every process with `out` among its arguments (ranks, wrappers, mpirun)."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and out in _argv(d)]


def rank_pids(out):
    """{MPI rank: pid} of the `trellis train` processes writing to `out`."""
    ranks = {}
    for pid in job_pids(out):
        argv = _argv(pid)
        if len(argv) > 1 and argv[0].endswith("trellis") and argv[1] == "train":
            ranks[_rank_of(pid)] = pid
    return ranks


def alive(pid):
    """Whether pid exists and has not exited (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_training(p, out, n_ranks, timeout=180):
    """Waits until the job has logged a step and all n_ranks rank processes are up; returns
    {rank: pid}, or None when the job ended or the time ran out first."""
    path = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            ranks = rank_pids(out)
            if len(ranks) == n_ranks and None not in ranks:
                return ranks
        time.sleep(0.1)
    return None


def watch_exits(p, pids, t0, timeout):
    """Polls until mpirun and every pid in `pids` are gone (or timeout seconds after t0); returns
    ({pid: seconds after t0 it was last seen alive, None if still alive}, mpirun's seconds)."""
    gone, job_end = {}, None
    while time.time() < t0 + timeout:
        now = time.time() - t0
        for pid in pids:
            if pid not in gone and not alive(pid):
                gone[pid] = now
        if job_end is None and p.poll() is not None:
            job_end = now
        if job_end is not None and len(gone) == len(pids):
            break
        time.sleep(0.02)
    return {pid: gone.get(pid) for pid in pids}, job_end


def output_of(p, timeout=30):
    """The job's output (stdout and stderr together) once it has ended: waits up to timeout
    seconds, then ends it (SIGTERM, then SIGKILL) so that a hung job cannot hang the test."""
    try:
        return p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            return p.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            return p.communicate()[0]


def cleanup(p, out, stopped=()):
    """Ends whatever is left of the job, whatever the test did: resumes stopped pids, ends
    mpirun (it takes its ranks along), then kills any process still naming `out`."""
    for pid in stopped:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for pid in job_pids(out):
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
