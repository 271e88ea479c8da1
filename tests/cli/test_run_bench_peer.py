"""bench/run_bench.py's PyTorch peer (issue 25): the thread probe tries every combination of
torch threads {1, N} x OpenBLAS threads {1, N} (1 torch / 2 OpenBLAS, PyTorch's best fp32 setup
here, was once missing), and the bench refuses, exit 2 with one line, to measure a torch that
runs on netlib's reference BLAS: planted here by putting the reference libblas.so.3 first on
LD_LIBRARY_PATH (python3-torch depends on libblas3, so it is there wherever torch is)."""
import glob
import os
import subprocess
import sys

from trellis_test import check, SOURCE

sys.path.insert(0, os.path.join(SOURCE, "bench"))
import run_bench  # noqa: E402

setups = run_bench.torch_setups(2)
check(sorted((t, omp, blas) for _, t, omp, blas in setups.values()) ==
      [(1, 1, 1), (1, 1, 2), (2, 2, 1), (2, 2, 2)],
      f"every torch x OpenBLAS thread combination, OMP_NUM_THREADS = torch's: {setups}")
check(len(run_bench.torch_setups(1)) == 1, "one thread: one setup")
env = run_bench.torch_env(setups["t1-b2"], "auto")
check((env["OMP_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"]) == ("1", "2")
      and "OPENBLAS_CORETYPE" not in env, "the probe's variables reach torch's environment")

reference = glob.glob("/usr/lib/*/blas/libblas.so.3")
check(reference, "netlib's reference BLAS (libblas3, a python3-torch dependency) is installed")
planted = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(reference[0]))
# A missing trellis binary would exit 1 after the BLAS check: exit 2 is the check itself.
p = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "run_bench.py"), "--quick",
                    "--trellis", "/nonexistent/trellis"], env=planted, capture_output=True,
                   text=True, timeout=300)
lines = p.stderr.strip().splitlines()
check(p.returncode == 2 and len(lines) == 1 and "reference BLAS" in lines[0]
      and os.path.dirname(reference[0]) in lines[0],
      f"run_bench refuses the reference BLAS, naming it (exit {p.returncode}): {p.stderr}")
print("ok")
