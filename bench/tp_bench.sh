#!/usr/bin/env bash
# bench/tp_bench.sh — tensor parallel against one process on this machine's cores, in one
# invocation (a command, not a test: never in CTest). Issue 3's benchmark: a 6-layer,
# 384-wide GPT-2 (6 heads, block 256, vocabulary 65, micro-batch 4) trained on Tiny Shakespeare.
#
#   bench/tp_bench.sh [--steps N] [--warmup W] [--rounds R] [--family gpt2|llama]
#
# Each round runs, one after the other (never concurrently: they share the cores):
#   tp=1     1 process × 2 threads (both cores, oneDNN and OpenMP threads)
#   tp=1×1   1 process × 1 thread (one core: the baseline the 2-rank layouts divide)
#   tp=2     2 processes × 1 thread (mpirun), sequence parallelism off
#   tp=2+sp  the same with parallel.sequence_parallel = true
# all at the same global batch. Reported per layout: the median step time over N steps after
# W warm-up steps (metrics JSON step_time_s), tokens/s from it, the final loss (the layouts
# train the same model, so the losses agree to ~1e-5), and the bytes rank 0 handed to the tp
# group per step (metrics tp_comm_bytes: all-reduce and reduce-scatter count their input D,
# all-gather its input D/tp) and the milliseconds rank 0 spent inside them (metrics tp_comm_s:
# the transfer and the wait for the other rank). The speed-up tp=2 / tp=1 is the median over R alternating
# rounds, against each tp=1 row. Defaults N=20, W=5, R=3: about 3 minutes here.
#
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps=20 warmup=5 rounds=3 family=gpt2
while (($#)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --family) family=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "tp_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
if [[ ! -x $bin ]]; then
  echo "tp_bench.sh: no meshtrain binary at $bin; run scripts/build.sh or set MESHTRAIN_BIN" >&2
  exit 2
fi
data_dir=data/prepared/shakespeare_char
[[ -f $data_dir/meta.json ]] || "$bin" prepare data/tinyshakespeare.txt --out "$data_dir" >/dev/null
config=configs/shakespeare_char.toml
[[ $family == llama ]] && config=configs/llama_shakespeare.toml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

model=(--model.n_layer 6 --model.n_head 6 --model.n_embd 384 --model.block_size 256)
[[ $family == llama ]] && model+=(--model.n_kv_head 6 --model.ffn_hidden 1024)
common=("${model[@]}" --training.micro_batch 4 --training.max_steps $((steps + warmup))
        --training.warmup_steps 5 --training.eval_interval 0 --training.eval_batches 1
        --training.log_interval 1000 --checkpoint.save_final false --data.dir "$data_dir")

run() {  # run <name> <round>
  local name=$1 round=$2 out="$work/$1.$2.jsonl"
  case $name in
    tp1) "$bin" train "$config" "${common[@]}" --training.threads 2 --metrics "$out" ;;
    tp1x1) "$bin" train "$config" "${common[@]}" --training.threads 1 --metrics "$out" ;;
    tp2) mpirun --bind-to none -np 2 "$bin" train "$config" "${common[@]}" --parallel.tp 2 \
           --training.threads 1 --metrics "$out" ;;
    tp2sp) mpirun --bind-to none -np 2 "$bin" train "$config" "${common[@]}" --parallel.tp 2 \
             --parallel.sequence_parallel true --training.threads 1 --metrics "$out" ;;
  esac >/dev/null
}

for ((r = 1; r <= rounds; ++r)); do
  for name in tp1 tp1x1 tp2 tp2sp; do
    echo "round $r/$rounds: $name" >&2
    run "$name" "$r"
  done
done

/usr/bin/python3 - "$work" "$rounds" "$warmup" "$family" <<'PY'
import json, statistics, sys
work, rounds, warmup, family = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tokens = 4 * 256
def load(name, r):
    rows = [json.loads(l) for l in open(f"{work}/{name}.{r}.jsonl")]
    timed = [x for x in rows if x["step"] > warmup]
    ms = statistics.median(x["step_time_s"] for x in timed) * 1e3
    return {"ms": ms, "tps": tokens / ms * 1e3, "loss": rows[-1]["loss"],
            "tp_bytes": statistics.median(x["tp_comm_bytes"] for x in timed),
            "tp_ms": statistics.median(x["tp_comm_s"] for x in timed) * 1e3}
res = {n: [load(n, r) for r in range(1, rounds + 1)] for n in ("tp1", "tp1x1", "tp2", "tp2sp")}
print(f"tensor parallel on 2 cores: {family}, 6 layers × 384, block 256, micro-batch 4 "
      f"({tokens} tokens/step), median step of each run, {rounds} alternating rounds")
print(f"{'layout':<8} {'ms/step (rounds)':<28} {'tokens/s':>9} {'tp bytes/step':>14} "
      f"{'in tp comm':>11} {'final loss':>11}")
for n, label in (("tp1", "tp=1"), ("tp1x1", "tp=1×1"), ("tp2", "tp=2"), ("tp2sp", "tp=2+sp")):
    rs = res[n]
    med = statistics.median(x["ms"] for x in rs)
    per_round = " / ".join("%.1f" % x["ms"] for x in rs)
    print(f"{label:<8} {per_round:<28} {tokens / med * 1e3:>9.0f} "
          f"{rs[0]['tp_bytes'] / 2**20:>10.2f} MiB "
          f"{statistics.median(x['tp_ms'] for x in rs):>8.1f} ms {rs[0]['loss']:>11.5f}")
for base, blabel in (("tp1", "tp=1 (2 threads)"), ("tp1x1", "tp=1×1 (1 thread)")):
    for n, label in (("tp2", "tp=2"), ("tp2sp", "tp=2+sp")):
        ratios = [res[base][i]["ms"] / res[n][i]["ms"] for i in range(rounds)]
        rounds_text = ", ".join("%.2f" % x for x in ratios)
        print(f"speed-up {label} / {blabel}: {statistics.median(ratios):.2f}× (rounds {rounds_text})")
PY
