#!/usr/bin/env bash
# Training from the token files people already have (docs/data.md): the prepared Tiny
# Shakespeare re-encoded with numpy as nanoGPT's raw uint16 train.bin / val.bin (no meta.json)
# and as llm.c's tiny_shakespeare_{train,val}.bin (GPT-2 header, uint16), trained 30 steps
# each from the CLI with data.format / data.*_file / model.vocab_size: the losses and val
# losses are bit-for-bit those of the same run on meshtrain's own files (same tokens, same
# seed). Then data.sampler = "epoch" on the nanoGPT pair (loss falls from ln 65, differs from
# the random sampler's, and the metrics' "epoch" is sequences / windows), and an llm.c Llama-3 file (uint32 ids up to 68,867) trained with
# a 70,000-id vocabulary (loss from ln 70000 ≈ 11.16 down by > 0.3 in 20 steps).
# Usage: token_formats.sh <meshtrain binary> <prepared data dir>
set -euo pipefail
BIN=$1
DATA=$2
CONFIG=$(dirname "$0")/../../configs/shakespeare_char.toml
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1

/usr/bin/python3 - "$DATA" "$WORK" <<'PY'
import sys, os
import numpy as np
data, work = sys.argv[1:]
os.makedirs(f"{work}/nanogpt"); os.makedirs(f"{work}/llmc"); os.makedirs(f"{work}/llama3")
def header(magic, version, n):
    h = np.zeros(256, dtype=np.int32)  # llm.c dev/data/data_common.py write_datafile
    h[0], h[1], h[2] = magic, version, n
    return h.tobytes()
for split in ("train", "val"):
    ids = np.fromfile(f"{data}/{split}.bin", dtype=np.uint16)
    ids.tofile(f"{work}/nanogpt/{split}.bin")  # nanoGPT's prepare.py: np.uint16, no header
    with open(f"{work}/llmc/tiny_shakespeare_{split}.bin", "wb") as f:
        f.write(header(20240520, 1, len(ids)) + ids.tobytes())
    # Llama 3 layout: uint32 ids spread over a 70,000-id vocabulary (beyond uint16)
    wide = ids.astype(np.uint32) * 1076 + 3
    assert wide.max() > 65535
    with open(f"{work}/llama3/{split}.bin", "wb") as f:
        f.write(header(20240801, 7, len(wide)) + wide.tobytes())
PY

run() {  # run <name> <extra args...>: 30 steps of the main config on one rank
  local name=$1
  shift
  "$BIN" train "$CONFIG" --training.max_steps 30 --training.eval_interval 15 \
    --training.micro_batch 4 --training.threads 1 --checkpoint.dir "$WORK/ckpt_$name" \
    --metrics "$WORK/$name.jsonl" "$@" >"$WORK/$name.log"
}
run meshtrain --data.dir "$DATA"
run nanogpt --data.dir "$WORK/nanogpt" --data.format nanogpt --model.vocab_size 65
run llmc --data.dir "$WORK/llmc" --data.format llmc --model.vocab_size 65 \
  --data.train_file tiny_shakespeare_train.bin --data.val_file tiny_shakespeare_val.bin
run epoch --data.dir "$WORK/nanogpt" --data.format nanogpt --model.vocab_size 65 \
  --data.sampler epoch
"$BIN" train "$CONFIG" --training.max_steps 20 --training.eval_interval 20 \
  --training.micro_batch 4 --training.threads 1 --training.warmup_steps 0 --training.lr 1e-2 \
  --model.n_layer 1 --model.n_head 2 --model.n_embd 32 --model.block_size 32 \
  --model.vocab_size 70000 --data.dir "$WORK/llama3" --data.format llmc \
  --checkpoint.dir "$WORK/ckpt_llama3" --metrics "$WORK/llama3.jsonl" >"$WORK/llama3.log"

/usr/bin/python3 - "$WORK" <<'PY'
import json, math, sys
work = sys.argv[1]
def load(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
base = load("meshtrain")
assert len(base) == 30
for name in ("nanogpt", "llmc"):
    got = load(name)
    for key in ("loss", "grad_norm", "val_loss"):
        a = [l.get(key) for l in base]
        b = [l.get(key) for l in got]
        assert a == b, f"{name}: {key} differs from meshtrain's own files: {a[:3]} vs {b[:3]}"
epoch = load("epoch")
assert abs(epoch[0]["loss"] - math.log(65)) < 0.1, epoch[0]["loss"]
assert epoch[-1]["loss"] < epoch[0]["loss"] - 0.5, (epoch[0]["loss"], epoch[-1]["loss"])
assert [l["loss"] for l in epoch] != [l["loss"] for l in load("nanogpt")], "epoch = random?"
# "epoch" in the metrics: sequences so far / windows, (1003854 - 1) // 64 = 15685 windows
windows = (1003854 - 1) // 64
assert all(abs(l["epoch"] - l["step"] * 4 / windows) < 1e-12 for l in epoch), epoch[-1]["epoch"]
wide = load("llama3")
assert abs(wide[0]["loss"] - math.log(70000)) < 0.3, wide[0]["loss"]
assert wide[-1]["loss"] < wide[0]["loss"] - 0.3, (wide[0]["loss"], wide[-1]["loss"])
print(f"4 passed, 0 failed: nanogpt and llmc runs bit-identical to meshtrain's "
      f"(loss {base[0]['loss']:.4f} -> {base[-1]['loss']:.4f}); epoch sampler "
      f"{epoch[0]['loss']:.3f} -> {epoch[-1]['loss']:.3f}; uint32 vocab 70000 "
      f"{wide[0]['loss']:.3f} -> {wide[-1]['loss']:.3f}")
PY
# The checkpoints of foreign data hold the model and config, and no meta.json to copy.
[[ -f $WORK/ckpt_nanogpt/model.safetensors && ! -e $WORK/ckpt_nanogpt/meta.json ]] ||
  { echo "nanogpt checkpoint: expected model.safetensors and no meta.json"; exit 1; }
echo "checkpoints ok"
