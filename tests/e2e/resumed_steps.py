#!/usr/bin/env python3
"""A job that `meshtrain launch` restarted, against the same job uninterrupted (e2e tests).

Usage: resumed_steps.py REF.jsonl RUN.jsonl LAUNCH.log LAST_STEP

Finds the first step the restarted attempt logged (after "restart 1 of" in the launcher's
log), checks that RUN's metrics hold every step from it to LAST_STEP and that their loss,
grad_norm and val_loss are the same text as REF's — equal text is equal bits: nlohmann prints
the shortest representation that round-trips — and prints that first step and the final loss.
The metrics file may hold the killed attempt's lines too: the last line of a step is the one
the finished job wrote.
"""
import re
import sys

KEYS = ("loss", "grad_norm", "val_loss")


def fields(line):
    return {k: m.group(1) for k in ("step",) + KEYS
            if (m := re.search(r'"%s":([^,}]+)' % k, line))}


def steps(path):
    return {int(f["step"]): f for f in map(fields, open(path))}


def main(ref_path, run_path, log_path, last):
    last = int(last)
    ref, run = steps(ref_path), steps(run_path)
    after = open(log_path).read().split("meshtrain launch: restart 1 of", 1)
    assert len(after) == 2, "the launcher logged no restart"
    first = re.search(r"^step\s+(\d+)/%d" % last, after[1], re.M)
    assert first, "the restarted attempt logged no step"
    first = int(first.group(1))
    missing = [s for s in range(first, last + 1) if s not in run]
    assert not missing, f"steps {missing} missing from the restarted run's metrics"
    diffs = [f"step {s} {k}: {run[s].get(k)} vs {ref[s].get(k)}" for s in range(first, last + 1)
             for k in KEYS if run[s].get(k) != ref[s].get(k)]
    assert not diffs, "the resumed run differs from the uninterrupted one:\n  " + "\n  ".join(
        diffs[:10])
    print(first, run[last]["loss"])


if __name__ == "__main__":
    main(*sys.argv[1:])
