#!/usr/bin/env bash
# Faults across hosts under `meshtrain launch` (issue 17 items 3 and 7; docs/resilience.md,
# "Faults across hosts"): the test bed of netns_bed.sh with 2 hosts, dp 2, one rank per host,
# a checkpoint every 10 steps, `meshtrain launch` run on host 0. First an uninterrupted run
# (the reference: step losses as text, exported parameters' sha256). Then, each under the
# launcher and compared with the reference bit for bit (every step the last attempt logged, and
# the exported parameters):
#   link  (once) host 1's link down for LINK_DOWN_S (30) s at a step past the first checkpoint,
#         then up. Rank 0's watchdog must report within comm_timeout_s + 5 s of the link going
#         down (5 s: its 0.5 s tick, up to one step of compute before the first collective
#         that blocks, the output's way to the log), naming the operation, its group dp{0,1}
#         and world rank 1 on mthost1 as unreachable; the first attempt must end within the
#         watchdog's time + --grace (10 s) + 3 s (killing a stuck mpirun), its attempts while the link is down fail and are
#         retried after a doubling delay, and the run finishes once the link is back.
#   kill  (KILL_TRIALS times, 2 by default) kill -9 of the rank on host 1 at a random step
#         between checkpoints (11–49, not a multiple of 10).
# Prints one row per fault for docs/resilience.md's table: fault, trial, detected (s from the
# fault to the first restart line or watchdog report), survived, final loss equal.
# Usage: net_faults.sh <meshtrain binary> <prepared data dir>   [env: KILL_TRIALS, LINK_DOWN_S,
#        NET_FAULTS=link,kill to choose]
set -euo pipefail
BIN=$(realpath "$1")
DATA=$(realpath "$2")
CONFIG=$(realpath "$(dirname "$0")/../../configs/shakespeare_char.toml")
KILL_TRIALS=${KILL_TRIALS:-2}
LINK_DOWN_S=${LINK_DOWN_S:-30}
FAULTS=${NET_FAULTS:-link,kill}
TIMEOUT_S=8  # parallel.comm_timeout_s: room for start-up collectives on a loaded machine
STEPS=60
GRACE_S=10   # meshtrain launch --grace
source "$(dirname "$0")/netns_bed.sh"
WORK=$(mktemp -d -p "$PWD" net_faults.XXXXXX)
trap 'bed_down; rm -rf "$WORK"' EXIT
fail() {
  echo "FAIL: $*"
  [[ -f ${LOG:-} ]] && { echo "---- launcher log (without step lines) ----"; grep -v '^step ' "$LOG" | tail -80; }
  exit 1
}
bed_up 2
JOB=(train "$CONFIG" --parallel.dp 2 --training.micro_batch 6 --training.max_steps "$STEPS"
  --training.eval_interval 0 --training.eval_batches 1 --training.threads 1 --data.dir "$DATA"
  --checkpoint.interval 10 --parallel.comm_timeout_s "$TIMEOUT_S")
MPIRUN_ARGS="$(bed_mpirun_args) -x OMP_NUM_THREADS=1"

BED_TIMEOUT=600 bed_mpirun 2 -x OMP_NUM_THREADS=1 "$BIN" "${JOB[@]}" --checkpoint.dir "$WORK/ref" \
  --metrics "$WORK/ref.jsonl" >"$WORK/ref.log" 2>&1 || { tail -30 "$WORK/ref.log"; fail "reference run"; }
"$BIN" export "$WORK/ref" "$WORK/ref.safetensors" >/dev/null 2>&1 || fail "export of the reference"
REF_SHA=$(sha256sum <"$WORK/ref.safetensors")

# start_launch <name>: the job under the launcher on host 0, in the background (pid LAUNCHER).
start_launch() {
  LOG=$WORK/$1.log
  bed_exec 0 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout --kill-after=10 400 "$BIN" launch -n 2 --max-restarts 6 --grace "$GRACE_S" \
    --restart-delay 2 --mpirun-args "$MPIRUN_ARGS" -- "${JOB[@]}" --checkpoint.dir "$WORK/$1" \
    --metrics "$WORK/$1.jsonl" >"$LOG" 2>&1 &
  LAUNCHER=$!
}
latest_step() { { tail -n 1 "$WORK/$1.jsonl" 2>/dev/null || true; } | sed -n 's/.*"step":\([0-9]*\).*/\1/p'; }
# wait_step <name> <K>: until the metrics show step K and the checkpoint before it is complete.
wait_step() {
  local before step
  before=$(printf '%s/%s/checkpoints/step-%08d/COMPLETE' "$WORK" "$1" $(($2 / 10 * 10)))
  while kill -0 "$LAUNCHER" 2>/dev/null; do
    step=$(latest_step "$1")
    [[ -n $step ]] && ((step >= $2)) && [[ -e $before ]] && return 0
    sleep 0.1
  done
  fail "$1: the job ended before step $2"
}
# The rank of this job with OMPI_COMM_WORLD_RANK = $2 (the bed shares the PID namespace).
rank_pid() {
  for pid in $(pgrep -f "^$BIN train .*$WORK/$1( |$)" || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
    fi
  done
}
# finish <name>: the launcher exits 0, no process of the job is left, every step of the last
# attempt and the exported parameters equal the reference's. Prints the final loss.
finish() {
  local rc=0
  wait "$LAUNCHER" || rc=$?
  ((rc == 0)) || fail "$1: the launcher exited with $rc, expected 0"
  grep -q "^meshtrain launch: the job finished after [0-9]* restarts\?$" "$LOG" ||
    fail "$1: no 'the job finished after N restarts' line"
  local left
  left=$(pgrep -fa "$WORK/$1" || true)
  [[ -z $left ]] || fail "$1: processes of the job left after the launcher exited: $left"
  /usr/bin/python3 - "$WORK/ref.jsonl" "$WORK/$1.jsonl" "$STEPS" "$LOG" <<'PY' || fail "$1: steps differ"
import re, sys
# The last attempt resumed from a checkpoint (--checkpoint.resume auto), not from step 1.
last = open(sys.argv[4], errors="replace").read().rsplit("meshtrain launch: attempt ", 1)[1]
first = re.search(r"^step\s+(\d+)/", last, re.M)
assert first and int(first.group(1)) > 1 and (int(first.group(1)) - 1) % 10 == 0, (
    f"the last attempt began at step {first and first.group(1)}, not one after a checkpoint")
def fields(line):  # raw JSON text: equal text is equal bits
    return {k: m.group(1) for k in ("step", "loss", "grad_norm")
            if (m := re.search(r'"%s":([^,}]+)' % k, line))}
ref = {int(f["step"]): f for f in map(fields, open(sys.argv[1]))}
run = {}
for f in map(fields, open(sys.argv[2])):  # the last line of a step is the last attempt's
    run[int(f["step"])] = f
steps = int(sys.argv[3])
assert sorted(run) == list(range(1, steps + 1)), f"steps logged: {sorted(run)}"
diffs = [f"step {s} {k}: {run[s][k]} vs {ref[s][k]}" for s in run for k in ("loss", "grad_norm")
         if run[s][k] != ref[s][k]]
assert not diffs, "differs from the uninterrupted run:\n  " + "\n  ".join(diffs[:10])
PY
  "$BIN" export "$WORK/$1" "$WORK/$1.safetensors" >/dev/null 2>&1 || fail "$1: export"
  [[ $(sha256sum <"$WORK/$1.safetensors") == "$REF_SHA" ]] || fail "$1: exported parameters differ"
  FINAL_LOSS=$(sed -n 's/.*"loss":\([^,}]*\).*/\1/p' "$WORK/$1.jsonl" | tail -1)
}
# What the user saw: the watchdog's report and the launcher's lines (commands cut short).
show_log() { grep -aE '^\[watchdog\]|^meshtrain launch:|^-+$|abort|ORTE|lost' "$LOG" | cut -c1-160 | sed 's/^/     | /'; }
now() { date +%s.%N; }
since() { /usr/bin/python3 -c "print(f'{$(now) - $1:.1f}')"; }

if [[ $FAULTS == *link* ]]; then
  start_launch link
  wait_step link 15
  bed_link 1 down
  down_at=$(now)
  echo "link: host 1's link down at step $(latest_step link)"
  detected=""
  while [[ -z $detected ]] && kill -0 "$LAUNCHER" 2>/dev/null; do
    grep -q '^\[watchdog\] world rank 0: .* has not completed after' "$LOG" && detected=$(since "$down_at")
    (($(date +%s) - ${down_at%.*} > 60)) && break
    sleep 0.1
  done
  [[ -n $detected ]] || fail "link: no watchdog report from rank 0 within 60 s of the link going down"
  # The attempt must end (mpirun killed after --grace if it hangs) while the link is still down.
  ended=""
  while (($(date +%s%N) - ${down_at/./} < LINK_DOWN_S * 1000000000)); do
    [[ -z $ended ]] && grep -q '^meshtrain launch: restart 1 of' "$LOG" && ended=$(since "$down_at")
    sleep 0.1
  done
  bed_link 1 up
  echo "link: up again after $(since "$down_at") s"
  /usr/bin/python3 -c "import sys; sys.exit(0 if $detected <= $TIMEOUT_S + 5 else 1)" ||
    fail "link: the watchdog reported after $detected s, more than comm_timeout_s ($TIMEOUT_S) + 5 s"
  [[ -n $ended ]] || fail "link: the first attempt had not ended when the link came back, $LINK_DOWN_S s after it went down"
  /usr/bin/python3 -c "import sys; sys.exit(0 if $ended <= $detected + $GRACE_S + 3 else 1)" ||
    fail "link: the attempt ended $ended s after the link went down, more than the watchdog's $detected s + --grace $GRACE_S s + 3 s"
  # What the user reads: the operation and its group, and the peer behind the dead link.
  # The collective that blocks first is the dp all-reduce of the gradients or, under ZeRO 0,
  # the ranks' 4-byte agreement on a finite grad norm over the world (both {0,1} here).
  grep -Eq '^\[watchdog\] world rank 0: [a-z_]+ on (dp|world)\{0,1\} \(collective #[0-9]+ of the group, [0-9]+ bytes\) has not completed after' "$LOG" ||
    fail "link: the watchdog's report does not name the operation on dp{0,1} or world{0,1}"
  grep -q '^\[watchdog\]   world rank 1 (host mthost1): no report — on another host' "$LOG" ||
    fail "link: the report does not say world rank 1 on mthost1 gave no report"
  grep -q '^\[watchdog\] unreachable from host mthost0 (on other hosts, no report): world rank 1$' "$LOG" ||
    fail "link: the report does not name world rank 1 as unreachable"
  grep -q 'every peer has reached it' "$LOG" && fail "link: the report claims every peer has reached it"
  finish link
  restarts=$(grep -c '^meshtrain launch: restart [0-9]* of' "$LOG")
  stuck=$(grep -c 'killing its process group (SIGKILL)' "$LOG" || true)
  echo "ok   link down ${LINK_DOWN_S} s: watchdog after $detected s (timeout $TIMEOUT_S s), attempt ended after $ended s, $restarts restart(s), $stuck stuck mpirun(s) killed, finished bit-identical"
  show_log
  echo "row  link_down | 1 | $detected | yes | yes ($FINAL_LOSS)"
fi

if [[ $FAULTS == *kill* ]]; then
  for ((t = 1; t <= KILL_TRIALS; t++)); do
    K=$((11 + RANDOM % 39))
    ((K % 10 != 0)) || K=$((K + 1))
    start_launch "kill$t"
    wait_step "kill$t" "$K"
    for _ in 1 2 3 4 5 6 7 8 9 10; do  # /proc may be read while a rank execs
      victim=$(rank_pid "kill$t" 1)
      [[ -n $victim ]] && break
      sleep 0.2
    done
    [[ -n $victim ]] || fail "kill$t: no rank 1 found at step $(latest_step "kill$t") among: $(pgrep -fa "$WORK/kill$t" | cut -c1-120)"
    step=$(latest_step "kill$t")
    kill -9 "$victim"
    killed_at=$(now)
    until grep -q '^meshtrain launch: restart 1 of' "$LOG"; do
      kill -0 "$LAUNCHER" 2>/dev/null || fail "kill$t: the launcher ended without a restart"
      sleep 0.1
    done
    detected=$(since "$killed_at")
    finish "kill$t"
    grep -q "^meshtrain launch: restart 1 of 6: rank 1 exited on signal 9 (Killed)" "$LOG" ||
      fail "kill$t: the restart line does not name rank 1 and signal 9"
    echo "ok   kill -9 of rank 1 on host 1 at step $step: restart after $detected s, finished bit-identical"
    show_log
    echo "row  kill_remote | $t (step $step) | $detected | yes | yes ($FINAL_LOSS)"
  done
fi
echo "net_faults: all passed"
