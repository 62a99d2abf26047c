#!/usr/bin/env bash
# Configures and builds meshtrain (Release, Ninja) into build/. Idempotent and incremental.
# With target names (e.g. `bash scripts/build.sh meshtrain meshtrain_spm`) only those targets
# and what they need are built: the training scripts build the `meshtrain` executable and the
# SentencePiece module it loads, not the tests and benchmarks; without arguments, everything.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache, when installed, lets several checkouts (git worktrees) share compiled objects.
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build --parallel "$(nproc)" "${targets[@]}"
