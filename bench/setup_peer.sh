#!/usr/bin/env bash
# Gives bench/run_bench.py's PyTorch peer an optimized BLAS. Debian's python3-torch links
# libblas.so.3, which is netlib's reference BLAS (a triple loop, a few GFLOP/s) until an optimized
# implementation is installed; this installs libopenblas0-pthread (only if missing), makes sure the
# libblas.so.3 / liblapack.so.3 alternatives point at it, then checks what torch really loads
# (bench/torch_gpt_bench.py --blas-info) and times a 1024^3 fp32 matmul in torch (GFLOP/s, with the
# environment's OPENBLAS_CORETYPE and, on AVX-512 machines, with SkylakeX's kernels).
#   bench/setup_peer.sh                    # needs root or sudo for apt-get / update-alternatives
#   PYTHON=/usr/bin/python3 bench/setup_peer.sh
# Exits non-zero if torch would still run on the reference BLAS.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-/usr/bin/python3}
pkg=libopenblas0-pthread
sudo_cmd=""
[[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null ||
            "$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH") or "")')
multiarch=${multiarch:-x86_64-linux-gnu}

if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
  echo "setup_peer: installing $pkg"
  if ! DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "$pkg" >/dev/null; then
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "$pkg" >/dev/null
  fi
else
  echo "setup_peer: $pkg is installed"
fi

# The package registers itself (priority 100) above the reference BLAS (10); an alternative a user
# once set by hand stays in manual mode, so point it at OpenBLAS explicitly when it is not there.
for lib in libblas.so.3 liblapack.so.3; do
  alt="$lib-$multiarch"
  target=/usr/lib/$multiarch/openblas-pthread/$lib
  value=$(update-alternatives --query "$alt" 2>/dev/null | sed -n 's/^Value: //p')
  if [[ "$value" != *openblas* ]]; then
    echo "setup_peer: $alt -> ${value:-none}; setting it to $target"
    $sudo_cmd update-alternatives --set "$alt" "$target"
    value=$(update-alternatives --query "$alt" | sed -n 's/^Value: //p')
  fi
  echo "setup_peer: $alt -> $value"
done

info=$("$PYTHON" bench/torch_gpt_bench.py --blas-info)
echo "setup_peer: torch loads: $info"
if "$PYTHON" -c 'import json, sys; sys.exit(0 if json.loads(sys.argv[1])["reference"] else 1)' \
    "$info"; then
  echo "setup_peer: error: torch still loads netlib's reference BLAS" >&2
  exit 1
fi

matmul_gflops() {  # $1: threads, $2: OPENBLAS_CORETYPE ("" = unset: OpenBLAS detects the CPU)
  local core_env=(-u OPENBLAS_CORETYPE)
  [[ -n "$2" ]] && core_env=("OPENBLAS_CORETYPE=$2")
  env "${core_env[@]}" OMP_NUM_THREADS="$1" OPENBLAS_NUM_THREADS="$1" "$PYTHON" - "$1" <<'EOF'
import ctypes, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
lib = next(ln.split()[-1] for ln in open("/proc/self/maps") if "openblas" in ln)
corename = ctypes.CDLL(lib).openblas_get_corename
corename.restype = ctypes.c_char_p
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
a @ b
times = []
for _ in range(5):
    t0 = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - t0)
print(f"{2 * 1024**3 / min(times) / 1e9:.0f} GFLOP/s (OpenBLAS core {corename().decode()})")
EOF
}
cores=("${OPENBLAS_CORETYPE:-}")
[[ -n "${OPENBLAS_CORETYPE:-}" ]] && cores+=("")
if grep -qw avx512f /proc/cpuinfo && [[ "${OPENBLAS_CORETYPE:-}" != SkylakeX ]]; then
  cores+=(SkylakeX)
fi
for core in "${cores[@]}"; do
  for t in 1 "$(nproc)"; do
    echo "setup_peer: torch 1024^3 fp32 matmul, OPENBLAS_CORETYPE=${core:-(unset)}," \
         "$t thread(s): $(matmul_gflops "$t" "$core")"
  done
done
echo "setup_peer: ok (run_bench.py sets the core type with --openblas-coretype)"
