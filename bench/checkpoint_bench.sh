#!/usr/bin/env bash
# bench/checkpoint_bench.sh — what a sharded checkpoint costs training (a command, not a test).
# GPT-2, 6 layers × 384, block 128 (10.8 M parameters: 130 MB of fp32 masters and AdamW moments)
# on dp 2 with ZeRO-1 (each rank saves half), micro-batch 4, 1 thread per rank, 40 steps with a
# checkpoint every 10 (4 saves), once with checkpoint.async = true and once with false, then
# once without checkpoints. Reported per mode: the median and largest training pause per save
# (metrics checkpoint_s: waiting for the previous save, copying the pieces and, synchronous,
# writing them), the median write time (the log's "written in"), the checkpoint's bytes on disk
# and the total wall time of the run against the run without checkpoints.
#
#   bench/checkpoint_bench.sh [--dir DIR]   (DIR: where checkpoints go; default a temporary
#                                            directory under /tmp)
#
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
DIR=""
while (($#)); do
  case $1 in
    --dir) DIR=$2; shift 2 ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
[[ -n $DIR ]] || DIR=$(mktemp -d /tmp/meshtrain_ckpt_bench.XXXXXX)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
"$BIN" prepare data/tinyshakespeare.txt --out data/prepared/shakespeare_char >/dev/null
COMMON=(configs/shakespeare_char.toml --model.n_layer 6 --model.n_embd 384 --model.n_head 6
  --model.block_size 128 --parallel.dp 2 --parallel.zero_stage 1 --training.micro_batch 4
  --training.max_steps 40 --training.eval_interval 0 --training.eval_batches 1
  --training.threads 1 --training.log_interval 10 --checkpoint.save_final false)
run() {  # run <name> <args...>
  local name=$1; shift
  local start end
  start=$(date +%s.%N)
  mpirun --bind-to none -np 2 "$BIN" train "${COMMON[@]}" --checkpoint.dir "$DIR/$name" \
    --metrics "$DIR/$name.jsonl" "$@" >"$DIR/$name.log" 2>&1 || { cat "$DIR/$name.log"; exit 1; }
  end=$(date +%s.%N)
  echo "$end - $start" | bc >"$DIR/$name.wall"
}
run none
run async --checkpoint.interval 10 --checkpoint.async true
run sync --checkpoint.interval 10 --checkpoint.async false
/usr/bin/python3 - "$DIR" <<'PY'
import json, os, re, statistics, sys
d = sys.argv[1]
base = float(open(f"{d}/none.wall").read())
print(f"{'mode':<6} | {'pause/save ms (median, max)':<28} | {'write ms (median)':<17} | "
      f"{'bytes per checkpoint':<20} | {'wall s':<6} | vs none")
print("---|---|---|---|---|---")
for mode in ("async", "sync"):
    m = [json.loads(l) for l in open(f"{d}/{mode}.jsonl")]
    pauses = [x["checkpoint_s"] * 1e3 for x in m if x.get("checkpoint_s", 0) > 0]
    writes = [float(w) for w in re.findall(r"written in ([0-9.]+) ms", open(f"{d}/{mode}.log").read())]
    step = sorted(os.listdir(f"{d}/{mode}/checkpoints"))[-1]
    size = sum(os.path.getsize(f"{d}/{mode}/checkpoints/{step}/{f}")
               for f in os.listdir(f"{d}/{mode}/checkpoints/{step}"))
    wall = float(open(f"{d}/{mode}.wall").read())
    print(f"{mode:<6} | {statistics.median(pauses):8.1f}, {max(pauses):8.1f} "
          f"({len(pauses)} saves) | {statistics.median(writes):17.1f} | {size:20,d} | "
          f"{wall:6.1f} | {wall / base:.3f}×")
print(f"none   | – | – | – | {base:6.1f} | 1")
PY
