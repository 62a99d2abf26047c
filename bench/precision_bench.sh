#!/usr/bin/env bash
# bench/precision_bench.sh — fp32 against bf16 (and fp16) step time on a GEMM-bound model, in
# one invocation (a command, not a test). Issue 5's benchmark: an 8-layer, 512-wide GPT-2
# (8 heads, block 256, vocabulary 65, micro-batch 8 = 2048 tokens per step), one process with
# 2 threads (both cores).
#
#   bench/precision_bench.sh [--steps N] [--warmup W] [--rounds R]
#
# Each round runs fp32, bf16 and fp16 one after the other. Reported per precision: the median
# step time over N steps after W warm-up steps (metrics JSON step_time_s), the model FLOP/s it
# achieves (6·N + 12·L·C·T FLOPs per token, the MFU column's count: metrics mfu × the fp32
# peak it was computed against), that rate against each precision's peak on 2 cores (fp32 FMA
# 438 GFLOP/s; bf16 dot 841 GFLOP/s, DESIGN machine notes / issue 5), the final loss, and the
# speed-up over fp32 (median over R alternating rounds). fp16 has no oneDNN matmul in
# Debian's oneDNN 2.6: its GEMMs widen to f32 (docs/mixed_precision.md), so it shows the cost
# of the conversions. Defaults N=10, W=3, R=3: about 4 minutes here.
#
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps=10 warmup=3 rounds=3
while (($#)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "precision_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
if [[ ! -x $bin ]]; then
  echo "precision_bench.sh: no meshtrain binary at $bin; run scripts/build.sh or set MESHTRAIN_BIN" >&2
  exit 2
fi
data_dir=data/prepared/shakespeare_char
[[ -f $data_dir/meta.json ]] || "$bin" prepare data/tinyshakespeare.txt --out "$data_dir" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

peak_per_core=2.19e11
common=(--model.n_layer 8 --model.n_head 8 --model.n_embd 512 --model.block_size 256
        --training.micro_batch 8 --training.max_steps $((steps + warmup)) --training.threads 2
        --training.warmup_steps 5 --training.eval_interval 0 --training.eval_batches 1
        --training.log_interval 1000 --training.peak_flops_per_core $peak_per_core
        --checkpoint.save_final false --data.dir "$data_dir")

for ((r = 1; r <= rounds; ++r)); do
  for p in fp32 bf16 fp16; do
    echo "round $r/$rounds: $p" >&2
    "$bin" train configs/shakespeare_char.toml "${common[@]}" --training.precision "$p" \
      --metrics "$work/$p.$r.jsonl" >/dev/null
  done
done

/usr/bin/python3 - "$work" "$rounds" "$warmup" "$peak_per_core" <<'PY'
import json, statistics, sys
work, rounds, warmup, peak_core = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
peaks = {"fp32": 438e9, "bf16": 841e9, "fp16": 438e9}
def load(p, r):
    rows = [json.loads(l) for l in open(f"{work}/{p}.{r}.jsonl")]
    timed = [x for x in rows if x["step"] > warmup]
    ms = statistics.median(x["step_time_s"] for x in timed) * 1e3
    flops = statistics.median(x["mfu"] for x in timed) * peak_core * 2  # achieved model FLOP/s
    return {"ms": ms, "flops": flops, "loss": rows[-1]["loss"],
            "act": rows[-1]["peak_bytes_activations"]}
res = {p: [load(p, r) for r in range(1, rounds + 1)] for p in ("fp32", "bf16", "fp16")}
print(f"mixed precision on 2 cores (1 process × 2 threads): gpt2 8 layers × 512, block 256, "
      f"micro-batch 8, median step of each run, {rounds} alternating rounds")
print(f"{'precision':<9} {'ms/step (rounds)':<26} {'GFLOP/s':>8} {'of peak':>8} "
      f"{'peak act.':>10} {'final loss':>11}")
for p in ("fp32", "bf16", "fp16"):
    rs = res[p]
    med = statistics.median(x["ms"] for x in rs)
    fl = statistics.median(x["flops"] for x in rs)
    print(f"{p:<9} {' / '.join('%.0f' % x['ms'] for x in rs):<26} {fl / 1e9:>8.0f} "
          f"{fl / peaks[p] * 100:>7.0f}% {rs[0]['act'] / 2**20:>6.1f} MiB {rs[0]['loss']:>11.4f}")
for p in ("bf16", "fp16"):
    ratios = [res["fp32"][i]["ms"] / res[p][i]["ms"] for i in range(rounds)]
    print(f"speed-up {p} / fp32: {statistics.median(ratios):.2f}× "
          f"(rounds {', '.join('%.2f' % x for x in ratios)})")
PY
