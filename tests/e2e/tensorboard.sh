#!/usr/bin/env bash
# TensorBoard round trip, progress and summary (docs/observability.md): a 40-step run on 2
# data-parallel ranks with --metrics and --tensorboard, then
#  - TensorBoard's own EventAccumulator (PyPI tensorboard, scripts/setup.sh PYDEPS) reads one
#    event file named events.out.tfevents.<unix seconds>.<hostname>, of file version
#    brain.Event:2, whose scalar tags are exactly those the metrics keys map to, every step's
#    value equal to the metrics line's (float32), and whose text "config" at step 0 is the
#    resolved config (the checkpoint's config.toml);
#  - every log line's elapsed and ETA parse and equal the metrics' elapsed_s and eta_s (to the
#    second shown), eta_s is the documented formula recomputed from the metrics lines, it is
#    positive before the last step and 0 after it;
#  - the summary line's numbers equal those recomputed from the metrics lines.
# Usage: tensorboard.sh <meshtrain binary> <prepared data dir>   (PYTHONPATH: .pydeps)
set -euo pipefail
BIN=$1
DATA=$2
CONFIG=$(dirname "$0")/../../configs/shakespeare_char.toml
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

mpirun --oversubscribe --bind-to none -np 2 "$BIN" train "$CONFIG" --parallel.dp 2 \
  --training.micro_batch 4 --training.max_steps 40 --training.eval_interval 15 \
  --training.eval_batches 2 --training.log_interval 1 --training.threads 1 --data.dir "$DATA" \
  --checkpoint.dir "$WORK/ckpt" --metrics "$WORK/m.jsonl" --tensorboard "$WORK/tb/run" \
  >"$WORK/log" 2>&1 || { cat "$WORK/log"; exit 1; }

/usr/bin/python3 - "$WORK" <<'PY'
import json, os, re, socket, sys
import numpy as np
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    sys.exit(f"{e}: run scripts/setup.sh (tensorboard into .pydeps) and set PYTHONPATH=.pydeps")

work = sys.argv[1]
lines = [json.loads(l) for l in open(f"{work}/m.jsonl")]
log = open(f"{work}/log").read()
assert [l["step"] for l in lines] == list(range(1, 41)), "metrics lines are not steps 1..40"
MAX_STEPS, EVAL_INTERVAL, GLOBAL_BATCH, BLOCK = 40, 15, 8, 64

# --- TensorBoard -------------------------------------------------------------------------
files = os.listdir(f"{work}/tb/run")
assert len(files) == 1, f"expected one event file (rank 0 only), found {files}"
host = re.escape(socket.gethostname())
assert re.fullmatch(rf"events\.out\.tfevents\.\d{{10}}\.{host}", files[0]), files[0]

def tag(key):  # the mapping docs/observability.md documents (train/reporting.cpp)
    if key == "val_loss": return "val/loss"
    if key.startswith("peak_bytes") or key in ("allocator_misses", "minor_faults"):
        return "memory/" + key
    if "_comm_" in key or key == "attention_s": return "comm/" + key
    if key in ("elapsed_s", "eta_s"): return "progress/" + key
    if key in ("step_time_s", "tokens_per_s", "mfu", "bubble", "predicted_bubble", "checkpoint_s"):
        return "perf/" + key
    return "train/" + key

expected = {}  # tag -> {step: value}
for l in lines:
    for key, value in l.items():
        if key != "step" and isinstance(value, (int, float)):  # bool is an int
            expected.setdefault(tag(key), {})[l["step"]] = float(value)
for t in ("train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/mfu",
          "memory/peak_bytes", "memory/allocator_misses", "memory/minor_faults", "comm/dp_comm_bytes", "comm/dp_comm_s", "val/loss",
          "progress/eta_s"):
    assert t in expected, f"the metrics lack the source of {t}"

ea = EventAccumulator(f"{work}/tb/run", size_guidance={"scalars": 0, "tensors": 0})
ea.Reload()
assert ea.file_version == 2.0, f"file version {ea.file_version}, expected brain.Event:2"
got_tags = set(ea.Tags()["scalars"])
assert got_tags == set(expected), (f"scalar tags differ: missing {set(expected) - got_tags}, "
                                   f"extra {got_tags - set(expected)}")
values = 0
for t, by_step in expected.items():
    events = ea.Scalars(t)
    got = {e.step: e.value for e in events}
    assert len(events) == len(got) == len(by_step), f"{t}: steps {sorted(got)} vs {sorted(by_step)}"
    for step, v in by_step.items():
        want = float(np.float32(v))  # TensorBoard scalars are float32
        assert got[step] == want, f"{t} at step {step}: {got[step]} in TensorBoard, {want} in metrics"
        values += 1
assert sorted(expected["val/loss"]) == [15, 30, 40], sorted(expected["val/loss"])
text = ea.Tensors("config")
assert len(text) == 1 and text[0].step == 0, "config text: one value at step 0 expected"
config_toml = open(f"{work}/ckpt/config.toml").read()
assert text[0].tensor_proto.string_val[0].decode() == config_toml, "config text != config.toml"

# The server's own reader (the one `tensorboard --logdir` uses) files them under its plugins.
from tensorboard.backend.event_processing import plugin_event_accumulator
pa = plugin_event_accumulator.EventAccumulator(f"{work}/tb/run")
pa.Reload()
assert set(pa.PluginTagToContent("scalars")) == set(expected), "scalars plugin tags differ"
assert list(pa.PluginTagToContent("text")) == ["config"], pa.PluginTagToContent("text")

# --- progress: elapsed and ETA -----------------------------------------------------------
def seconds(hms):
    h, m, s = map(int, hms.split(":"))
    return 3600 * h + 60 * m + s
shown = {int(m.group(1)): (seconds(m.group(2)), seconds(m.group(3))) for m in re.finditer(
    r"^step +(\d+)/40 \|.*\| elapsed (\d+:\d\d:\d\d) \| ETA (\d+:\d\d:\d\d)", log, re.M)}
assert sorted(shown) == list(range(1, 41)), f"log lines with elapsed/ETA: {sorted(shown)}"
window, prev, eval_sum, evals = [], 0.0, 0.0, 0
for l in lines:
    step, elapsed, eta = l["step"], l["elapsed_s"], l["eta_s"]
    assert abs(shown[step][0] - elapsed) <= 0.5 + 1e-9, f"step {step}: elapsed {shown[step][0]} vs {elapsed}"
    assert abs(shown[step][1] - eta) <= 0.5 + 1e-9, f"step {step}: ETA {shown[step][1]} vs {eta}"
    wall = elapsed - prev
    assert wall > 0, f"step {step}: elapsed_s does not grow"
    prev = elapsed
    e = max(0.0, wall - l["step_time_s"] - l["checkpoint_s"]) if "val_loss" in l else 0.0
    window = (window + [wall - e])[-20:]
    if "val_loss" in l:
        eval_sum, evals = eval_sum + e, evals + 1
    evals_left = MAX_STEPS // EVAL_INTERVAL - step // EVAL_INTERVAL + (step < MAX_STEPS and MAX_STEPS % EVAL_INTERVAL != 0)
    want = sum(window) / len(window) * (MAX_STEPS - step) + (eval_sum / evals if evals else 0) * evals_left
    assert abs(eta - want) <= 1e-9 * max(1.0, want), f"step {step}: eta_s {eta}, formula {want}"
etas = [l["eta_s"] for l in lines]
assert etas[-1] == 0.0, f"ETA after the last step is {etas[-1]}"
# Whether the ETA falls between two steps depends on how long the steps between them took (a
# few slow ones on a busy machine raised step 20's ETA above step 5's in a CI run); the
# formula check above already pins every value to the metrics, so only the sign is asserted.
assert all(e > 0 for e in etas[:-1]), f"ETA not positive before the last step: {etas}"

# --- summary ------------------------------------------------------------------------------
m = re.search(r"^summary: (\d+) steps \((\d+)–(\d+)\) \| (\d+) tokens \| wall (\d+:\d\d:\d\d) "
              r"\(([\d.]+) s\) \| ([\d.]+) tokens/s \(([\d.]+) over the wall time\) \| MFU ([\d.]+)% "
              r"\| best val_loss ([\d.]+) at step (\d+) \| peak memory [\d.]+ MiB \((\d+) bytes, "
              r"rank (\d+)\)$", log, re.M)
assert m, "no summary line in the log:\n" + log[-2000:]
steps, first, last, tokens = (int(m.group(i)) for i in range(1, 5))
assert (steps, first, last) == (40, 1, 40), m.group(0)
assert tokens == 40 * GLOBAL_BATCH * BLOCK, f"summary tokens {tokens}"
measured_tokens = sum(l["tokens_per_s"] * l["step_time_s"] for l in lines)
assert abs(measured_tokens - tokens) < 1e-6 * tokens, f"metrics' tokens {measured_tokens} vs {tokens}"
wall = float(m.group(6))
assert abs(wall - lines[-1]["elapsed_s"]) <= 5e-4, f"summary wall {wall}, metrics {lines[-1]['elapsed_s']}"
assert abs(seconds(m.group(5)) - wall) <= 0.5 + 1e-3, m.group(5)
step_time = sum(l["step_time_s"] for l in lines)
assert abs(float(m.group(7)) - tokens / step_time) <= 0.05 + 1e-9, f"tokens/s {m.group(7)} vs {tokens / step_time}"
assert abs(float(m.group(8)) - tokens / lines[-1]["elapsed_s"]) <= 0.05 + 1e-6, m.group(8)
mfu = sum(l["mfu"] * l["step_time_s"] for l in lines) / step_time * 100
assert abs(float(m.group(9)) - mfu) <= 5e-4 + 1e-9, f"MFU {m.group(9)} vs {mfu}"
best = min((l["val_loss"], l["step"]) for l in lines if "val_loss" in l)
assert abs(float(m.group(10)) - best[0]) <= 5e-7 and int(m.group(11)) == best[1], (m.group(10, 11), best)
# The dp replicas allocate the same; rank 0's peak (the metrics') is the largest over the ranks.
peak = max(l["peak_bytes"] for l in lines)
assert int(m.group(12)) == peak, f"summary peak {m.group(12)} bytes, metrics' peak {peak}"
print(f"1 passed, 0 failed: {len(expected)} tags, {values} scalar values, config text, "
      f"40 ETAs, summary ({tokens} tokens, {wall:.2f} s, best val {best[0]:.4f} at {best[1]})")
PY
