#!/usr/bin/env bash
# scripts/slurm/train.sbatch run by a real one-node Slurm that this test starts and stops
# (docs/multinode.md, "Slurm"): Debian's slurmctld, slurmd and munged, as root, every file
# under one temporary directory (a generated slurm.conf found through SLURM_CONF, a generated
# munge key, state, spool, logs), ports chosen free on this machine; nothing in /etc is read
# or written. Then:
#   1. `sbatch --wait` of train.sbatch with 2 ranks (srun --mpi=pmix), 30 steps on dp = 2:
#      the job exits 0 (sbatch's status and scontrol's ExitCode=0:0), its output names the
#      layout, the loss falls, and every step's loss is the same text as the same run
#      started directly with mpirun -np 2;
#   2. the same with MESHTRAIN_LAUNCHER=mpirun (OpenMPI's mpirun inside the allocation);
#   3. the script `meshtrain plan --emit-sbatch` writes trains (exit 0, the loss falls);
#   4. a job with a bad config (dp = 3 on 2 ranks) ends with exit code 2 in sbatch and
#      scontrol (ExitCode=2:0) and its output names the setting;
#   5. afterwards no process of this test is left: every daemon, step and rank carries
#      SLURM_CONF=<this test's file> in its environment, so they are found and checked by it.
# Every wait is bounded (the daemons' start, each job), so that a broken Slurm fails, never hangs.
# Usage: slurm_job.sh <meshtrain binary> <prepared data dir>
set -euo pipefail
BIN=$(realpath "$1")
DATA=$(realpath "$2")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CONFIG=$ROOT/configs/shakespeare_char.toml
for tool in slurmctld slurmd sbatch scontrol sinfo munged munge; do
  command -v "$tool" >/dev/null ||
    { echo "FAIL: $tool not found: install slurmctld slurmd slurm-client munge (scripts/setup.sh)"; exit 1; }
done
WORK=$(mktemp -d)
chmod 755 "$WORK"  # munged requires its socket's directory to be searchable by all
export SLURM_CONF=$WORK/slurm.conf

# The processes of this test: those whose environment holds our SLURM_CONF.
ours() {
  local p
  for p in /proc/[0-9]*; do
    [[ ${p#/proc/} != "$$" ]] || continue
    if { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF"; then
      echo "${p#/proc/}"
    fi
  done
}
stop_all() {
  local pids i
  pids=$(ours)
  [[ -z $pids ]] || kill $pids 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    pids=$(ours)
    [[ -n $pids ]] || return 0
    sleep 0.2
  done
  kill -9 $pids 2>/dev/null || true
  sleep 0.5
}
cleanup() {
  stop_all
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for log in "$WORK"/*.log "$WORK"/job-*.out; do
    [[ -f $log ]] && { echo "---- $log (last 30 lines)"; tail -30 "$log"; }
  done
  exit 1
}

# Free TCP ports for slurmctld and slurmd (the kernel picks them; closed again at once).
read -r CTLD_PORT SLURMD_PORT < <(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
HOST=$(uname -n)
HOST=${HOST%%.*}  # the short name, as slurmd and slurmctld take it from gethostname()
CPUS=$(nproc)

# munge: the authentication Slurm's daemons and commands use, with a key of its own.
head -c 1024 /dev/urandom >"$WORK/munge.key"
chmod 400 "$WORK/munge.key"
munged -F --key-file="$WORK/munge.key" --socket="$WORK/munge.sock" --pid-file="$WORK/munged.pid" \
  --log-file="$WORK/munged.log" --seed-file="$WORK/munged.seed" 2>>"$WORK/munged.log" &
for ((i = 0; i < 50; i++)); do
  munge -n -S "$WORK/munge.sock" 2>/dev/null | unmunge -S "$WORK/munge.sock" >/dev/null 2>&1 && break
  sleep 0.2
done
((i < 50)) || fail "munged did not start within 10 s"

mkdir -p "$WORK/state" "$WORK/spool"
: >"$WORK/plugstack.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=meshtrain_test
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$WORK/munge.sock
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
PlugStackConfig=$WORK/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
MinJobAge=600
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=1024 State=UNKNOWN
PartitionName=test Nodes=$HOST Default=YES MaxTime=30 State=UP
EOF
slurmctld -D -i >"$WORK/slurmctld.stdout.log" 2>&1 &
slurmd -D >"$WORK/slurmd.stdout.log" 2>&1 &
for ((i = 0; i < 100; i++)); do
  [[ $(sinfo -h -o %T 2>/dev/null) == idle ]] && break
  sleep 0.3
done
((i < 100)) || fail "the node did not become idle within 30 s: $(sinfo 2>&1)"
echo "slurm up: node $HOST ($CPUS CPUs), slurmctld :$CTLD_PORT, slurmd :$SLURMD_PORT"
srun --mpi=list 2>&1 | grep -qw pmix || fail "Slurm's pmix plugin is missing: $(srun --mpi=list 2>&1)"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MESHTRAIN=$BIN
JOB=("$CONFIG" --parallel.dp 2 --training.micro_batch 6 --training.max_steps 30
  --training.eval_interval 30 --training.eval_batches 4 --data.dir "$DATA")

# The reference: the same 30 steps started directly with mpirun (one thread per rank, as the job).
OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np 2 "$BIN" train "${JOB[@]}" \
  --training.threads 1 --checkpoint.dir "$WORK/ref" --metrics "$WORK/ref.jsonl" \
  >"$WORK/ref.log" 2>&1 || fail "the reference mpirun run failed: $(tail -5 "$WORK/ref.log")"

# submit <name> <expected exit code> [script arguments...]: runs the job (the script $SCRIPT,
# by default scripts/slurm/train.sbatch) to its end (at most 300 s) and leaves its id in JOBID
# and its output in $WORK/job-<name>.out.
submit() {
  local name=$1 want=$2 rc=0
  shift 2
  # --time: the script asks for an hour, more than the test partition's 30 minutes (a job
  # asking for more would wait forever).
  JOBID=$(timeout 300 sbatch --wait --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
    --time=10 --chdir="$WORK" --output="$WORK/job-$name.out" \
    "${SCRIPT:-$ROOT/scripts/slurm/train.sbatch}" "$@") || rc=$?
  ((rc != 124)) || fail "$name: the job did not end within 300 s"
  ((rc == want)) || fail "$name: sbatch --wait exited $rc, expected $want"
  local code
  code=$(scontrol show job "$JOBID" | grep -o 'ExitCode=[0-9:]*')
  [[ $code == "ExitCode=$want:0" ]] || fail "$name: scontrol says $code, expected ExitCode=$want:0"
  echo "ok   $name: job $JOBID ended with exit code $want ($code)"
}

# check_trained <name> <metrics>: the job's log names the layout and the launcher, and its
# losses fall and equal the reference's, step by step.
check_trained() {
  local name=$1 out=$WORK/job-$1.out
  grep -qF "(gpt2) on 2 rank(s) (dp=2 tp=1 pp=1)" "$out" || fail "$name: no layout line in the output"
  grep -qF "2 rank(s), 1 thread(s) each, launcher $2" "$out" || fail "$name: no launcher line"
  /usr/bin/python3 - "$name" "$WORK/$name.jsonl" "$WORK/ref.jsonl" <<'PY' || fail "$name: metrics"
import json, sys
name, path, ref_path = sys.argv[1:]
run = [json.loads(l) for l in open(path)]
ref = [json.loads(l) for l in open(ref_path)]
assert len(run) == 30, f"{name}: {len(run)} metric lines, expected 30"
assert run[0]["loss"] > 3.9 and run[-1]["loss"] < run[0]["loss"] - 0.8, \
    f"{name}: loss {run[0]['loss']} -> {run[-1]['loss']} did not fall by 0.8"
diff = [(a["step"], a["loss"], b["loss"]) for a, b in zip(run, ref) if repr(a["loss"]) != repr(b["loss"])]
assert not diff, f"{name}: losses differ from the direct mpirun run at (step, job, mpirun): {diff[:3]}"
print(f"ok   {name}: loss {run[0]['loss']:.4f} -> {run[-1]['loss']:.4f}, "
      f"all 30 steps equal to mpirun -np 2")
PY
}

submit srun 0 "${JOB[@]}" --checkpoint.dir "$WORK/srun" --metrics "$WORK/srun.jsonl"
check_trained srun srun
MESHTRAIN_LAUNCHER=mpirun submit mpirun 0 "${JOB[@]}" --checkpoint.dir "$WORK/mpirun" \
  --metrics "$WORK/mpirun.jsonl"
check_trained mpirun mpirun
# The script `meshtrain plan --emit-sbatch` writes for this machine's preset (1 node × 2 ranks),
# with the run's own settings added after its name.
"$BIN" plan --model "$CONFIG" --cluster cpu-this-machine --global-batch 12 --precision fp32 \
  --emit-sbatch >"$WORK/plan.sbatch" || fail "plan --emit-sbatch exited $?"
SCRIPT=$WORK/plan.sbatch submit planned 0 --training.max_steps 30 --training.eval_interval 30 \
  --training.eval_batches 4 --data.dir "$DATA" --checkpoint.dir "$WORK/planned" \
  --metrics "$WORK/planned.jsonl"
grep -qF "(gpt2) on 2 rank(s) (dp=2 tp=1 pp=1)" "$WORK/job-planned.out" ||
  fail "planned: no layout line in the output"
/usr/bin/python3 - "$WORK/planned.jsonl" <<'PY' || fail "planned: metrics"
import json, sys
run = [json.loads(l) for l in open(sys.argv[1])]
assert len(run) == 30 and run[-1]["loss"] < run[0]["loss"] - 0.8, f"planned: {len(run)} steps"
print(f"ok   planned: the emitted script trained 30 steps, loss {run[0]['loss']:.4f} -> {run[-1]['loss']:.4f}")
PY
submit bad_config 2 "${JOB[@]}" --parallel.dp 3 --checkpoint.dir "$WORK/bad"
grep -qF "parallel.dp" "$WORK/job-bad_config.out" || fail "bad_config: the output does not name parallel.dp"
echo "ok   bad_config: the output names parallel.dp"

stop_all
left=$(ours)
[[ -z $left ]] || fail "processes left after stopping Slurm: $(ps -o pid,args -p ${left//$'\n'/,})"
echo "ok   slurmctld, slurmd, munged and every job process stopped; none left"
echo "slurm_job: all passed"
