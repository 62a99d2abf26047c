#!/usr/bin/env bash
# The whole-step trace (issue 15 item 5, docs/tracing.md): `train --trace` on 4 ranks in three
# layouts — gpt2 on pp 2 × dp 2 with interleaved 1F1B (2 chunks per rank, 4 micro-batches,
# a checkpoint and an evaluation every 2 steps), the Llama config on pp 2 × tp 2 with ZB-H1 and
# sequence parallelism, and gpt2 on dp 4 under ZeRO-3 (non-blocking all-gathers) with
# --trace-steps 2 of 4 steps — each checked by check_trace.py: structure, phases per step in
# order and disjoint, F/B/W per (micro-batch, chunk), every collective and send/recv with group,
# bytes and wait, and the traced bytes equal to the ProcessGroup counters per rank, step and
# group and to the --metrics line's per-axis bytes. Then the checker must reject broken traces:
# one group's events dropped, one event's bytes doubled, a forward missing, two phases
# overlapping, a file cut short.
# Usage: trace.sh <meshtrain binary> <prepared data dir>
set -euo pipefail
BIN=$1
DATA=$2
ROOT=$(dirname "$0")/../..
CHECK="/usr/bin/python3 $ROOT/tests/e2e/check_trace.py"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

run() {  # run <name> <config> <args...>
  local name=$1 config=$2
  shift 2
  mpirun --oversubscribe --bind-to none -np 4 "$BIN" train "$config" --training.eval_batches 1 \
    --training.threads 1 --data.dir "$DATA" --checkpoint.dir "$WORK/$name" \
    --checkpoint.save_final false --metrics "$WORK/$name.jsonl" --trace "$WORK/$name.json" "$@" \
    >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; exit 1; }
  grep -qF "wrote the trace of 4 rank(s) to $WORK/$name.json" "$WORK/$name.log" ||
    { echo "$name: no trace line in the log"; cat "$WORK/$name.log"; exit 1; }
}

run interleaved "$ROOT/configs/shakespeare_char.toml" --parallel.pp 2 --parallel.dp 2 \
  --parallel.pp_schedule interleaved_1f1b --parallel.virtual_stages 2 --training.micro_batch 3 \
  --training.accumulation 4 --training.max_steps 4 --training.eval_interval 2 \
  --checkpoint.interval 2
$CHECK "$WORK/interleaved.json" "$WORK/interleaved.jsonl" --ranks 4 --pp 2 --microbatches 4 \
  --chunks 2 --steps 4 --eval-steps 2,4 --checkpoint-steps 2,4 --axes pp,dp,embedding

run zb "$ROOT/configs/llama_shakespeare.toml" --parallel.pp 2 --parallel.tp 2 \
  --parallel.sequence_parallel true --parallel.pp_schedule zb_h1 --training.micro_batch 3 \
  --training.accumulation 4 --training.max_steps 3 --training.eval_interval 0
$CHECK "$WORK/zb.json" "$WORK/zb.jsonl" --ranks 4 --pp 2 --microbatches 4 --chunks 1 --steps 3 \
  --eval-steps 3 --zero-bubble --axes pp,tp

run zero3 "$ROOT/configs/shakespeare_char.toml" --parallel.dp 4 --parallel.zero_stage 3 \
  --training.micro_batch 3 --training.max_steps 4 --training.eval_interval 0 --trace-steps 2
$CHECK "$WORK/zero3.json" "$WORK/zero3.jsonl" --ranks 4 --pp 1 --microbatches 1 --chunks 1 \
  --steps 2 --axes dp
/usr/bin/python3 - "$WORK/zero3.json" <<'PY'
import json, sys
comm = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("cat") == "comm"]
posted = [e for e in comm if e["args"]["nonblocking"] and e["args"]["op"] == "all_gather"]
assert posted, "zero3: no non-blocking all_gather traced"
steps = {e["args"]["step"] for e in comm}
assert steps == {1, 2}, f"zero3: comm events of steps {steps} under --trace-steps 2"
PY

# The checker must fail on broken traces (each mutation of the interleaved run's file).
break_trace() {  # break_trace <what> <expected message> <python mutating `t`>
  local what=$1 expect=$2 code=$3 out
  /usr/bin/python3 - "$WORK/interleaved.json" "$WORK/broken.json" "$code" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(t, open(sys.argv[2], "w"))
PY
  if out=$($CHECK "$WORK/broken.json" "$WORK/interleaved.jsonl" --ranks 4 --pp 2 --microbatches 4 \
    --chunks 2 --steps 4 --eval-steps 2,4 --checkpoint-steps 2,4 --axes pp,dp,embedding); then
    echo "the checker accepted a trace with $what"; exit 1
  fi
  grep -qF -- "$expect" <<<"$out" || { echo "$what: no '$expect' in: $out"; exit 1; }
  echo "ok   rejected: $what"
}
break_trace "the dp group's events dropped" "traced vs counted bytes per group differ" \
  't["traceEvents"] = [e for e in t["traceEvents"] if e.get("args", {}).get("axis") != "dp"]'
break_trace "one send's bytes doubled" "traced vs counted bytes per group differ" '
e = next(e for e in t["traceEvents"] if e.get("cat") == "comm" and e["args"]["op"] == "send")
e["args"]["bytes"] *= 2'
break_trace "rank 0's bytes against the metrics" "metrics dp_comm_bytes" '
w = next(w for w in t["meshtrain"]["window_comm_bytes"] if w["rank"] == 0)
for e in t["traceEvents"]:
    if e.get("cat") == "comm" and e["pid"] == 0 and e["args"]["axis"] == "dp":
        e["args"]["bytes"] += 4
        w["bytes"][e["args"]["group"]] += 4
        break'
break_trace "a forward missing" "forward events for (micro-batch, chunk)" '
i = next(i for i, e in enumerate(t["traceEvents"]) if e.get("name") == "forward")
del t["traceEvents"][i]'
break_trace "two phases overlapping" "overlaps" '
n = next(e for e in t["traceEvents"] if e.get("name") == "grad_norm")
e = next(e for e in t["traceEvents"] if e.get("name") == "optimizer" and e["pid"] == n["pid"]
         and e["args"]["step"] == n["args"]["step"])
e["ts"] = n["ts"] + n["dur"] / 2'
break_trace "a rank without its name" "no process_name" '
t["traceEvents"] = [e for e in t["traceEvents"] if not (e["ph"] == "M" and e["pid"] == 3)]'
head -c 1000 "$WORK/interleaved.json" >"$WORK/broken.json"
if $CHECK "$WORK/broken.json" "$WORK/interleaved.jsonl" --ranks 4 --pp 2 --microbatches 4 \
  --chunks 2 --steps 4 >/dev/null 2>&1; then
  echo "the checker accepted a truncated file"; exit 1
fi
echo "ok   rejected: a truncated file"
