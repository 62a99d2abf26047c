#!/usr/bin/env bash
# The watchdog's directories ($TMPDIR/meshtrain-watchdog-XXXXXX, monitor/watchdog_dirs.h) do not
# pile up (issue 17 item 8: a killed job left its folder behind). With TMPDIR a fresh folder:
# 1. a long dp 2 job L runs; its directory appears;
# 2. a short job that ends normally, and one that fails after the watchdog started (exit 3, a
#    missing checkpoint to resume), leave nothing of theirs — and leave L's, whose owner lives;
# 3. kill -9 of one of L's ranks leaves L's directory behind (mpirun ends the other rank, so
#    no rank removes it); the next job removes it: after it ends, the folder is empty;
# 4. the same kill under `meshtrain launch --max-restarts 0` (no next attempt): when the
#    launcher has ended, the folder is empty.
# Usage: watchdog_dirs.sh <meshtrain binary> <prepared data dir>
set -uo pipefail
BIN=$(realpath "$1")
DATA=$2
CONFIG=$(dirname "$0")/../../configs/shakespeare_char.toml
. "$(dirname "$0")/job_work_dir.sh"
export TMPDIR=$WORK/tmp
mkdir -p "$TMPDIR"
MPI=(mpirun --oversubscribe --bind-to none -np 2)
JOB=(train "$CONFIG" --data.dir "$DATA" --parallel.dp 2 --training.micro_batch 6
  --model.n_layer 1 --training.threads 1 --training.eval_interval 0
  --checkpoint.save_final false)
fail() {
  echo "FAIL: $*"
  echo "---- $TMPDIR ----"; ls -laR "$TMPDIR"
  exit 1
}
dirs() { ls -d "$TMPDIR"/meshtrain-watchdog-* 2>/dev/null || true; }

# The pid of rank $2 of the job whose checkpoint.dir is $1 (OpenMPI's OMPI_COMM_WORLD_RANK).
rank_pid() {
  for pid in $(pgrep -f "^$BIN train .*--checkpoint.dir $1" || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
    fi
  done
}
# rank_pid, retried for up to 10 s: a rank can still be starting (or its /proc entry not yet
# readable) when rank 0's first step is logged; a CI run on a busy machine found no rank 1 once.
wait_rank_pid() {
  local i pid
  for ((i = 0; i < 100; i++)); do
    pid=$(rank_pid "$1" "$2")
    [[ -n $pid ]] && { echo "$pid"; return 0; }
    sleep 0.1
  done
}
# Waits (at most 120 s) until log $1 of the job started as pid $2 shows a training step.
wait_for_step() {
  local i
  for ((i = 0; i < 1200; i++)); do
    grep -q '^step ' "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  fail "no training step in $1: $(cat "$1")"
}
# run_short <name> <expected exit> <extra args...>: a 3-step job, its exit code checked.
run_short() {
  local name=$1 code=$2 rc=0
  shift 2
  "${MPI[@]}" "$BIN" "${JOB[@]}" --training.max_steps 3 --checkpoint.dir "$WORK/$name" "$@" \
    >"$WORK/$name.log" 2>&1 || rc=$?
  ((rc == code)) || { cat "$WORK/$name.log"; fail "job $name exited $rc, expected $code"; }
}

# 1. The long job.
"${MPI[@]}" "$BIN" "${JOB[@]}" --training.max_steps 100000 --checkpoint.dir "$WORK/long" \
  >"$WORK/long.log" 2>&1 &
LONG=$!
wait_for_step "$WORK/long.log" "$LONG"
long_dir=$(dirs)
[[ -n $long_dir && $(wc -l <<<"$long_dir") -eq 1 ]] || fail "expected L's one directory, found '$long_dir'"
[[ -f $long_dir/owner && -f $long_dir/rank0.progress && -f $long_dir/rank1.progress ]] ||
  fail "L's directory lacks its owner or progress files"

# 2. A normal and an error exit beside it.
run_short normal 0
[[ $(dirs) == "$long_dir" ]] || fail "after a normal exit: '$(dirs)', expected only $long_dir"
run_short error 3 --checkpoint.resume "$WORK/none/step-00000010"
grep -q "no such directory" "$WORK/error.log" || fail "the error job failed otherwise: $(cat "$WORK/error.log")"
[[ $(dirs) == "$long_dir" ]] || fail "after an error exit: '$(dirs)', expected only $long_dir"
echo "ok   normal exit (0) and error exit (3) leave nothing; the live job's directory is kept"

# 3. kill -9 of L's rank 1, then the next job.
victim=$(wait_rank_pid "$WORK/long" 1)
[[ -n $victim ]] || fail "rank 1 of the long job not found"
kill -9 "$victim"
wait "$LONG"
echo "long job: mpirun exited $? after kill -9 of rank 1 (pid $victim)"
[[ -d $long_dir ]] || fail "the killed job's directory vanished by itself: the test shows nothing"
run_short next 0
[[ -z $(dirs) ]] || fail "the next job left '$(dirs)' (the killed job's directory not cleaned)"
[[ -z $(ls -A "$TMPDIR") ]] || fail "files left in $TMPDIR: $(ls -A "$TMPDIR")"
echo "ok   kill -9 left $long_dir; the next job removed it, and its own"

# 4. The same under the launcher, with no attempt after the killed one.
"$BIN" launch -n 2 --max-restarts 0 --mpirun-args "--oversubscribe --bind-to none" -- \
  "${JOB[@]}" --training.max_steps 100000 --checkpoint.dir "$WORK/launch" \
  >"$WORK/launch.log" 2>&1 &
LAUNCHER=$!
wait_for_step "$WORK/launch.log" "$LAUNCHER"
[[ -n $(dirs) ]] || fail "the launched job has no watchdog directory"
victim=$(wait_rank_pid "$WORK/launch" 1)
[[ -n $victim ]] || fail "rank 1 of the launched job not found"
kill -9 "$victim"
rc=0
wait "$LAUNCHER" || rc=$?
((rc != 0)) || fail "the launcher exited 0 after its job was killed with no restart left"
grep -q "rank 1 exited on signal 9" "$WORK/launch.log" || fail "launcher log: $(grep -v '^step ' "$WORK/launch.log")"
[[ -z $(ls -A "$TMPDIR") ]] || fail "after the launcher ended: $(ls -A "$TMPDIR")"
echo "ok   launcher (exit $rc, no restart left): the killed job's directory removed"
echo "3 passed, 0 failed"
