#!/usr/bin/python3
"""bench/plot_scaling.py — draws bench/scaling_bench.sh's scaling.json as a PNG.

    plot_scaling.py SCALING_JSON [SCALING_JSON ...] OUT_PNG

Several JSON files (e.g. one scaling_bench.sh run per sweep) are drawn as one: their rows
joined, the first file's machine line in the title. One column per sweep present (width: n_embd, depth: n_layer, seq: block_size). Top row:
tokens/s measured (solid) and GEMM-bound (dashed, same colour) per precision, log scale, so
the gap between a solid line and its dashed one is how far meshtrain is from the GEMM limit.
Bottom row: MFU against the measured peak (bench/fma_peak) and, dotted, against the configured
training.peak_flops_per_core. Needs matplotlib (python3-matplotlib, scripts/setup.sh); draws
with the Agg backend (no display). Exit 2 on bad arguments or a JSON without rows.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import matplotlib.ticker  # noqa: E402

X = {"width": ("n_embd", "model width n_embd"), "depth": ("n_layer", "depth n_layer"),
     "seq": ("block_size", "sequence length (block_size)")}
COLOURS = {"fp32": "tab:blue", "bf16": "tab:orange"}


def fixed_of(rows):
    """The two shape values a sweep holds fixed, for its panel title."""
    r = rows[0]
    return ", ".join(f"{k}={r[k]}" for k in ("n_layer", "n_embd", "block_size")
                     if all(x[k] == r[k] for x in rows))


def main(argv):
    if len(argv) < 3:
        print("usage: " + __doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    docs = [json.load(open(path)) for path in argv[1:-1]]
    rows = [r for d in docs for r in d.get("rows", [])]
    meta = docs[0].get("meta", {})
    sweeps = [s for s in X if any(r["sweep"] == s for r in rows)]
    if not sweeps:
        print(f"plot_scaling.py: no rows in {', '.join(argv[1:-1])}", file=sys.stderr)
        return 2
    fig, axes = plt.subplots(2, len(sweeps), figsize=(5 * len(sweeps), 7.5), squeeze=False)
    for col, sweep in enumerate(sweeps):
        key, label = X[sweep]
        mine = [r for r in rows if r["sweep"] == sweep]
        top, bottom = axes[0][col], axes[1][col]
        for prec in sorted({r["precision"] for r in mine}):
            pts = sorted((r for r in mine if r["precision"] == prec), key=lambda r: r[key])
            xs = [r[key] for r in pts]
            c = COLOURS.get(prec, None)
            top.plot(xs, [r["tokens_per_s"] for r in pts], "o-", color=c, label=f"{prec} measured")
            top.plot(xs, [r["gemm_bound_tokens_per_s"] for r in pts], "s--", color=c,
                     label=f"{prec} GEMM-bound ({meta.get('gemm_rate_source', '?')} rate)")
            bottom.plot(xs, [100 * r["mfu_measured"] for r in pts], "o-", color=c,
                        label=f"{prec} vs measured peak")
            bottom.plot(xs, [100 * r["mfu_cfg"] for r in pts], "^:", color=c,
                        label=f"{prec} vs {meta.get('peak_cfg_per_core', 0) / 1e9:.0f} GFLOP/s")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r[key] for r in mine}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel(label)
        top.set_yscale("log")
        top.set_ylabel("tokens/s")
        top.set_title(f"{sweep} sweep ({fixed_of(mine)})", fontsize=10)
        bottom.set_ylabel("MFU (%)")
        bottom.set_ylim(bottom=0)
        top.legend(fontsize=7)
        bottom.legend(fontsize=7)
    fig.suptitle(f"meshtrain train, {meta.get('threads', '?')} thread(s): {meta.get('cpu', '')} "
                 f"({meta.get('flags', '')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(argv[-1], dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
