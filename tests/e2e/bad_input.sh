#!/usr/bin/env bash
# Bad input gets a clear error and loses nothing: each case must exit with its documented code
# (2 config/arguments, 3 data file) — not 0, not a crash (134/139) — and name the culprit.
# (One case checks that a valid variant, 0, is accepted and also writes nothing.)
# Usage: bad_input.sh <meshtrain binary> <prepared data dir>
set -u
. "$(dirname "$0")/mpirun_retry.sh"
BIN=$1
DATA=$2
CONFIG=$(dirname "$0")/../../configs/shakespeare_char.toml
LLAMA=$(dirname "$0")/../../configs/llama_shakespeare.toml
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
COMMON=(--data.dir "$DATA" --checkpoint.dir "$WORK/ckpt" --training.max_steps 2)
failures=0
passed=0

# expect <name> <exit code> <text the message must contain> -- <command...>
expect() {
  local name=$1 code=$2 text=$3
  shift 4
  run_mpirun_job "$WORK/out" "$@"
  local got=$?
  local out
  out=$(cat "$WORK/out")
  if [[ $got -ne $code ]]; then
    echo "FAIL $name: exit $got, expected $code"; echo "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  elif ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL $name: message lacks '$text'"; echo "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  elif [[ -e $WORK/ckpt ]]; then
    echo "FAIL $name: a checkpoint was written although the run was rejected"
    failures=$((failures + 1))
  else
    echo "ok   $name (exit $got)"
    passed=$((passed + 1))
  fi
}

expect "indivisible global batch" 2 "micro_batch × accumulation × dp = 6 × 1 × 2 = 12" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.dp 2 \
  --training.micro_batch 6 --training.global_batch 10
expect "n_embd not divisible by n_head" 2 "model.n_embd = 130" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --model.n_embd 130
expect "missing data file" 3 "/nonexistent/data/meta.json" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --data.dir /nonexistent/data
expect "unknown key on the command line" 2 "did you mean \`training.max_steps\`" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --training.max_step 5
printf '[training]\nlearning_rate = 0.1\n' >"$WORK/typo.toml"
expect "unknown key in the TOML file" 2 "training.learning_rate" -- \
  "$BIN" train "$WORK/typo.toml" "${COMMON[@]}"
expect "world size not the product of the parallel sizes" 2 "must equal the number of ranks launched (2)" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.dp 1
expect "tensor parallel over more ranks than the heads divide" 2 "model.n_head = 4" -- \
  mpirun --oversubscribe -np 3 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.tp 3
expect "sequence parallel with a block size tp does not divide" 2 "model.block_size = 63" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.tp 2 \
  --parallel.sequence_parallel true --model.block_size 63
expect "tensor parallel on the wrong number of ranks" 2 "pass --parallel.dp 2" -- \
  mpirun --oversubscribe -np 4 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.tp 2
expect "unwritable trace file" 2 "--trace = /proc/meshtrain_trace.json" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --trace /proc/meshtrain_trace.json
expect "context parallel with a block size 2·cp does not divide" 2 "model.block_size = 63" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.cp 2 \
  --model.block_size 63
expect "unknown cp_comm" 2 'parallel.cp_comm = ring' -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.cp 2 \
  --parallel.cp_comm ring
expect "Ulysses with heads cp does not divide" 2 "model.n_head = 6" -- \
  mpirun --oversubscribe -np 4 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.cp 4 \
  --parallel.cp_comm a2a --model.n_head 6 --model.n_embd 192
MOE=$(dirname "$0")/../../configs/llama_moe.toml
expect "expert parallel in a dense model" 2 "parallel.ep = 2" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.ep 2 \
  --parallel.dp 2
expect "MoE in the gpt2 family" 2 "model.family = gpt2" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --model.moe_experts 4
expect "experts not divisible by ep" 2 "model.moe_experts = 6 must be divisible by parallel.ep" -- \
  mpirun --oversubscribe -np 4 "$BIN" train "$MOE" "${COMMON[@]}" --model.moe_experts 6 \
  --parallel.dp 4 --parallel.ep 4 --training.micro_batch 3
expect "ep not dividing dp" 2 "parallel.dp = 3 must be divisible by parallel.ep" -- \
  mpirun --oversubscribe -np 3 "$BIN" train "$MOE" "${COMMON[@]}" --parallel.dp 3 \
  --parallel.ep 2 --training.micro_batch 4
expect "top_k above the experts" 2 "model.moe_top_k = 9" -- \
  "$BIN" train "$MOE" "${COMMON[@]}" --model.moe_top_k 9
expect "negative capacity factor" 2 "model.moe_capacity_factor = -1" -- \
  "$BIN" train "$MOE" "${COMMON[@]}" --model.moe_capacity_factor -1
expect "unknown drop policy" 2 "model.moe_token_drop_policy = random" -- \
  "$BIN" train "$MOE" "${COMMON[@]}" --model.moe_token_drop_policy random
expect "more pipeline chunks than layers" 2 "model.n_layer = 1" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.pp 2 \
  --model.n_layer 1
expect "unknown pipeline schedule" 2 "parallel.pp_schedule = pipedream" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.pp 2 \
  --parallel.pp_schedule pipedream
expect "interleaved schedule with micro-batches not a multiple of pp" 2 "training.accumulation = 3" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.pp 2 \
  --parallel.pp_schedule interleaved_1f1b --parallel.virtual_stages 2 --training.accumulation 3
expect "ZeRO stage 4" 2 "parallel.zero_stage = 4" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.zero_stage 4
expect "ZeRO-2 with the zb_h1 schedule" 2 "zb_h1 computes the weight gradients later" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.pp 2 \
  --parallel.pp_schedule zb_h1 --parallel.zero_stage 2 --training.accumulation 2
expect "unknown precision" 2 "training.precision = fp8" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --training.precision fp8
expect "fp16 loss scaler that cannot back off" 2 "training.loss_scale_backoff = 1" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --training.precision fp16 --training.loss_scale_backoff 1
expect "fp16 initial loss scale beyond 2^24" 2 "training.loss_scale_init" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --training.precision fp16 --training.loss_scale_init 1e9
expect "unknown recompute mode" 2 "training.recompute = attention" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --training.recompute attention
expect "explicit layer split that drops a layer" 2 "parallel.pp_layers = 3,0" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.pp 2 \
  --parallel.pp_layers 3,0
expect "unknown model family" 2 "model.family = bert" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --model.family bert
expect "llama with biases" 2 "llama has no biases" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --model.family llama --model.bias true
expect "gpt2 with grouped-query attention" 2 "model.n_kv_head = 2" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --model.n_kv_head 2
expect "llama kv heads that tp does not divide" 2 "model.n_kv_head = 2" -- \
  mpirun --oversubscribe -np 4 "$BIN" train "$LLAMA" "${COMMON[@]}" --parallel.tp 4
expect "non-positive rope_theta" 2 "model.rope_theta = 0" -- \
  "$BIN" train "$LLAMA" "${COMMON[@]}" --model.rope_theta 0
# The GPT config has bias = false and an even head size, so it is a valid llama (a run that
# writes nothing: save_final off).
expect "llama family from the GPT config trains" 0 "(llama) on 1 rank(s)" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --model.family llama --checkpoint.save_final false \
  --training.eval_batches 1
expect "value of the wrong type" 2 "must be an integer" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --training.max_steps many
expect "missing config file" 2 "/nonexistent.toml" -- "$BIN" train /nonexistent.toml

mkdir -p "$WORK/odd"
cp "$DATA/meta.json" "$DATA/val.bin" "$WORK/odd/"
head -c 1001 "$DATA/train.bin" >"$WORK/odd/train.bin"
expect "token file of odd size" 3 "$WORK/odd/train.bin" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --data.dir "$WORK/odd"
expect "missing text for prepare" 3 "/nonexistent.txt" -- "$BIN" prepare /nonexistent.txt --out "$WORK/p"
expect "sample from a missing checkpoint" 3 "$WORK/none: no such checkpoint directory" -- \
  "$BIN" sample "$WORK/none" --prompt "ROMEO:"

expect "non-finite learning rate" 2 "must be a finite number" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --training.lr inf
expect "override without a value" 2 "training.lr = (missing)" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --training.lr --training.max_steps 3
expect "model too large for memory (before allocating)" 2 "GiB available" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --model.n_layer 100000
expect "config path is a directory" 2 "must be an existing, readable TOML file" -- \
  "$BIN" train "$WORK" "${COMMON[@]}"
printf '[model]\nn_layer = 4.0\n' >"$WORK/float.toml"
expect "float where an integer is expected" 2 "write a whole number" -- \
  "$BIN" train "$WORK/float.toml" "${COMMON[@]}"
expect "unknown subcommand" 2 "unknown command 'fit'" -- "$BIN" fit "$CONFIG"
expect "sample with bad arguments" 2 "--temperature = nan" -- \
  "$BIN" sample "$WORK/none" --temperature nan --tokens -5 --top-k -1

# An unwritable checkpoint directory is found before training, not after it.
out=$("$BIN" train "$CONFIG" --data.dir "$DATA" --training.max_steps 2 \
  --checkpoint.dir /proc/meshtrain_ckpt 2>&1)
if [[ $? -eq 2 && $out == *"checkpoint.dir = /proc/meshtrain_ckpt"* && $out != *"step "* ]]; then
  echo "ok   unwritable checkpoint directory (exit 2, before step 1)"; passed=$((passed + 1))
else
  echo "FAIL unwritable checkpoint directory"; echo "$out" | sed 's/^/    /'
  failures=$((failures + 1))
fi

# A checkpoint whose meta.json belongs to another dataset, or whose weights hold a NaN.
"$BIN" prepare "$0" --out "$WORK/other" >/dev/null
"$BIN" train "$CONFIG" --data.dir "$DATA" --training.max_steps 1 --checkpoint.dir "$WORK/good" \
  --model.n_layer 1 >/dev/null
cp -r "$WORK/good" "$WORK/mixed" && cp "$WORK/other/meta.json" "$WORK/mixed/meta.json"
expect "sample with a foreign meta.json" 3 "does not belong to this checkpoint" -- \
  "$BIN" sample "$WORK/mixed" --prompt "ROMEO:"
cp -r "$WORK/good" "$WORK/nan"
/usr/bin/python3 - "$WORK/nan/model.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
begin = json.loads(data[8:8 + n])["transformer.wpe.weight"]["data_offsets"][0]
data[8 + n + begin:8 + n + begin + 4] = struct.pack("<f", float("nan"))
open(path, "wb").write(data)
PY
expect "sample from weights holding a NaN" 3 \
  "$WORK/nan/model.safetensors: tensor transformer.wpe.weight holds a non-finite value (nan) at element 0" -- \
  "$BIN" sample "$WORK/nan" --prompt "ROMEO:"
expect "sample with an empty prompt" 2 "--prompt = \"\"" -- \
  "$BIN" sample "$WORK/good" --prompt ""
expect "sample with a prompt outside the vocabulary" 2 "--prompt = ROMEO:€" -- \
  "$BIN" sample "$WORK/good" --prompt "ROMEO:€"

# Export (meshtrain export) and import (checkpoint.init_from): bad sources and bad files.
mkdir -p "$WORK/hf"
expect "export of a good checkpoint" 0 "exported $WORK/good" -- \
  "$BIN" export "$WORK/good" "$WORK/hf/model.safetensors"
expect "export from a missing checkpoint" 3 "$WORK/none: no such checkpoint directory" -- \
  "$BIN" export "$WORK/none" "$WORK/hf/x.safetensors"
expect "export into a missing directory" 2 "its directory $WORK/missing does not exist" -- \
  "$BIN" export "$WORK/good" "$WORK/missing/model.safetensors"
expect "export of weights holding a NaN" 3 "transformer.wpe.weight holds a non-finite value" -- \
  "$BIN" export "$WORK/nan" "$WORK/hf/nan.safetensors"
[[ ! -e $WORK/hf/nan.safetensors ]] || { echo "FAIL export of a NaN wrote a file"; failures=$((failures + 1)); }
IMPORT=(--model.n_layer 1 --checkpoint.save_final false --training.eval_batches 1)
expect "import of a good export trains" 0 "initialised the parameters from $WORK/hf/model.safetensors" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${IMPORT[@]}" \
  --checkpoint.init_from "$WORK/hf/model.safetensors"
/usr/bin/python3 - "$WORK/hf/model.safetensors" "$WORK/hf/no_ln_f.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
data = open(src, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
del header["transformer.ln_f.weight"]  # its bytes stay, unreferenced: still a valid file
text = json.dumps(header).encode()
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
expect "import of a file lacking a tensor" 3 "$WORK/hf/no_ln_f.safetensors does not fit the model" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${IMPORT[@]}" \
  --checkpoint.init_from "$WORK/hf/no_ln_f.safetensors"
expect "import names the missing tensor" 3 "tensor transformer.ln_f.weight is missing" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${IMPORT[@]}" \
  --checkpoint.init_from "$WORK/hf/no_ln_f.safetensors"
expect "import into a model of another width (tp 2: every rank agrees)" 3 \
  "tensor transformer.wte.weight has shape [65, 128] in the file; the model expects [65, 64]" -- \
  mpirun --oversubscribe -np 2 "$BIN" train "$CONFIG" "${COMMON[@]}" "${IMPORT[@]}" \
  --model.n_embd 64 --parallel.tp 2 --checkpoint.init_from "$WORK/hf/model.safetensors"
expect "import of a file of another model family" 3 \
  "the file holds a gpt2 model, the config says model.family = llama" -- \
  "$BIN" train "$LLAMA" "${COMMON[@]}" "${IMPORT[@]}" \
  --checkpoint.init_from "$WORK/hf/model.safetensors"
expect "import of a deeper model's file" 3 "tensor transformer.h.1.ln_1.weight is missing" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${IMPORT[@]}" --model.n_layer 2 \
  --checkpoint.init_from "$WORK/hf/model.safetensors"
expect "import of a meshtrain checkpoint file, not an export" 3 "meshtrain export $WORK/good" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${IMPORT[@]}" \
  --checkpoint.init_from "$WORK/good/model.safetensors"
expect "import of a missing file" 3 "checkpoint.init_from: $WORK/hf/none.safetensors: cannot open" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${IMPORT[@]}" \
  --checkpoint.init_from "$WORK/hf/none.safetensors"

expect "resume from a missing checkpoint" 3 "checkpoint $WORK/none/step-00000010: no such directory" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --checkpoint.resume "$WORK/none/step-00000010"
expect "keep no checkpoint" 2 "checkpoint.keep_last = 0" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --checkpoint.interval 1 --checkpoint.keep_last 0
expect "negative watchdog timeout" 2 "parallel.comm_timeout_s = -1" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --parallel.comm_timeout_s -1

# meshtrain plan (docs/planner.md): unknown presets list the known ones; bad layouts name the
# rule; a cluster on which no layout passes the trainer's rules is an error, not an empty table.
expect "plan: unknown model preset" 2 "llama3-70b" -- \
  "$BIN" plan --model gpt5 --cluster 8xA100-80GB
expect "plan: unknown cluster preset" 2 "8xH100-80GB" -- \
  "$BIN" plan --model llama3-8b --cluster 8xV100
expect "plan: zero nodes (not a default)" 2 "--nodes = 0" -- \
  "$BIN" plan --model llama3-8b --cluster 8xA100-80GB --nodes 0
expect "plan: a global batch too large to search" 2 "--global-batch = 2147483648" -- \
  "$BIN" plan --model llama3-8b --cluster 8xA100-80GB --global-batch 2147483648
expect "plan: unknown precision" 2 "--precision = fp8" -- \
  "$BIN" plan --model llama3-8b --cluster 8xA100-80GB --precision fp8
expect "plan: malformed layout" 2 "dp must be an integer" -- \
  "$BIN" plan --model llama3-8b --cluster 8xA100-80GB --layout tp=8,dp=x
expect "plan: layout the trainer rejects" 2 "model.n_head = 4" -- \
  "$BIN" plan --model "$CONFIG" --cluster 8xA100-80GB --layout tp=8 --global-batch 8
printf 'devices_per_node = 7\nnodes = 1\nmemory_gib = 16\n[peak_tflops]\nfp32 = 1\n[intra_node]\nbandwidth_gb_per_s = 10\n[inter_node]\nbandwidth_gb_per_s = 1\n' \
  >"$WORK/seven.toml"
expect "plan: no layout of 7 devices" 2 "no layout of 7 devices" -- \
  "$BIN" plan --model "$CONFIG" --cluster "$WORK/seven.toml" --global-batch 8 --precision fp32
sed 's/^memory_gib = 16$/memory_gib = 16\nefficency = 0.6/' "$WORK/seven.toml" >"$WORK/typo.toml"
expect "plan: a misspelt cluster-file key" 2 "efficency = (unknown key)" -- \
  "$BIN" plan --model "$CONFIG" --cluster "$WORK/typo.toml" --global-batch 8 --precision fp32
expect "plan: nothing fits" 2 "No layout fits" -- \
  "$BIN" plan --model gpt3-175b --cluster 8xA100-80GB --global-batch 8 --max-micro-batch 1
expect "plan: seed 000's LongChat-32B layout, 64 ranks on 16 devices" 2 "2 × 2 × 4 × 4 = 64" -- \
  "$BIN" plan --model llama-33b --cluster 8xA100-80GB --nodes 2 --seq 32768 --global-batch 16 \
  --layout tp=2,pp=2,dp=4,cp=4,recompute=full
expect "plan: a cp size that does not divide the devices" 2 "must divide the 16 devices" -- \
  "$BIN" plan --model llama-33b --cluster 8xA100-80GB --nodes 2 --cp 3
expect "plan: a negative claimed throughput" 2 "--claim-samples-per-s = -5" -- \
  "$BIN" plan --model llama3-8b --cluster 8xA100-80GB --claim-samples-per-s -5
expect "plan: two claims at once" 2 "give one claim" -- \
  "$BIN" plan --model llama3-8b --cluster 8xA100-80GB --claim-samples-per-s 5 \
  --claim-tokens-per-s 100
expect "plan: seed 000's Mixtral row, 32 ranks on 64 GPUs and ep 8 with dp 4" 2 \
  "4 × 2 × 4 × 1 = 32" -- \
  "$BIN" plan --model mixtral-8x7b --cluster 8xA100-80GB --nodes 8 --seq 2048 \
  --global-batch 1024 --max-micro-batch 1 --layout tp=4,pp=2,dp=4,ep=8,mb=1 \
  --claim-samples-per-s 145

# A run that fails after the checks leaves no checkpoint directory behind, and a non-finite
# gradient is reported before any update with the step and a parameter.
out=$("$BIN" train "$CONFIG" --data.dir "$DATA" --training.max_steps 5 --training.lr 1e6 \
  --training.warmup_steps 0 --training.grad_clip 0 --model.n_layer 1 \
  --checkpoint.dir "$WORK/diverged/ckpt" 2>&1)
if [[ $? -eq 1 && $out == *"non-finite"* && ! -e $WORK/diverged ]]; then
  echo "ok   diverging run: exit 1, reported, no checkpoint directory left"; passed=$((passed + 1))
else
  echo "FAIL diverging run"; echo "$out" | sed 's/^/    /'; failures=$((failures + 1))
fi

# Hugging Face models (issue 15 item 3): hostile files through checkpoint.init_from, and the
# tokenizer files of `meshtrain export`.
mkdir -p "$WORK/hf_escape" "$WORK/hf_huge" "$WORK/hf_tok"
printf '{"weight_map": {"transformer.wte.weight": "../hf/model.safetensors"}}' \
  >"$WORK/hf_escape/model.safetensors.index.json"
expect "import of an index naming a shard outside its directory" 3 \
  "names the shard \"../hf/model.safetensors\", which is not a file name in the index's directory" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${IMPORT[@]}" --checkpoint.init_from "$WORK/hf_escape"
printf '\xff\xff\xff\xff\xff\xff\xff\x7f{}' >"$WORK/hf_huge/model.safetensors"
expect "import of a file with a huge header length" 3 \
  "$WORK/hf_huge/model.safetensors: header length 9223372036854775807 exceeds safetensors' limit" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${IMPORT[@]}" --checkpoint.init_from "$WORK/hf_huge"
expect "export of a char run writes no tokenizer files and says so" 0 \
  "no tokenizer files: Hugging Face has no tokenizer class" -- \
  "$BIN" export "$WORK/good" "$WORK/hf/model.safetensors"
cp -r "$WORK/good" "$WORK/gpt2_no_files"
printf '%s' '{"format": "meshtrain-tokens-v2", "tokenizer": {"kind": "gpt2", "files": ["encoder.json", "vocab.bpe"]},
  "vocab_size": 50257, "token_dtype": "uint16", "eot_id": 50256, "sources": ["x.txt"],
  "document_separator": null, "val_fraction": 0.1, "train_tokens": 1, "val_tokens": 1}' \
  >"$WORK/gpt2_no_files/meta.json"
expect "export of a GPT-2 BPE run whose tokenizer files are missing" 3 \
  "$WORK/gpt2_no_files/encoder.json: the GPT-2 encoder.json is missing" -- \
  "$BIN" export "$WORK/gpt2_no_files" "$WORK/hf_tok/model.safetensors"
[[ -z $(ls -A "$WORK/hf_tok") ]] || { echo "FAIL the failed export left files in $WORK/hf_tok"; failures=$((failures + 1)); }

# --tensorboard: a directory that cannot be created is refused before training (exit 2).
expect "unwritable TensorBoard directory" 2 "--tensorboard = /proc/meshtrain_tb" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --tensorboard /proc/meshtrain_tb
expect "--trace-steps 0" 2 "--trace-steps: Value 0 not in range 1 to 1000000" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --trace "$WORK/t.json" --trace-steps 0

# Token files of other tools (docs/data.md): a bad header, a size that disagrees with it, an id
# outside the vocabulary, and the settings that describe them.
mkdir -p "$WORK/tokens"
/usr/bin/python3 - "$DATA" "$WORK/tokens" <<'PY'
import sys
import numpy as np
data, out = sys.argv[1:]
ids = np.fromfile(f"{data}/val.bin", dtype=np.uint16)[:5000]
def llmc(name, magic, version, count, body):
    h = np.zeros(256, dtype=np.int32)
    h[0], h[1], h[2] = magic, version, count
    open(f"{out}/{name}", "wb").write(h.tobytes() + body.tobytes())
llmc("magic.bin", 20240521, 1, len(ids), ids)
llmc("short.bin", 20240520, 1, len(ids) + 10, ids)
llmc("val.bin", 20240520, 1, len(ids), ids)
bad = ids.copy()
bad[1234] = 65
bad.tofile(f"{out}/oov.bin")
ids.tofile(f"{out}/train.bin")
PY
TOK=(--data.dir "$WORK/tokens" --model.vocab_size 65)
expect "llm.c file with the wrong magic" 3 "magic.bin' has magic 20240521" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${TOK[@]}" --data.format llmc --data.train_file magic.bin
expect "llm.c file shorter than its header says" 3 "says 5010 uint16 tokens" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${TOK[@]}" --data.format llmc --data.train_file short.bin
expect "nanoGPT file with an id outside the vocabulary" 3 "oov.bin' holds id 65 at token 1234" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${TOK[@]}" --data.format nanogpt --data.train_file oov.bin
expect "nanoGPT format without model.vocab_size" 2 "must be > 0 with data.format = \"nanogpt\"" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --data.dir "$WORK/tokens" --data.format nanogpt
expect "data.tokenizer naming a missing file" 3 "$WORK/none/tokenizer.model' does not exist" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --data.dir "$WORK/tokens" --data.format nanogpt \
  --data.tokenizer "$WORK/none/tokenizer.model"
expect "model.vocab_size below data.tokenizer's" 2 "model.vocab_size = 65" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" "${TOK[@]}" --data.format nanogpt --data.tokenizer gpt2
expect "data.tokenizer that is not meta.json's" 2 "it is a gpt2 tokenizer, the data's is char" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --data.tokenizer gpt2
expect "data.tokenizer = char" 2 "data.tokenizer = \"char\"" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --data.tokenizer char
expect "a token file name that leaves data.dir" 2 "data.train_file = \"../train.bin\"" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --data.train_file ../train.bin
expect "an unknown data.format" 2 "data.format = megatron" -- \
  "$BIN" train "$CONFIG" "${COMMON[@]}" --data.format megatron

echo "$passed passed, $failures failed"
((failures == 0))
