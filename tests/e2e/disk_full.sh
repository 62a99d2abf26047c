#!/usr/bin/env bash
# The checkpoint file system full during a save (issue 17 item 3; docs/resilience.md, "A full
# disk"). In a private mount namespace (nothing outside the test sees it) a 14 MiB tmpfs holds
# checkpoint.dir: one checkpoint of the main job's model on 2 dp ranks (≈ 9.3 MiB: weights and
# both Adam moments) fits, a second does not.
#   1. 20 steps with a checkpoint every 5: the save of step 10 fails; the job exits 3 with a
#      message naming the file it could not write and "No space left on device", and leaves
#      step 5 complete (COMPLETE, metadata, both shards) and no temporary file in it;
#   2. step 5 still loads: `meshtrain export` of it succeeds;
#   3. `checkpoint.resume auto` removes the failed step-10 directory (said in the log), resumes
#      at step 5 and trains to 20 with every loss and grad norm the same text as an
#      uninterrupted run's; afterwards the tmpfs holds step 5 only.
# Usage: disk_full.sh <meshtrain binary> <prepared data dir>; needs root (mount).
set -euo pipefail
if [[ ${1:-} != --inside ]]; then
  exec unshare --mount --propagation private bash "$0" --inside "$@"
fi
shift
BIN=$(realpath "$1")
DATA=$(realpath "$2")
CONFIG=$(realpath "$(dirname "$0")/../../configs/shakespeare_char.toml")
WORK=$(mktemp -d)
trap 'umount "$WORK/ck" 2>/dev/null || true; rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fail() {
  echo "FAIL: $*"
  exit 1
}
mkdir "$WORK/ck" "$WORK/ref"
mount -t tmpfs -o size=14m tmpfs "$WORK/ck" || fail "cannot mount a tmpfs (root needed)"
train() {  # train <log> <checkpoint dir> <extra flags…>
  local log=$1 dir=$2
  shift 2
  mpirun --oversubscribe --bind-to none -np 2 "$BIN" train "$CONFIG" --parallel.dp 2 \
    --training.micro_batch 6 --training.max_steps 20 --training.eval_interval 0 \
    --training.eval_batches 1 --training.threads 1 --data.dir "$DATA" --checkpoint.dir "$dir" \
    --metrics "$log.jsonl" "$@" >"$log" 2>&1
}

# 1. The failed save.
rc=0
train "$WORK/full.log" "$WORK/ck" --checkpoint.interval 5 || rc=$?
[[ $rc == 3 ]] || { tail -20 "$WORK/full.log"; fail "exit code $rc on a full disk, expected 3"; }
step10=$WORK/ck/checkpoints/step-00000010
grep -qE "cannot write '$step10/[^']+': No space left on device" "$WORK/full.log" ||
  { grep -v '^step' "$WORK/full.log"; fail "the message does not name the file under $step10"; }
step5=$WORK/ck/checkpoints/step-00000005
for f in COMPLETE metadata.json rank-00000.safetensors rank-00001.safetensors; do
  [[ -f $step5/$f ]] || fail "step 5 lacks $f after the failed save"
done
leftover=$(find "$step5" -name '.*tmp*' | head -1)
[[ -z $leftover ]] || fail "a temporary file is left in step 5: $leftover"
echo "ok   full disk: exit 3, the message names $step10/…, step 5 complete"

# 2. The previous checkpoint still loads.
"$BIN" export "$step5" "$WORK/ref/step5.safetensors" >"$WORK/export.log" 2>&1 ||
  { cat "$WORK/export.log"; fail "export of step 5 after the failed save"; }
echo "ok   step 5 exports"

# 3. Resume, and compare with an uninterrupted run.
train "$WORK/resume.log" "$WORK/ck" --checkpoint.interval 0 --checkpoint.save_final false \
  --checkpoint.resume auto || { tail -20 "$WORK/resume.log"; fail "resume after the full disk"; }
grep -qF "checkpoint.resume = auto: removed $step10, a save that never completed" \
  "$WORK/resume.log" || { grep -v '^step' "$WORK/resume.log"; fail "step 10 not removed"; }
[[ ! -e $step10 ]] || fail "$step10 is still there"
train "$WORK/whole.log" "$WORK/ref/run" --checkpoint.save_final false ||
  { tail -20 "$WORK/whole.log"; fail "the uninterrupted run"; }
/usr/bin/python3 - "$WORK/resume.log.jsonl" "$WORK/whole.log.jsonl" <<'PY' || fail "resumed run"
import json, sys
resumed = [json.loads(l) for l in open(sys.argv[1])]
whole = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
assert [r["step"] for r in resumed] == list(range(6, 21)), [r["step"] for r in resumed]
for r in resumed:
    for k in ("loss", "grad_norm"):
        assert repr(r[k]) == repr(whole[r["step"]][k]), (r["step"], k, r[k], whole[r["step"]][k])
print("ok   resumed at step 5 after removing step 10: steps 6-20 bit-identical to the uninterrupted run")
PY
left=$(ls "$WORK/ck/checkpoints" | xargs)
[[ $left == step-00000005 ]] || fail "checkpoints left: '$left', expected step-00000005"
echo "disk_full: all passed"
