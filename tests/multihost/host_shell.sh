# tests/multihost/host_shell.sh <hostname> <dir> <command…>: the inside of a bed host
# (netns_bed.sh). Run in fresh UTS and mount namespaces: sets the host's name, mounts a private
# /tmp, and runs the command from <dir>. A command of one word with spaces (OpenMPI's agent
# call) runs through bash -c.
set -e
hostname "$1"
mount -t tmpfs -o size=512m,mode=1777 tmpfs /tmp
cd "$2"
shift 2
unset TMPDIR
if (($# == 1)); then exec bash -c "$1"; fi
exec "$@"
