#!/usr/bin/env bash
# Installs everything meshtrain's build, main job, tests and benchmarks need (Debian 12, as root).
# Idempotent: packages already present are skipped by apt-get; safe to run on every invocation.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config ninja-build
  libdnnl-dev                      # GEMM (oneDNN)
  libopenmpi-dev openmpi-bin       # ProcessGroup backend and mpirun
  librandom123-dev                        # Philox counter-based RNG (header-only)
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  libfmt-dev libspdlog-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-torch python3-numpy   # PyTorch reference tests and bench (/usr/bin/python3)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
