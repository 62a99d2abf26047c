#!/usr/bin/env bash
# The GPT-2 BPE job's guard (README "A GPT-2 BPE job"): Tiny Shakespeare prepared with GPT-2 BPE
# as scripts/train_shakespeare_bpe.sh does it, then the shipped configs/shakespeare_bpe.toml
# trained as that script runs it (2 data-parallel ranks, micro-batch 4) for 8 steps instead of
# 500. Asserts the dataset's token counts (nanoGPT's `shakespeare`: 301,966 / 36,059), the
# reference losses tools/token_baselines.py gives on it (unigram 6.4749, bigram 5.1605), the
# model's parameter count (7,236,864 = a tied 50,257 × 128 embedding + 4 layers), a first loss
# within 0.1 of ln(50257) ≈ 10.82 (measured 10.81) and a loss at step 8 at least 0.2 below it
# (measured 10.50 when this test was written).
# Usage: bpe_job.sh <meshtrain binary>
set -euo pipefail
BIN=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

out=$("$BIN" prepare "$ROOT/data/tinyshakespeare.txt" --tokenizer gpt2 --out "$WORK/data")
grep -qF "vocab 50257, 301966 train tokens, 36059 val tokens" <<<"$out" ||
  { echo "FAIL prepare: unexpected dataset: $out"; exit 1; }
echo "ok   prepare: $out"
# The reference losses docs/performance.md quotes for this dataset.
out=$(/usr/bin/python3 "$ROOT/tools/token_baselines.py" "$WORK/data")
grep -qE "unigram +6\.4749 " <<<"$out" && grep -qE "bigram \(λ 0\.5\) +5\.1605 " <<<"$out" ||
  { echo "FAIL token_baselines.py: not the documented 6.4749 / 5.1605"; echo "$out"; exit 1; }
echo "ok   baselines: unigram 6.4749, bigram 5.1605 nats/token"

out=$(mpirun --oversubscribe --bind-to none -np 2 "$BIN" train "$ROOT/configs/shakespeare_bpe.toml" \
  --parallel.dp 2 --training.micro_batch 4 --training.max_steps 8 --training.eval_interval 8 \
  --training.eval_batches 2 --training.threads 1 --data.dir "$WORK/data" \
  --checkpoint.dir "$WORK/ckpt" --metrics "$WORK/m.jsonl" 2>&1) ||
  { echo "FAIL train"; echo "$out"; exit 1; }
grep -qF "7236864 parameters, global batch 8 × 128 tokens" <<<"$out" ||
  { echo "FAIL train: not the documented model"; echo "$out" | head -3; exit 1; }
echo "ok   train: $(head -1 <<<"$out")"

/usr/bin/python3 - "$WORK/m.jsonl" <<'PY'
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 8, f"{len(lines)} metric lines, expected 8"
first, last, ln_v = lines[0]["loss"], lines[-1]["loss"], math.log(50257)
assert abs(first - ln_v) < 0.1, f"initial loss {first} is not within 0.1 of ln(50257) = {ln_v:.3f}"
assert last < ln_v - 0.2, f"loss at step 8 is {last}, expected < {ln_v - 0.2:.3f}"
assert last < first, f"loss did not fall: {first} -> {last}"
print(f"ok   loss {first:.3f} -> {last:.3f} (ln 50257 = {ln_v:.3f}), val {lines[-1]['val_loss']:.3f}")
PY

out=$("$BIN" sample "$WORK/ckpt" --prompt "ROMEO:" --tokens 8)
[[ $out == ROMEO:* ]] || { echo "FAIL sample does not start with the prompt: $out"; exit 1; }
echo "ok   sample: ${out:0:60}"
