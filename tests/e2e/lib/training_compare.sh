# tests/e2e/lib/training_compare.sh — what the short real training runs (tp_training.sh,
# cp_training.sh, moe_training.sh) share: a scratch directory, running a training command with
# its output kept for the failure report, the layout line of the run log, the metrics checks
# (steps, the loss falling from ln(65) below a bound, the val loss, a parallel dimension's
# traffic) and sampling from the checkpoint. Sourced after `set -euo pipefail`, with BIN set.

CONFIGS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../configs" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# run_logged <log> <command>...: runs the command with stdout and stderr in <log>; on failure
# prints the log and exits 1.
run_logged() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }
}

# expect_in_log <name> <log> <text>: the run log holds <text> (the model, the layout, a summary).
expect_in_log() {
  grep -qF -- "$3" "$2" || { echo "$1: the run log lacks '$3'"; cat "$2"; exit 1; }
}

# check_metrics <name> <metrics file> <steps> <loss bound> [<comm field>]: <steps> metric lines;
# the first loss ≈ ln(65) ≈ 4.17 (within 0.15); the mean train loss of the last 5 steps and
# the val loss of the last step below <loss bound>; <comm field> (e.g. tp_comm_bytes) > 0 on
# every step when given.
check_metrics() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
name, path, steps, bound = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
comm = sys.argv[5] if len(sys.argv) > 5 else None
lines = [json.loads(l) for l in open(path)]
assert len(lines) == steps, f"{name}: {len(lines)} metric lines, expected {steps}"
first, last = lines[0], lines[-1]
tail = sum(l["loss"] for l in lines[-5:]) / 5
assert abs(first["loss"] - 4.17) < 0.15, f"{name}: initial loss {first['loss']} is not ≈ ln(65)"
assert tail < bound, f"{name}: mean train loss of steps {steps - 4}-{steps} is {tail}, expected < {bound}"
assert last["val_loss"] < bound, f"{name}: val loss at step {steps} is {last['val_loss']}, expected < {bound}"
if comm is not None:
    assert all(l[comm] > 0 for l in lines), f"{name}: no traffic ({comm} is 0)"
print(f"ok   {name}: loss {first['loss']:.3f} -> {last['loss']:.3f} "
      f"(last 5: {tail:.3f}), val {last['val_loss']:.3f}")
PY
}

# check_sample <name> <checkpoint dir>: the checkpoint samples 50 tokens that start with the
# prompt.
check_sample() {
  local out
  out=$("$BIN" sample "$2" --prompt "ROMEO:" --tokens 50)
  [[ $out == ROMEO:* && ${#out} -ge 50 ]] || { echo "$1: bad sample: $out"; exit 1; }
  echo "ok   $1: sample ${out:0:40}"
}
