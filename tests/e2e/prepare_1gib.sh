#!/usr/bin/env bash
# Streaming `prepare` in constant memory (issue 15 item 2): a 1 GiB corpus generated here is
# prepared with the char tokenizer while the peak resident memory of the process is measured
# (getrusage of the child, ru_maxrss); it must stay under 256 MiB — reading the corpus whole
# would need 1 GiB for the text alone. The token files must hold exactly one uint16 per byte,
# split at int(n · 0.9). Everything is deleted at the end.
# Usage: prepare_1gib.sh <meshtrain binary>
set -euo pipefail
BIN=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
BYTES=$((1 << 30))
LIMIT_KIB=$((256 * 1024))

# yes ends on SIGPIPE when head has its bytes: the size check below is what matters.
yes "The quick brown fox jumps over the lazy dog; 0123456789 ÀÉÎ <|endoftext|>" |
  head -c $BYTES >"$WORK/big.txt" || true
[[ $(stat -c %s "$WORK/big.txt") -eq $BYTES ]] || { echo "FAIL could not write 1 GiB to $WORK"; exit 1; }
start=$(date +%s.%N)
/usr/bin/python3 - "$BIN" "$WORK" "$LIMIT_KIB" <<'PY'
import resource, subprocess, sys
binary, work, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
subprocess.run([binary, "prepare", f"{work}/big.txt", "--out", f"{work}/out"], check=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
print(f"peak RSS of prepare on 1 GiB: {peak / 1024:.1f} MiB (limit {limit / 1024:.0f} MiB)")
assert peak < limit, f"peak RSS {peak} KiB is not below {limit} KiB"
PY
end=$(date +%s.%N)
train=$(stat -c %s "$WORK/out/train.bin")
val=$(stat -c %s "$WORK/out/val.bin")
n_train=$(/usr/bin/python3 -c "print(int($BYTES * 0.9))")
[[ $train -eq $((2 * n_train)) && $val -eq $((2 * (BYTES - n_train))) ]] || {
  echo "FAIL token files hold $train + $val bytes, expected $((2 * n_train)) + $((2 * (BYTES - n_train)))"
  exit 1
}
grep -q "\"train_tokens\": $n_train," "$WORK/out/meta.json" || { echo "FAIL meta.json counts"; exit 1; }
echo "ok   1 GiB streamed: $n_train + $((BYTES - n_train)) tokens, prepare took $(printf '%.1f' "$(echo "$end - $start" | bc)") s"
