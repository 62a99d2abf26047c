#!/usr/bin/env bash
# bench/zero_bench.sh — ZeRO stages and activation recompute on this machine's 2 cores, in one
# invocation (a command, not a test: never in CTest). Issue 5's benchmark: nanoGPT's CPU
# configuration (configs/shakespeare_char.toml: GPT-2, 4 layers × 128, block 64, 804,096
# parameters) at its global batch of 12 sequences (768 tokens per step), in P = --precision
# (training.precision: fp32, or bf16 / fp16 mixed precision; default fp32) in every run:
#   dp=2 zero=S  2 processes × 1 thread (mpirun), micro-batch 6, parallel.zero_stage S = 0…3
#   dp=1 R       1 process × 1 thread, micro-batch 12, training.recompute R = none,
#                selective, full (one thread: two OpenMP threads collapse when anything else
#                runs on the shared cores, and the modes are compared with each other)
# Each round runs the 7 layouts one after the other (never concurrently: they share the
# cores). Reported per layout: the median step time over N steps after W warm-up steps
# (metrics step_time_s; per round, and tokens/s from the median of the rounds), every rank's
# peak bytes per memory category (the end-of-run table rank 0 prints, MiB; the same in every
# round), the bytes rank 0 handed to the dp group's collectives per step (metrics
# dp_comm_bytes: all-reduce and reduce-scatter count their input, all-gather its input, which
# is 1/dp of its output), the milliseconds rank 0 spent inside them per step (metrics
# dp_comm_s, median over the rounds: the transfer and the wait for the other rank), the
# final loss (the dp=2 stages train the same model up to float re-association, the recompute
# modes bitwise the same) and, below the table, rank 0's peaks in bytes (metrics
# peak_bytes_<category>, round 1's last line). docs/memory.md derives the memory and byte columns. Defaults N=30,
# W=5, R=3, P=fp32: about 2 minutes here.
#
#   bench/zero_bench.sh [--steps N] [--warmup W] [--rounds R] [--precision fp32|bf16|fp16]
#
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps=30 warmup=5 rounds=3 precision=fp32
while (($#)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "zero_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $precision in
  fp32|bf16|fp16) ;;
  *) echo "zero_bench.sh: --precision must be fp32, bf16 or fp16, not '$precision'" >&2; exit 2 ;;
esac
bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
if [[ ! -x $bin ]]; then
  echo "zero_bench.sh: no meshtrain binary at $bin; run scripts/build.sh or set MESHTRAIN_BIN" >&2
  exit 2
fi
data_dir=data/prepared/shakespeare_char
[[ -f $data_dir/meta.json ]] || "$bin" prepare data/tinyshakespeare.txt --out "$data_dir" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# One evaluation batch at the end only (eval_interval 0), so the peaks are the training step's.
common=(--training.max_steps $((steps + warmup)) --training.eval_interval 0
        --training.eval_batches 1 --training.log_interval 1000 --checkpoint.save_final false
        --data.dir "$data_dir" --training.precision "$precision")
layouts=(z0 z1 z2 z3 none selective full)

run() {  # run <layout> <round>: metrics to $work/<layout>.<round>.jsonl, stdout to .out
  local name=$1 out="$work/$1.$2"
  case $name in
    z?) mpirun --oversubscribe --bind-to none -np 2 "$bin" train configs/shakespeare_char.toml \
          "${common[@]}" --parallel.dp 2 --training.micro_batch 6 --training.threads 1 \
          --parallel.zero_stage "${name#z}" --metrics "$out.jsonl" ;;
    *) "$bin" train configs/shakespeare_char.toml "${common[@]}" --training.micro_batch 12 \
         --training.threads 1 --training.recompute "$name" --metrics "$out.jsonl" ;;
  esac >"$out.out"
}

for ((r = 1; r <= rounds; ++r)); do
  for name in "${layouts[@]}"; do
    echo "round $r/$rounds: $name" >&2
    run "$name" "$r"
  done
done

/usr/bin/python3 - "$work" "$rounds" "$warmup" "$precision" <<'PY'
import json, statistics, sys
work, rounds, warmup, precision = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tokens = 12 * 64
cats = ("params", "grads", "optimizer", "activations", "comm")

def peaks(path):  # {rank: {category: MiB}} from the table rank 0 prints at the end
    lines = open(path).read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("peak memory per rank"))
    header = lines[start + 1].split()
    out = {}
    for line in lines[start + 2:]:
        f = line.split()
        if len(f) != len(header) or not f[0].isdigit():
            break
        out[int(f[0])] = {h: float(v) for h, v in zip(header[4:], f[4:])}
    return out

def load(name, r):
    rows = [json.loads(l) for l in open(f"{work}/{name}.{r}.jsonl")]
    timed = [x for x in rows if x["step"] > warmup]
    return {"ms": statistics.median(x["step_time_s"] for x in timed) * 1e3,
            "dp_bytes": statistics.median(x["dp_comm_bytes"] for x in timed),
            "dp_ms": statistics.median(x["dp_comm_s"] for x in timed) * 1e3,
            "loss": rows[-1]["loss"], "peaks": peaks(f"{work}/{name}.{r}.out"),
            "bytes": {c: rows[-1][f"peak_bytes_{c}"] for c in cats}}

labels = {"z0": "dp=2 zero=0", "z1": "dp=2 zero=1", "z2": "dp=2 zero=2", "z3": "dp=2 zero=3",
          "none": "dp=1 none", "selective": "dp=1 selective", "full": "dp=1 full"}
res = {name: [load(name, r) for r in range(1, rounds + 1)] for name in labels}
per_round = {name: " / ".join("%.1f" % x["ms"] for x in rs) for name, rs in res.items()}
w = max(16, *(len(t) for t in per_round.values()))
print(f"ZeRO and recompute on 2 cores: gpt2 4 layers × 128, block 64, global batch 12 "
      f"({tokens} tokens/step), {precision}; median step of {rounds} alternating rounds; dp=2: "
      f"2 processes × 1 thread, micro-batch 6; dp=1: 1 process × 1 thread, micro-batch 12; "
      f"peaks in MiB per rank")
print(f"{'layout':<15} {'rank':>4} {'ms/step (rounds)':<{w}} {'tokens/s':>8} "
      + " ".join(f"{c:>11}" for c in cats) + f" {'total':>7} {'dp bytes/step':>13} "
      f"{'in dp comm':>10} {'loss':>8}")
for name, rs in res.items():
    med = statistics.median(x["ms"] for x in rs)
    if any(x["peaks"] != rs[0]["peaks"] for x in rs):
        print(f"note: {labels[name]}: the peaks differ between rounds; round 1 shown")
    for rank, p in sorted(rs[0]["peaks"].items()):
        first = rank == min(rs[0]["peaks"])
        timing = (f"{per_round[name]:<{w}} {tokens / med * 1e3:>8.0f}" if first
                  else f"{'':<{w}} {'':>8}")
        dp_ms = statistics.median(x["dp_ms"] for x in rs)
        tail = (f" {rs[0]['dp_bytes']:>13,.0f} {dp_ms:>7.2f} ms {rs[0]['loss']:>8.5f}"
                if first else "")
        print(f"{labels[name] if first else '':<15} {rank:>4} {timing} "
              + " ".join(f"{p[c]:>11.2f}" for c in cats) + f" {p['total']:>7.2f}" + tail)
print(f"rank 0 peak bytes (metrics peak_bytes_<category>, round 1):")
print(f"{'layout':<15} " + " ".join(f"{c:>11}" for c in cats))
for name, rs in res.items():
    print(f"{labels[name]:<15} " + " ".join(f"{rs[0]['bytes'][c]:>11,}" for c in cats))
PY
