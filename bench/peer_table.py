#!/usr/bin/env python3
"""bench/peer_table.py — the table of bench/run_bench.sh part (e): meshtrain against PyTorch at
its best on the same cores, with the two ceilings that say how far a speed-up could go here.

    peer_table.py WORK CORES CONFIGS PRECISIONS      (CORES "1,2", CONFIGS "nanogpt,6l384",
                                                      PRECISIONS "fp32,bf16")

Reads from WORK what run_bench.sh wrote there:
  best_NAME.json             bench/torch_best.py --json (PyTorch's fastest verified setting per
                             cores and precision; its args.warmup);
  peer_NAME_C_P.jsonl        meshtrain's metrics (step_time_s per step);
  gemm_NAME_C.json           gemm_bench C --json --dtypes f32 --model … on the same cores: the
                             step's linear-layer GEMMs (flops_per_step, seconds_per_step) and
                             the attention core's products at their causal half
                             (attention_flops_per_step, attention_seconds_per_step);
  peak.json                  fma_peak --json: one core's measured f32 FMA peak (f32_flops).

For each fp32 row it prints, besides the speed-up (PyTorch ms ÷ meshtrain ms), two ceilings on
that speed-up, both PyTorch ms ÷ a time no meshtrain step on these cores can beat with the
same arithmetic:
  oneDNN bound   ÷ the step's GEMMs alone at the rates gemm_bench measured (linear + attention
                 seconds): a step that did nothing but its GEMMs, on oneDNN;
  FMA-peak bound ÷ (the step's GEMM FLOPs ÷ (C × one core's f32 FMA peak)): a step that did
                 nothing but its GEMM FLOPs, every core at its measured peak — no GEMM
                 library and no fusion can pass it.
A goal above the FMA-peak bound cannot be met on this machine by any implementation of the
same model; the verdict says so. Goals (issue 16, fp32): ≥ 2× on nanoGPT, ≥ 1.6× on 6L/384.
Exit 1 when an input is missing or malformed (the message names the file and, where it is one,
the field); exit 2 on bad arguments.
"""
import json
import math
import os
import statistics
import sys

GOAL = {"nanogpt": 2.0, "6l384": 1.6}
LABEL = {"nanogpt": "nanoGPT 4L/128 T64 B12", "6l384": "GPT-2 6L/384 T256 B4"}


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"peer_table.py: cannot read {path}: {e}")


def number(obj, key, path, default=None):
    """obj[key] as a finite float > 0 (or default where the key is absent); exits 1 naming path
    and key otherwise."""
    if isinstance(obj, dict) and key not in obj and default is not None:
        return default
    value = obj.get(key) if isinstance(obj, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf:
        return float(value)
    sys.exit(f"peer_table.py: {path}: '{key}' must be a number > 0, got {value!r}")


def meshtrain_ms(path, warmup):
    """Median step_time_s (ms) over the steps after `warmup`."""
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"peer_table.py: cannot read {path}: {e}")
    times = [number(r, "step_time_s", path) for r in rows
             if isinstance(r, dict) and "step_time_s" in r and number(r, "step", path) > warmup]
    if not times:
        sys.exit(f"peer_table.py: {path} has no step after warm-up {warmup}")
    return 1e3 * statistics.median(times)


def bounds(gemm, path, f32_peak, cores):
    """(oneDNN-bound ms, FMA-peak-bound ms) of one step from gemm_bench's JSON (read from path)
    and fma_peak's f32 FLOP/s per core."""
    seconds = number(gemm, "seconds_per_step", path) + number(
        gemm, "attention_seconds_per_step", path, 0.0)
    flops = number(gemm, "flops_per_step", path) + number(
        gemm, "attention_flops_per_step", path, 0.0)
    return 1e3 * seconds, 1e3 * flops / (cores * f32_peak)


def verdict(ratio, goal, peak_bound):
    if ratio >= goal:
        return "meets"
    if goal > peak_bound:
        return "BELOW; beyond the FMA-peak bound"
    return "BELOW"


def main(argv):
    usage = __doc__.split("\n\n")[1]
    if len(argv) != 5:
        sys.exit(usage)
    work = argv[1]
    names, precisions = argv[3].split(","), argv[4].split(",")
    try:
        cores = [int(c) for c in argv[2].split(",")]
    except ValueError:
        cores = []
    if not cores or min(cores) < 1 or any(n not in GOAL for n in names):
        print(f"peer_table.py: cores '{argv[2]}' must be integers ≥ 1 and configs '{argv[3]}' "
              f"among {', '.join(GOAL)}\n{usage}", file=sys.stderr)
        sys.exit(2)
    peak_path = os.path.join(work, "peak.json")
    f32_peak = number(load_json(peak_path), "f32_flops", peak_path)
    print("\nPeer baseline, same cores (speed-up = PyTorch-at-its-best ms ÷ meshtrain ms; the "
          "bounds: PyTorch ms ÷ the step's GEMMs on oneDNN, and ÷ its GEMM FLOPs at the FMA peak "
          f"of {f32_peak / 1e9:.1f} GFLOP/s per core):")
    print(f"  {'config':<24} {'cores':>5} {'prec':<5} {'meshtrain':>10} {'PyTorch':>9} "
          f"{'speed-up':>8} {'oneDNN bound':>12} {'FMA-peak bound':>14}  PyTorch setting; goal")
    for name in names:
        best_path = os.path.join(work, f"best_{name}.json")
        best = load_json(best_path)
        args = best.get("args") if isinstance(best, dict) else None
        warm = args.get("warmup") if isinstance(args, dict) else None
        if not isinstance(warm, int) or warm < 0 or not isinstance(best.get("best"), list):
            sys.exit(f"peer_table.py: {best_path}: expected args.warmup (an integer ≥ 0) and a "
                     "'best' list, as bench/torch_best.py --json writes")
        for c in cores:
            gemm_path = os.path.join(work, f"gemm_{name}_{c}.json")
            onednn_ms, peak_ms = bounds(load_json(gemm_path), gemm_path, f32_peak, c)
            for p in precisions:
                mt = meshtrain_ms(os.path.join(work, f"peer_{name}_{c}_{p}.jsonl"), warm)
                b = next((x for x in best["best"] if isinstance(x, dict)
                          and x.get("cores") == c and x.get("precision") == p), None)
                if b is None:
                    print(f"  {LABEL[name]:<24} {c:>5} {p:<5} {mt:>10.2f} {'none':>9}")
                    continue
                s, torch_ms = b.get("setting"), number(b, "ms_per_step", best_path)
                if not isinstance(s, dict) or not all(
                        k in s for k in ("build", "coretype", "torch_threads", "blas_threads")):
                    sys.exit(f"peer_table.py: {best_path}: a best entry without its setting")
                ratio = torch_ms / mt
                setting = (f"{s['build']}/{s['coretype']}, torch {s['torch_threads']} thr, "
                           f"BLAS {s['blas_threads']} thr")
                if p == "fp32":
                    onednn_x, peak_x = torch_ms / onednn_ms, torch_ms / peak_ms
                    cols = f"{onednn_x:>11.2f}× {peak_x:>13.2f}×"
                    setting += f"; goal ≥{GOAL[name]}×: {verdict(ratio, GOAL[name], peak_x)}"
                else:  # the bounds are f32 GEMM rates; the goals are fp32's
                    cols = f"{'—':>12} {'—':>14}"
                print(f"  {LABEL[name]:<24} {c:>5} {p:<5} {mt:>10.2f} {torch_ms:>9.2f} "
                      f"{ratio:>7.2f}× {cols}  {setting}")


if __name__ == "__main__":
    main(sys.argv)
