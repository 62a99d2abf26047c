#!/usr/bin/env bash
# tests/reference/run_hf_init_reference.sh <hf_init_dump> <python> <hf_init_reference.py> <gpt2_124m.toml> <work dir>
#
# The CTest driver of reference.hf_init_matches_transformers: transformers writes the models
# (hf_init_reference.py make: GPT-2 124M's shape, a small GPT-2 and a small Llama; F32, BF16,
# F16, sharded, OpenAI's hub spelling, a tied Llama), hf_init_dump loads each through
# checkpoint.init_from's loader and writes meshtrain's logits, and transformers' logits of the
# same weights must match (hf_init_reference.py check). The models (about 750 MB, most of it
# the two 124M copies) go to a fresh directory under <work dir> (the build tree, not /tmp),
# removed at the end. Fails when any step fails.
set -euo pipefail
dump=$1 python=$2 script=$3 gpt2_toml=$4 work=$5
mkdir -p "$work"
tmp=$(mktemp -d "$work/hf_init_reference.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

start=$SECONDS
"$python" "$script" make "$tmp" "$gpt2_toml"
echo "run_hf_init_reference: transformers wrote the models in $((SECONDS - start)) s ($(du -sm "$tmp" | cut -f1) MB)"
while read -r name config init_from; do
  "$dump" "$config" "$init_from" "$tmp/$name.meshtrain.safetensors"
done <"$tmp/variants.txt"
"$python" "$script" check "$tmp"
echo "run_hf_init_reference: $((SECONDS - start)) s in all"
