#!/usr/bin/env bash
# Installs what trellis needs from Debian's packages (only what is missing) and builds it.
#   scripts/setup.sh          # build dependencies + Release build in build/
#   scripts/setup.sh --tests  # also the test dependencies (PyTorch oracle, OpenMPI runtime,
#                             # clang and libFuzzer for fuzz/)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config libdnnl-dev libopenmpi-dev openmpi-bin libfmt-dev
          nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libgtest-dev libpcre2-dev zlib1g-dev
          libsentencepiece-dev)
if [[ "${1:-}" == "--tests" ]]; then
  # clang, its sanitizer/libFuzzer runtimes and OpenMP: the fuzz targets (build-fuzz).
  packages+=(python3 python3-torch python3-numpy python3-sentencepiece dataset-fashion-mnist
             gettext iproute2 clang libclang-rt-dev libomp-dev)
  # A real Slurm cluster in network namespaces (scripts/slurm_cluster.sh, ctest -R slurm).
  packages+=(slurmctld slurmd slurm-client munge)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
# Two jobs: the machines this is meant for may have little memory per core.
cmake --build build -j "$(nproc)"
echo "setup: built build/trellis"
