#!/usr/bin/env bash
# Fault injection through the documented settings (docs/resilience.md, "Fault injection").
# Scenario `kill` (e2e.fault_kill) runs 0 and 1, scenario `hang` (e2e.fault_hang) runs 2.
# 0. A bad fault setting exits 2 naming it; a non-finite gradient on one rank stops the run
#    (exit 1) naming the rank and step, after the rank's "fault_injection:" line.
# 1. A killed rank under `meshtrain launch`: a dp 2 job of 20 steps with a checkpoint every 5
#    and --fault_injection.kill_step 13 --fault_injection.kill_rank 1. The rank raises SIGKILL
#    on itself on the first attempt only (MESHTRAIN_RESTART_COUNT), so the launcher restarts
#    the job once, it resumes at step 11 and finishes (exit 0) with every logged loss, grad
#    norm and val loss from step 11 on, and the final model.safetensors, bit-identical to an
#    uninterrupted run. Its checkpoints store no fault: the last reshards to one rank.
# 2. A hung rank under mpirun: --fault_injection.hang_step 3 --fault_injection.hang_rank 1 with
#    parallel.comm_timeout_s = 2: rank 0's watchdog names world rank 1 and the job exits 4
#    within the timeout + 10 s.
# Usage: fault_injection.sh <meshtrain binary> <prepared data dir> kill|hang
set -euo pipefail
. "$(dirname "$0")/mpirun_retry.sh"
BIN=$(realpath "$1")
DATA=$2
SCENARIO=$3
CONFIG=$(dirname "$0")/../../configs/shakespeare_char.toml
. "$(dirname "$0")/job_work_dir.sh"
unset MESHTRAIN_RESTART_COUNT SLURM_RESTART_COUNT
MPI=(mpirun --oversubscribe --bind-to none)
fail() {
  echo "FAIL: $1"
  [[ -z ${2:-} ]] || grep -v '^step ' "$2" || true
  exit 1
}
# Synchronous checkpoints: the step-10 one is complete before step 11 begins.
JOB=(train "$CONFIG" --parallel.dp 2 --training.micro_batch 6 --training.max_steps 20
  --training.eval_interval 10 --training.eval_batches 2 --training.threads 1 --data.dir "$DATA"
  --checkpoint.interval 5 --checkpoint.async false)

kill_scenario() {
# 0. Settings errors and the non-finite gradient.
rc=0
"$BIN" "${JOB[@]}" --parallel.dp 1 --fault_injection.kill_step 5 --fault_injection.kill_rank 1 \
  --checkpoint.dir "$WORK/bad" >"$WORK/bad.log" 2>&1 || rc=$?
((rc == 2)) || fail "a kill_rank outside the world exited $rc, expected 2" "$WORK/bad.log"
grep -qF "fault_injection.kill_rank = 1" "$WORK/bad.log" ||
  fail "the error does not name fault_injection.kill_rank" "$WORK/bad.log"
rc=0
"$BIN" "${JOB[@]}" --parallel.dp 1 --fault_injection.nonfinite_grad_step 2 \
  --fault_injection.nonfinite_grad_value nan --checkpoint.dir "$WORK/nan" >"$WORK/nan.log" 2>&1 ||
  rc=$?
((rc == 1)) || fail "a NaN gradient exited $rc, expected 1" "$WORK/nan.log"
grep -qF "fault_injection: rank 0 wrote nan into its first gradient element at step 2" \
  "$WORK/nan.log" || fail "no fault_injection line for the NaN" "$WORK/nan.log"
grep -qF "non-finite gradient norm nan at step 2; no rank put a non-finite gradient into a reduction; the first one after them is on rank 0: transformer.wte.weight" \
  "$WORK/nan.log" || fail "the divergence does not name rank 0 and step 2" "$WORK/nan.log"
echo "settings ok: a bad kill_rank exits 2; an injected NaN stops the run at step 2 (exit 1)"

# 1. Uninterrupted, then killed once under the launcher.
"${MPI[@]}" -np 2 "$BIN" "${JOB[@]}" --checkpoint.dir "$WORK/ref" --metrics "$WORK/ref.jsonl" \
  >"$WORK/ref.log" 2>&1 || fail "the uninterrupted run failed" "$WORK/ref.log"
rc=0
"$BIN" launch -n 2 --max-restarts 2 --mpirun-args "--oversubscribe --bind-to none" -- \
  "${JOB[@]}" --checkpoint.dir "$WORK/run" --metrics "$WORK/run.jsonl" \
  --fault_injection.kill_step 13 --fault_injection.kill_rank 1 >"$WORK/launch.log" 2>&1 || rc=$?
((rc == 0)) || fail "the launcher exited $rc, expected 0" "$WORK/launch.log"
for text in "fault_injection: rank 1 raises SIGKILL on itself at the start of step 13" \
  "meshtrain launch: restart 1 of 2: rank 1 exited on signal 9 (Killed)" \
  "fault_injection: rank 1: not injecting SIGKILL at step 13: this is restart 1 of the job" \
  "meshtrain launch: the job finished after 1 restart"; do
  grep -qF -- "$text" "$WORK/launch.log" || fail "the launcher's log lacks '$text'" "$WORK/launch.log"
done
[[ $(grep -c "raises SIGKILL" "$WORK/launch.log") == 1 ]] ||
  fail "the kill fired more than once" "$WORK/launch.log"
cmp -s "$WORK/ref/model.safetensors" "$WORK/run/model.safetensors" ||
  fail "the final parameters differ from the uninterrupted run's" "$WORK/launch.log"
read -r first final_loss < <(/usr/bin/python3 "$(dirname "$0")/resumed_steps.py" \
  "$WORK/ref.jsonl" "$WORK/run.jsonl" "$WORK/launch.log" 20) ||
  fail "the resumed run is not the uninterrupted one's (above)" "$WORK/launch.log"
((first == 11)) ||
  fail "the restarted attempt began at step $first, expected 11 (after the step-10 checkpoint)" \
    "$WORK/launch.log"
echo "kill ok: rank 1 killed at step 13, resumed at step 11, steps 11-20 and the final" \
  "parameters bit-identical (final loss $final_loss)"
# The rehearsal's checkpoints hold no fault: the last one reshards to one rank (where
# kill_rank 1 would be refused), and the final config.toml says kill_step = -1.
"$BIN" reshard "$WORK/run/checkpoints/step-00000020" "$WORK/dp1" --parallel.dp 1 \
  --training.micro_batch 12 >"$WORK/reshard.log" 2>&1 ||
  fail "the rehearsal's last checkpoint does not reshard to one rank" "$WORK/reshard.log"
grep -qx "kill_step = -1" "$WORK/run/config.toml" ||
  fail "the final checkpoint's config.toml stores the fault" "$WORK/run/config.toml"
echo "checkpoints ok: no fault stored; the last checkpoint reshards to dp 1"
}

hang_scenario() {

# 2. A hung rank: the watchdog names it and ends the job with exit 4.
TIMEOUT_S=2
rc=0
run_mpirun_job "$WORK/hang.log" timeout -k 5 $((TIMEOUT_S + 30)) "${MPI[@]}" -np 2 "$BIN" \
  "${JOB[@]}" --checkpoint.dir "$WORK/hang" --parallel.comm_timeout_s "$TIMEOUT_S" \
  --fault_injection.hang_step 3 --fault_injection.hang_rank 1 || rc=$?
((rc == 4)) || fail "the hung job exited $rc, expected 4" "$WORK/hang.log"
((MPIRUN_JOB_MS < (TIMEOUT_S + 10) * 1000)) ||
  fail "the hung job took $MPIRUN_JOB_MS ms, more than the timeout + 10 s" "$WORK/hang.log"
for text in "fault_injection: rank 1 hangs at the start of step 3" \
  "world rank 1: has not reached collective" "not arrived: world rank 1" "exit code 4"; do
  grep -qF -- "$text" "$WORK/hang.log" || fail "the hung job's output lacks '$text'" "$WORK/hang.log"
done
echo "hang ok: rank 1 hung at step 3, named by the watchdog, exit 4 in $MPIRUN_JOB_MS ms"
}

case $SCENARIO in
  kill) kill_scenario ;;
  hang) hang_scenario ;;
  *) echo "unknown scenario '$SCENARIO' (kill or hang)"; exit 2 ;;
esac
