#!/usr/bin/env bash
# bench/step_bench.sh — the GPT-2 6L/384 training step against its GEMM-bound time, side by side.
#
# For each core count (1 and 2, pinned with taskset to cores 0 and 0-1) and each precision
# (fp32, bf16; fp16 on request, its GEMMs timed as gemm_bench's f16), in one run: the median
# step time of `meshtrain train` (configs/shakespeare_char.toml with 6 layers × 384 features,
# 6 heads, block 256, micro-batch 4: 1024 tokens per step; metrics' step_time_s, steps after
# the warm-up) and the GEMM-bound time of the same step from `gemm_bench --model 6l384`: every
# linear layer's forward, backward-data and backward-weight GEMM timed with oneDNN on the
# trainer's shapes, plus the attention core's six products per block and head (S = QKᵀ,
# O = PV, dP, dV, dQ, dK) timed per head on oneDNN and counted at their causal half (the
# FLOPs a causal step needs; the issue's 73.6 GFLOP counted them whole): Σ count × seconds
# per call. Prints two ratios: step / (linear + attention) — issue 16's goal for fp32, ≤ 1.15:
# "the step's time ≤ 1.15 × (its GEMM FLOPs ÷ the GEMM rate measured on the same shapes)" —
# and the stricter step / linear, which charges the whole attention core to overhead.
#
#   bash bench/step_bench.sh [--steps N] [--warmup W] [--rounds R] [--cores "1 2"]
#                            [--precisions "fp32 bf16"]
#
# Lists are space-separated and quoted ("1 2") or comma-separated (1,2). Core counts lie in
# 1..nproc; precisions are fp32, bf16 and fp16 (the trainer's training.precision values).
# N ≥ 1, W ≥ 0, R ≥ 1. A bad argument exits 2 before anything runs.
#
# Each of R rounds (default 2) runs, per core count and precision, gemm_bench then the training
# run right after it on the same cores; the ratio is formed per round and the median over the
# rounds is printed with the range (a shared machine's load changes between runs: a GEMM rate
# measured minutes away from the step it is compared with would mislead).
#
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain), GEMM_BENCH_BIN (default
# build/bench/gemm_bench). The config's data is prepared on first use. Timings on a shared
# machine are noisy: the first line says how busy the CPUs were before starting.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=8
warmup=3
rounds=2
cores_list="1 2"
precisions="fp32 bf16"
die() { echo "step_bench.sh: $*" >&2; exit 2; }
posint() { [[ $2 =~ ^[1-9][0-9]{0,5}$ ]] || die "$1 must be an integer from 1 to 999999, got '$2' (e.g. $1 3)"; }
nonneg() { [[ $2 =~ ^[0-9]{1,6}$ ]] || die "$1 must be an integer from 0 to 999999, got '$2' (e.g. $1 2)"; }
while (($#)); do
  case $1 in
    --steps|--warmup|--rounds|--cores|--precisions)
      (($# >= 2)) || die "$1 needs a value (see the header of bench/step_bench.sh)" ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (options: --steps --warmup --rounds --cores --precisions)" ;;
  esac
  case $1 in
    --steps) posint --steps "$2"; steps=$2 ;;
    --warmup) nonneg --warmup "$2"; warmup=$2 ;;
    --rounds) posint --rounds "$2"; rounds=$2 ;;
    --cores) cores_list=${2//,/ } ;;
    --precisions) precisions=${2//,/ } ;;
  esac
  shift 2
done
ncpu=$(nproc)
[[ -n ${cores_list// /} ]] || die "--cores needs at least one core count, e.g. --cores \"1 2\""
for c in $cores_list; do
  [[ $c =~ ^[1-9][0-9]*$ ]] && ((c <= ncpu)) ||
    die "--cores: each core count must be an integer in 1..$ncpu (nproc), got '$c'" \
        "(e.g. --cores \"1 $ncpu\" or --cores 1,$ncpu)"
done
[[ -n ${precisions// /} ]] || die "--precisions needs at least one of fp32 bf16 fp16"
for p in $precisions; do
  [[ $p == fp32 || $p == bf16 || $p == fp16 ]] ||
    die "--precisions: each must be fp32, bf16 or fp16 (training.precision), got '$p'" \
        "(e.g. --precisions \"fp32 bf16\")"
done
bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
gemm_bin=${GEMM_BENCH_BIN:-build/bench/gemm_bench}
for b in "$bin" "$gemm_bin"; do
  [[ -x $b ]] || { echo "step_bench.sh: no binary at $b; build first (bash scripts/build.sh)" >&2; exit 1; }
done
data_dir=data/prepared/shakespeare_char  # configs/shakespeare_char.toml's data.dir
if [[ ! -f $data_dir/train.bin ]]; then
  echo "== preparing $data_dir"
  "$bin" prepare data/tinyshakespeare.txt --out "$data_dir" > /dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
total=$((steps + warmup))

busy() {  # percent of CPU time not idle over one second
  local a b
  read -r _ a1 a2 a3 a4 a5 a6 a7 _ < /proc/stat
  sleep 1
  read -r _ b1 b2 b3 b4 b5 b6 b7 _ < /proc/stat
  a=$((a1 + a2 + a3 + a4 + a5 + a6 + a7)); b=$((b1 + b2 + b3 + b4 + b5 + b6 + b7))
  echo $((100 - 100 * (b4 - a4) / (b - a > 0 ? b - a : 1)))
}
echo "== $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
     "$(nproc) cores, $(busy)% busy before starting"
echo "   flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512bw|avx512_bf16|avx512_fp16|amx_bf16|amx_tile)$' | xargs)"

for round in $(seq 1 "$rounds"); do
for cores in $cores_list; do
  mask=$(seq -s, 0 $((cores - 1)))
  for prec in $precisions; do
    tag=${cores}_${prec}_${round}
    dtype=f32; [[ $prec == bf16 ]] && dtype=bf16; [[ $prec == fp16 ]] && dtype=f16
    # The GEMM-bound time right before the step it is compared with, on the same cores.
    taskset -c "$mask" "$gemm_bin" "$cores" --model 6l384 --dtypes "$dtype" --windows 3 \
      --min-seconds 0.2 --json > "$work/gemm_$tag.json" 2> "$work/gemm_$tag.log" ||
      { echo "gemm_bench failed:" >&2; tail -5 "$work/gemm_$tag.log" >&2; exit 1; }
    taskset -c "$mask" "$bin" train configs/shakespeare_char.toml --model.n_layer 6 \
      --model.n_head 6 --model.n_embd 384 --model.block_size 256 --training.micro_batch 4 \
      --training.max_steps "$total" --training.threads "$cores" --training.precision "$prec" \
      --training.eval_interval 0 --training.eval_batches 1 --checkpoint.save_final false \
      --metrics "$work/mt_$tag.jsonl" > "$work/mt_$tag.log" 2>&1 ||
      { echo "meshtrain failed:" >&2; tail -20 "$work/mt_$tag.log" >&2; exit 1; }
  done
done
done
grep -m1 "effective ISA" "$work"/gemm_*.log | head -1 | sed 's/^[^:]*://'

python3 - "$work" "$warmup" "$cores_list" "$precisions" "$rounds" <<'PY'
import json, statistics, sys
work, warmup, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[5])
print(f"{'cores':>5} {'prec':>5} {'step ms':>9} {'linear ms':>10} {'+attn ms':>9} {'GFLOP/s':>8} "
      f"{'step/linear':>11} {'step/(linear+attn)':>18} {'(range)':>13} {'non-GEMM ms':>12} "
      f"{'alloc miss':>10} {'minflt':>7}")
for cores in sys.argv[3].split():
    for prec in sys.argv[4].split():
        key = {"fp32": "", "bf16": "_bf16", "fp16": "_f16"}[prec]
        per_round = []
        for r in range(1, rounds + 1):
            tag = f"{cores}_{prec}_{r}"
            rows = [json.loads(l) for l in open(f"{work}/mt_{tag}.jsonl") if l.strip()]
            timed = [x for x in rows if x["step"] > warmup]
            g = json.load(open(f"{work}/gemm_{tag}.json"))
            step = statistics.median(x["step_time_s"] for x in timed)
            linear, attn = g["seconds_per_step" + key], g["attention_seconds_per_step" + key]
            per_round.append({"step": step, "linear": linear, "attn": attn, "bound": linear + attn,
                              "gflops": g["gflops" + key], "flops": g["flops_per_step"],
                              "attn_flops": g["attention_flops_per_step"],
                              "miss": max(x["allocator_misses"] for x in timed),
                              "flt": max(x["minor_faults"] for x in timed), "n": len(timed)})
        strict = [p["step"] / p["linear"] for p in per_round]
        ratios = [p["step"] / p["bound"] for p in per_round]
        med = lambda k: statistics.median(p[k] for p in per_round)
        print(f"{cores:>5} {prec:>5} {med('step')*1e3:9.1f} {med('linear')*1e3:10.1f} "
              f"{med('attn')*1e3:9.1f} {med('gflops'):8.1f} {statistics.median(strict):11.3f} "
              f"{statistics.median(ratios):18.3f} {min(ratios):6.3f}–{max(ratios):<6.3f} "
              f"{(med('step')-med('bound'))*1e3:12.1f} "
              f"{max(p['miss'] for p in per_round):10d} {max(p['flt'] for p in per_round):7d}")
print(f"(per round: median of {per_round[0]['n']} steps after {warmup} warm-up; ratios = median over "
      f"{rounds} round(s), the range is that of step/(linear+attn); GEMM FLOPs per step: linear "
      f"layers {per_round[0]['flops']*1e-9:.2f} G, attention core {per_round[0]['attn_flops']*1e-9:.2f} G "
      f"(its causal half) at oneDNN's rate on the per-head shapes; non-GEMM = step − linear − attn; "
      f"alloc miss / minflt = the largest per-step count after warm-up)")
PY
