#!/usr/bin/env bash
# e2e.torch_best_args: bench/torch_best.py (PyTorch at its best, issue 16) in its --quick mode —
# a tiny model, 3 steps, 1 core, both OpenBLAS builds, fp32 and bf16 — writes a JSON whose best
# settings were verified inside their processes; a build that is not what its directory says
# (the "pthread" directory holding the OpenMP build) is caught and never reported best; bad
# arguments exit 2 naming the culprit.
#   torch_best_args.sh <prepared shakespeare_char dir>
set -euo pipefail
data=${1:?usage: torch_best_args.sh <prepared data dir>}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=${TORCH_PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/torch_best_args.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
blas_root=$root/build/bench_openblas

# 1. the quick search: JSON fields, every best verified against the process's own report.
"$py" "$root/bench/torch_best.py" --quick --data "$data" --blas-root "$blas_root" \
  --json "$tmp/quick.json" > "$tmp/quick.txt" || { cat "$tmp/quick.txt"; fail "quick run exit $?"; }
"$py" - "$tmp/quick.json" "$blas_root" <<'PY' || fail "quick JSON check"
import json, os, sys
out, root = json.load(open(sys.argv[1])), os.path.realpath(sys.argv[2])
for key in ("torch", "cpu", "args", "coretype", "runs", "best"):
    assert key in out, f"no '{key}' in the JSON"
assert len(out["runs"]) == 4, f"expected 4 runs (2 builds × 2 precisions), got {len(out['runs'])}"
assert {(b["cores"], b["precision"]) for b in out["best"]} == {(1, "fp32"), (1, "bf16")}, out["best"]
parallel = {"openmp": 2, "pthread": 1}
for b in out["best"]:
    s, rt = b["setting"], b["blas_runtime"]
    assert b["verified"] is True and b["ms_per_step"] > 0, b
    want = os.path.join(root, "usr/lib/x86_64-linux-gnu", f"openblas-{s['build']}")
    assert os.path.dirname(rt["openblas"]) == want, (rt["openblas"], want)
    assert rt["parallel"] == parallel[s["build"]], rt
    assert rt["num_threads"] == s["blas_threads"] and rt["torch_threads"] == s["torch_threads"], rt
    assert rt["cpus_allowed"] == 1 and rt["corename"], rt
    same = [r for r in out["runs"] if r["setting"] == s]
    assert len(same) == 1 and same[0]["ms_per_step"] == b["ms_per_step"], "best is not a run"
    assert min(r["ms_per_step"] for r in out["runs"] if r["setting"]["precision"] == s["precision"]
               and r["verified"]) == b["ms_per_step"], "best is not the fastest verified run"
assert len({r["params"] for r in out["runs"]}) == 1, "runs trained different models"
assert out["runs"][0]["config"]["model"]["n_layer"] == 1, "--quick's tiny model not used"
print("quick JSON ok:", [(b["precision"], round(b["ms_per_step"], 2)) for b in out["best"]])
PY
grep -q "PyTorch at its best" "$tmp/quick.txt" || fail "no table printed"

# 2. a directory named pthread holding the OpenMP build: the check must refuse it (exit 1).
fake=$tmp/fake/usr/lib/x86_64-linux-gnu/openblas-pthread
mkdir -p "$fake"
for f in "$blas_root"/usr/lib/x86_64-linux-gnu/openblas-openmp/*; do ln -s "$f" "$fake/"; done
rc=0
"$py" "$root/bench/torch_best.py" --quick --data "$data" --blas-root "$tmp/fake" \
  --builds pthread --precisions fp32 > "$tmp/fake.txt" 2>&1 || rc=$?
((rc == 1)) || { cat "$tmp/fake.txt"; fail "mislabelled build: exit $rc, expected 1"; }
grep -q "NOT VERIFIED: .*expected openblas_get_parallel 1, got 2" "$tmp/fake.txt" ||
  { cat "$tmp/fake.txt"; fail "mislabelled build not named"; }

# 3. bad arguments: exit 2 with the culprit named.
bad() {  # bad <expected message> <args...>
  local msg=$1 rc=0; shift
  "$py" "$root/bench/torch_best.py" --data "$data" --blas-root "$blas_root" "$@" \
    > "$tmp/bad.txt" 2>&1 || rc=$?
  ((rc == 2)) || { cat "$tmp/bad.txt"; fail "'$*': exit $rc, expected 2"; }
  grep -qF -- "$msg" "$tmp/bad.txt" || { cat "$tmp/bad.txt"; fail "'$*': no '$msg'"; }
}
bad "--cores [0]: each must be between 1" --cores 0
bad "--cores 'x': expected a comma list of integers" --cores x
bad "--precisions 'fp16': expected a comma list of fp32, bf16" --precisions fp16
bad "--builds 'mkl': expected a comma list of openmp, pthread" --builds mkl
bad "need steps ≥ 1" --steps 0
bad "unknown setting 'model.bogus'" --quick --builds openmp --precisions fp32 --model.bogus 1
bad "model.n_layer = 'two': expected int" --quick --builds openmp --precisions fp32 \
  --model.n_layer two
echo "torch_best_args: ok"
