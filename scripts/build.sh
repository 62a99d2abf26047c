#!/usr/bin/env bash
# Configures and builds meshtrain (Release, Ninja) into build/. Idempotent and incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --parallel "$(nproc)"
