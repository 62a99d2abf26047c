#!/usr/bin/env bash
# bench/precision_bench.sh — fp32 against bf16 and fp16 step time, side by side in one
# invocation (a command, not a test; issue 16 item 3, issue 5 before it).
#
#   bench/precision_bench.sh [--model 6l384|8l512] [--threads T[,T…]] [--steps N]
#                            [--warmup W] [--rounds R] [--loss-check] [--verbose-isa]
#
# Models: 6l384 (default) is issue 16's GEMM-bound GPT-2: 6 layers × 384, 6 heads, block 256,
# micro-batch 4 (1024 tokens per step); 8l512 is issue 5's: 8 × 512, 8 heads, block 256,
# micro-batch 8. Vocabulary 65 (Tiny Shakespeare, characters), AdamW, one process.
#
# For each thread count, each round runs fp32, bf16 and fp16 one after the other; reported per
# precision: the median step time over N steps after W warm-up steps (metrics JSON
# step_time_s) in every round, and the speed-up over fp32 (median over the R rounds of the
# per-round ratio, so machine load shared by the three runs of a round cancels).
# fp16 has no oneDNN matmul in Debian's oneDNN 2.6: its GEMMs widen to f32
# (docs/mixed_precision.md), so it shows the cost of the conversions.
#
# --loss-check: instead of timing, 300 steps of each precision from the same seed (threads =
# the first of --threads), printing the final training losses and |bf16 − fp32|,
# |fp16 − fp32|; exits 1 when a difference exceeds 1e-2 (issue 16's bound).
# --verbose-isa: instead of timing steps, R alternating rounds of 2 fp32 and 2 bf16 steps under
# ONEDNN_VERBOSE=1, printing oneDNN's version and ISA line, which kernels ran the second
# step's matmuls (implementation:ISA, e.g. brg:avx512_core_bf16 or brg:avx512_core_amx, with
# the layouts) and their GEMM rate from the verbose exec times (2·M·N·K per matmul).
# Defaults: --threads 1,2 N=8 W=2 R=3 (about 3 minutes here). Thread counts ≥ 1, N ≥ 1, W ≥ 0,
# R ≥ 1; a bad argument exits 2 before anything runs.
#
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
model=6l384 threads=1,2 steps=8 warmup=2 rounds=3 loss_check=0 verbose_isa=0
die() { echo "precision_bench.sh: $*" >&2; exit 2; }
posint() {  # posint NAME VALUE [EXAMPLE]
  [[ $2 =~ ^[1-9][0-9]{0,5}$ ]] || die "$1 must be an integer from 1 to 999999, got '$2' (e.g. $1 ${3:-3})"
}
nonneg() { [[ $2 =~ ^[0-9]{1,6}$ ]] || die "$1 must be an integer from 0 to 999999, got '$2' (e.g. $1 2)"; }
while (($#)); do
  case $1 in
    --model|--threads|--steps|--warmup|--rounds)
      (($# >= 2)) || die "$1 needs a value (see --help)" ;;
  esac
  case $1 in
    --model) model=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --steps) posint --steps "$2"; steps=$2; shift 2 ;;
    --warmup) nonneg --warmup "$2"; warmup=$2; shift 2 ;;
    --rounds) posint --rounds "$2"; rounds=$2; shift 2 ;;
    --loss-check) loss_check=1; shift ;;
    --verbose-isa) verbose_isa=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $threads =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
  die "--threads must be a comma list of thread counts ≥ 1, got '$threads' (e.g. --threads 1,2)"
case $model in
  6l384) shape=(--model.n_layer 6 --model.n_head 6 --model.n_embd 384 --model.block_size 256
                --training.micro_batch 4) ;;
  8l512) shape=(--model.n_layer 8 --model.n_head 8 --model.n_embd 512 --model.block_size 256
                --training.micro_batch 8) ;;
  *) die "--model must be 6l384 or 8l512, got '$model' (e.g. --model 6l384)" ;;
esac
IFS=, read -r -a thread_list <<<"$threads"

bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
if [[ ! -x $bin ]]; then
  echo "precision_bench.sh: no meshtrain binary at $bin; run scripts/build.sh or set MESHTRAIN_BIN" >&2
  exit 2
fi
data_dir=data/prepared/shakespeare_char
[[ -f $data_dir/meta.json ]] || "$bin" prepare data/tinyshakespeare.txt --out "$data_dir" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run PRECISION THREADS STEPS METRICS
run() {
  "$bin" train configs/shakespeare_char.toml "${shape[@]}" --training.max_steps "$3" \
    --training.threads "$2" --training.warmup_steps 5 --training.eval_interval 0 \
    --training.eval_batches 1 --training.log_interval 1000 --checkpoint.save_final false \
    --data.dir "$data_dir" --training.precision "$1" --metrics "$4" >/dev/null
}

if ((verbose_isa)); then
  # Two steps per run under ONEDNN_VERBOSE=1 (stdout carries the verbose lines); the second
  # step's matmuls (the last half of the exec lines) give the GEMM rate inside the step.
  for ((r = 1; r <= rounds; ++r)); do
    for p in fp32 bf16; do
      echo "oneDNN verbose, round $r/$rounds: $p" >&2
      ONEDNN_VERBOSE=1 "$bin" train configs/shakespeare_char.toml "${shape[@]}" \
        --training.max_steps 2 --training.threads "${thread_list[0]}" --training.eval_interval 0 \
        --training.eval_batches 1 --checkpoint.save_final false --data.dir "$data_dir" \
        --training.precision "$p" >"$work/verbose.$p.$r.txt" 2>&1
    done
  done
  /usr/bin/python3 - "$work" "$rounds" "${thread_list[0]}" <<'PY'
import collections, statistics, sys
work, rounds, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def parse(p, r):
    lines = [l.strip().split(",") for l in open(f"{work}/verbose.{p}.{r}.txt")
             if l.startswith("onednn_verbose,exec,")]
    info = [l.strip() for l in open(f"{work}/verbose.{p}.{r}.txt")
            if l.startswith("onednn_verbose,info,") and ("isa:" in l or "oneDNN v" in l)]
    step2 = lines[len(lines) // 2:]
    ms = flops = 0.0
    kernels = collections.Counter()
    for f in step2:
        m_k, k_n, _ = f[-2].split(":")
        m, k = map(int, m_k.split("x")); n = int(k_n.split("x")[1])
        flops += 2.0 * m * n * k; ms += float(f[-1])
        kernels[f"{f[3]} {f[4]} {f[6].split()[0].split(':')[0]}"] += 1
    return ms, flops, kernels, info
res = {p: [parse(p, r) for r in range(1, rounds + 1)] for p in ("fp32", "bf16")}
print("\n".join(res["bf16"][0][3]))
print(f"oneDNN matmuls of one training step ({threads} thread(s)), from ONEDNN_VERBOSE exec times:")
for p in ("fp32", "bf16"):
    for k, c in res[p][0][2].most_common():
        print(f"  {p}: {c:3d} × {k}")
    rates = [x[1] / x[0] / 1e6 for x in res[p]]
    print(f"  {p}: matmul ms per step {' / '.join('%.0f' % x[0] for x in res[p])}, "
          f"GFLOP/s {' / '.join('%.1f' % x for x in rates)} (median {statistics.median(rates):.1f})")
ratios = [res["bf16"][i][1] / res["bf16"][i][0] / (res["fp32"][i][1] / res["fp32"][i][0])
          for i in range(rounds)]
print(f"  bf16 / fp32 GEMM rate: {statistics.median(ratios):.2f}× "
      f"(rounds {', '.join('%.2f' % x for x in ratios)})")
PY
  exit 0
fi

if ((loss_check)); then
  t=${thread_list[0]}
  for p in fp32 bf16 fp16; do
    echo "loss check: $p, 300 steps, $t thread(s)" >&2
    run "$p" "$t" 300 "$work/$p.loss.jsonl"
  done
  exec /usr/bin/python3 - "$work" "$model" <<'PY'
import json, sys
work, model = sys.argv[1], sys.argv[2]
loss = {p: [json.loads(l) for l in open(f"{work}/{p}.loss.jsonl")][-1]["loss"]
        for p in ("fp32", "bf16", "fp16")}
print(f"loss after 300 steps, {model}: " + ", ".join(f"{p} {v:.4f}" for p, v in loss.items()))
bad = 0
for p in ("bf16", "fp16"):
    d = abs(loss[p] - loss["fp32"])
    bad += d > 1e-2
    print(f"|{p} - fp32| = {d:.4f} ({'within' if d <= 1e-2 else 'OVER'} 1e-2)")
sys.exit(1 if bad else 0)
PY
fi

for t in "${thread_list[@]}"; do
  for ((r = 1; r <= rounds; ++r)); do
    for p in fp32 bf16 fp16; do
      echo "threads $t, round $r/$rounds: $p" >&2
      run "$p" "$t" $((steps + warmup)) "$work/$p.$t.$r.jsonl"
    done
  done
done

/usr/bin/python3 - "$work" "$rounds" "$warmup" "$model" "${thread_list[@]}" <<'PY'
import json, statistics, sys
work, rounds, warmup, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def ms(p, t, r):
    rows = [json.loads(l) for l in open(f"{work}/{p}.{t}.{r}.jsonl")]
    return statistics.median(x["step_time_s"] for x in rows if x["step"] > warmup) * 1e3
print(f"mixed precision, {model}, 1 process, median step of each run, {rounds} rounds")
print(f"{'threads':>7} {'precision':<9} {'ms/step (rounds)':<24} {'speed-up vs fp32 (rounds)'}")
for t in sys.argv[5:]:
    res = {p: [ms(p, t, r) for r in range(1, rounds + 1)] for p in ("fp32", "bf16", "fp16")}
    for p, v in res.items():
        ratios = [res["fp32"][i] / v[i] for i in range(rounds)]
        print(f"{t:>7} {p:<9} {' / '.join('%.0f' % x for x in v):<24} "
              f"{statistics.median(ratios):.2f}× ({', '.join('%.2f' % x for x in ratios)})")
PY
