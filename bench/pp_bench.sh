#!/usr/bin/env bash
# bench/pp_bench.sh — pipeline parallel against one process on this machine's 2 cores, in one
# invocation (a command, not a test: never in CTest). Issue 4's benchmark: a 6-layer, 384-wide
# GPT-2 (6 heads, block 128, micro-batch 2) on Tiny Shakespeare, for m ∈ {2, 4, 8, 16}
# micro-batches per step (training.accumulation):
#   1 process × 2 threads, the m micro-batches one after the other (the baseline)
#   pp=2 (2 processes × 1 thread, 3 layers each) with the 1f1b schedule
#   pp=2 with the zero-bubble zb_h1 schedule
# all at the same global batch (2·m sequences). Reported per run: the median step time over N
# steps after W warm-up steps (metrics step_time_s), tokens/s, the measured bubble (metrics
# `bubble`: 1 − time in compute actions / time of the step's actions, averaged over the stages)
# and the schedule's bubble with unit costs (`predicted_bubble`, from the simulator).
#
#   bench/pp_bench.sh [--steps N] [--warmup W]      (defaults N=8, W=2; about 5 minutes here)
#
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps=8 warmup=2
while (($#)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "pp_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
if [[ ! -x $bin ]]; then
  echo "pp_bench.sh: no meshtrain binary at $bin; run scripts/build.sh or set MESHTRAIN_BIN" >&2
  exit 2
fi
data_dir=data/prepared/shakespeare_char
[[ -f $data_dir/meta.json ]] || "$bin" prepare data/tinyshakespeare.txt --out "$data_dir" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

common=(--model.n_layer 6 --model.n_head 6 --model.n_embd 384 --model.block_size 128
        --training.micro_batch 2 --training.max_steps $((steps + warmup))
        --training.warmup_steps 5 --training.eval_interval 0 --training.eval_batches 1
        --training.log_interval 1000 --checkpoint.save_final false --data.dir "$data_dir")
for m in 2 4 8 16; do
  echo "m=$m: one process" >&2
  "$bin" train configs/shakespeare_char.toml "${common[@]}" --training.accumulation "$m" \
    --training.threads 2 --metrics "$work/one.$m.jsonl" >/dev/null
  for schedule in 1f1b zb_h1; do
    echo "m=$m: pp=2 $schedule" >&2
    mpirun --bind-to none -np 2 "$bin" train configs/shakespeare_char.toml "${common[@]}" \
      --training.accumulation "$m" --parallel.pp 2 --parallel.pp_schedule "$schedule" \
      --training.threads 1 --metrics "$work/$schedule.$m.jsonl" >/dev/null
  done
done

/usr/bin/python3 - "$work" "$warmup" <<'PY'
import json, statistics, sys
work, warmup = sys.argv[1], int(sys.argv[2])
def load(name, m):
    rows = [json.loads(l) for l in open(f"{work}/{name}.{m}.jsonl")]
    timed = [r for r in rows if r["step"] > warmup]
    ms = statistics.median(r["step_time_s"] for r in timed) * 1e3
    return {"ms": ms, "tps": 2 * m * 128 / ms * 1e3, "loss": rows[-1]["loss"],
            "bubble": statistics.median(r["bubble"] for r in timed),
            "predicted": rows[-1]["predicted_bubble"]}
print("pipeline parallel on 2 cores: gpt2 6 layers × 384, block 128, micro-batch 2; "
      "pp=2 runs 2 processes × 1 thread, the baseline 1 process × 2 threads")
print(f"{'m':>3} {'1 proc ms':>10} {'1f1b ms':>9} {'speed-up':>9} {'bubble':>7} {'sched.':>7} "
      f"{'zb_h1 ms':>9} {'speed-up':>9} {'bubble':>7} {'sched.':>7} {'losses (1 proc, 1f1b, zb_h1)':>32}")
for m in (2, 4, 8, 16):
    one, a, b = load("one", m), load("1f1b", m), load("zb_h1", m)
    print(f"{m:>3} {one['ms']:>10.1f} {a['ms']:>9.1f} {one['ms'] / a['ms']:>8.2f}× "
          f"{a['bubble']:>7.3f} {a['predicted']:>7.3f} {b['ms']:>9.1f} {one['ms'] / b['ms']:>8.2f}× "
          f"{b['bubble']:>7.3f} {b['predicted']:>7.3f}   {one['loss']:.5f} {a['loss']:.5f} {b['loss']:.5f}")
PY
