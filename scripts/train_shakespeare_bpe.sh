#!/usr/bin/env bash
# The GPT-2 BPE job: set-up, build, Tiny Shakespeare prepared with GPT-2's byte-level BPE
# (data/tokenizers/gpt2; nanoGPT's `shakespeare` dataset), then configs/shakespeare_bpe.toml
# trained on 2 data-parallel MPI ranks (global batch 8 = 4 per rank), then a sample from the
# final checkpoint, encoded and decoded with the run's GPT-2 tokenizer. Extra arguments are
# passed to `meshtrain train` (e.g. --training.max_steps 100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh meshtrain meshtrain_spm   # only what the job runs; test.sh builds the rest
BIN=build/src/meshtrain/meshtrain
"$BIN" prepare data/tinyshakespeare.txt --tokenizer gpt2 --out data/prepared/shakespeare_gpt2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p runs/shakespeare_bpe
mpirun --oversubscribe --bind-to none -np 2 "$BIN" train configs/shakespeare_bpe.toml \
  --parallel.dp 2 --training.micro_batch 4 \
  --metrics runs/shakespeare_bpe/metrics.jsonl "$@"
echo "---- sample (meshtrain sample runs/shakespeare_bpe --prompt \"ROMEO:\") ----"
"$BIN" sample runs/shakespeare_bpe --prompt "ROMEO:" --tokens 100
