#!/usr/bin/env bash
# tests/reference/run_export_tokenizer_reference.sh <hf_init_dump> <meshtrain> <python> <script> <gpt2 tokenizer dir> <text> <work dir>
#
# The CTest driver of reference.export_tokenizer_matches_transformers: for each variant that
# hf_export_tokenizer_reference.py makes (GPT-2 BPE, two SentencePiece models, char), a model
# transformers wrote becomes a meshtrain final checkpoint (hf_init_dump --checkpoint-out: the
# model in meshtrain's layout, config.toml, meta.json and the tokenizer files it names, copied
# by the checkpoint writer as in a run), the real `meshtrain export` writes the Hugging
# Face directory, and the script's check loads it with AutoTokenizer / AutoModelForCausalLM.
# Works in a fresh directory under <work dir>, removed at the end. Fails when any step fails.
set -euo pipefail
dump=$1 meshtrain=$2 python=$3 script=$4 gpt2=$5 text=$6 work=$7
mkdir -p "$work"
tmp=$(mktemp -d "$work/export_tokenizer_reference.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

"$python" "$script" make "$tmp" "$gpt2" "$text"
while read -r name kind; do
  dir=$tmp/$name
  # meta.json beside the tokenizer's files, as in a prepared dataset: the checkpoint writer
  # copies the files meta.json names (none for char) into the checkpoint.
  cp "$dir/meta.json" "$dir/tok/meta.json"
  "$dump" "$dir/meshtrain.toml" "$dir/hf_in" "$dir/meshtrain.safetensors" \
    --checkpoint-out "$dir/ckpt" "$dir/tok/meta.json"
  mkdir -p "$dir/out"
  # The char model goes into a directory that holds the GPT-2 export's tokenizer files: the
  # export removes them (check then finds none), or AutoTokenizer would load GPT-2's 50,257 ids.
  [[ $kind == char ]] && cp "$tmp"/gpt2/out/{vocab.json,merges.txt,tokenizer_config.json,special_tokens_map.json} "$dir/out/"
  message=$("$meshtrain" export "$dir/ckpt" "$dir/out/model.safetensors")
  echo "$message"
  if [[ $kind == char && $message != *"no tokenizer files: Hugging Face has no tokenizer class"* ]]; then
    echo "FAILED: the char export does not say that it wrote no tokenizer files" >&2
    exit 1
  fi
  stale="removed vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json from $dir/out"
  if [[ $kind == char && $message != *"$stale"* ]]; then
    echo "FAILED: the char export does not say '$stale'" >&2
    exit 1
  fi
done <"$tmp/variants.txt"
"$python" "$script" check "$tmp" "$gpt2"
