#!/usr/bin/env bash
# bench/dp_overlap_bench.sh — data-parallel scaling on this machine's 2 cores with and without
# the gradient all-reduce overlapping backward (parallel.overlap_grad_reduce), in one invocation
# (a command, not a test: never in CTest). Issue 16's goal: dp = 2 on 2 cores ≥ 1.85 × one
# process on one core at the same global batch. The model is the GEMM-bound 6L/384 GPT-2 of the
# issue (configs/shakespeare_char.toml with 6 layers × 384, 6 heads, block 256: 10.7 M
# parameters, 43 MB of fp32 gradients, 11 buckets of 4 MiB), fp32, global batch B = --batch
# sequences (default 4, the issue's B4), every run:
#   dp=2 on   2 processes × 1 thread (mpirun), micro-batch B/2, overlap_grad_reduce true
#   dp=2 off  the same with overlap_grad_reduce false (every bucket reduced after backward)
#   dp=1      1 process × 1 thread, micro-batch B
#   pair      2 independent dp = 1 processes × 1 thread at once, micro-batch B/2 each: a
#             dp = 2 step with no communication and no waiting for each other, so dp=1 ÷ pair
#             estimates what dp = 2 could reach on this machine in that round (the two share
#             its memory bandwidth and caches). An estimate, not a bound: a noisy host moves
#             it from round to round, and at ZeRO stage ≥ 1 each dp rank steps half the
#             AdamW that each pair process steps
# Each round runs the 4 layouts one after the other, pair right after on (never two layouts at
# once: they share the cores).
# Reported per layout: the median step time over N steps after W warm-up steps (metrics
# step_time_s; per round, and tokens/s from the median of the rounds), the speed-up over dp=1,
# rank 0's seconds per step blocked in dp collectives (dp_comm_s) and waiting on the dp
# reduction after backward (dp_comm_exposed_s), medians over the rounds, and the final loss
# (the dp=2 runs are bitwise the same model; dp=1 within float re-association; the pair's
# processes each train on half the batch, so theirs differs). The pair's step is the slower of
# its two processes' medians; its row's × dp=1 is the estimate, and the last line gives dp=2
# overlap on ÷ that estimate per round (pair ms ÷ on ms, run one after the other). Defaults
# N=10, W=3, R=3, B=4: about 4 minutes here when the machine is otherwise idle. --zero-stage Z
# runs both dp=2 layouts at parallel.zero_stage Z (0–3; default 0: the bucket all-reduces;
# 1–3: the gradient reduce-scatters overlap, docs/data_parallel.md); dp=1 has no ZeRO.
#
#   bench/dp_overlap_bench.sh [--steps N] [--warmup W] [--rounds R] [--batch B] [--zero-stage Z]
#
# N ≥ 1, W ≥ 0, R ≥ 1, B even ≥ 2, Z in 0–3; a bad argument exits 2 before anything runs.
#
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps=10 warmup=3 rounds=3 batch=4 zero=0
die() { echo "dp_overlap_bench.sh: $*" >&2; exit 2; }
posint() {  # posint NAME VALUE [EXAMPLE]
  [[ $2 =~ ^[1-9][0-9]{0,5}$ ]] || die "$1 must be an integer from 1 to 999999, got '$2' (e.g. $1 ${3:-3})"
}
nonneg() { [[ $2 =~ ^[0-9]{1,6}$ ]] || die "$1 must be an integer from 0 to 999999, got '$2' (e.g. $1 2)"; }
while (($#)); do
  case $1 in
    --steps|--warmup|--rounds|--batch|--zero-stage) (($# >= 2)) || die "$1 needs a value (see --help)" ;;
  esac
  case $1 in
    --steps) posint --steps "$2"; steps=$2; shift 2 ;;
    --warmup) nonneg --warmup "$2"; warmup=$2; shift 2 ;;
    --rounds) posint --rounds "$2"; rounds=$2; shift 2 ;;
    --batch) posint --batch "$2" 4; batch=$2; shift 2 ;;
    --zero-stage)
      [[ $2 =~ ^[0-3]$ ]] || die "--zero-stage must be 0, 1, 2 or 3, got '$2' (e.g. --zero-stage 2)"
      zero=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
if ((batch % 2 != 0 || batch < 2)); then
  die "--batch must be even and ≥ 2 (dp = 2 splits it), not '$batch' (e.g. --batch 4)"
fi
bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
if [[ ! -x $bin ]]; then
  echo "dp_overlap_bench.sh: no meshtrain binary at $bin; run scripts/build.sh or set MESHTRAIN_BIN" >&2
  exit 2
fi
data_dir=data/prepared/shakespeare_char
[[ -f $data_dir/meta.json ]] || "$bin" prepare data/tinyshakespeare.txt --out "$data_dir" >/dev/null
work=$(mktemp -d)
# The pair's processes run in the background: stop them (they finish their step) before
# their folder goes.
trap 'kill $(jobs -p) 2>/dev/null || true; wait || true; rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

common=(--model.n_layer 6 --model.n_head 6 --model.n_embd 384 --model.block_size 256
        --training.max_steps $((steps + warmup)) --training.eval_interval 0
        --training.eval_batches 1 --training.log_interval 1000 --checkpoint.save_final false
        --training.threads 1 --data.dir "$data_dir")
layouts=(on pair off one)

run() {  # run <layout> <round>: metrics to $work/<layout>.<round>.jsonl, stdout to .out
  local name=$1 out="$work/$1.$2"
  case $name in
    on|off) mpirun --oversubscribe --bind-to none -np 2 "$bin" train configs/shakespeare_char.toml \
              "${common[@]}" --parallel.dp 2 --training.micro_batch $((batch / 2)) \
              --parallel.zero_stage "$zero" \
              --parallel.overlap_grad_reduce "$([[ $name == on ]] && echo true || echo false)" \
              --metrics "$out.jsonl" ;;
    one) "$bin" train configs/shakespeare_char.toml "${common[@]}" --training.micro_batch "$batch" \
           --metrics "$out.jsonl" ;;
    pair)
      local p pids=()
      for p in a b; do
        "$bin" train configs/shakespeare_char.toml "${common[@]}" \
          --training.micro_batch $((batch / 2)) --checkpoint.dir "$work/pair.$p" \
          --metrics "$out.$p.jsonl" >"$out.$p.out" &
        pids+=($!)
      done
      local rc=0  # wait for both, so that neither outlives the script's cleanup of $work
      wait "${pids[0]}" || rc=$?
      wait "${pids[1]}" || rc=$?
      return "$rc" ;;
  esac >"$out.out"
}

for ((r = 1; r <= rounds; ++r)); do
  for name in "${layouts[@]}"; do
    echo "round $r/$rounds: $name" >&2
    run "$name" "$r"
  done
done

/usr/bin/python3 - "$work" "$rounds" "$warmup" "$batch" "$zero" <<'PY'
import json, statistics, sys
work, rounds, warmup, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
zero = int(sys.argv[5])
tokens = batch * 256

def load_file(path):
    rows = [json.loads(l) for l in open(path)]
    timed = [x for x in rows if x["step"] > warmup]
    return {"ms": statistics.median(x["step_time_s"] for x in timed) * 1e3,
            "dp_ms": statistics.median(x["dp_comm_s"] for x in timed) * 1e3,
            "exposed_ms": statistics.median(x["dp_comm_exposed_s"] for x in timed) * 1e3,
            "loss": rows[-1]["loss"]}

def load(name, r):
    if name != "pair":
        return load_file(f"{work}/{name}.{r}.jsonl")
    # The slower process bounds a step that would wait for both.
    return max((load_file(f"{work}/pair.{r}.{p}.jsonl") for p in "ab"), key=lambda x: x["ms"])

labels = {"on": "dp=2 overlap on", "off": "dp=2 overlap off", "one": "dp=1",
          "pair": "pair (no comm)"}
res = {name: [load(name, r) for r in range(1, rounds + 1)] for name in labels}
med = {name: statistics.median(x["ms"] for x in rs) for name, rs in res.items()}
per_round = {name: " / ".join("%.0f" % x["ms"] for x in rs) for name, rs in res.items()}
w = max(18, *(len(t) for t in per_round.values()))
print(f"dp overlap on 2 cores: gpt2 6 layers × 384, block 256, global batch {batch} "
      f"({tokens} tokens/step), fp32; median step of {rounds} alternating rounds; dp=2: "
      f"2 processes × 1 thread, micro-batch {batch // 2}, ZeRO stage {zero}; "
      f"dp=1: 1 process × 1 thread; pair: 2 independent dp=1 processes at once, micro-batch "
      f"{batch // 2} each (the slower one's step)")
print(f"{'layout':<17} {'ms/step (rounds)':<{w}} {'tokens/s':>8} {'× dp=1':>7} "
      f"{'dp comm ms':>10} {'exposed ms':>10} {'loss':>8}")
for name, rs in res.items():
    dp_ms = statistics.median(x["dp_ms"] for x in rs)
    exposed = statistics.median(x["exposed_ms"] for x in rs)
    print(f"{labels[name]:<17} {per_round[name]:<{w}} {tokens / med[name] * 1e3:>8.0f} "
          f"{med['one'] / med[name]:>7.3f} {dp_ms:>10.1f} {exposed:>10.1f} {rs[-1]['loss']:>8.5f}")
print(f"overlap on vs off: {med['off'] / med['on']:.3f}× (step time off / on)")
estimate = [p["ms"] / o["ms"] for p, o in zip(res["pair"], res["on"])]
print(f"dp=2 overlap on ÷ the pair's estimate: {statistics.median(estimate):.3f} (rounds "
      + " / ".join("%.3f" % c for c in estimate) + ")")
PY
