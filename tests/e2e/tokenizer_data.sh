#!/usr/bin/env bash
# Tokenizers end to end (issue 15): GPT-2 and SentencePiece datasets train, their checkpoints
# carry the tokenizer files, and `sample` encodes the prompt and decodes with the run's
# tokenizer; nanoGPT's raw GPT-2 files trained with data.tokenizer (plain and padded to 50304)
# do the same; bad tokenizer inputs exit 3 (a bad file, named) or 2 (a bad argument).
# Usage: tokenizer_data.sh <meshtrain binary>
set -u
BIN=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CONFIG=$ROOT/configs/shakespeare_char.toml
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
failures=0
passed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; [[ -n ${2:-} ]] && echo "$2" | sed 's/^/    /'; failures=$((failures + 1)); }

# expect <name> <exit code> <text the message must contain> -- <command...>
expect() {
  local name=$1 code=$2 text=$3
  shift 4
  local out got
  out=$("$@" 2>&1)
  got=$?
  if [[ $got -ne $code ]]; then
    fail "$name: exit $got, expected $code" "$out"
  elif ! grep -qF -- "$text" <<<"$out"; then
    fail "$name: message lacks '$text'" "$out"
  else
    ok "$name (exit $got)"
  fi
}

TEXT=$ROOT/data/tinystories_sample.txt
expect "prepare: unknown tokenizer name" 3 "unknown tokenizer 'gpt3'" -- \
  "$BIN" prepare "$TEXT" --tokenizer gpt3 --out "$WORK/p"
expect "prepare: a missing .model" 3 "$WORK/none.model" -- \
  "$BIN" prepare "$TEXT" --tokenizer "$WORK/none.model" --out "$WORK/p"
printf 'not a model' >"$WORK/garbage.model"
expect "prepare: a garbage .model" 3 "$WORK/garbage.model" -- \
  "$BIN" prepare "$TEXT" --tokenizer "$WORK/garbage.model" --out "$WORK/p"
mkdir -p "$WORK/badgpt2" && echo '{"a": 0' >"$WORK/badgpt2/encoder.json" && : >"$WORK/badgpt2/vocab.bpe"
expect "prepare: a broken encoder.json" 3 "$WORK/badgpt2/encoder.json" -- \
  "$BIN" prepare "$TEXT" --tokenizer "$WORK/badgpt2" --out "$WORK/p"
expect "prepare: --val-fraction 1" 2 "--val-fraction = 1" -- \
  "$BIN" prepare "$TEXT" --val-fraction 1 --out "$WORK/p"
[[ -e $WORK/p ]] && fail "a rejected prepare left $WORK/p behind" || ok "rejected prepares wrote nothing"
expect "tokenizer train: bad model type and size" 2 "--model-type = wordpiece" -- \
  "$BIN" tokenizer train --input "$TEXT" --model-type wordpiece --vocab-size 3 --out "$WORK/sp"
expect "tokenizer train: a missing input" 3 "$WORK/none.txt" -- \
  "$BIN" tokenizer train --input "$WORK/none.txt" --vocab-size 100 --out "$WORK/sp"

# A tokenizer's dataset → a short run → the checkpoint → sample with that tokenizer.
# run <name> <tokenizer> <prompt>
run() {
  local name=$1 tokenizer=$2 prompt=$3 out
  if ! out=$("$BIN" prepare "$ROOT/data/tinyshakespeare.txt" "$TEXT" --tokenizer "$tokenizer" \
      --document-separator "<|endoftext|>" --out "$WORK/$name/data" --quiet 2>&1); then
    fail "$name: prepare" "$out"; return
  fi
  if ! out=$("$BIN" train "$CONFIG" --data.dir "$WORK/$name/data" --checkpoint.dir "$WORK/$name/ckpt" \
      --training.max_steps 3 --training.eval_interval 3 --training.eval_batches 1 \
      --model.n_layer 1 --model.n_embd 32 --model.n_head 2 --training.micro_batch 2 2>&1); then
    fail "$name: train" "$out"; return
  fi
  local files missing=0
  files=$(/usr/bin/python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["tokenizer"]["files"]))' \
    "$WORK/$name/ckpt/meta.json")
  for f in $files; do
    cmp -s "$WORK/$name/data/$f" "$WORK/$name/ckpt/$f" || { fail "$name: checkpoint lacks $f"; missing=1; }
  done
  [[ -n $files && $missing -eq 0 ]] && ok "$name: the checkpoint carries $files"
  if out=$("$BIN" sample "$WORK/$name/ckpt" --prompt "$prompt" --tokens 8 2>&1) && [[ $out == "$prompt"* ]]; then
    ok "$name: sample continues the prompt: ${out:0:40}"
  else
    fail "$name: sample" "$out"
  fi
}
run gpt2 gpt2 "Once upon a time"

# nanoGPT's raw files of GPT-2 ids (the gpt2 run's .bin without meta.json) with data.tokenizer
# and no model.vocab_size, and with nanoGPT's padded 50304: the checkpoint gets a meta.json and
# GPT-2's files, and sample decodes with them.
# foreign <name> <extra train args...>
foreign() {
  local name=$1 out
  shift
  if ! out=$("$BIN" train "$CONFIG" --data.dir "$WORK/nanogpt" --data.format nanogpt \
      --data.tokenizer gpt2 --checkpoint.dir "$WORK/$name" --training.max_steps 3 \
      --training.eval_interval 3 --training.eval_batches 1 --model.n_layer 1 --model.n_embd 32 \
      --model.n_head 2 --training.micro_batch 2 "$@" 2>&1); then
    fail "$name: train" "$out"; return
  fi
  if out=$(/usr/bin/python3 - "$WORK/$name" "$ROOT/data/tokenizers/gpt2" <<'PY' 2>&1
import filecmp, json, sys
ckpt, gpt2 = sys.argv[1:]
meta = json.load(open(f"{ckpt}/meta.json"))
assert meta["format"] == "meshtrain-tokens-v2", meta
assert meta["tokenizer"] == {"kind": "gpt2", "files": ["encoder.json", "vocab.bpe"]}, meta
assert (meta["vocab_size"], meta["eot_id"], meta["token_dtype"]) == (50257, 50256, "uint16"), meta
for f in ("encoder.json", "vocab.bpe"):
    assert filecmp.cmp(f"{ckpt}/{f}", f"{gpt2}/{f}", shallow=False), f
PY
  ); then
    ok "$name: the checkpoint carries meta.json (gpt2, 50257 ids) and GPT-2's files"
  else
    fail "$name: checkpoint tokenizer" "$out"
  fi
  local prompt="Once upon a time"
  if out=$("$BIN" sample "$WORK/$name" --prompt "$prompt" --tokens 8 2>&1) &&
      [[ $out == "$prompt"* && ${#out} -gt ${#prompt} ]]; then
    ok "$name: sample decodes with GPT-2: ${out:0:40}"
  else
    fail "$name: sample" "$out"
  fi
}
mkdir -p "$WORK/nanogpt" && cp "$WORK/gpt2/data/train.bin" "$WORK/gpt2/data/val.bin" "$WORK/nanogpt/"
foreign nanogpt_tokenizer
foreign nanogpt_padded --model.vocab_size 50304
# Same tokens, same seed: the nanoGPT run is the meshtrain-format gpt2 run, so are its samples.
if [[ $("$BIN" sample "$WORK/nanogpt_tokenizer" --prompt "The" --tokens 20 2>&1) == \
      "$("$BIN" sample "$WORK/gpt2/ckpt" --prompt "The" --tokens 20 2>&1)" ]]; then
  ok "nanogpt_tokenizer: samples equal the meshtrain-format gpt2 run's"
else
  fail "nanogpt_tokenizer: samples differ from the gpt2 run's"
fi
grep -q '^vocab_size = 50304$' "$WORK/nanogpt_padded/config.toml" &&
  ok "nanogpt_padded: config.toml keeps model.vocab_size = 50304" ||
  fail "nanogpt_padded: config.toml" "$(grep vocab_size "$WORK/nanogpt_padded/config.toml")"

if "$BIN" tokenizer train --input "$ROOT/data/tinyshakespeare.txt" --vocab-size 500 \
    --out "$WORK/sp" >/dev/null 2>&1; then
  run sentencepiece "$WORK/sp/tokenizer.model" "ROMEO:"
else
  fail "tokenizer train"
fi
# A dataset whose tokenizer files do not match its meta.json is refused before the first step
# (exit 3, the file named) and no checkpoint is written: the final checkpoint copies those
# files and sample/export read them. broken <name> <dataset> <text> <edit command...>
broken() {
  local name=$1 data=$2 text=$3
  shift 3
  rm -rf "$WORK/broken" && cp -r "$data" "$WORK/broken" && "$@"
  expect "train: $name" 3 "$text" -- "$BIN" train "$CONFIG" --data.dir "$WORK/broken" \
    --checkpoint.dir "$WORK/broken_ckpt" --training.max_steps 2 --model.n_layer 1 \
    --model.n_embd 32 --model.n_head 2 --training.micro_batch 2
  [[ -e $WORK/broken_ckpt ]] && fail "train: $name left $WORK/broken_ckpt" ||
    ok "train: $name wrote no checkpoint"
}
edit_meta() {
  /usr/bin/python3 -c 'import json,sys; p=sys.argv[1]; m=json.load(open(p)); exec(sys.argv[2]); json.dump(m, open(p, "w"))' \
    "$WORK/broken/meta.json" "$1"
}
if [[ -f $WORK/sentencepiece/data/tokenizer.model ]]; then
  SPD=$WORK/sentencepiece/data
  broken "a deleted tokenizer.model" "$SPD" "$WORK/broken/tokenizer.model" rm "$WORK/broken/tokenizer.model"
  broken "a garbage tokenizer.model" "$SPD" "$WORK/broken/tokenizer.model" \
    /usr/bin/python3 -c 'import os,sys; open(sys.argv[1], "wb").write(os.urandom(4096))' "$WORK/broken/tokenizer.model"
  broken "meta.json kind gpt2 beside a tokenizer.model" "$SPD" "$WORK/broken/vocab.bpe" \
    edit_meta 'm["tokenizer"]["kind"] = "gpt2"'
  broken "meta.json vocab_size 2000 for a 500-id model" "$SPD" "has 500 ids but its meta.json says \"vocab_size\" = 2000" \
    edit_meta 'm["vocab_size"] = 2000'
  broken "meta.json eot_id 5 for a model whose eos is 2" "$SPD" "says \"eot_id\" = 5 but the sentencepiece tokenizer beside it has end-of-text id 2" \
    edit_meta 'm["eot_id"] = 5'
fi
if [[ -f $WORK/gpt2/data/encoder.json ]]; then
  broken "a deleted vocab.bpe" "$WORK/gpt2/data" "$WORK/broken/vocab.bpe" rm "$WORK/broken/vocab.bpe"
  broken "gpt2 meta.json naming tokenizer.model" "$WORK/gpt2/data" \
    "names tokenizer files [tokenizer.model] but a gpt2 tokenizer is [encoder.json, vocab.bpe]" \
    edit_meta 'm["tokenizer"]["files"] = ["tokenizer.model"]'
fi

# A truncated model in a checkpoint is a bad file there too.
if [[ -f $WORK/sentencepiece/ckpt/tokenizer.model ]]; then
  head -c 100 "$WORK/sp/tokenizer.model" >"$WORK/sentencepiece/ckpt/tokenizer.model"
  expect "sample: a truncated tokenizer.model in the checkpoint" 3 \
    "$WORK/sentencepiece/ckpt/tokenizer.model" -- "$BIN" sample "$WORK/sentencepiece/ckpt" --prompt "A"
fi

echo "$passed passed, $failures failed"
((failures == 0))
