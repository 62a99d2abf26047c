#!/usr/bin/env bash
# tests/reference/run_export_reference.sh <export_dump> <meshtrain> <python> <hf_export_reference.py> [variant ...]
#
# The CTest driver of reference.export_matches_pytorch and reference.mixtral_export_matches_transformers:
# for each variant (default: a GPT-2 with biases, one without and a Llama; "mixtral": the
# Llama with MoE blocks), export_dump writes a final-checkpoint directory and meshtrain's
# logits, the real `meshtrain export` command turns the checkpoint into a Hugging Face file +
# config.json, and PyTorch rebuilds the model from those two files alone (Hugging Face layouts:
# GPT-2 Conv1D [in, out], Llama nn.Linear; Mixtral through transformers' MixtralForCausalLM)
# and must reproduce the logits. Fails when any step fails.
set -euo pipefail
dump=$1 meshtrain=$2 python=$3 script=$4
shift 4
variants=("$@")
((${#variants[@]})) || variants=(gpt2_bias gpt2_nobias llama)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain_export_reference.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

args=()
for variant in "${variants[@]}"; do
  flag=()
  [[ $variant == gpt2_nobias ]] && flag=(--no-bias)
  [[ $variant == llama ]] && flag=(--llama)
  [[ $variant == mixtral ]] && flag=(--mixtral)
  "$dump" "$tmp/$variant" "${flag[@]}"
  mkdir -p "$tmp/$variant/hf"
  "$meshtrain" export "$tmp/$variant/ckpt" "$tmp/$variant/hf/model.safetensors"
  args+=("$tmp/$variant")
done
"$python" "$script" "${args[@]}"
