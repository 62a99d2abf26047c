#!/usr/bin/env bash
# The main job: set-up, build, data preparation, then nanoGPT's CPU configuration on Tiny
# Shakespeare trained on 2 data-parallel MPI ranks (global batch 12 = 6 per rank), with a
# sharded checkpoint every 500 steps (runs/shakespeare_char/checkpoints/), then a sample from the
# final checkpoint. Extra arguments are passed to `meshtrain train`
# (e.g. --training.max_steps 200).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh meshtrain meshtrain_spm   # only what the job runs; test.sh builds the rest
BIN=build/src/meshtrain/meshtrain
"$BIN" prepare data/tinyshakespeare.txt --out data/prepared/shakespeare_char
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p runs/shakespeare_char
mpirun --oversubscribe --bind-to none -np 2 "$BIN" train configs/shakespeare_char.toml \
  --parallel.dp 2 --training.micro_batch 6 --checkpoint.interval 500 \
  --metrics runs/shakespeare_char/metrics.jsonl "$@"
echo "---- sample (meshtrain sample runs/shakespeare_char --prompt \"ROMEO:\") ----"
"$BIN" sample runs/shakespeare_char --prompt "ROMEO:" --tokens 300
