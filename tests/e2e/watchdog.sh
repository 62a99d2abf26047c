#!/usr/bin/env bash
# The watchdog (docs/resilience.md, "Watchdog") ends a hung job with a report: each scenario of
# watchdog_probe runs under mpirun with parallel.comm_timeout_s = 2 and must exit non-zero
# within timeout + 10 s, name the operation, group, sequence number and the missing rank, and
# leave a flight-recorder file listing the operations. The mismatched-size scenario uses
# parallel.debug_collectives and must name both calls. ("ok" checks that nothing fires and
# that the watchdog's directory is removed.)
# Usage: watchdog.sh <watchdog_probe binary>
set -u
. "$(dirname "$0")/mpirun_retry.sh"
PROBE=$1
TIMEOUT_S=2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
failures=0
passed=0

fail() {
  echo "FAIL $1: $2"; sed 's/^/    /' "$WORK/out"
  failures=$((failures + 1))
}

# scenario <np> <name> <exit code> <text...>: every text must appear in the output.
scenario() {
  local np=$1 name=$2 code=$3
  shift 3
  export TMPDIR=$WORK/tmp.$name.$np
  mkdir -p "$TMPDIR"
  # -k: an mpirun that ignores SIGTERM (its ranks stuck) is killed 5 s later; ranks it leaves
  # behind are killed below, so one stuck scenario cannot stall the others.
  run_mpirun_job "$WORK/out" timeout -k 5 $((TIMEOUT_S + 30)) mpirun --oversubscribe \
    --bind-to none -np "$np" "$PROBE" "$name" "$TIMEOUT_S"
  local got=$?
  pkill -9 -f "^$PROBE $name " 2>/dev/null || true
  local ms=$MPIRUN_JOB_MS
  local label="$name (np $np)"
  if [[ $got -ne $code ]]; then
    fail "$label" "exit $got, expected $code"; return
  fi
  if ((ms >= (TIMEOUT_S + 10) * 1000)); then
    fail "$label" "took ${ms} ms, more than timeout + 10 s"; return
  fi
  # The sequence number the probe says will hang (rank 0 prints it before the hang).
  local seq
  seq=$(sed -n 's/^probe: the third all_reduce is collective #\([0-9]*\) .*/\1/p' "$WORK/out")
  local text
  for text in "$@"; do
    text=${text//@SEQ@/$seq}
    if ! grep -qF -- "$text" "$WORK/out"; then
      fail "$label" "output lacks '$text'"; return
    fi
  done
  if ((code == 4)); then
    # The report names the dump; it lists the operations, the hung one in flight.
    local dump
    dump=$(sed -n 's/^\[watchdog\] flight recorder (last [0-9]* operations of world rank 0): \([^;]*\).*/\1/p' \
      "$WORK/out" | head -1)
    if [[ ! -s $dump ]]; then
      fail "$label" "no flight-recorder file '$dump'"; return
    fi
    if ! grep -q "in_flight" "$dump" || ! grep -q "^[0-9]* all_reduce world{" "$dump"; then
      fail "$label" "the flight recorder lacks the operations"; cat "$dump"; return
    fi
  fi
  echo "ok   $label: exit $got in ${ms} ms"
  passed=$((passed + 1))
}

GROUP2="world{0,1}"
GROUP4="world{0,1,2,3}"
HANG="all_reduce on"
for np in 2 4; do
  group=$GROUP2
  ((np == 4)) && group=$GROUP4
  last=$((np - 1))
  scenario "$np" sleep 4 "$HANG $group (collective #@SEQ@ of the group, 16 bytes)" \
    "world rank $last: has not reached collective #@SEQ@" "not in a communication operation" \
    "not arrived: world rank $last" "exit code 4"
  scenario "$np" skip 4 "$HANG $group (collective #@SEQ@ of the group, 16 bytes)" \
    "world rank $last: has not reached collective #@SEQ@" "it has left training" \
    "not arrived: world rank $last"
done
# A rank stopped inside the collective (it entered it: "reached") is named by its heartbeat.
# Where the others then wait (the third all-reduce, or the barrier after it when its data had
# already gone out) depends on MPI, so only the rank, the verdict and the exit are checked.
for np in 2 4; do
  group=$GROUP2
  ((np == 4)) && group=$GROUP4
  last=$((np - 1))
  scenario "$np" freeze 4 "now blocked in all_reduce on $group #@SEQ@ — but frozen: its process" \
    "frozen (not running, so the operation cannot complete): world rank $last" "exit code 4"
done
scenario 2 mismatch 1 "mismatched collective on $GROUP2" \
  "group rank 0 (world rank 0): collective #@SEQ@ all_reduce_sum(f32) of 4 elements" \
  "group rank 1 (world rank 1): collective #@SEQ@ all_reduce_sum(f32) of 5 elements"
scenario 2 recv 4 "recv from world rank 1 on $GROUP2 (recv #1 from that peer, 16 bytes)" \
  "not arrived: world rank 1"
scenario 2 ok 0 "probe: the third all_reduce"
if [[ -n $(ls -A "$WORK/tmp.ok.2") ]]; then
  echo "FAIL ok (np 2): the watchdog left files behind: $(ls -A "$WORK/tmp.ok.2")"
  failures=$((failures + 1))
fi

echo "$passed passed, $failures failed"
((failures == 0))
