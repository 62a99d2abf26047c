#!/usr/bin/env bash
# SIGTERM (what Slurm sends before preemption) stops a job cleanly (docs/resilience.md,
# "Preemption"): every rank finishes the same step, a complete checkpoint of it is written, the
# job exits 5, and `--checkpoint.resume auto` continues bit for bit.
# 0. An uninterrupted 40-step run on 2 data-parallel ranks (ZeRO-1: each rank writes its own
#    shard, so a checkpoint is complete only when both ranks wrote the same step).
# 1. Under mpirun, SIGTERM to both ranks (as srun and scancel deliver it) once the metrics show
#    a random step K: exit 5, rank 0's message names the signal, "2 ranks", the step N it
#    stopped after and its checkpoint; that checkpoint is complete and N is the last step
#    logged. Resumed with `--checkpoint.resume auto`: it starts at step N + 1, and the loss,
#    grad norm and val loss of steps N + 1 … 40 and every final parameter (model.safetensors)
#    are the uninterrupted run's bits.
# 2. SIGTERM to one random rank only: both ranks still stop after the same step (a rank that
#    stopped alone would leave the other in a collective until the 30 s watchdog, exit 4):
#    exit 5, the message names that rank, the checkpoint of the step holds both ranks' shards.
# 3. Under `meshtrain launch -n 2 --max-restarts 2`, SIGTERM to the launcher: it passes SIGUSR1
#    to mpirun (which forwards it to every rank), does not restart, exits 5 and leaves no
#    process; run again under the launcher with --checkpoint.resume auto, it ends bit-identical.
# Usage: preemption.sh <meshtrain binary> <prepared data dir>
set -euo pipefail
BIN=$(realpath "$1")
DATA=$2
CONFIG=$(dirname "$0")/../../configs/shakespeare_char.toml
. "$(dirname "$0")/job_work_dir.sh"
LOG=""
fail() {
  echo "FAIL: $*"
  if [[ -n $LOG ]]; then
    echo "---- $LOG (without step lines) ----"
    grep -v '^step ' "$LOG" || true
  fi
  exit 1
}
MPIRUN=(mpirun --oversubscribe --bind-to none -np 2)
JOB=(train "$CONFIG" --parallel.dp 2 --parallel.zero_stage 1 --training.micro_batch 6
  --training.max_steps 40 --training.eval_interval 20 --training.eval_batches 4
  --training.threads 1 --data.dir "$DATA" --parallel.comm_timeout_s 30)

"${MPIRUN[@]}" "$BIN" "${JOB[@]}" --checkpoint.dir "$WORK/ref" --metrics "$WORK/ref.jsonl" \
  >"$WORK/ref.log" 2>&1 || { LOG=$WORK/ref.log; fail "the uninterrupted run failed"; }

# The pids of run $1's ranks, rank $2 first when given (OpenMPI puts the rank in the
# environment as OMPI_COMM_WORLD_RANK).
rank_pids() {
  for pid in $(pgrep -f "^$BIN train .*$WORK/$1( |$)" || true); do
    local r
    r=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [[ -n $r ]] && { [[ -z ${2:-} ]] || [[ $r == "$2" ]]; } && echo "$pid"
  done
  return 0
}
latest_step() {
  { tail -n 1 "$WORK/$1.jsonl" 2>/dev/null || true; } | sed -n 's/.*"step":\([0-9]*\).*/\1/p'
}
# Waits until the metrics of run $1 show step $2 or later while process $3 runs.
wait_for_step() {
  while kill -0 "$3" 2>/dev/null; do
    local s
    s=$(latest_step "$1")
    [[ -n $s ]] && ((s >= $2)) && return 0
    sleep 0.05
  done
  return 1
}
# Checks run $1's exit ($2), message and checkpoint; prints the step N it stopped after.
check_stopped() {
  local run=$1 rc=$2 who=$3
  LOG=$WORK/$run.log
  ((rc == 5)) || fail "$run: exit code $rc, expected 5 (stopped by a signal)"
  local line
  line=$(grep "^meshtrain: received " "$LOG") || fail "$run: no 'meshtrain: received ...' message"
  local re="^meshtrain: received (SIGTERM|SIGUSR1) \\($who\\) at step ([0-9]+); every rank stopped after it; checkpoint written to $WORK/$run/checkpoints/step-0*([0-9]+); resume with --checkpoint.resume auto \\(checkpoint.dir = $WORK/$run\\); exit code 5$"
  [[ $line =~ $re ]] || fail "$run: unexpected message: $line"
  local n=${BASH_REMATCH[2]}
  ((BASH_REMATCH[3] == n)) || fail "$run: the checkpoint named is not step $n's"
  local dir
  dir=$(printf '%s/%s/checkpoints/step-%08d' "$WORK" "$run" "$n")
  [[ -e $dir/COMPLETE ]] || fail "$run: $dir has no COMPLETE"
  [[ -e $dir/rank-00000.safetensors && -e $dir/rank-00001.safetensors ]] ||
    fail "$run: $dir lacks a rank's shard: $(ls "$dir")"
  [[ $(latest_step "$run") == "$n" ]] ||
    fail "$run: the last step in the metrics is $(latest_step "$run"), the message says $n"
  [[ ! -e $WORK/$run/model.safetensors ]] || fail "$run: a stopped run wrote the final model"
  echo "$n"
}
# Resumed run $1 (its log $1-resumed.log, started from step $2) against the uninterrupted one.
check_resumed() {
  grep -q "resumed from $WORK/$1/checkpoints/step-$(printf %08d "$2") at step $2 " \
    "$WORK/$1-resumed.log" || { LOG=$WORK/$1-resumed.log; fail "$1 did not resume at step $2"; }
  /usr/bin/python3 - "$WORK/ref" "$WORK/$1" "$2" <<'PY'
import json, re, struct, sys
ref_dir, run_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def fields(line):
    # The raw JSON text of each value: equal text is equal bits (shortest round-trip output).
    return {k: m.group(1) for k in ("step", "loss", "grad_norm", "val_loss")
            if (m := re.search(r'"%s":([^,}]+)' % k, line))}
def steps(path):
    out = {}
    for f in map(fields, open(path)):
        out[int(f["step"])] = f  # the resumed run's line is the later one
    return out
ref, run = steps(ref_dir + ".jsonl"), steps(run_dir + ".jsonl")
assert sorted(run) == list(range(1, 41)), f"steps logged: {sorted(run)}"
diffs = [f"step {s} {k}: {run[s].get(k)} vs {ref[s].get(k)}" for s in range(n + 1, 41)
         for k in ("loss", "grad_norm", "val_loss") if run[s].get(k) != ref[s].get(k)]
assert not diffs, "resumed run differs from the uninterrupted one:\n  " + "\n  ".join(diffs[:10])
def tensors(path):
    data = open(path, "rb").read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    header.pop("__metadata__", None)
    body = data[8 + size:]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}
a, b = tensors(ref_dir + "/model.safetensors"), tensors(run_dir + "/model.safetensors")
assert a.keys() == b.keys(), f"tensor names differ: {sorted(a.keys() ^ b.keys())}"
bad = [k for k in a if a[k] != b[k]]
assert not bad, f"final parameters differ from the uninterrupted run's: {bad[:5]}"
print(f"resumed at step {n + 1}: steps {n + 1}-40 and all {len(a)} final tensors bit-identical "
      f"(final loss {run[40]['loss']})")
PY
}

# 1. Every rank signalled.
K=$((5 + RANDOM % 20))
"${MPIRUN[@]}" "$BIN" "${JOB[@]}" --checkpoint.dir "$WORK/all" --metrics "$WORK/all.jsonl" \
  >"$WORK/all.log" 2>&1 &
JOBPID=$!
wait_for_step all "$K" "$JOBPID" || { LOG=$WORK/all.log; fail "all: ended before step $K"; }
pids=$(rank_pids all)
(($(wc -w <<<"$pids") == 2)) || { LOG=$WORK/all.log; fail "all: found rank pids '$pids'"; }
kill -TERM $pids
rc=0
wait "$JOBPID" || rc=$?
N=$(check_stopped all "$rc" "2 ranks") || { echo "$N"; exit 1; }
echo "all ranks signalled at step >= $K: exit 5, stopped after step $N, checkpoint complete"
"${MPIRUN[@]}" "$BIN" "${JOB[@]}" --checkpoint.dir "$WORK/all" --metrics "$WORK/all.jsonl" \
  --checkpoint.resume auto >"$WORK/all-resumed.log" 2>&1 ||
  { LOG=$WORK/all-resumed.log; fail "the resumed run failed"; }
check_resumed all "$N"

# 2. One rank signalled.
K=$((5 + RANDOM % 20))
R=$((RANDOM % 2))
"${MPIRUN[@]}" "$BIN" "${JOB[@]}" --checkpoint.dir "$WORK/one" --metrics "$WORK/one.jsonl" \
  >"$WORK/one.log" 2>&1 &
JOBPID=$!
wait_for_step one "$K" "$JOBPID" || { LOG=$WORK/one.log; fail "one: ended before step $K"; }
pids=$(rank_pids one "$R")
[[ -n $pids ]] || { LOG=$WORK/one.log; fail "one: no process of rank $R found"; }
kill -TERM $pids
rc=0
wait "$JOBPID" || rc=$?
N=$(check_stopped one "$rc" "rank $R") || { echo "$N"; exit 1; }
echo "rank $R alone signalled at step >= $K: exit 5, both ranks stopped after step $N"

# 3. The launcher signalled.
K=$((5 + RANDOM % 20))
LAUNCH=("$BIN" launch -n 2 --max-restarts 2 --mpirun-args "--oversubscribe --bind-to none" --)
"${LAUNCH[@]}" "${JOB[@]}" --checkpoint.dir "$WORK/launch" --metrics "$WORK/launch.jsonl" \
  >"$WORK/launch.log" 2>&1 &
JOBPID=$!
wait_for_step launch "$K" "$JOBPID" || { LOG=$WORK/launch.log; fail "launch: ended before step $K"; }
kill -TERM "$JOBPID"
rc=0
wait "$JOBPID" || rc=$?
N=$(check_stopped launch "$rc" "2 ranks") || { echo "$N"; exit 1; }
LOG=$WORK/launch.log
grep -q "^meshtrain launch: got SIGTERM; asking every rank to finish its step, write a checkpoint and stop (SIGUSR1 to mpirun)" \
  "$LOG" || fail "launch: no line saying it passed the stop on"
grep -q "not restarting: exit code 5 means the ranks received a stop signal" "$LOG" ||
  fail "launch: no line saying why it does not restart"
! grep -q "restart 1 of" "$LOG" || fail "launch: the launcher restarted a stopped job"
left=$(pgrep -fa "$WORK/launch" || true)
[[ -z $left ]] || fail "launch: processes left after the launcher exited: $left"
echo "launcher signalled at step >= $K: exit 5, stopped after step $N, no restart, nothing left"
"${LAUNCH[@]}" "${JOB[@]}" --checkpoint.dir "$WORK/launch" --metrics "$WORK/launch.jsonl" \
  --checkpoint.resume auto >"$WORK/launch-resumed.log" 2>&1 ||
  { LOG=$WORK/launch-resumed.log; fail "the resumed launch failed"; }
check_resumed launch "$N"
echo "3 passed, 0 failed"
