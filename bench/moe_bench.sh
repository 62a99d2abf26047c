#!/usr/bin/env bash
# bench/moe_bench.sh — mixture of experts (a command, not a test: never in CTest), side by side
# in one run so the ratios compare:
#   1. the dense Llama (configs/llama_shakespeare.toml, ffn_hidden 352) against the MoE Llama
#      (configs/llama_moe.toml: 8 experts of 176, top-2 — the same active MLP width) on 1 rank;
#   2. the MoE at ep = 1 (dp 2) and ep = 2 (dp 2) on 2 ranks: tokens/s, ep all-to-all bytes and
#      seconds per step (rank 0's ep_comm_bytes / ep_comm_s);
#   3. capacity factor 1.0, 1.25 and 0 (dropless) on 1 rank: tokens/s and the dropped fraction.
#
#   bench/moe_bench.sh [--steps N] [--val-steps M]
#
# Each run trains N steps (default 20) after the first (warm-up) and reports the median of
# tokens/s over them. With --val-steps M (default 0: skipped) it also trains the dense and MoE
# models for M steps each and reports their final val loss (the issue's "val loss against the
# dense Llama with the same active parameters").
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps=20 val_steps=0
while (($#)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --val-steps) val_steps=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "moe_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
if [[ ! -x $bin ]]; then
  echo "moe_bench.sh: no meshtrain binary at $bin; run scripts/build.sh or set MESHTRAIN_BIN" >&2
  exit 2
fi
data_dir=data/prepared/shakespeare_char
[[ -f $data_dir/meta.json ]] || "$bin" prepare data/tinyshakespeare.txt --out "$data_dir" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
  "flags: $(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"

# run NAME RANKS CONFIG ARGS… → one line: tokens/s (median after the first step), ep bytes and
# seconds per step, the mean dropped fraction of the last step, the last val loss.
run() {
  local name=$1 ranks=$2 config=$3
  shift 3
  local cmd=("$bin" train "configs/$config" --data.dir "$data_dir" --checkpoint.save_final false
    --checkpoint.dir "$work/$name" --metrics "$work/$name.jsonl" --training.log_interval 100000 "$@")
  if ((ranks > 1)); then cmd=(mpirun --oversubscribe --bind-to none -np "$ranks" "${cmd[@]}"); fi
  "${cmd[@]}" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  /usr/bin/python3 - "$name" "$work/$name.jsonl" <<'PY'
import json, statistics, sys
name, path = sys.argv[1], sys.argv[2]
lines = [json.loads(l) for l in open(path)]
steady = lines[1:] or lines
tps = statistics.median(l["tokens_per_s"] for l in steady)
ep_b = statistics.median(l.get("ep_comm_bytes", 0) for l in steady)
ep_s = statistics.median(l.get("ep_comm_s", 0.0) for l in steady)
moe = lines[-1].get("moe", [])
dropped = sum(m["dropped_fraction"] for m in moe) / len(moe) if moe else 0.0
val = next((l["val_loss"] for l in reversed(lines) if "val_loss" in l), float("nan"))
print(f"{name:<26} {tps:>10.0f} {ep_b / 2**20:>12.2f} {ep_s * 1e3:>10.1f} {dropped * 100:>9.2f} {val:>8.4f}")
PY
}

printf '%-26s %10s %12s %10s %9s %8s\n' run tokens/s "ep MiB/step" "ep ms/step" "dropped%" val
common=(--training.max_steps $((steps + 1)) --training.eval_interval 0 --training.eval_batches 2)
run dense_1rank 1 llama_shakespeare.toml "${common[@]}"
run moe_1rank 1 llama_moe.toml "${common[@]}"
run moe_dp2_ep1 2 llama_moe.toml --parallel.dp 2 --training.micro_batch 6 "${common[@]}"
run moe_dp2_ep2 2 llama_moe.toml --parallel.dp 2 --parallel.ep 2 --training.micro_batch 6 "${common[@]}"
for f in 1.0 1.25 0; do
  run "moe_capacity_$f" 1 llama_moe.toml --model.moe_capacity_factor "$f" "${common[@]}"
done
if ((val_steps > 0)); then
  val=(--training.max_steps "$val_steps" --training.eval_interval "$val_steps")
  run "dense_val_${val_steps}" 1 llama_shakespeare.toml "${val[@]}"
  run "moe_val_${val_steps}" 1 llama_moe.toml "${val[@]}"
fi
