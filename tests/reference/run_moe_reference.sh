#!/usr/bin/env bash
# tests/reference/run_moe_reference.sh <moe_dump> <python> <moe_reference.py>
#
# The CTest driver of reference.moe_matches_pytorch: dumps one SparseMoeBlock's numbers for the
# dropless block (against Hugging Face's MixtralSparseMoeBlock), the dropless block with aux and
# z losses, and capacity factor 1.0 under both drop policies (against the Switch-rule module in
# the script), then has PyTorch check all four. PYTHONPATH must reach transformers 4.36.2
# (scripts/setup.sh installs it into .pydeps; the CTest test sets PYTHONPATH).
set -euo pipefail
dump=$1 python=$2 script=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain_moe_reference.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

files=()
for variant in dropless losses capacity_probs capacity_position; do
  "$dump" "$tmp/moe_$variant.safetensors" "$variant"
  files+=("$tmp/moe_$variant.safetensors")
done
"$python" "$script" "${files[@]}"
