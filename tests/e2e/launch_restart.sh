#!/usr/bin/env bash
# The launcher restarts a job after kill -9 of one rank (docs/resilience.md, "Launcher").
# 0. Its argument errors, and a bad config through it, exit 2 (not restarted).
# 1. An uninterrupted 40-step run on 2 data-parallel ranks, a checkpoint every 10 steps.
# 2. The same job under `meshtrain launch -n 2 --max-restarts 2`; once the metrics show a
#    random step K between checkpoints (11–35, not a multiple of 10: a kill that lands a few
#    steps late on a loaded machine still leaves the restart steps to run), a random rank gets
#    kill -9. Then:
#    - the launcher exits 0 and logged "restart 1 of 2: rank R exited on signal 9 (Killed)";
#    - the killed attempt's other rank was gone before the next attempt started, and no
#      process of the job is left at the end;
#    - a complete checkpoint (checkpoints/step-NNNNNNNN/COMPLETE) existed when the rank died,
#      and the restarted attempt's first step is one after a checkpoint, not step 1;
#    - loss, grad_norm and val_loss of every step the restarted attempt logged are the same
#      text (so the same bits) as the uninterrupted run's, through step 40.
# Usage: launch_restart.sh <meshtrain binary> <prepared data dir>
set -euo pipefail
BIN=$(realpath "$1")
DATA=$2
CONFIG=$(dirname "$0")/../../configs/shakespeare_char.toml
. "$(dirname "$0")/job_work_dir.sh"
fail() {
  echo "FAIL: $*"
  echo "---- launcher log (without step lines) ----"
  grep -v '^step ' "$WORK/launch.log" || true
  exit 1
}

JOB=(train "$CONFIG" --parallel.dp 2 --training.micro_batch 6 --training.max_steps 40
  --training.eval_interval 20 --training.eval_batches 4 --training.threads 1 --data.dir "$DATA"
  --checkpoint.interval 10)

# 0. The launcher's own argument errors exit 2 before anything runs, and a job that fails
#    with exit code 2 (bad configuration) is not restarted.
expect_error() {
  local text=$1
  shift
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  ((rc == 2)) || { echo "FAIL: exit $rc, expected 2: $*"; echo "$out"; exit 1; }
  [[ $out == *"$text"* ]] || { echo "FAIL: message lacks '$text': $*"; echo "$out"; exit 1; }
}
expect_error "-n must be at least 1, got 0" "$BIN" launch -n 0 -- train "$CONFIG"
expect_error "missing \`--\`" "$BIN" launch -n 2 train "$CONFIG"
expect_error "no command after \`--\`" "$BIN" launch -n 2 --
expect_error "must be \`train\` (got 'sample')" "$BIN" launch -n 2 -- sample "$WORK"
expect_error "no_such_mpirun not found on PATH" "$BIN" launch -n 2 --mpirun no_such_mpirun -- \
  train "$CONFIG"
expect_error "not restarting: exit code 2 means a bad configuration" "$BIN" launch -n 2 \
  --mpirun-args "--oversubscribe --bind-to none" -- "${JOB[@]}" --parallel.dp 3 \
  --checkpoint.dir "$WORK/bad"
echo "argument errors ok: 6 cases exit 2 with their message, a bad config is not restarted"

# 1. Uninterrupted.
mpirun --oversubscribe --bind-to none -np 2 "$BIN" "${JOB[@]}" --checkpoint.dir "$WORK/ref" \
  --metrics "$WORK/ref.jsonl" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }

# 2. Under the launcher, with one rank killed at step K.
K=$((11 + RANDOM % 25))
((K % 10 != 0)) || K=$((K + 1))
R=$((RANDOM % 2))
echo "killing rank $R once the metrics show step $K"
"$BIN" launch -n 2 --max-restarts 2 --mpirun-args "--oversubscribe --bind-to none" -- \
  "${JOB[@]}" --checkpoint.dir "$WORK/run" --metrics "$WORK/run.jsonl" >"$WORK/launch.log" 2>&1 &
LAUNCHER=$!

# The ranks are the `meshtrain train` processes of this job; OpenMPI gives each its rank in
# OMPI_COMM_WORLD_RANK.
rank_pid() {
  for pid in $(pgrep -f "^$BIN train .*$WORK/run" || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$pid"
    fi
  done
}
latest_step() {
  { tail -n 1 "$WORK/run.jsonl" 2>/dev/null || true; } | sed -n 's/.*"step":\([0-9]*\).*/\1/p'
}
# Kill at step K once the checkpoint before K is complete (async writing may lag a step or
# two); at the latest at the step before the next checkpoint, so the kill stays between
# checkpoints even when none appears.
BEFORE=$(printf '%s/run/checkpoints/step-%08d/COMPLETE' "$WORK" $((K / 10 * 10)))
killed=""
while kill -0 "$LAUNCHER" 2>/dev/null; do
  step=$(latest_step)
  if [[ -n $step ]] && ((step >= K)) && { [[ -e $BEFORE ]] || ((step >= K / 10 * 10 + 9)); }; then
    victim=$(rank_pid "$R")
    other=$(rank_pid $((1 - R)))
    if [[ -n $victim && -n $other ]]; then
      checkpoints_at_kill=$(ls "$WORK/run/checkpoints"/step-*/COMPLETE 2>/dev/null || true)
      kill -9 "$victim"
      killed="rank $R (pid $victim) at step $step"
      echo "killed $killed; complete checkpoints then: ${checkpoints_at_kill:-none}"
      break
    fi
  fi
  sleep 0.1
done
[[ -n $killed ]] || fail "the job ended before step $K was reached; nothing was killed"

# The next attempt must not start while the killed attempt's other rank still runs.
while kill -0 "$LAUNCHER" 2>/dev/null && ! grep -q 'attempt 2 of' "$WORK/launch.log"; do
  sleep 0.05
done
if kill -0 "$other" 2>/dev/null && [[ $(tr '\0' '\n' <"/proc/$other/cmdline" 2>/dev/null) == *"$WORK/run"* ]]; then
  fail "rank $((1 - R)) (pid $other) of the killed attempt still runs after the restart began"
fi

rc=0
wait "$LAUNCHER" || rc=$?
((rc == 0)) || fail "the launcher exited with $rc, expected 0"
grep -q "^meshtrain launch: restart 1 of 2: rank $R exited on signal 9 (Killed) after .* s; resuming from the newest complete checkpoint in 1 s$" \
  "$WORK/launch.log" || fail "no restart line naming rank $R and signal 9"
grep -q "^meshtrain launch: the job finished after 1 restart$" "$WORK/launch.log" ||
  fail "no line saying the job finished after 1 restart"
left=$(pgrep -fa "$WORK/run" || true)
[[ -z $left ]] || fail "processes of the job left after the launcher exited: $left"
echo "restart ok: launcher exit 0, rank $R's signal 9 logged, nothing left running"

# What awaits sharded checkpoints and --checkpoint.resume auto (docs/resilience.md).
[[ -n $checkpoints_at_kill ]] ||
  fail "no complete checkpoint under $WORK/run/checkpoints when $killed was killed: train does not write --checkpoint.interval checkpoints"
read -r first final_loss < <(/usr/bin/python3 "$(dirname "$0")/resumed_steps.py" \
  "$WORK/ref.jsonl" "$WORK/run.jsonl" "$WORK/launch.log" 40) ||
  fail "the resumed run is not the uninterrupted one's (above)"
# One after a checkpoint (11, 21 or 31): --checkpoint.resume auto resumed.
((first > 1 && (first - 1) % 10 == 0)) ||
  fail "the restarted attempt began at step $first: expected one after a checkpoint"
echo "1 passed, 0 failed: resumed at step $first, steps $first-40 bit-identical" \
  "(final loss $final_loss)"
