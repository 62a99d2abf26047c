#!/usr/bin/env bash
# tests/reference/run_export_reference.sh <export_dump> <meshtrain> <python> <hf_export_reference.py>
#
# The CTest driver of reference.export_matches_pytorch: for a GPT-2 with biases, one without
# and a Llama, export_dump writes a final-checkpoint directory and meshtrain's logits, the real
# `meshtrain export` command turns the checkpoint into a Hugging Face file + config.json, and
# PyTorch rebuilds the model from those two files alone (Hugging Face layouts: GPT-2 Conv1D
# [in, out], Llama nn.Linear) and must reproduce the logits. Fails when any step fails.
set -euo pipefail
dump=$1 meshtrain=$2 python=$3 script=$4
tmp=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain_export_reference.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

args=()
for variant in gpt2_bias gpt2_nobias llama; do
  flag=()
  [[ $variant == gpt2_nobias ]] && flag=(--no-bias)
  [[ $variant == llama ]] && flag=(--llama)
  "$dump" "$tmp/$variant" "${flag[@]}"
  mkdir -p "$tmp/$variant/hf"
  "$meshtrain" export "$tmp/$variant/ckpt" "$tmp/$variant/hf/model.safetensors"
  args+=("$tmp/$variant")
done
"$python" "$script" "${args[@]}"
