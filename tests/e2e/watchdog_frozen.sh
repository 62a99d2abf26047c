#!/usr/bin/env bash
# Issue 17's repro of a frozen rank (docs/resilience.md, "Watchdog"): a dp 2 training run with
# parallel.comm_timeout_s = 3, and `kill -STOP` of world rank 1 at a different moment in each
# trial — inside a collective or between them. Before the heartbeat, 2 of 5 such trials said
# "not arrived: none found (every peer has reached it)". Every trial must now exit 4 within the
# timeout + 15 s and rank 0's report must name world rank 1 as frozen.
# Usage: watchdog_frozen.sh <meshtrain binary> <prepared data dir> [trials]
set -u
. "$(dirname "$0")/mpirun_retry.sh"
BIN=$(realpath "$1")
DATA=$2
TRIALS=${3:-4}
CONFIG=$(dirname "$0")/../../configs/shakespeare_char.toml
TIMEOUT_S=3
. "$(dirname "$0")/job_work_dir.sh"
failures=0

# The pid of trial $1's world rank 1 (OpenMPI puts the rank in the environment).
rank1_pid() {
  for pid in $(pgrep -f "^$BIN train .*$WORK/$1( |$)" || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
      echo "$pid"
    fi
  done
}

for ((t = 1; t <= TRIALS; t++)); do
  log=$WORK/trial$t.log
  start=$(date +%s%N)
  timeout -k 5 $((TIMEOUT_S + 60)) mpirun --oversubscribe --bind-to none -np 2 "$BIN" train \
    "$CONFIG" --parallel.dp 2 --training.micro_batch 6 --training.max_steps 5000 \
    --training.threads 1 --checkpoint.interval 0 --data.dir "$DATA" \
    --parallel.comm_timeout_s "$TIMEOUT_S" --checkpoint.dir "$WORK/trial$t" >"$log" 2>&1 &
  job=$!
  # Wait for training to run (a logged step), then stop rank 1 a varying few ms later.
  for _ in $(seq 300); do grep -q '^step ' "$log" 2>/dev/null && break; sleep 0.1; done
  sleep "0.$((t * 137 % 1000))"
  pid=$(rank1_pid "trial$t")
  if [[ -z $pid ]]; then
    echo "FAIL trial $t: no rank 1 process found"; failures=$((failures + 1)); kill -9 $job; continue
  fi
  kill -STOP "$pid"
  stopped=$(date +%s%N)
  wait $job
  got=$?
  ms=$((($(date +%s%N) - stopped) / 1000000))
  kill -9 "$pid" 2>/dev/null || true
  if [[ $got -ne 4 ]]; then
    echo "FAIL trial $t: exit $got, expected 4"; sed 's/^/    /' "$log" | grep -v '^    step '
    failures=$((failures + 1)); continue
  fi
  if ((ms >= (TIMEOUT_S + 15) * 1000)); then
    echo "FAIL trial $t: ended ${ms} ms after the stop, more than timeout + 15 s"
    failures=$((failures + 1)); continue
  fi
  if ! grep -q "frozen (not running, so the operation cannot complete): world rank 1$" "$log"; then
    echo "FAIL trial $t: the report does not name world rank 1 as frozen"
    grep '^\[watchdog\]' "$log" | sed 's/^/    /'
    failures=$((failures + 1)); continue
  fi
  echo "ok   trial $t: exit 4 ${ms} ms after the stop (started $(((stopped - start) / 1000000)) ms in)"
  grep '^\[watchdog\] .*world rank 1' "$log" | head -2 | sed 's/^/    /'
done
echo "$((TRIALS - failures)) passed, $failures failed"
((failures == 0))
