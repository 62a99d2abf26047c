# tests/multihost/netns_bed.sh — a multi-host test bed on one Linux machine (issue 17 item 1).
#
# Sourced by the tests in this folder (bash, run as root). `bed_up N` makes N "hosts", each a
# network namespace with one veth interface (eth0, 10.211.0.<i+1>/24) whose peer sits on a
# bridge inside a namespace of its own (the "switch"), so the root namespace's network is never
# touched and only addresses the bed made are used. Each command run on a host (bed_exec, and
# the rsh agent netns_rsh that OpenMPI uses instead of ssh) also gets a UTS namespace with its
# own hostname (mthost<i>) and a mount namespace with a private tmpfs on /tmp, as separate
# machines have: OpenMPI then treats the hosts as separate nodes (shared memory only inside a
# host, TCP between them) and nothing node-local is shared by accident. Everything else of the
# file system (the build, the data, checkpoint folders) is shared, as a cluster's shared FS:
# a test keeps its files outside /tmp (bed_up puts its own in a folder under $PWD, BED_WORK).
#
#   bed_up N            create hosts 0 … N−1 and the switch; bed_down removes them (trap it)
#   bed_exec I CMD…     run CMD on host I (its network, hostname and /tmp)
#   bed_mpirun NP ARGS… mpirun from host 0 over a hostfile of all hosts (1 slot each unless
#                       BED_SLOTS is set), launching through netns_rsh; ARGS are mpirun's
#                       options then the program; killed after BED_TIMEOUT s (600)
#   bed_hostfile        write the hostfile of all hosts (BED_SLOTS each); print its path
#   bed_mpirun_args     the mpirun options bed_mpirun uses, one line (for meshtrain launch)
#   bed_tx_bytes I      bytes host I has sent on eth0 (from its /sys/class/net statistics)
#   bed_link I up|down  bring host I's switch port up or down (a lost link)
#
# Needs iproute2 (ip, tc), util-linux (unshare) and root; bed_up fails loudly otherwise.

BED_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BED_ID=mt$$       # namespace prefix, unique per test process
BED_HOSTS=0
BED_SUBNET=10.211.0

bed_ns() { echo "${BED_ID}-h$1"; }
bed_addr() { echo "$BED_SUBNET.$(($1 + 1))"; }

# Namespaces of bed runs whose test process is gone (killed by a timeout before its trap ran).
bed_remove_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^mt[0-9]+-(sw|h[0-9]+)$'); do
    pid=${ns%%-*}
    pid=${pid#mt}
    [[ -d /proc/$pid ]] && continue
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

bed_up() {
  local n=$1 i
  command -v ip >/dev/null || { echo "bed_up: iproute2's ip is missing (apt-get install iproute2)" >&2; return 1; }
  bed_remove_stale
  # A signal ends the test through exit, so its EXIT trap (bed_down) still runs.
  trap 'exit 143' TERM INT
  ip netns add "${BED_ID}-sw" || { echo "bed_up: cannot create network namespaces (root needed)" >&2; return 1; }
  BED_HOSTS=$n
  ip -n "${BED_ID}-sw" link add br0 type bridge
  ip -n "${BED_ID}-sw" link set br0 up
  for ((i = 0; i < n; i++)); do
    ip netns add "$(bed_ns "$i")"
    ip link add eth0 netns "$(bed_ns "$i")" type veth peer name "p$i" netns "${BED_ID}-sw"
    ip -n "${BED_ID}-sw" link set "p$i" master br0 up
    ip -n "$(bed_ns "$i")" addr add "$(bed_addr "$i")/24" dev eth0
    ip -n "$(bed_ns "$i")" link set eth0 up
    ip -n "$(bed_ns "$i")" link set lo up
  done
  # The bridge forwards once its ports leave the listening state; wait for every host to answer.
  for ((i = 1; i < n; i++)); do
    local tries=0
    until bed_reachable 0 "$i"; do
      ((++tries < 30)) || { echo "bed_up: host $i unreachable from host 0" >&2; return 1; }
      sleep 0.2
    done
  done
  # The agent reads the namespace prefix from its own file: OpenMPI does not pass our
  # environment to the agent reliably.
  BED_WORK=$(mktemp -d -p "$PWD" bed.XXXXXX)
  BED_AGENT=$BED_WORK/netns_rsh
  sed "s|@BED_ID@|$BED_ID|; s|@BED_SUBNET@|$BED_SUBNET|; s|@BED_DIR@|$BED_DIR|" \
    "$BED_DIR/netns_rsh.in" >"$BED_AGENT"
  chmod +x "$BED_AGENT"
}

# bed_reachable I J: host J answers host I (a TCP connection to a closed port of J is refused,
# which needs a round trip; no ping in a minimal Debian).
bed_reachable() {
  local out
  out=$(ip netns exec "$(bed_ns "$1")" timeout 2 bash -c "exec 3<>/dev/tcp/$(bed_addr "$2")/9" 2>&1)
  [[ $out == *"refused"* ]]
}

bed_down() {
  local i
  for ((i = 0; i < BED_HOSTS; i++)); do
    # Processes left in a namespace (a killed test) would keep its interfaces alive.
    ip netns pids "$(bed_ns "$i")" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$(bed_ns "$i")" 2>/dev/null || true
  done
  ip netns del "${BED_ID}-sw" 2>/dev/null || true
  [[ -n ${BED_WORK:-} ]] && rm -rf "$BED_WORK"
  BED_HOSTS=0
}

bed_exec() {
  local i=$1
  shift
  ip netns exec "$(bed_ns "$i")" unshare --uts --mount --propagation private \
    bash "$BED_DIR/host_shell.sh" "mthost$i" "$PWD" "$@"
}

# bed_hostfile: writes the hostfile of all hosts (BED_SLOTS slots each, 1 by default) and
# prints its path.
bed_hostfile() {
  local i hostfile=$BED_WORK/hostfile
  : >"$hostfile"
  for ((i = 0; i < BED_HOSTS; i++)); do echo "$(bed_addr "$i") slots=${BED_SLOTS:-1}" >>"$hostfile"; done
  echo "$hostfile"
}

# bed_mpirun_args: mpirun's options for the bed, one line (for `meshtrain launch --mpirun-args`).
# OpenMPI's TCP transports on eth0 only (lo would connect a host's ranks to themselves over
# the loopback, and bypass the wire the test measures); shared memory inside a host.
bed_mpirun_args() {
  echo "--hostfile $(bed_hostfile) --bind-to none --mca plm_rsh_agent $BED_AGENT" \
    "--mca btl tcp,vader,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0"
}

bed_mpirun() {
  local np=$1
  shift
  # shellcheck disable=SC2046  # bed_mpirun_args is word-split on purpose (no blanks inside)
  bed_exec 0 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout --kill-after=10 "${BED_TIMEOUT:-600}" mpirun -np "$np" $(bed_mpirun_args) "$@"
}

bed_tx_bytes() { ip netns exec "$(bed_ns "$1")" cat /sys/class/net/eth0/statistics/tx_bytes; }

bed_link() { ip -n "${BED_ID}-sw" link set "p$1" "$2"; }
