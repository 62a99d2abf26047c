#!/usr/bin/env bash
# bench/run_bench.sh — meshtrain against PyTorch on the main job's configuration, on this
# machine, in one invocation (a command, not a test: never in CTest).
#
#   bench/run_bench.sh [--steps N] [--warmup W] [--threads T] [--keep] [--peer-only]
#                      [--peer-steps N] [--peer-cores 1,2] [--peer-coretypes LIST]
#                      [--peer-configs nanogpt,6l384] [--peer-precisions fp32,bf16]
#
# Runs, one after the other (never concurrently: they share the cores):
#   (a) bench/torch_gpt_train.py: nanoGPT's training step in PyTorch (eager, fp32) on
#       configs/shakespeare_char.toml's model, batch and optimizer, T threads;
#   (b) meshtrain train on the same config, T threads, 1 process;
#   (c) meshtrain with 1 process × 1 thread, and dp=2 under mpirun (2 processes × 1 thread,
#       micro-batch 6: the same global batch of 12), for the data-parallel speed-up: three
#       alternating rounds, the median ratio reported;
#   (d) gemm_bench T --json: the GEMM rate meshtrain's kernels reach on the job's shapes,
#       against which MFU is stated (flops per token 6·N + 12·L·C·T, N without wpe, as
#       GptModel::flops_per_token).
#   (e) peer baseline, same cores: for the nanoGPT config and GPT-2 6L/384 (T 256, B 4), at
#       each core count of --peer-cores (taskset -c 0..c-1 for both programs):
#       bench/torch_best.py — PyTorch at its verified best over OpenBLAS build × coretype ×
#       torch threads × BLAS threads, fp32 and bf16 autocast — then meshtrain at
#       `training.threads c` in fp32 and bf16; prints the speed-up PyTorch ms ÷ meshtrain ms
#       per config, cores and precision (> 1: meshtrain faster), goals ≥ 2× (nanoGPT) and
#       ≥ 1.6× (6L/384) in fp32 (issue 16). Then gemm_bench c --model … on the same CPUs, and
#       bench/fma_peak once on CPU 0, give each fp32 row two ceilings on its speed-up
#       (bench/peer_table.py): PyTorch ms ÷ the step's GEMMs alone on oneDNN, and ÷ its GEMM
#       FLOPs at c × the measured FMA peak — a goal above the latter cannot be met on this
#       machine by any implementation of the same model. --peer-only runs (e) alone.
# Every figure is the median over N timed steps after W warm-up steps (meshtrain: median
# step_time_s of the metrics JSON lines with step > W). Defaults: N=60, W=10, T=nproc;
# about 2–4 minutes here, most of it PyTorch, plus (e): --peer-steps (default 20 on nanoGPT,
# a quarter of it, at least 4, on 6L/384) after 5 (2) warm-up; 8–15 minutes on a loaded VM.
# --peer-coretypes: the OPENBLAS_CORETYPE values torch_best.py tries (default
# auto,SkylakeX,Cooperlake); --peer-configs / --peer-precisions narrow (e) to some configs or
# precisions (on a loaded VM the 6L/384 grid alone can take 15 minutes).
#
# Environment:
#   MESHTRAIN_BIN    meshtrain binary (default build/src/meshtrain/meshtrain)
#   GEMM_BENCH_BIN   gemm_bench binary (default: bench/gemm_bench in the same build tree)
#   FMA_PEAK_BIN     fma_peak binary (default: next to gemm_bench)
#   TORCH_PYTHON     a Python that imports torch (default /usr/bin/python3, Debian's
#                    python3-torch)
#   TORCH_BLAS_DIR   a directory holding the libblas.so.3 PyTorch should load (put first on
#                    PyTorch's LD_LIBRARY_PATH only). Debian's torch is built with
#                    BLAS_INFO=generic and calls whatever libblas.so.3 the system selects: the
#                    reference (netlib) BLAS unless an optimised one is installed, ≈4 GFLOP/s,
#                    which makes PyTorch a straw man. By default this script therefore unpacks
#                    Debian's OpenBLAS (OpenMP build) into build/bench_openblas with
#                    `apt-get download` + `dpkg -x` — the system's BLAS is not changed — and
#                    PyTorch runs on it. TORCH_BLAS_DIR=system keeps the system's BLAS.
#                    (The OpenMP build, not the pthread one: the pthread one's threads fight
#                    PyTorch's OpenMP threads for the 2 cores, measured 3× slower per step.)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps=60 warmup=10 threads=$(nproc) keep=0 peer_only=0 peer_steps=20 peer_cores=1,2
peer_coretypes=auto,SkylakeX,Cooperlake peer_configs=nanogpt,6l384 peer_precisions=fp32,bf16
while (($#)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --peer-only) peer_only=1; shift ;;
    --peer-steps) peer_steps=$2; shift 2 ;;
    --peer-cores) peer_cores=$2; shift 2 ;;
    --peer-coretypes) peer_coretypes=$2; shift 2 ;;
    --peer-configs) peer_configs=$2; shift 2 ;;
    --peer-precisions) peer_precisions=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for name in ${peer_configs//,/ }; do  # checked before anything runs: each run takes minutes
  [[ $name == nanogpt || $name == 6l384 ]] ||
    { echo "run_bench.sh: --peer-configs '$name': expected nanogpt and/or 6l384" >&2; exit 2; }
done

config=configs/shakespeare_char.toml
data_dir=data/prepared/shakespeare_char
bin=${MESHTRAIN_BIN:-build/src/meshtrain/meshtrain}
gemm_bin=${GEMM_BENCH_BIN:-$(dirname "$(dirname "$(dirname "$bin")")")/bench/gemm_bench}
fma_bin=${FMA_PEAK_BIN:-$(dirname "$gemm_bin")/fma_peak}
python=${TORCH_PYTHON:-/usr/bin/python3}
total_steps=$((steps + warmup))

if [[ ! -x $bin ]]; then
  echo "run_bench.sh: no meshtrain binary at $bin; build first (cmake -S . -B build -G Ninja &&" \
       "cmake --build build) or set MESHTRAIN_BIN" >&2
  exit 2
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "run_bench.sh: $python cannot import torch (Debian: apt-get install python3-torch;" \
       "or set TORCH_PYTHON)" >&2
  exit 2
fi
if [[ -z ${TORCH_BLAS_DIR:-} ]]; then
  TORCH_BLAS_DIR=$PWD/build/bench_openblas/usr/lib/x86_64-linux-gnu/openblas-openmp
  if [[ ! -f $TORCH_BLAS_DIR/libblas.so.3 ]]; then
    echo "== unpacking Debian's libopenblas0-openmp for the PyTorch baseline into build/bench_openblas"
    (mkdir -p build/bench_openblas && cd build/bench_openblas &&
     apt-get download libopenblas0-openmp >/dev/null && dpkg -x libopenblas0-openmp_*.deb .) ||
      { echo "run_bench.sh: could not fetch libopenblas0-openmp (run apt-get update?)," \
             "or set TORCH_BLAS_DIR=system" >&2; exit 2; }
  fi
elif [[ $TORCH_BLAS_DIR == system ]]; then
  TORCH_BLAS_DIR=
fi
if [[ ! -f $data_dir/train.bin ]]; then
  echo "== preparing $data_dir"
  "$bin" prepare data/tinyshakespeare.txt --out "$data_dir"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain_bench.XXXXXX")
if ((keep)); then echo "== keeping outputs in $work"; else trap 'rm -rf "$work"' EXIT; fi
# Other work on the cores ruins every figure here: sample the CPU use for one second first.
cpu_busy_pct() {
  local a b
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  local total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  local idle=$((b[4] - a[4] + b[5] - a[5]))
  echo $((total > 0 ? 100 * (total - idle) / total : 0))
}
busy=$(cpu_busy_pct)
echo "== $(date -u +%FT%TZ) $(nproc) cores, ${busy}% busy before starting;" \
     "steps $steps after $warmup warm-up, $threads thread(s)"
if ((busy > 10)); then
  echo "   warning: something else is using the CPUs: timings will be noisy and slow"
fi

# meshtrain train, common flags: no periodic eval (the final one is 1 batch), no checkpoint.
mt_train() {  # mt_train <metrics> <log> <processes> <extra flags...>
  local metrics=$1 log=$2 np=$3; shift 3
  local launch=("$bin")
  if ((np > 1)); then
    launch=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            mpirun --oversubscribe -np "$np" "$bin")
  fi
  "${launch[@]}" train "$config" --training.max_steps "$total_steps" \
    --training.eval_interval 0 --training.eval_batches 1 --checkpoint.save_final false \
    --metrics "$metrics" "$@" > "$log" 2>&1 ||
    { echo "run_bench.sh: meshtrain failed; its log ($log):" >&2; tail -20 "$log" >&2; exit 1; }
}

peer_bench() {  # (e): PyTorch at its best and meshtrain on the same cores, both configs
  local name overrides c p tsteps twarm cpus model b
  for b in "$gemm_bin" "$fma_bin"; do
    [[ -x $b ]] || { echo "run_bench.sh: (e) needs $b (cmake --build build --target" \
                          "gemm_bench fma_peak, or set GEMM_BENCH_BIN / FMA_PEAK_BIN)" >&2; exit 2; }
  done
  taskset -c 0 "$fma_bin" --json > "$work/peak.json"
  for name in ${peer_configs//,/ }; do
    if [[ $name == nanogpt ]]; then
      overrides=() tsteps=$peer_steps twarm=5 model=4,128,512,65,768,64,4
    else  # 6l384 (the names were checked with the arguments)
      overrides=(--model.n_layer 6 --model.n_head 6 --model.n_embd 384 --model.block_size 256
                 --training.micro_batch 4)
      tsteps=$((peer_steps / 4 > 4 ? peer_steps / 4 : 4)) twarm=2 model=6l384
    fi
    echo "== (e) $name: PyTorch at its best (bench/torch_best.py, cores $peer_cores)"
    "$python" bench/torch_best.py --config "$config" --data "$data_dir" --cores "$peer_cores" \
      --coretypes "$peer_coretypes" --precisions "$peer_precisions" --steps "$tsteps" --warmup "$twarm" \
      --json "$work/best_$name.json" "${overrides[@]}" | tee "$work/best_$name.txt"
    for c in ${peer_cores//,/ }; do
      cpus=$(seq -s, 0 $((c - 1)))
      for p in ${peer_precisions//,/ }; do
        echo "== (e) $name: meshtrain $p, 1 process × $c thread(s) on CPUs $cpus"
        taskset -c "$cpus" "$bin" train "$config" --training.max_steps $((tsteps + twarm)) \
          --training.eval_interval 0 --training.eval_batches 1 --checkpoint.save_final false \
          --training.threads "$c" --training.precision "$p" "${overrides[@]}" \
          --metrics "$work/peer_${name}_${c}_$p.jsonl" > "$work/peer_${name}_${c}_$p.log" 2>&1 \
          < /dev/null || { echo "run_bench.sh: meshtrain failed:" >&2
                           tail -20 "$work/peer_${name}_${c}_$p.log" >&2; exit 1; }
      done
      echo "== (e) $name: gemm_bench $c --model $model on CPUs $cpus (the step's GEMMs alone)"
      taskset -c "$cpus" "$gemm_bin" "$c" --json --dtypes f32 --model "$model" \
        > "$work/gemm_${name}_$c.json" 2> "$work/gemm_${name}_$c.log" ||
        { echo "run_bench.sh: gemm_bench failed:" >&2; tail -5 "$work/gemm_${name}_$c.log" >&2
          exit 1; }
    done
  done
  "$python" bench/peer_table.py "$work" "$peer_cores" "$peer_configs" "$peer_precisions"
}

if ((peer_only)); then
  peer_bench
  exit 0
fi

echo "== (a) PyTorch, $threads thread(s)"
(
  export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
  if [[ -n ${TORCH_BLAS_DIR:-} ]]; then
    export LD_LIBRARY_PATH=$TORCH_BLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  "$python" bench/torch_gpt_train.py --config "$config" --threads "$threads" --steps "$steps" \
    --warmup "$warmup" --json > "$work/torch.json"
)
echo "== (b) meshtrain, 1 process × $threads thread(s)"
mt_train "$work/mt.jsonl" "$work/mt.log" 1 --training.threads "$threads"
# The dp=2 speed-up is a ratio of two runs on a shared VM; alternating 3 rounds and taking
# the median ratio keeps one disturbed run from deciding it.
for round in 1 2 3; do
  echo "== (c) round $round: meshtrain 1 process × 1 thread, then dp=2 (2 processes × 1 thread," \
       "micro-batch 6)"
  mt_train "$work/mt_1x1_$round.jsonl" "$work/mt_1x1_$round.log" 1 --training.threads 1
  mt_train "$work/mt_dp2_$round.jsonl" "$work/mt_dp2_$round.log" 2 --parallel.dp 2 \
    --training.micro_batch 6 --training.threads 1
done
echo "== (d) gemm_bench, $threads thread(s)"
if [[ -x $gemm_bin ]]; then
  "$gemm_bin" "$threads" --json --dtypes f32 > "$work/gemm.json" 2> "$work/gemm.log" ||
    { echo "   gemm_bench failed:" >&2; tail -5 "$work/gemm.log" >&2; rm -f "$work/gemm.json"; }
else
  echo "   gemm_bench not found at $gemm_bin (build it: cmake --build <build> --target" \
       "gemm_bench, or set GEMM_BENCH_BIN): MFU against the measured GEMM rate is not reported"
fi

"$python" - "$work" "$warmup" "$threads" "$config" "$gemm_bin" <<'EOF'
import json, os, re, statistics, sys

work, warmup, threads, config, gemm_bin = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    sys.argv[4], sys.argv[5]

def meshtrain(name):
    rows = [json.loads(l) for l in open(os.path.join(work, name + ".jsonl")) if l.strip()]
    timed = [r["step_time_s"] for r in rows if r["step"] > warmup]
    median = statistics.median(timed)
    tokens_per_step = rows[-1]["tokens_per_s"] * rows[-1]["step_time_s"]
    log = open(os.path.join(work, name + ".log")).read()
    params = int(re.search(r"(\d+) parameters", log).group(1))
    return {"ms": median * 1e3, "ms_mean": statistics.fmean(timed) * 1e3, "tps": tokens_per_step / median, "steps": len(timed),
            "params": params, "last_loss": rows[-1]["loss"], "mfu_peak": statistics.median(
                r["mfu"] for r in rows if r["step"] > warmup)}

torch = json.load(open(os.path.join(work, "torch.json")))
mt = meshtrain("mt")
rounds = [(meshtrain(f"mt_1x1_{r}"), meshtrain(f"mt_dp2_{r}")) for r in (1, 2, 3)]
round_speedups = [dp2["tps"] / mt1["tps"] for mt1, dp2 in rounds]
mt1, dp2 = rounds[round_speedups.index(statistics.median(round_speedups))]
gemm_path = os.path.join(work, "gemm.json")
gemm = json.load(open(gemm_path))["gflops"] if os.path.exists(gemm_path) else None

if torch["params"] != mt["params"]:
    print(f"warning: PyTorch model has {torch['params']} parameters, meshtrain "
          f"{mt['params']}: not the same model")
fpt = torch["flops_per_token"]
ratio = torch["ms_per_step"] / mt["ms"]
speedup = statistics.median(round_speedups)

def verdict(x, target):
    return "meets" if x >= target else "BELOW"

blas = ", ".join(torch["blas"]) or "none found"
print()
print(f"meshtrain bench: {config} ({mt['params']} parameters, global batch 12 × 64 tokens), "
      f"median of {mt['steps']} steps after {warmup} warm-up (mean in brackets: far above the "
      f"median means the run was disturbed)")
print(f"PyTorch {torch['torch']} eager fp32, BLAS: {blas}")
if torch["blas_is_reference"]:
    print("  note: PyTorch runs on the reference (netlib) BLAS: a weak baseline; "
          "TORCH_BLAS_DIR=<dir with an optimised libblas.so.3> gives a fair one")
rows = [
    ("PyTorch ms/step", f"{threads} thr", f"{torch['ms_per_step']:.2f}",
     f"(mean {torch['ms_per_step_mean']:.2f})"),
    ("meshtrain ms/step", f"{threads} thr", f"{mt['ms']:.2f}", f"(mean {mt['ms_mean']:.2f})"),
    ("speed-up meshtrain vs PyTorch", f"{threads} thr", f"{ratio:.2f}×",
     f"≥3×: {verdict(ratio, 3.0)}"),
    ("meshtrain tokens/s, 1 process", "1 thr", f"{mt1['tps']:.0f}",
     f"({mt1['ms']:.2f} ms/step)"),
    ("meshtrain tokens/s, dp=2", "2×1 thr", f"{dp2['tps']:.0f}", f"({dp2['ms']:.2f} ms/step)"),
    ("dp=2 speed-up (same global batch)", "median of 3", f"{speedup:.2f}×",
     f"≥1.8×: {verdict(speedup, 1.8)}; rounds "
     + ", ".join(f"{x:.2f}×" for x in round_speedups)),
]
if gemm is not None:
    rows += [
        ("GEMM rate (gemm_bench --json)", f"{threads} thr", f"{gemm:.1f} GFLOP/s", ""),
        ("MFU meshtrain vs measured GEMM", f"{threads} thr",
         f"{100 * mt['tps'] * fpt / (gemm * 1e9):.1f}%", ""),
        ("MFU PyTorch vs measured GEMM", f"{threads} thr",
         f"{100 * torch['tokens_per_s'] * fpt / (gemm * 1e9):.1f}%", ""),
    ]
else:
    rows.append(("MFU vs measured GEMM", "", "n/a", f"no gemm_bench at {gemm_bin}"))
rows.append(("MFU meshtrain vs fp32 FMA peak", f"{threads} thr",
             f"{100 * mt['mfu_peak']:.1f}%", "(meshtrain's own metric)"))
w = [max(len(r[i]) for r in rows) for i in range(4)]
for r in rows:
    print(f"  {r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]}")
print(f"  (flops/token {fpt:.0f}; last losses: PyTorch {torch['last_loss']:.3f}, "
      f"meshtrain {mt['last_loss']:.3f})")
EOF

peer_bench
