#!/usr/bin/env bash
# Configures and builds meshtrain (Release, Ninja) into build/. Idempotent and incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache, when installed, lets several checkouts (git worktrees) share compiled objects.
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
cmake --build build --parallel "$(nproc)"
