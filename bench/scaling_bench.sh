#!/usr/bin/env bash
# bench/scaling_bench.sh — how meshtrain's cost grows (issue 16 item 5): tokens/s and MFU of
# `meshtrain train` against model width, depth, sequence length and precision, next to the
# GEMM-bound limit, as a table (stdout and OUT/scaling.md), JSON (OUT/scaling.json) and a PNG
# plot (OUT/scaling.png, bench/plot_scaling.py). A command, not a test.
#
#   bench/scaling_bench.sh [--quick] [--sweeps width,depth,seq] [--precisions fp32,bf16]
#                          [--steps N] [--warmup W] [--rounds R] [--threads T]
#                          [--tokens K] [--gemm-rate gemm_bench|peak] [--data DIR] [--out DIR]
#
# Grid (GPT-2 family, character vocabulary 65, n_head = n_embd / 64, no bias, one process):
#   width  n_embd 128, 256, 384, 512, 768 at 4 layers, block 256
#   depth  n_layer 1, 2, 4, 8 at n_embd 384, block 256
#   seq    block 256, 512, 1024, 2048, 4096, 8192 at 2 layers, n_embd 256
# each in every precision (default fp32 and bf16); micro-batch = max(1, K / block) so a step
# holds K tokens (default 2048). --quick: width 128, 256 at 2 layers; depth 1, 2 at 128;
# block 256, 512 at 2 × 128; 3 steps after 1 warm-up; --gemm-rate peak (the e2e test).
#
# Per run: the median step_time_s of the steps after the W warm-up steps (metrics JSON), the
# tokens/s that gives, and:
# - GEMM-bound tokens/s = tokens / (GEMM FLOPs per step ÷ GEMM rate). GEMM FLOPs per step =
#   (6·N_linear + 12·L·C·T)·tokens: N_linear the linear layers' weights (L·(4C² + 2·C·F) +
#   V·C, F = 4C: qkv, attention projection, MLP, LM head; norms and biases excluded), 6 = the
#   forward product plus the two backward ones (dx, dW); attention's QKᵀ and P·V INCLUDED at
#   the full 12·L·C·T the MFU also counts (PaLM, Chowdhery et al. 2022, appendix B), as issue
#   16's 73.6 GFLOP for 6L/384 does, as if attention ran at the GEMM rate. The GEMM rate per
#   dtype (f32 for fp32 rows, bf16 for bf16 rows), --gemm-rate:
#     gemm_bench (default): shape-exact, per grid point: `gemm_bench --model L,C,4C,V,B·T`
#       times that model's linear-layer GEMMs (forward, dx, dW on the trainer's shapes) in f32
#       and bf16 (--cpu-time with 1 thread; 2 windows of ≥ 0.05 s per shape, ≈ 13 s per grid
#       point), and its FLOP-weighted rate is the row's rate (oneDNN's bf16 kernel, AMX where
#       the CPU has it, sets the bf16 bound).
#     peak (--quick's default): the measured peak below, the limit no GEMM can pass: a looser
#       bound, in seconds.
# - MFU against two peaks: training.peak_flops_per_core (2.19e11, the metrics' own mfu, DESIGN
#   machine notes) and this core's measured peak (bench/fma_peak: f32 FMA, AVX-512 or AVX2, for fp32
#   rows; for bf16 rows the fastest of that, AVX512_BF16 vdpbf16ps and AMX tdpbf16ps, since
#   oneDNN may run a bf16 GEMM on any of them), × threads. Model FLOPs = 6·N + 12·L·C·T per
#   token (meshtrain's flops_per_token).
# With R > 1 rounds the grid runs R times in alternation and each figure is the median.
#
# Environment: MESHTRAIN_BIN (default build/src/meshtrain/meshtrain), GEMM_BENCH (default
# build/bench/gemm_bench), FMA_PEAK (default build/bench/fma_peak). Exit 2 on a bad argument.
# --data DIR without meta.json is prepared from data/tinyshakespeare.txt, but only when DIR
# exists or lies inside the repository (relative paths are from the repository root).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
die() { echo "scaling_bench.sh: $*" >&2; exit 2; }
posint() { [[ $2 =~ ^[1-9][0-9]{0,5}$ ]] || die "$1 must be an integer from 1 to 999999, got '$2'"; }
nonneg() { [[ $2 =~ ^[0-9]{1,6}$ ]] || die "$1 must be an integer from 0 to 999999, got '$2'"; }

args="$*"
quick=0 steps=5 warmup=2 rounds=1 threads=1 tokens=2048
sweeps=width,depth,seq precisions=fp32,bf16
data_dir=data/prepared/shakespeare_char out=runs/scaling_bench
steps_set=0 warmup_set=0 gemm_rate=
while (($#)); do
  case $1 in
    --sweeps|--precisions|--steps|--warmup|--rounds|--threads|--tokens|--gemm-rate|--data|--out)
      (($# >= 2)) || die "$1 needs a value (see --help)" ;;
  esac
  case $1 in
    --quick) quick=1; shift ;;
    --sweeps) sweeps=$2; shift 2 ;;
    --precisions) precisions=$2; shift 2 ;;
    --steps) posint --steps "$2"; steps=$2; steps_set=1; shift 2 ;;
    --warmup) nonneg --warmup "$2"; warmup=$2; warmup_set=1; shift 2 ;;
    --rounds) posint --rounds "$2"; rounds=$2; shift 2 ;;
    --threads) posint --threads "$2"; threads=$2; shift 2 ;;
    --tokens) posint --tokens "$2"; tokens=$2; shift 2 ;;
    --gemm-rate) gemm_rate=$2; shift 2 ;;
    --data) data_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for s in ${sweeps//,/ }; do
  [[ $s == width || $s == depth || $s == seq ]] || die "--sweeps takes width,depth,seq; got '$s'"
done
for p in ${precisions//,/ }; do
  [[ $p == fp32 || $p == bf16 ]] || die "--precisions takes fp32,bf16; got '$p'"
done
if ((quick)); then
  ((steps_set)) || steps=3
  ((warmup_set)) || warmup=1
  : "${gemm_rate:=peak}"
fi
: "${gemm_rate:=gemm_bench}"
[[ $gemm_rate == gemm_bench || $gemm_rate == peak ]] ||
  die "--gemm-rate takes gemm_bench or peak; got '$gemm_rate'"

bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
gemm_bench=${GEMM_BENCH:-build/bench/gemm_bench}
fma_peak=${FMA_PEAK:-build/bench/fma_peak}
for b in "$bin" "$gemm_bench" "$fma_peak"; do
  [[ -x $b ]] || die "no binary at $b; run scripts/build.sh or set MESHTRAIN_BIN/GEMM_BENCH/FMA_PEAK"
done
if [[ ! -f $data_dir/meta.json ]]; then
  # Only prepare into a directory that exists, or a new one inside the repository (the default):
  # a typo'd --data must not create directories elsewhere on the machine.
  data_abs=$(realpath -m -- "$data_dir")
  if [[ ! -d $data_dir && $data_abs != "$PWD"/* ]]; then
    die "--data $data_dir: no such directory (and not a prepared one: no meta.json); point it at" \
        "a prepared data dir, or create it first (mkdir -p $data_abs) to have it prepared there"
  fi
  echo "== --data $data_dir has no meta.json: preparing data/tinyshakespeare.txt into $data_abs" >&2
  "$bin" prepare data/tinyshakespeare.txt --out "$data_dir" >/dev/null
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The grid: one "sweep L C T" line per run (a shape shared by two sweeps runs once per sweep).
grid() {
  local s
  for s in ${sweeps//,/ }; do
    if ((quick)); then
      case $s in
        width) printf 'width 2 %s 256\n' 128 256 ;;
        depth) printf 'depth %s 128 256\n' 1 2 ;;
        seq) printf 'seq 2 128 %s\n' 256 512 ;;
      esac
    else
      case $s in
        width) printf 'width 4 %s 256\n' 128 256 384 512 768 ;;
        depth) printf 'depth %s 384 256\n' 1 2 4 8 ;;
        seq) printf 'seq 2 256 %s\n' 256 512 1024 2048 4096 8192 ;;
      esac
    fi
  done
}

echo "scaling_bench: measured peak (fma_peak)" >&2
"$fma_peak" --json >"$work/peak.json"

# GEMM rate per dtype of grid point L C T B → gemm.L.C.T.B.json {"gflops": f32, "gflops_bf16":
# bf16} (gemm_bench's format), once per grid point.
vocab=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' \
  "$data_dir/meta.json")
gemm_rates() {  # L C T B
  local file="$work/gemm.$1.$2.$3.$4.json"
  [[ -f $file ]] && return 0
  if [[ $gemm_rate == gemm_bench ]]; then
    # --cpu-time (1 thread only) leaves out the time other processes take the core.
    local cpu_time=()
    ((threads == 1)) && cpu_time=(--cpu-time)
    echo "scaling_bench: GEMM rate of L=$1 C=$2 tokens=$(($3 * $4)) (gemm_bench $threads" \
      "--model ${cpu_time[*]})" >&2
    "$gemm_bench" "$threads" --json --dtypes f32,bf16 --windows 2 --min-seconds 0.05 \
      --model "$1,$2,$((4 * $2)),$vocab,$(($3 * $4))" "${cpu_time[@]}" 2>/dev/null >"$file"
  else
    /usr/bin/python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); t = int(sys.argv[2])
bf16 = max(p["bf16_flops"] or 0, p.get("amx_bf16_flops") or 0, p["f32_flops"])
print(json.dumps({"gflops": p["f32_flops"] * t / 1e9, "gflops_bf16": bf16 * t / 1e9}))' \
      "$work/peak.json" "$threads" >"$file"
  fi
}

peak_cfg=2.19e11
n=0
for ((r = 1; r <= rounds; ++r)); do
  while read -r sweep L C T; do
    B=$(( tokens / T > 0 ? tokens / T : 1 ))
    gemm_rates "$L" "$C" "$T" "$B"
    for p in ${precisions//,/ }; do
      n=$((n + 1))
      echo "round $r/$rounds: $sweep L=$L C=$C T=$T B=$B $p" >&2
      "$bin" train configs/shakespeare_char.toml \
        --model.n_layer "$L" --model.n_embd "$C" --model.n_head $((C / 64)) \
        --model.block_size "$T" --training.micro_batch "$B" --training.precision "$p" \
        --training.max_steps $((steps + warmup)) --training.threads "$threads" \
        --training.warmup_steps 1 --training.eval_interval 0 --training.eval_batches 1 \
        --training.log_interval 1000 --training.peak_flops_per_core "$peak_cfg" \
        --checkpoint.save_final false --data.dir "$data_dir" \
        --metrics "$work/run.$n.jsonl" >/dev/null
      echo "$sweep $L $C $T $B $p $r $work/run.$n.jsonl" >>"$work/runs.txt"
    done
  done < <(grid)
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
# (|| true: a CPU with none of them, e.g. AVX2 only, makes grep exit 1 under pipefail)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
        grep -E '^(avx2|fma|avx512f|avx512_bf16|amx_bf16|amx_tile|avx512_fp16)$' | paste -sd, - || true)
/usr/bin/python3 - "$work" "$out" "$warmup" "$threads" "$peak_cfg" "$cpu" "$flags" "$data_dir" \
  "$args" "$gemm_rate" <<'PY'
import json, statistics, sys
work, out, warmup, threads, peak_cfg, cpu, flags, data_dir = sys.argv[1:9]
warmup, threads, peak_cfg = int(warmup), int(threads), float(peak_cfg)
peak = json.load(open(f"{work}/peak.json"))
def rate_of(L, C, T, B, p):
    g = json.load(open(f"{work}/gemm.{L}.{C}.{T}.{B}.json"))
    return (g["gflops"] if p == "fp32" else g["gflops_bf16"]) * 1e9
# A bf16 GEMM may run on any of the units (oneDNN picks), so its peak is the fastest.
peak_meas = {"fp32": peak["f32_flops"],
             "bf16": max(peak["bf16_flops"] or 0, peak.get("amx_bf16_flops") or 0,
                         peak["f32_flops"])}
V = json.load(open(f"{data_dir}/meta.json"))["vocab_size"]  # the LM head's rows

runs = {}
for line in open(f"{work}/runs.txt"):
    sweep, L, C, T, B, p, r, path = line.split()
    steps = [json.loads(x) for x in open(path)]
    timed = [x for x in steps if x["step"] > warmup] or steps
    key = (sweep, int(L), int(C), int(T), int(B), p)
    runs.setdefault(key, []).append({
        "s": statistics.median(x["step_time_s"] for x in timed),
        "mfu": statistics.median(x["mfu"] for x in timed)})

rows = []
for (sweep, L, C, T, B, p), rs in runs.items():
    F, tokens = 4 * C, B * T
    s = statistics.median(x["s"] for x in rs)
    mfu_cfg = statistics.median(x["mfu"] for x in rs)
    n_linear = L * (4 * C * C + 2 * C * F) + V * C
    gemm_flops = (6 * n_linear + 12 * L * C * T) * tokens
    rate = {p: rate_of(L, C, T, B, p)}
    model_flops_s = mfu_cfg * peak_cfg * threads  # metrics mfu × the peak it was taken against
    rows.append({
        "sweep": sweep, "n_layer": L, "n_embd": C, "block_size": T, "micro_batch": B,
        "precision": p, "tokens_per_step": tokens, "rounds": len(rs),
        "step_s": s, "tokens_per_s": tokens / s,
        "gemm_flops_per_step": gemm_flops, "gemm_rate_flops": rate[p],
        "gemm_bound_step_s": gemm_flops / rate[p],
        "gemm_bound_tokens_per_s": tokens / (gemm_flops / rate[p]),
        "of_gemm_bound": (gemm_flops / rate[p]) / s,
        "model_flops_per_s": model_flops_s,
        "mfu_cfg": mfu_cfg, "mfu_measured": model_flops_s / (peak_meas[p] * threads)})

meta = {"cpu": cpu, "flags": flags, "threads": threads, "warmup": warmup,
        "peak_cfg_per_core": peak_cfg, "peak_measured_per_core": peak_meas, "fma_peak": peak,
        "gemm_rate_source": sys.argv[10], "vocab": V, "args": sys.argv[9],
        "gemm_flops": "(6*N_linear + 12*L*C*T)*tokens, N_linear = L*(4C^2+2CF)+V*C"}
json.dump({"meta": meta, "rows": rows}, open(f"{out}/scaling.json", "w"), indent=1)

lines = [
    f"scaling: {cpu} ({flags}), {threads} thread(s); GEMM rate per row ({sys.argv[10]}: "
    f"{'shape-exact, per model' if sys.argv[10] == 'gemm_bench' else 'the measured peak'}); measured peak per core "
    f"(fma_peak) f32 FMA {peak['f32_flops'] / 1e9:.0f}, bf16 dot "
    f"{(peak['bf16_flops'] or 0) / 1e9:.0f}, AMX {(peak.get('amx_bf16_flops') or 0) / 1e9:.0f}"
    f" GFLOP/s (bf16 rows: the fastest); configured "
    f"{peak_cfg / 1e9:.0f}",
    "",
    "| sweep | prec | L | C | T | B | ms/step | tokens/s | GEMM GFLOP/s | GEMM-bound tokens/s "
    "| of bound | model GFLOP/s | MFU (219) | MFU (measured peak) |",
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
    "| ---: |"]
for x in rows:
    lines.append(
        f"| {x['sweep']} | {x['precision']} | {x['n_layer']} | {x['n_embd']} | {x['block_size']} "
        f"| {x['micro_batch']} | {x['step_s'] * 1e3:.1f} | {x['tokens_per_s']:.0f} "
        f"| {x['gemm_rate_flops'] / 1e9:.0f} | {x['gemm_bound_tokens_per_s']:.0f} | {x['of_gemm_bound'] * 100:.0f}% "
        f"| {x['model_flops_per_s'] / 1e9:.1f} | {x['mfu_cfg'] * 100:.1f}% "
        f"| {x['mfu_measured'] * 100:.1f}% |")
text = "\n".join(lines) + "\n"
open(f"{out}/scaling.md", "w").write(text)
print(text, end="")
PY
/usr/bin/python3 bench/plot_scaling.py "$out/scaling.json" "$out/scaling.png"
echo "scaling_bench: wrote $out/scaling.md, $out/scaling.json, $out/scaling.png" >&2
