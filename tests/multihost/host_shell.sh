# tests/multihost/host_shell.sh <hostname> <dir> <command…>: the inside of a bed host
# (netns_bed.sh). Run in fresh UTS and mount namespaces: sets the host's name, mounts a private
# /tmp, and runs the command from <dir>. A command of one word with spaces (OpenMPI's agent
# call) runs through bash -c.
set -e
hostname "$1"
# A checkout under /tmp (this script's own, with its build) stays shared by the hosts, as an
# NFS home would be: its top folder is parked on /mnt (a mount of this namespace only) and
# moved back over the private /tmp.
here=$(cd "$(dirname "$0")" && pwd -P)
if [[ $here == /tmp/?* ]]; then
  top=/tmp/$(cut -d/ -f3 <<<"$here")
  mount --bind "$top" /mnt
  mount -t tmpfs -o size=512m,mode=1777 tmpfs /tmp
  mkdir "$top"
  mount --move /mnt "$top"
else
  mount -t tmpfs -o size=512m,mode=1777 tmpfs /tmp
fi
cd "$2"
shift 2
unset TMPDIR
if (($# == 1)); then exec bash -c "$1"; fi
exec "$@"
