#!/usr/bin/env bash
# One slow link and one slow host (issue 17 item 3; docs/resilience.md, "Slow links and slow
# hosts"), dp 2 with one rank per host on the bed of netns_bed.sh, 15 steps, a straggler report
# every 5:
#   0. a reference run on the bed, nothing slowed;
#   1. slow link: host 1's interface throttled by a token bucket (`tc qdisc … tbf rate 40mbit`;
#      the kernels here have no netem). The run completes with every loss and grad norm the
#      same text as the reference; each step's time inside the dp all-reduce is at least 90 %
#      of dp_comm_bytes over 40 Mbit/s (the bucket's bound), and the straggler report names
#      nobody: a collective waits for its slowest link on every member alike, so the slow link
#      shows as dp_comm_s on both ranks, not as one rank's compute;
#   2. slow host: host 1's ranks cycled with SIGSTOP / SIGCONT (150 ms stopped, 20 ms running)
#      for the whole run. It completes equal to the reference, and every report after the
#      first names world rank 1 on mthost1 with a compute phase, and never rank 0 (which
#      waits for it inside collectives, which the report takes out).
# Usage: slow_link_host.sh <meshtrain binary> <prepared data dir>
set -euo pipefail
BIN=$(realpath "$1")
DATA=$(realpath "$2")
CONFIG=$(realpath "$(dirname "$0")/../../configs/shakespeare_char.toml")
source "$(dirname "$0")/netns_bed.sh"
WORK=$(mktemp -d -p "$PWD" slow.XXXXXX)
trap 'bed_down; [[ -n ${KEEP:-} ]] || rm -rf "$WORK"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
bed_up 2
train() {  # train <name>: 15 steps, dp 2, one rank per host
  BED_TIMEOUT=300 bed_mpirun 2 -x OMP_NUM_THREADS=1 "$BIN" train "$CONFIG" --parallel.dp 2 \
    --training.micro_batch 6 --training.max_steps 15 --training.eval_interval 0 \
    --training.eval_batches 1 --training.threads 1 --training.straggler_interval 5 \
    --data.dir "$DATA" --checkpoint.dir "$WORK/$1" --checkpoint.save_final false \
    --metrics "$WORK/$1.jsonl" >"$WORK/$1.log" 2>&1 || { tail -30 "$WORK/$1.log"; fail "training $1"; }
}
same_as_reference() {  # same_as_reference <name>
  /usr/bin/python3 - "$WORK/$1.jsonl" "$WORK/ref.jsonl" <<'PY' || fail "$1 differs from the reference"
import json, sys
run, ref = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert [r["step"] for r in run] == list(range(1, 16)), [r["step"] for r in run]
for a, b in zip(run, ref):
    for k in ("loss", "grad_norm"):
        assert repr(a[k]) == repr(b[k]), (a["step"], k, a[k], b[k])
PY
}

train ref
echo "ok   reference: 15 steps on 2 hosts"

# 1. Slow link.
ip netns exec "$(bed_ns 1)" tc qdisc add dev eth0 root tbf rate 40mbit burst 64kb latency 50ms
train slow_link
ip netns exec "$(bed_ns 1)" tc qdisc del dev eth0 root
same_as_reference slow_link
/usr/bin/python3 - "$WORK/slow_link.jsonl" <<'PY' || fail "slow link"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bound = rows[0]["dp_comm_bytes"] * 8 / 40e6  # seconds for the all-reduce's bytes at 40 Mbit/s
slow = [r["step"] for r in rows if r["dp_comm_s"] < 0.9 * bound]
assert not slow, f"steps {slow} spent < 90 % of {bound:.3f} s in the all-reduce"
named = [(r["step"], r["stragglers"]) for r in rows if r.get("stragglers")]
assert not named, f"a slow link is nobody's compute, yet the report named {named}"
reports = sum(1 for r in rows if "stragglers" in r)
assert reports == 3, f"{reports} straggler reports, expected 3"
med = sorted(r["dp_comm_s"] for r in rows)[len(rows) // 2]
print(f"ok   slow link: equal to the reference; dp_comm_s median {med:.3f} s per step "
      f"(bound {bound:.3f} s); 3 reports, none naming a rank")
PY

# 2. Slow host: SIGSTOP / SIGCONT of host 1's meshtrain processes while the run lasts.
train slow_host &
job=$!
cycles=0
pids=
while kill -0 "$job" 2>/dev/null; do
  # Found once and kept while they live: looking them up (ip, cat, xargs) every cycle took
  # long enough on a busy machine to stretch the 20 ms of running, and a report once named
  # nobody. (`|| true`: under pipefail a loop ending on a non-matching pid would fail.)
  if [[ -z $pids ]] || ! kill -0 $pids 2>/dev/null; then
    pids=$(ip netns pids "$(bed_ns 1)" 2>/dev/null | while read -r p; do
      if [[ $(cat "/proc/$p/comm" 2>/dev/null) == meshtrain ]]; then echo "$p"; fi; done | xargs) || true
  fi
  if [[ -n $pids ]]; then
    kill -STOP $pids 2>/dev/null || true
    sleep 0.15
    kill -CONT $pids 2>/dev/null || true
    cycles=$((cycles + 1))
  fi
  sleep 0.02
done
wait "$job" || fail "the slow-host run failed"
((cycles >= 10)) || fail "only $cycles stop/continue cycles ran"
same_as_reference slow_host
/usr/bin/python3 - "$WORK/slow_host.jsonl" <<'PY' || { grep -i straggler "$WORK/slow_host.log"; fail "slow host"; }
import json, sys
reports = [r for r in map(json.loads, open(sys.argv[1])) if "stragglers" in r]
assert len(reports) == 3, f"{len(reports)} straggler reports, expected 3"
for r in reports[1:]:
    named = {(s["rank"], s["host"]) for s in r["stragglers"]}
    assert (1, "mthost1") in named, f"step {r['step']}: report {r['stragglers']} lacks rank 1 on mthost1"
    assert all(s["rank"] != 0 for s in r["stragglers"]), f"step {r['step']}: rank 0 named"
    assert all(s["phase"] in ("data", "forward", "backward", "optimizer")
               for s in r["stragglers"]), r["stragglers"]
print("ok   slow host: equal to the reference; reports at steps",
      [r["step"] for r in reports[1:]], "name",
      sorted({f"rank {s['rank']} on {s['host']} ({s['phase']})" for r in reports[1:] for s in r["stragglers"]}))
PY
grep -m1 "straggler report.*rank 1 on mthost1" "$WORK/slow_host.log" ||
  fail "the log's straggler report does not name rank 1 on mthost1"
echo "slow_link_host: all passed"
