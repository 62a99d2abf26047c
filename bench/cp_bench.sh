#!/usr/bin/env bash
# bench/cp_bench.sh — context parallel at long sequences (a command, not a test: never in
# CTest). configs/llama_long_context.toml (4 layers, 128 features, 4 heads / 2 kv heads) at
# T = 2048, 4096, 8192 (micro-batch 1, accumulation 1), for cp = 1, 2, 4 and both cp modes:
#
#   bench/cp_bench.sh [--steps N] [--seqs "2048 4096 8192"] [--cps "1 2 4"] [--comms "p2p a2a"]
#
# Reported per run (rank 0's metrics JSON, the median over N steps after one warm-up step):
# tokens/s, the activation peak of rank 0 (tracked allocator, MiB), the bytes rank 0 handed to
# the cp group per step (cp_comm_bytes: ring sends and receives, or all-to-all inputs), and
# wait/attn = cp_comm_s / attention_s: the seconds rank 0 spent waiting in the cp group
# (ProcessGroup counters: the time inside wait() of the posted K/V transfers, or inside the
# all-to-alls) over the seconds of the attention core's kernels. For the ring this is the share
# of the transfer the compute did NOT hide. Each rank gets cores / ranks threads; with more
# ranks than cores (cp 4 on 2 cores) ranks share a core and the waits include the other rank's
# compute, so only rows with ranks ≤ cores measure the overlap. Default N = 3.
#
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps=3 seqs="2048 4096 8192" cps="1 2 4" comms="p2p a2a"
while (($#)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --seqs) seqs=$2; shift 2 ;;
    --cps) cps=$2; shift 2 ;;
    --comms) comms=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cp_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
if [[ ! -x $bin ]]; then
  echo "cp_bench.sh: no meshtrain binary at $bin; run scripts/build.sh or set MESHTRAIN_BIN" >&2
  exit 2
fi
data_dir=data/prepared/shakespeare_char
[[ -f $data_dir/meta.json ]] || "$bin" prepare data/tinyshakespeare.txt --out "$data_dir" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores," \
  "flags: $(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
printf '%6s %3s %4s %5s %10s %14s %14s %9s\n' T cp mode ranks tokens/s "act peak MiB" \
  "cp bytes/step" wait/attn
for T in $seqs; do
  for cp in $cps; do
    for comm in $comms; do
      [[ $cp == 1 && $comm == a2a ]] && continue
      out="$work/T$T.cp$cp.$comm.jsonl"
      threads=$((cores / cp > 0 ? cores / cp : 1))
      mpirun --oversubscribe --bind-to none -np "$cp" "$bin" train configs/llama_long_context.toml \
        --model.block_size "$T" --parallel.cp "$cp" --parallel.cp_comm "$comm" \
        --training.micro_batch 1 --training.accumulation 1 --training.max_steps $((steps + 1)) \
        --training.eval_interval 0 --training.eval_batches 1 --training.log_interval 1000 \
        --training.threads "$threads" --checkpoint.save_final false --data.dir "$data_dir" \
        --metrics "$out" >"$work/log" 2>&1 || {
        # A layout the config rules refuse (Ulysses needs cp | kv heads) is reported, not fatal.
        if grep -q "rule:" "$work/log"; then
          printf '%6s %3s %4s %5s  refused: %s\n' "$T" "$cp" "$comm" "$cp" \
            "$(grep -m1 'rule:' "$work/log" | sed 's/^ *rule: //' | cut -c1-70)"
          continue
        fi
        cat "$work/log"; exit 1; }
      python3 - "$out" "$T" "$cp" "$comm" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]  # the first step warms the buffers
med = lambda k: statistics.median(r[k] for r in rows)
wait = med("cp_comm_s") / med("attention_s") if med("attention_s") > 0 else 0.0
print(f"{sys.argv[2]:>6} {sys.argv[3]:>3} {sys.argv[4]:>4} {sys.argv[3]:>5} "
      f"{med('tokens_per_s'):>10.0f} {max(r['peak_bytes_activations'] for r in rows) / 2**20:>14.1f} "
      f"{med('cp_comm_bytes'):>14.0f} {wait:>9.3f}")
EOF
    done
  done
done
