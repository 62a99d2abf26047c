#!/usr/bin/env python3
"""Checks a `meshtrain train --trace` file (docs/tracing.md) against the run that wrote it.

Usage: check_trace.py TRACE METRICS --ranks N --pp P --microbatches M --chunks V --steps S
           [--zero-bubble] [--eval-steps 2,4] [--checkpoint-steps 2,4] [--axes pp,dp,tp]

Asserts: valid JSON in the Trace Event Format; a named process per rank with its two threads;
per rank and step one "step" event holding that step's phases, which do not overlap on the
phases thread and come in order (data/forward/backward…, grad_reduce, grad_norm, optimizer,
eval, checkpoint); forward and backward once per (micro-batch, chunk) of the schedule; every
block event inside a forward, backward or eval; every comm event with group, axis, op, bytes,
wait; per rank, step and group the traced bytes inside the step window equal what the
ProcessGroup counters counted there (the trace's "meshtrain" record), and on rank 0 per axis
the --metrics line's tp/dp/cp/ep_comm_bytes; no event dropped. Exit 1 with the reasons.
"""
import argparse
import bisect
import collections
import json
import sys

EPS_US = 1e-3  # ts and dur come from integer ns: one ns of rounding
COMPUTE = {"data", "forward", "backward", "backward_input", "backward_weight"}
AFTER = ["grad_reduce", "grad_norm", "optimizer", "eval", "checkpoint"]
METRIC_AXES = {"tp": ["tp"], "dp": ["dp", "dp_cp"], "cp": ["cp"], "ep": ["ep"]}


class Failures(list):
    def check(self, ok, message):
        if not ok:
            self.append(message)
        return ok


def parse_steps(text):
    return {int(s) for s in text.split(",") if s}


def check_metadata(events, ranks, fail):
    names = {(e["pid"], e.get("tid"), e["name"]): e["args"].get("name")
             for e in events if e["ph"] == "M"}
    for r in range(ranks):
        fail.check(str(names.get((r, 0, "process_name"), "")).startswith(f"rank {r} "),
                   f"rank {r}: no process_name 'rank {r} (...)'")
        fail.check(names.get((r, 0, "thread_name")) == "phases", f"rank {r}: no 'phases' thread")
        fail.check(names.get((r, 1, "thread_name")) == "comm", f"rank {r}: no 'comm' thread")
    xs = [e for e in events if e["ph"] == "X"]
    fail.check({e["pid"] for e in xs} == set(range(ranks)),
               f"tracks {sorted({e['pid'] for e in xs})}, expected ranks 0..{ranks - 1}")
    for e in xs:
        if not (isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
                and e["dur"] >= 0 and "name" in e and "tid" in e):
            fail.append(f"malformed X event {e}")
            break


def check_step(rank, step, evs, a, fail):
    where = f"rank {rank} step {step}"
    steps = [e for e in evs if e["cat"] == "step"]
    if not fail.check(len(steps) == 1, f"{where}: {len(steps)} step events"):
        return
    lo, hi = steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]
    phases = sorted((e for e in evs if e["cat"] == "phase"), key=lambda e: e["ts"])
    for e in phases:
        fail.check(e["tid"] == 0, f"{where}: phase {e['name']} off the phases thread")
        fail.check(lo - EPS_US <= e["ts"] and e["ts"] + e["dur"] <= hi + EPS_US,
                   f"{where}: {e['name']} outside its step event")
    for prev, e in zip(phases, phases[1:]):
        fail.check(e["ts"] >= prev["ts"] + prev["dur"] - EPS_US,
                   f"{where}: {e['name']} at {e['ts']} overlaps {prev['name']} ending "
                   f"{prev['ts'] + prev['dur']}")
    order = [e["name"] for e in phases]
    rank_of = [0 if n in COMPUTE else 1 + AFTER.index(n) for n in order]
    fail.check(rank_of == sorted(rank_of), f"{where}: phases out of order: {order}")
    expected = {"grad_reduce": 1, "grad_norm": 1, "optimizer": 1,
                "eval": int(step in a.eval_steps), "checkpoint": int(step in a.checkpoint_steps)}
    counts = collections.Counter(order)
    for name, n in expected.items():
        fail.check(counts[name] == n, f"{where}: {counts[name]} {name} events, expected {n}")
    pairs = {(mb, c) for mb in range(a.microbatches) for c in range(a.chunks)}
    kinds = ["forward"] + (["backward_input", "backward_weight"] if a.zero_bubble else ["backward"])
    for kind in kinds:
        got = [(e["args"].get("microbatch"), e["args"].get("chunk"))
               for e in phases if e["name"] == kind]
        fail.check(sorted(got) == sorted(pairs),
                   f"{where}: {kind} events for (micro-batch, chunk) {sorted(got)}, expected "
                   f"each of {a.microbatches} × {a.chunks} once")
    pp_rank = rank // (a.ranks // a.pp)
    reads = a.microbatches if pp_rank in (0, a.pp - 1) else 0
    fail.check(counts["data"] == reads, f"{where}: {counts['data']} data events, expected {reads}")
    # Blocks nest inside a forward, backward or eval on the same thread.
    holders = [e for e in phases if e["name"] in ("forward", "backward", "backward_input", "eval")]
    starts = [e["ts"] for e in holders]
    blocks = [e for e in evs if e["cat"] == "block"]
    fail.check(len(blocks) > 0, f"{where}: no block events")
    for b in blocks:
        i = bisect.bisect_right(starts, b["ts"] + EPS_US) - 1
        ok = i >= 0 and b["ts"] + b["dur"] <= holders[i]["ts"] + holders[i]["dur"] + EPS_US
        if not fail.check(ok and b["tid"] == 0, f"{where}: {b['name']} outside forward/backward"):
            break


def check_comm(rank, evs, fail):
    # One thread runs every operation, so the comm track's spans never overlap (Perfetto needs
    # the spans of a thread properly nested).
    spans = sorted(evs, key=lambda e: e["ts"])
    for prev, e in zip(spans, spans[1:]):
        if not fail.check(e["ts"] >= prev["ts"] + prev["dur"] - EPS_US,
                          f"rank {rank}: {e['name']} overlaps {prev['name']} on the comm track"):
            break
    for e in evs:
        args = e.get("args", {})
        need = ["group", "axis", "op", "wait_us", "step"] + (["bytes"] if e["cat"] == "comm" else [])
        missing = [k for k in need if k not in args]
        if not fail.check(not missing and e["tid"] == 1, f"rank {rank}: {e['name']} lacks {missing}"):
            return
        fail.check(args["group"].startswith(args["axis"] + "{"), f"rank {rank}: {args}")
        fail.check(args["wait_us"] >= 0 and (args.get("nonblocking", False) or e["cat"] != "comm"
                                             or args["wait_us"] <= e["dur"] + EPS_US),
                   f"rank {rank}: {e['name']} wait {args['wait_us']} of dur {e['dur']}")
        if args["op"] in ("send", "recv"):
            fail.check("peer" in args, f"rank {rank}: {e['name']} without peer")


def traced_bytes(comm):
    """(rank, step) -> group -> Σ bytes of the comm events inside the step's metrics window."""
    out = collections.defaultdict(lambda: collections.defaultdict(int))
    for e in comm:
        if e["cat"] == "comm" and e["args"]["in_step_window"]:
            out[(e["pid"], e["args"]["step"])][e["args"]["group"]] += e["args"]["bytes"]
    return out


def check_bytes(trace, comm, metrics, a, fail):
    extra = trace.get("meshtrain", {})
    fail.check(all(n == 0 for n in extra.get("dropped_events", {"?": -1}).values()),
               f"dropped events: {extra.get('dropped_events')}")
    traced = traced_bytes(comm)
    windows = extra.get("window_comm_bytes", [])
    fail.check(len(windows) == a.ranks * a.steps,
               f"{len(windows)} counter windows, expected {a.ranks} ranks × {a.steps} steps")
    for w in windows:
        mine = traced.get((w["rank"], w["step"]), {})
        groups = set(mine) | set(w["bytes"])
        diff = {g: (mine.get(g, 0), w["bytes"].get(g, 0)) for g in groups
                if mine.get(g, 0) != w["bytes"].get(g, 0)}
        fail.check(not diff, f"rank {w['rank']} step {w['step']}: traced vs counted bytes "
                             f"per group differ: {diff}")
    seen_axes = {g.split("{")[0] for w in windows for g in w["bytes"]}
    fail.check(a.axes <= seen_axes, f"groups with traffic {seen_axes}, expected {a.axes}")
    for line in metrics[:a.steps]:  # the traced steps are the first ones
        mine = traced.get((0, line["step"]), {})
        for axis, prefixes in METRIC_AXES.items():
            got = sum(b for g, b in mine.items() if g.split("{")[0] in prefixes)
            fail.check(got == line[f"{axis}_comm_bytes"],
                       f"step {line['step']}: traced {axis} bytes {got} on rank 0, metrics "
                       f"{axis}_comm_bytes {line[f'{axis}_comm_bytes']}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("metrics")
    for name in ("ranks", "pp", "microbatches", "chunks", "steps"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--zero-bubble", action="store_true")
    p.add_argument("--eval-steps", type=parse_steps, default=set())
    p.add_argument("--checkpoint-steps", type=parse_steps, default=set())
    p.add_argument("--axes", type=lambda s: set(s.split(",")), default=set())
    a = p.parse_args()
    fail = Failures()
    try:
        trace = json.load(open(a.trace))
        events = trace["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"FAIL {a.trace}: not a Chrome-trace JSON object: {e}")
    metrics = [json.loads(l) for l in open(a.metrics)]
    check_metadata(events, a.ranks, fail)
    xs = [e for e in events if e["ph"] == "X"]
    by_rank_step = collections.defaultdict(list)
    for e in xs:
        if e["cat"] in ("step", "phase", "block"):
            by_rank_step[(e["pid"], e["args"]["step"])].append(e)
    for r in range(a.ranks):
        for s in range(1, a.steps + 1):
            check_step(r, s, by_rank_step.get((r, s), []), a, fail)
    comm = [e for e in xs if e["cat"] in ("comm", "comm_wait")]
    for r in range(a.ranks):
        check_comm(r, [e for e in comm if e["pid"] == r], fail)
    ops = {(e["args"]["axis"], e["args"]["op"]) for e in comm}
    fail.check(a.pp == 1 or {("pp", "send"), ("pp", "recv")} <= ops, f"no pp send/recv in {ops}")
    check_bytes(trace, comm, metrics, a, fail)
    if fail:
        print(f"FAIL {a.trace}: {len(fail)} problem(s)")
        for f in fail[:20]:
            print("  " + f)
        sys.exit(1)
    print(f"ok   {a.trace}: {len(xs)} events on {a.ranks} ranks, {len(comm)} comm events, "
          f"bytes equal the counters on every rank, step and group")


if __name__ == "__main__":
    main()
