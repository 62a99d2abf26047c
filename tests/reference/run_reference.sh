#!/usr/bin/env bash
# tests/reference/run_reference.sh <reference_dump> <python> <gpt_reference.py>
#
# The CTest driver of reference.models_match_pytorch: dumps the C++ model's numbers for a GPT-2
# with biases, one without, and a Llama (GQA, RoPE, SwiGLU, RMSNorm, untied head) into a
# temporary directory, then has PyTorch check all three. Fails (non-zero) when either program
# fails or any comparison is outside its tolerance.
set -euo pipefail
dump=$1 python=$2 script=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain_reference.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

"$dump" "$tmp/gpt_bias.safetensors"
"$dump" "$tmp/gpt_nobias.safetensors" --no-bias
"$dump" "$tmp/llama.safetensors" --llama
"$python" "$script" "$tmp/gpt_bias.safetensors" "$tmp/gpt_nobias.safetensors" \
    "$tmp/llama.safetensors"
