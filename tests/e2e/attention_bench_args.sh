#!/usr/bin/env bash
# build/bench/attention_bench's arguments: each bad one exits 2 with a line that names the
# option (or "threads") and the value, before any allocation or timing, including values whose
# working set or work per round is above the bench's limits (4 GiB, 1e13 FLOP) and numbers with
# trailing junk; a small valid call exits 0 and prints its table row.
# Usage: attention_bench_args.sh <attention_bench>
set -euo pipefail
BENCH=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

expect_error() {  # expect_error <text the error must contain> <args...>
  local want=$1 rc=0
  shift
  timeout 60 "$BENCH" "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
  if ((rc != 2)); then echo "FAIL: attention_bench $* exited $rc, expected 2"; cat "$WORK/err"; exit 1; fi
  if ! grep -qF -- "$want" "$WORK/err"; then
    echo "FAIL: attention_bench $*: the error does not name '$want':"; cat "$WORK/err"; exit 1
  fi
}
expect_error "--t 0:" 1 --t 0
expect_error "--t -5:" 1 --t -5
expect_error "--t 64x:" 1 --t 64x
expect_error "--t 1e3:" 1 --t 1e3
expect_error "--t 99999999999999999999:" 1 --t 99999999999999999999
expect_error "--head-dim 0:" 1 --head-dim 0
expect_error "--heads 4.5:" 1 --heads 4.5
expect_error "--batch 100000000:" 1 --batch 100000000
expect_error "--rounds 0:" 1 --rounds 0
expect_error "threads 0:" 0
expect_error "threads 1x:" 1x
expect_error "unknown option or missing value: --t" 1 --t
expect_error "unknown option or missing value: --bogus" 1 --bogus
expect_error "--cpu-time times one thread" 2 --cpu-time
expect_error "above the 4 GiB" 1 --t 40000
expect_error "above the 4 GiB" 1 --batch 1048576 --heads 1024 --head-dim 1024 --t 1048576

timeout 120 "$BENCH" 1 --t 16 --heads 1 --head-dim 16 --rounds 1 --no-bf16 >"$WORK/out"
grep -qE '^ +16 \| f32 ' "$WORK/out" || { echo "FAIL: no f32 row for T = 16:"; cat "$WORK/out"; exit 1; }
echo "attention_bench: 16 bad calls exit 2 naming the option; a valid call runs"
