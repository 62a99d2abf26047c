#!/usr/bin/env bash
# The whole test suite: set-up, build, then every test (unit, dist under mpirun, PyTorch
# reference, e2e) through CTest. Extra arguments go to ctest (e.g. -L unit, -R dist).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 900 -j 2 "$@"
