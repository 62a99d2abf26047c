# Sourced by the e2e scripts that run meshtrain jobs: a fresh $WORK, removed on exit together
# with every process whose command line names it (whatever fails, no rank of the test is left
# behind), and the environment OpenMPI needs as root, with one compute thread per rank.
WORK=$(mktemp -d)
cleanup() {
  for pid in $(pgrep -f "$WORK" || true); do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
