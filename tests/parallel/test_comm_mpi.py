#!/usr/bin/env python3
"""The MPI communicator under mpirun: correctness on 2, 3 and 4 ranks, and no hangs on failure.

Runs tests/mpi/comm_check.cpp (built next to the trellis binary) under
`mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np N`:
  - N = 2, 3, 4: all collectives, p2p, split, mesh and GradReducer checks pass, and an
    all-reduce and a message complete while the caller makes no MPI call (progress thread);
  - N = 3 with --chunk 1000: the same through the paths that cut buffers into several requests;
  - N = 3 with --no-ring: the same with MPI's own reduce-scatter (an MPI whose MPI_TAG_UB leaves
    the ring no tags); comm_check counts the calls of it, so each run proves which path it took;
  - --die-rank 1: a rank exits(3) before a collective; the job must fail within 30 s and say which
    rank failed;
  - --stall-rank 2: a rank stays alive but never joins; the others must time out (5 s) and end
    the job with a message naming the rank and the operation;
  - --mismatch: under TRELLIS_CHECK_COLLECTIVES=1 the ranks all-reduce different counts; the job
    must end within 30 s with trellis's line naming both sides, and no rank's call returns.

Usage: under ctest (TRELLIS_BIN set), or `test_comm_mpi.py [BUILD_DIR]`.
A missing dependency fails (exit 1) with a message saying what is missing: trellis built
without MPI, or no mpirun on PATH. A test that cannot run must not pass.
"""
import os
import re
import shutil
import subprocess
import sys
import time

TIMEOUT_S = 120  # one correctness run; they take a few seconds
FAIL_WITHIN_S = 30  # the no-hang guarantee for the failure drills


def find_comm_check():
    if len(sys.argv) > 1:
        build = sys.argv[1]
    elif os.environ.get("TRELLIS_BIN"):
        build = os.path.dirname(os.environ["TRELLIS_BIN"])
    else:
        build = os.path.join(os.path.dirname(__file__), "..", "..", "build")
    return os.path.join(os.path.abspath(build), "comm_check")


def run(cmd, env, timeout):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return None, out, time.monotonic() - t0


def main():
    exe = find_comm_check()
    if not os.path.exists(exe):
        print(f"FAIL: {exe} not found (build the comm_check target)")
        return 1
    has = subprocess.run([exe, "--has-mpi"], capture_output=True, text=True, timeout=30)
    if has.stdout.strip() != "mpi: yes":
        print(f"FAIL: {exe} was built without MPI ({exe} --has-mpi said "
              f"{(has.stdout + has.stderr).strip()!r}): install the MPI development files "
              "(Debian: libopenmpi-dev openmpi-bin) and reconfigure the build")
        return 1
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        print("FAIL: mpirun not found on PATH (Debian: openmpi-bin): the MPI communicator "
              "tests cannot run")
        return 1

    env = dict(os.environ)
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env.pop("TRELLIS_MPI_MAX_CHUNK", None)
    env.pop("TRELLIS_MPI_PROGRESS_US", None)  # the progress check needs the thread on
    base = [mpirun, "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
    failures = []

    def check(name, ok, detail, output):
        print(f"{'PASS' if ok else 'FAIL'}: {name} ({detail})", flush=True)
        if not ok:
            failures.append(name)
            print("---- output ----\n" + output.rstrip() + "\n----------------", flush=True)

    cases = [(n, []) for n in (2, 3, 4)] + [(3, ["--chunk", "1000"]), (3, ["--no-ring"])]
    for n, extra in cases:
        name = f"comm_check -np {n} {' '.join(extra)}".rstrip()
        rc, out, dt = run(base + ["-np", str(n), exe] + extra, env, TIMEOUT_S)
        ok = rc == 0 and f"{n} ranks: all checks passed" in out
        detail = f"timed out after {TIMEOUT_S}s" if rc is None else f"rc={rc}, {dt:.1f}s"
        check(name, ok, detail, out)

    # Failure drills: non-zero exit, quickly, naming the failing rank.
    drills = [
        ("die-rank 1", ["--die-rank", "1"], ["rank 1"]),
        # Whichever waiting rank times out first ends the job (rank 0 or 1, depending on load).
        ("stall-rank 2", ["--stall-rank", "2"], [r"rank [01]: timed out after 5s in all_reduce"]),
        # TRELLIS_CHECK_COLLECTIVES: each rank all-reduces 8 + rank floats; a rank names both.
        ("mismatch", ["--mismatch"],
         [r"trellis: error: rank (\d): collectives differ on communicator world at its operation "
          r"#\d+: world rank \1 issues all_reduce of (8|9|10) floats, world rank [012] "
          r"all_reduce of (8|9|10) floats"]),
    ]
    for name, extra, needles in drills:
        rc, out, dt = run(base + ["-np", "3", exe] + extra, env, FAIL_WITHIN_S + 30)
        missing = [s for s in needles if not re.search(s, out)]
        if "mismatched all-reduce returned" in out:
            missing.append("no mismatched all-reduce returning")
        ok = rc is not None and rc != 0 and dt < FAIL_WITHIN_S and not missing
        detail = f"rc={rc}, {dt:.1f}s (limit {FAIL_WITHIN_S}s)"
        if missing:
            detail += f", output lacks {missing}"
        check(f"comm_check -np 3 --{name} fails cleanly", ok, detail, out)

    if failures:
        print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
        return 1
    print("all communicator checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
