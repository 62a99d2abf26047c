#!/usr/bin/env bash
# bench/scaling_bench.sh --quick end to end (issue 16 item 5; docs/performance.md "Scaling"):
# the grid's 6 shapes × fp32, bf16 train, and the table, JSON and PNG come out. Assertions:
# - scaling.json holds the 12 rows (width, depth and seq sweeps × 2 precisions) with positive
#   step time, tokens/s, GEMM FLOPs and rates; tokens/s = tokens per step ÷ step time;
# - every row's GEMM-bound tokens/s ≥ its measured tokens/s: the step runs those FLOPs and
#   more (softmax, norms, GELU, cross-entropy, AdamW), so it cannot beat the time they take at
#   the rate. --quick takes the measured FMA peak as that rate, which no GEMM passes; and the
#   peak is timed by thread CPU time (other processes' share of the core does not lower it)
#   while steps are timed by the wall clock (it slows them). Measured when written: the step
#   at 10–30 % of its bound, 6 jobs sharing the 2 cores;
# - MFU against the configured peak equals model FLOP/s ÷ 2.19e11 and is > 0; it is not bounded
#   by 1: 2.19e11 is a setting (an fp32 FMA peak), and a bf16 step on AMX passes it (101.6 % at
#   C 256 on an Intel Xeon model 167, CI 2026-12-03). MFU against the measured peak (the fastest
#   unit of the row's precision) lies in (0, 1];
# - scaling.md has the header and 12 table rows; scaling.png is a PNG of a plausible size;
# - bad arguments exit 2 (scaling_bench.sh and plot_scaling.py) before any training.
# Usage: scaling_bench.sh <meshtrain> <gemm_bench> <fma_peak> <prepared data dir>
set -euo pipefail
export MESHTRAIN_BIN=$1 GEMM_BENCH=$2 FMA_PEAK=$3
DATA=$4
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# A bad argument must stop the script before it trains: each call carries --quick and a
# scratch --out, and a time limit, so one that slipped through fails here in about a minute
# instead of running the full grid.
expect_exit2() {
  local rc=0
  timeout 300 "$@" >"$WORK/bad.out" 2>&1 || rc=$?
  if ((rc != 2)); then
    echo "FAIL: '$*' exited $rc, expected 2"; tail -5 "$WORK/bad.out"; exit 1
  fi
}
bench=("$ROOT/bench/scaling_bench.sh" --quick --data "$DATA" --out "$WORK/bad")
expect_exit2 bash "${bench[@]}" --bogus
expect_exit2 bash "${bench[@]}" --steps 0
expect_exit2 bash "${bench[@]}" --steps 99999999999999999999999
expect_exit2 bash "${bench[@]}" --steps
expect_exit2 bash "${bench[@]}" --rounds x
expect_exit2 bash "${bench[@]}" --sweeps width,height
expect_exit2 bash "${bench[@]}" --precisions fp32,fp8
expect_exit2 bash "${bench[@]}" --gemm-rate fastest
expect_exit2 /usr/bin/python3 "$ROOT/bench/plot_scaling.py"
echo '{"rows": []}' >"$WORK/empty.json"
expect_exit2 /usr/bin/python3 "$ROOT/bench/plot_scaling.py" "$WORK/empty.json" "$WORK/x.png"
[[ ! -e $WORK/bad/scaling.json ]] || { echo "FAIL: a rejected call wrote scaling.json"; exit 1; }
echo "bad arguments: exit 2"

bash "$ROOT/bench/scaling_bench.sh" --quick --data "$DATA" --out "$WORK/out"

/usr/bin/python3 - "$WORK/out" <<'PY'
import json, os, sys
out = sys.argv[1]
doc = json.load(open(f"{out}/scaling.json"))
rows, meta = doc["rows"], doc["meta"]
assert len(rows) == 12, f"{len(rows)} rows, expected 12"
assert {(r["sweep"], r["precision"]) for r in rows} == {
    (s, p) for s in ("width", "depth", "seq") for p in ("fp32", "bf16")}
for k in ("fp32", "bf16"):
    assert meta["peak_measured_per_core"][k] > 0, meta
failed = 0
for r in rows:
    name = f"{r['sweep']} {r['precision']} L={r['n_layer']} C={r['n_embd']} T={r['block_size']}"
    for k in ("step_s", "tokens_per_s", "gemm_flops_per_step", "gemm_rate_flops",
              "gemm_bound_tokens_per_s", "model_flops_per_s"):
        assert r[k] > 0, f"{name}: {k} = {r[k]}"
    assert abs(r["tokens_per_s"] * r["step_s"] - r["tokens_per_step"]) < 1e-6 * r["tokens_per_step"]
    assert abs(r["mfu_cfg"] * 2.19e11 * meta["threads"] - r["model_flops_per_s"]) \
        < 1e-9 * r["model_flops_per_s"], name
    ok = (r["gemm_bound_tokens_per_s"] >= r["tokens_per_s"] and r["mfu_cfg"] > 0
          and 0 < r["mfu_measured"] <= 1)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {r['tokens_per_s']:.0f} tokens/s, GEMM-bound "
          f"{r['gemm_bound_tokens_per_s']:.0f} ({100 * r['of_gemm_bound']:.0f} %), MFU "
          f"{100 * r['mfu_cfg']:.1f} % / {100 * r['mfu_measured']:.1f} % (measured peak)")
    failed += not ok
md = open(f"{out}/scaling.md").read().splitlines()
table = [l for l in md if l.startswith("| ") and not l.startswith(("| sweep", "| ---"))]
assert any(l.startswith("| sweep | prec |") for l in md), "scaling.md: no table header"
assert len(table) == 12, f"scaling.md: {len(table)} table rows, expected 12"
png = open(f"{out}/scaling.png", "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n", "scaling.png is not a PNG"
assert len(png) > 20000, f"scaling.png: {len(png)} bytes, too small for 6 panels"
sys.exit(1 if failed else 0)
PY
echo "PASS"
