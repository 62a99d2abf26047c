#!/usr/bin/env bash
# `meshtrain plan --emit` (docs/planner.md, "From a plan to a run"): what it prints is run.
#   1. The search's top layout for the main job's model on this machine's preset
#      (cpu-this-machine: 1 node × 2 devices), global batch 12, fp32: `--emit` prints one line
#      of flags and nothing else; `mpirun -np 2 meshtrain train <config> $(flags)` trains 2
#      steps, its log names the layout, and the config.toml it saves holds every flag's value;
#   2. the same with a layout given (--layout tp=2,sp=true,mb=6 on the Llama config);
#   3. --emit-sbatch: a bash script (bash -n) with the cluster's --nodes / --ntasks-per-node
#      and the same flags as --emit (the Slurm test, slurm_job.sh, runs one);
#   4. errors exit 2: --emit with --json; a layout that does not fit; --emit-sbatch of a
#      layout using fewer devices than the cluster; --placements without --layout or with --json;
#      a key given twice, an empty entry or an out-of-range number in --layout, a negative tp
#      (its own rule only), a --model file that does not exist;
#   5. --placements prints the placement table of a 70B layout (mesh/placement.h).
# Usage: plan_emit.sh <meshtrain binary> <prepared data dir>
set -euo pipefail
BIN=$(realpath "$1")
DATA=$(realpath "$2")
CONFIGS=$(cd "$(dirname "$0")/../../configs" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fail() {
  echo "FAIL: $*"
  exit 1
}

# emit_and_train <name> <config> <layout text> <plan arguments...>
emit_and_train() {
  local name=$1 config=$2 layout=$3
  shift 3
  local flags
  flags=$("$BIN" plan --model "$config" --cluster cpu-this-machine "$@" --emit) ||
    fail "$name: plan --emit exited $?"
  [[ $(wc -l <<<"$flags") == 1 && $flags == --parallel.tp\ * ]] ||
    fail "$name: --emit printed more than one line of flags: $flags"
  # shellcheck disable=SC2086  # the flags are words, split on purpose
  mpirun --oversubscribe --bind-to none -np 2 "$BIN" train "$config" $flags \
    --training.max_steps 2 --training.eval_interval 2 --training.eval_batches 1 \
    --training.threads 1 --data.dir "$DATA" --checkpoint.dir "$WORK/$name" \
    --metrics "$WORK/$name.jsonl" >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name: train"; }
  grep -qF -- "$layout" "$WORK/$name.log" || { cat "$WORK/$name.log"; fail "$name: no '$layout'"; }
  /usr/bin/python3 - "$name" "$WORK/$name.jsonl" "$WORK/$name/config.toml" "$flags" <<'PY' ||
import json, math, sys, tomllib
name, path, saved, flags = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
assert [l["step"] for l in lines] == [1, 2], f"{name}: steps {[l['step'] for l in lines]}"
assert all(math.isfinite(l["loss"]) and l["loss"] > 3.5 for l in lines), f"{name}: {lines}"
# The config the run saved with its checkpoint holds every emitted value.
config = tomllib.load(open(saved, "rb"))
words = flags.split()
for key, value in zip(words[0::2], words[1::2]):
    section, field = key.removeprefix("--").split(".")
    got = config[section][field]
    got = str(got).lower() if isinstance(got, bool) else str(got)
    assert got == value, f"{name}: the run's {section}.{field} is {got}, the flag said {value}"
print(f"ok   {name}: trained 2 steps with the emitted flags ({len(words) // 2} settings, "
      f"all in the run's config.toml), loss {lines[-1]['loss']:.4f}")
PY
    fail "$name: metrics or saved config"
  echo "$flags" >"$WORK/$name.flags"
}

# 1. The search's choice.
emit_and_train search "$CONFIGS/shakespeare_char.toml" "(gpt2) on 2 rank(s) (dp=2 tp=1 pp=1)" \
  --global-batch 12 --precision fp32
# 2. A layout given.
emit_and_train layout "$CONFIGS/llama_shakespeare.toml" "(llama) on 2 rank(s) (dp=1 tp=2 +sp pp=1)" \
  --global-batch 12 --precision fp32 --layout tp=2,sp=true,mb=6

# 3. The batch script.
"$BIN" plan --model "$CONFIGS/shakespeare_char.toml" --cluster cpu-this-machine --global-batch 12 \
  --precision fp32 --emit-sbatch >"$WORK/plan.sbatch" || fail "--emit-sbatch exited $?"
bash -n "$WORK/plan.sbatch" || fail "--emit-sbatch: not valid bash"
grep -qx "#SBATCH --nodes=1" "$WORK/plan.sbatch" || fail "--emit-sbatch: no --nodes=1"
grep -qx "#SBATCH --ntasks-per-node=2" "$WORK/plan.sbatch" || fail "--emit-sbatch: no --ntasks-per-node=2"
grep -qxF "  $(cat "$WORK/search.flags") \\" "$WORK/plan.sbatch" ||
  fail "--emit-sbatch: the flags differ from --emit's: $(cat "$WORK/plan.sbatch")"
echo "ok   --emit-sbatch: 1 node × 2 ranks, the flags of --emit"

# 4. Errors.
expect_error() {
  local text=$1 out rc=0
  shift
  out=$("$BIN" plan "$@" 2>&1) || rc=$?
  ((rc == 2)) || fail "exit $rc, expected 2: plan $*: $out"
  [[ $out == *"$text"* ]] || fail "message lacks '$text': plan $*: $out"
}
expect_error "give --emit or --emit-sbatch alone" --model llama3-8b --cluster 8xH100-80GB --emit --json
expect_error "the layout does not fit in the device memory" --model llama3-70b --cluster 8xH100-80GB \
  --layout tp=1,pp=1,dp=8 --emit
expect_error "a batch script allocates them all" --model llama3-8b --cluster 8xH100-80GB \
  --layout tp=8,dp=1 --nodes 2 --emit-sbatch
expect_error "add --layout" --model llama3-8b --cluster 8xH100-80GB --placements
expect_error "give --placements with --layout alone" --model llama3-8b --cluster 8xH100-80GB \
  --layout tp=8,dp=1 --placements --json
# --layout mistakes name the entry, the rule and a fix; a missing --model file suggests what
# `plan` takes.
expect_error "tp is given twice (tp=2, then tp=4)" --model llama3-8b --cluster 8xH100-80GB \
  --layout tp=2,tp=4
expect_error "entry 2 of 3 is empty (two commas in a row, or a comma at an end)" \
  --model llama3-8b --cluster 8xH100-80GB --layout tp=8,,
expect_error "tp is out of range: a mesh size is at most 2^20" --model llama3-8b \
  --cluster 8xH100-80GB --layout tp=99999999999999999999
expect_error "--layout tp=-8 has 1 problem" --model llama3-8b --cluster 8xH100-80GB --layout tp=-8
expect_error "give the path of a meshtrain config (e.g. configs/llama_shakespeare.toml), or a preset" \
  --model "$WORK/missing.toml" --cluster 8xH100-80GB
echo "ok   errors: 10 cases exit 2 with their message"

# 5. --placements: the placement table of a 70B layout, row by row.
out=$("$BIN" plan --model llama3-70b --cluster 8xH100-80GB --nodes 8 \
  --layout tp=8,pp=4,dp=2,zero=1,mb=1,sp=true --placements)
rows=$(grep -c '^model\.layers\.' <<<"$out" || true)
((rows == 80 * 9)) || fail "--placements: $rows block rows, expected 80 blocks × 9 tensors"
grep -qE '^model\.layers\.79\.mlp\.down_proj\.weight +8192×28672 +owned\(3\) +replicate +replicate +shard\(1\) +replicate +8192×3584 +dp +14680064 × dp·cp$' \
  <<<"$out" || fail "--placements: the last down_proj row is not as expected: $(grep 'layers.79.mlp.down' <<<"$out")"
grep -qE '^model\.norm\.weight +8192 +owned\(3\) .* 8192 +dp,tp +4096 × dp·cp$' <<<"$out" ||
  fail "--placements: model.norm is not summed over tp under sequence parallelism"
grep -qE '^lm_head\.weight +128256×8192 .* shard\(0\) .* 16032×8192 ' <<<"$out" ||
  fail "--placements: lm_head is not the vocabulary split over tp 8"
echo "ok   --placements: 720 block rows, shards, sums over tp and ZeRO slices as expected"
echo "plan_emit: all passed"
