#!/usr/bin/env bash
# `mpirun --hostfile` and `meshtrain launch` with a hostfile, as docs/multinode.md tells users
# to run them, on this one machine, every byte over loopback:
#   1. hostfile `localhost slots=2`: mpirun --hostfile H -np 2 (no --oversubscribe: the slots
#      allow 2 ranks), dp = 2;
#   2. two hosts, `nodea slots=2` and `nodeb slots=2`: names that are not this machine, so that
#      OpenMPI treats them as two nodes; its ssh is replaced by a script that runs the command
#      here (plm_rsh_agent), and its TCP traffic is held to loopback (btl_tcp_if_include lo,
#      oob_tcp_if_include lo). Ranks talk over TCP only (btl tcp,self): the two "nodes" are one
#      machine, and OpenMPI's shared-memory transport (vader) crashes when two of its node
#      daemons share one. Each "host" has a TMPDIR of its own. 4 ranks, tp 2 × dp 2. mpirun's map must put ranks 0, 1 on nodea
#      and 2, 3 on nodeb, so that each tp group (consecutive ranks: tp is the fastest mesh axis,
#      comm/device_mesh.h) is inside one node; --map-by node must instead deal them round
#      robin (0, 2 on nodea), which docs/multinode.md warns against;
#   3. the same two-host job through `meshtrain launch -n 4 --mpirun-args "--hostfile H ..."`.
# Each run trains 20 steps; its log must name the layout, its loss must fall, and every step's
# loss must be the same text as the same layout started without a hostfile; the two-host runs
# must have started OpenMPI's daemons on both hosts (the ssh stand-in logs them).
# Usage: hostfile.sh <meshtrain binary> <prepared data dir>
set -euo pipefail
BIN=$(realpath "$1")
DATA=$(realpath "$2")
CONFIG=$(dirname "$0")/../../configs/shakespeare_char.toml
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
COMMON=(--training.max_steps 20 --training.eval_interval 20 --training.eval_batches 2
  --training.threads 1 --data.dir "$DATA")
DP2=(--parallel.dp 2 --training.micro_batch 6)
TP2DP2=(--parallel.tp 2 --parallel.dp 2 --training.micro_batch 6)
fail() {
  echo "FAIL: $*"
  exit 1
}

# run <name> <launcher words...> :: <train overrides...>: trains into $WORK/<name>.
run() {
  local name=$1 launcher=()
  shift
  while [[ $1 != :: ]]; do
    launcher+=("$1")
    shift
  done
  shift
  "${launcher[@]}" train "$CONFIG" "${COMMON[@]}" "$@" --checkpoint.dir "$WORK/$name" \
    --metrics "$WORK/$name.jsonl" >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name"; }
}

# check <name> <reference name> <layout text>
check() {
  grep -qF -- "$3" "$WORK/$1.log" || { cat "$WORK/$1.log"; fail "$1: the log lacks '$3'"; }
  /usr/bin/python3 - "$1" "$WORK/$1.jsonl" "$WORK/$2.jsonl" <<'PY' || fail "$1: metrics"
import json, sys
name, path, ref_path = sys.argv[1:]
run = [json.loads(l) for l in open(path)]
ref = [json.loads(l) for l in open(ref_path)]
assert len(run) == 20 and len(ref) == 20, f"{name}: {len(run)} metric lines, expected 20"
assert run[0]["loss"] > 3.9 and run[-1]["loss"] < run[0]["loss"] - 0.4, \
    f"{name}: loss {run[0]['loss']} -> {run[-1]['loss']} did not fall by 0.4"
diff = [(a["step"], a["loss"], b["loss"]) for a, b in zip(run, ref) if repr(a["loss"]) != repr(b["loss"])]
assert not diff, f"{name}: losses differ from the run without a hostfile (step, run, ref): {diff[:3]}"
print(f"ok   {name}: loss {run[0]['loss']:.4f} -> {run[-1]['loss']:.4f}, "
      f"all 20 steps equal to the run without a hostfile")
PY
}

# 1. One host with 2 slots.
printf '# one machine, two ranks\nlocalhost slots=2\n' >"$WORK/hosts.local"
run ref_dp2 mpirun --oversubscribe --bind-to none -np 2 "$BIN" :: "${DP2[@]}"
run local_dp2 mpirun --hostfile "$WORK/hosts.local" --bind-to none -np 2 "$BIN" :: "${DP2[@]}"
check local_dp2 ref_dp2 "(gpt2) on 2 rank(s) (dp=2 tp=1 pp=1)"

# 2. Two "hosts". The agent stands in for ssh: OpenMPI runs `<agent> <host> <command...>`.
# Each host gets a TMPDIR of its own, as separate machines have: OpenMPI's node daemons create
# their session directories there, and two in one directory race.
# It logs each host it is asked for, which shows that mpirun used the hostfile.
cat >"$WORK/fake_ssh" <<EOF
#!/bin/bash
echo "\$1" >>$WORK/ssh.log
export TMPDIR=$WORK/tmp.\$1
mkdir -p "\$TMPDIR"
shift
exec bash -c "\$*"
EOF
chmod +x "$WORK/fake_ssh"
printf 'nodea slots=2\nnodeb slots=2\n' >"$WORK/hosts.two"
TWO=(--hostfile "$WORK/hosts.two" --mca plm_rsh_agent "$WORK/fake_ssh"
  --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --bind-to none)
# ranks_on <node> <mpirun --display-map output>: the ranks mpirun placed on that node (the map
# is printed more than once).
ranks_on() {
  awk -v node="$1" '/Data for node:/ { here = ($4 == node) }
    here && /Process rank:/ { for (i = 1; i < NF; i++) if ($i == "rank:") printf "%s ", $(i + 1) }' \
    <<<"$2" | xargs -n1 | sort -un | xargs
}
map=$(timeout 60 mpirun "${TWO[@]}" -np 4 --display-map true 2>&1) || fail "mpirun --display-map: $map"
[[ $(ranks_on nodea "$map") == "0 1" && $(ranks_on nodeb "$map") == "2 3" ]] ||
  fail "by-slot map is not 0 1 | 2 3: $map"
map=$(timeout 60 mpirun "${TWO[@]}" -np 4 --map-by node --display-map true 2>&1) || fail "$map"
[[ $(ranks_on nodea "$map") == "0 2" && $(ranks_on nodeb "$map") == "1 3" ]] ||
  fail "--map-by node is not 0 2 | 1 3: $map"
echo "ok   mpirun's map: ranks 0 1 on nodea, 2 3 on nodeb (by slot); 0 2 | 1 3 with --map-by node"
run ref_tp2dp2 mpirun --oversubscribe --bind-to none -np 4 "$BIN" :: "${TP2DP2[@]}"
# used_both_hosts <name>: mpirun started its daemons on nodea and nodeb (and no other host).
used_both_hosts() {
  [[ $(sort -u "$WORK/ssh.log" 2>/dev/null | xargs) == "nodea nodeb" ]] ||
    fail "$1: mpirun did not start daemons on nodea and nodeb: $(cat "$WORK/ssh.log" 2>&1)"
  rm -f "$WORK/ssh.log"
}
rm -f "$WORK/ssh.log"
run two_tp2dp2 timeout 300 mpirun "${TWO[@]}" -np 4 "$BIN" :: "${TP2DP2[@]}"
used_both_hosts two_tp2dp2
check two_tp2dp2 ref_tp2dp2 "(gpt2) on 4 rank(s) (dp=2 tp=2 pp=1)"

# 3. The launcher with the same hostfile (its --mpirun-args go before the program).
run launch_tp2dp2 timeout 300 "$BIN" launch -n 4 --mpirun-args "${TWO[*]}" -- :: "${TP2DP2[@]}"
used_both_hosts launch_tp2dp2
check launch_tp2dp2 ref_tp2dp2 "(gpt2) on 4 rank(s) (dp=2 tp=2 pp=1)"
echo "hostfile: all passed"
