#!/usr/bin/env bash
# e2e.peer_table: bench/peer_table.py, the table of bench/run_bench.sh part (e), on made-up
# inputs whose figures are known: the speed-up (PyTorch ms ÷ meshtrain's median step after the
# warm-up), the two ceilings on it (÷ the step's GEMM seconds on oneDNN; ÷ its GEMM FLOPs at
# cores × the FMA peak), the three verdicts ("meets", "BELOW", "BELOW; beyond the FMA-peak
# bound"), no bounds on bf16 rows; a missing or malformed input exits 1 naming the file (and the
# field), bad arguments exit 2.
#   peer_table.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=/usr/bin/python3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/peer_table.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$tmp/out.txt" >&2 || true; exit 1; }

# One core's FMA peak 1e11 FLOP/s. PyTorch's best: nanoGPT 100 ms on 1 and 2 cores; 6L/384
# 1000 ms on 1 core (fp32 and bf16). meshtrain (warm-up 2: steps 1–2 are ignored, their huge
# times must not count): nanoGPT 40 ms (1 core), 80 ms (2 cores); 6L/384 800 ms, bf16 500 ms.
# GEMMs: nanoGPT 3e9 + 1e9 FLOPs, 20 + 5 ms on 1 core, 10 + 2.5 ms on 2; 6L/384 6.5e10 + 0.5e10
# FLOPs (700 ms at the peak of one core), 600 + 25 ms.
"$py" - "$tmp" <<'PY'
import json, os, sys
work = sys.argv[1]
def dump(name, obj):
    with open(os.path.join(work, name), "w") as f:
        json.dump(obj, f)
def setting(threads):
    return {"build": "openmp", "coretype": "auto", "torch_threads": threads, "blas_threads": threads}
dump("peak.json", {"f32_flops": 1e11})
dump("best_nanogpt.json", {"args": {"warmup": 2}, "best": [
    {"cores": c, "precision": "fp32", "ms_per_step": 100.0, "setting": setting(c)} for c in (1, 2)]})
dump("best_6l384.json", {"args": {"warmup": 2}, "best": [
    {"cores": 1, "precision": p, "ms_per_step": 1000.0, "setting": setting(1)}
    for p in ("fp32", "bf16")]})
dump("gemm_nanogpt_1.json", {"flops_per_step": 3e9, "attention_flops_per_step": 1e9,
                             "seconds_per_step": 0.020, "attention_seconds_per_step": 0.005})
dump("gemm_nanogpt_2.json", {"flops_per_step": 3e9, "attention_flops_per_step": 1e9,
                             "seconds_per_step": 0.010, "attention_seconds_per_step": 0.0025})
dump("gemm_6l384_1.json", {"flops_per_step": 6.5e10, "attention_flops_per_step": 5e9,
                           "seconds_per_step": 0.600, "attention_seconds_per_step": 0.025})
def metrics(name, ms):
    with open(os.path.join(work, name), "w") as f:
        for step, t in enumerate([9.0, 9.0] + ms, start=1):
            f.write(json.dumps({"step": step, "step_time_s": t}) + "\n")
metrics("peer_nanogpt_1_fp32.jsonl", [0.039, 0.040, 0.041])
metrics("peer_nanogpt_2_fp32.jsonl", [0.080, 0.080, 0.079])
metrics("peer_6l384_1_fp32.jsonl", [0.800, 0.800, 0.801])
metrics("peer_6l384_1_bf16.jsonl", [0.500, 0.500, 0.499])
PY
"$py" "$root/bench/peer_table.py" "$tmp" 1,2 nanogpt fp32 > "$tmp/out.txt" || fail "nanogpt exit $?"
# nanoGPT 1 core: 100/40 = 2.50× meets; oneDNN 100/25 = 4.00×; peak 100/40 = 2.50×.
grep -qE 'nanoGPT.* 1 fp32 +40\.00 +100\.00 +2\.50× +4\.00× +2\.50× .*goal ≥2\.0×: meets$' \
  "$tmp/out.txt" || fail "nanoGPT 1-core row"
# 2 cores: 100/80 = 1.25×; oneDNN 100/12.5 = 8.00×; peak 100/(4e9/2e11 = 20 ms) = 5.00×: BELOW.
grep -qE 'nanoGPT.* 2 fp32 +80\.00 +100\.00 +1\.25× +8\.00× +5\.00× .*goal ≥2\.0×: BELOW$' \
  "$tmp/out.txt" || fail "nanoGPT 2-core row (the peak bound counts both cores)"
"$py" "$root/bench/peer_table.py" "$tmp" 1 6l384 fp32,bf16 > "$tmp/out.txt" || fail "6l384 exit $?"
# 6L/384: 1000/800 = 1.25×; oneDNN 1000/625 = 1.60×; peak 1000/700 = 1.43× < the 1.6 goal.
grep -qE '6L/384.* 1 fp32 +800\.00 +1000\.00 +1\.25× +1\.60× +1\.43× .*goal ≥1\.6×: BELOW; beyond the FMA-peak bound$' \
  "$tmp/out.txt" || fail "6L/384 fp32 row"
grep -qE '6L/384.* 1 bf16 +500\.00 +1000\.00 +2\.00× +— +— +openmp/auto, torch 1 thr, BLAS 1 thr$' \
  "$tmp/out.txt" || fail "6L/384 bf16 row: no bounds, no goal"

rm "$tmp/gemm_6l384_1.json"
set +e
"$py" "$root/bench/peer_table.py" "$tmp" 1 6l384 fp32 > "$tmp/out.txt" 2>&1
rc=$?
set -e
[[ $rc == 1 ]] || fail "a missing gemm JSON: exit $rc, expected 1"
grep -q 'cannot read .*gemm_6l384_1.json' "$tmp/out.txt" || fail "the missing file is not named"
# A malformed input exits 1 naming the file and the field; bad arguments exit 2.
expect_exit() {  # expect_exit <rc> <pattern> <args...>
  local want=$1 pattern=$2 rc; shift 2
  set +e
  "$py" "$root/bench/peer_table.py" "$@" > "$tmp/out.txt" 2>&1
  rc=$?
  set -e
  [[ $rc == "$want" ]] || fail "peer_table.py $*: exit $rc, expected $want"
  grep -q -- "$pattern" "$tmp/out.txt" || fail "peer_table.py $*: no '$pattern' in its message"
}
echo '{"f32_flops": "fast"}' > "$tmp/peak.json"
expect_exit 1 "peak.json: 'f32_flops' must be a number > 0, got 'fast'" "$tmp" 1 nanogpt fp32
echo '{"f32_flops": 1e11}' > "$tmp/peak.json"
echo '{"flops_per_step": 3e9, "seconds_per_step": NaN}' > "$tmp/gemm_nanogpt_1.json"
expect_exit 1 "gemm_nanogpt_1.json: 'seconds_per_step' must be a number > 0" "$tmp" 1 nanogpt fp32
echo '[1, 2]' > "$tmp/best_nanogpt.json"
expect_exit 1 "best_nanogpt.json: expected args.warmup" "$tmp" 1 nanogpt fp32
expect_exit 2 "must be integers ≥ 1" "$tmp" 0 nanogpt fp32
expect_exit 2 "among nanogpt, 6l384" "$tmp" 1 gpt4 fp32
echo "e2e.peer_table: OK"
