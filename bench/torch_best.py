#!/usr/bin/python3
"""PyTorch at its best on this machine: the fastest verified thread/BLAS setting per core count.

    /usr/bin/python3 bench/torch_best.py [--config configs/shakespeare_char.toml] [--data DIR]
        [--cores 1,2] [--precisions fp32,bf16] [--builds openmp,pthread]
        [--coretypes auto,SkylakeX,Cooperlake] [--steps 20] [--warmup 5]
        [--blas-root build/bench_openblas] [--json OUT] [--quick] [--section.key value ...]

Debian's python3-torch 1.13 (BLAS_INFO=generic) calls whatever libblas.so.3 the loader finds.
Its speed depends on settings a user must find by hand, so this script tries them, each in its
own process running bench/torch_gpt_train.py (same model, batch, AdamW as meshtrain's config,
`--section.key value` overrides passed through) pinned with `taskset -c 0..cores-1`:
  - the OpenBLAS build: Debian's libopenblas0-openmp or libopenblas0-pthread (0.3.21),
    unpacked with `apt-get download` + `dpkg -x` under --blas-root (the system's BLAS is not
    changed) and chosen per process with LD_LIBRARY_PATH;
  - OpenBLAS's kernels (OPENBLAS_CORETYPE): 0.3.21's DYNAMIC_ARCH does not know this KVM
    guest's CPU and falls back to Prescott (SSE3) kernels, ≈5× slower than its SkylakeX or
    Cooperlake (AVX-512) ones; chosen once per build on the 1-core fp32 run;
  - torch threads t ≤ cores (torch.set_num_threads, OMP_NUM_THREADS) and BLAS threads b ≤ cores:
    the OpenMP build follows the OpenMP thread count (b = t), the pthread build ignores it and
    takes OPENBLAS_NUM_THREADS / openblas_set_num_threads (b from 1 to cores);
  - precision: fp32, and bf16 = torch.autocast('cpu', dtype=torch.bfloat16) (oneDNN matmuls).
Every run is verified from inside its process (torch_gpt_train.py's blas_runtime): the
libopenblas mapped is the chosen build's, openblas_get_parallel is that build's mode (2 OpenMP,
1 pthreads), openblas_get_num_threads = b, torch.get_num_threads = t, the affinity mask has
`cores` CPUs and the corename is the one asked for. Only verified runs can be "best".

Prints a table (per cores × precision: the best ms/step and its setting, then every run) and,
with --json OUT, writes {"torch", "cpu", "args", "coretype": {build: chosen}, "runs": [...],
"best": [{"cores", "precision", "ms_per_step", "tokens_per_s", "setting", "blas_runtime",
"verified"}]}. --quick: a tiny model (1 layer, 32 wide, T 16, batch 2), 3 steps after 1,
1 core, coretype auto: seconds, for the e2e test. Exit 0; 1 when no run is verified; 2 on bad
arguments or when the OpenBLAS builds cannot be unpacked.
"""
import argparse
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "bench", "torch_gpt_train.py")
BUILDS = {"openmp": ("libopenblas0-openmp", 2), "pthread": ("libopenblas0-pthread", 1)}
QUICK_MODEL = ["--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
               "--model.block_size", "16", "--training.micro_batch", "2"]


def fail(msg):
    print(f"torch_best.py: {msg}", file=sys.stderr)
    sys.exit(2)


def csv(text, allowed, name):
    items = [x for x in text.split(",") if x]
    bad = [x for x in items if allowed is not None and x not in allowed]
    if not items or bad:
        fail(f"--{name} '{text}': expected a comma list of {', '.join(allowed)}")
    return items


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "shakespeare_char.toml"))
    ap.add_argument("--data", default=None)
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--builds", default="openmp,pthread")
    ap.add_argument("--coretypes", default="auto,SkylakeX,Cooperlake")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--blas-root", default=os.path.join(ROOT, "build", "bench_openblas"))
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--python", default=sys.executable)
    args, overrides = ap.parse_known_args()
    if any(not o.startswith("--") or "." not in o
           for o in overrides[::2] if not o.startswith("--") or "=" not in o):
        fail(f"unknown argument(s) {' '.join(overrides)} (overrides are --section.key value)")
    try:
        args.cores = [int(c) for c in csv(args.cores, None, "cores")]
    except ValueError:
        fail(f"--cores '{args.cores}': expected a comma list of integers")
    ncpu = len(os.sched_getaffinity(0))
    if any(c < 1 or c > ncpu for c in args.cores):
        fail(f"--cores {args.cores}: each must be between 1 and the {ncpu} CPUs this process has")
    args.precisions = csv(args.precisions, ("fp32", "bf16"), "precisions")
    args.builds = csv(args.builds, tuple(BUILDS), "builds")
    args.coretypes = csv(args.coretypes, None, "coretypes")
    if args.steps < 1 or args.warmup < 0:
        fail(f"--steps {args.steps} / --warmup {args.warmup}: need steps ≥ 1, warmup ≥ 0")
    if args.quick:
        args.steps, args.warmup, args.cores, args.coretypes = 3, 1, [1], ["auto"]
        overrides = QUICK_MODEL + overrides
    check_sizes(overrides)
    args.overrides = overrides
    check_python(args.python)
    if args.json_out:
        parent = os.path.dirname(os.path.abspath(args.json_out))
        if not os.path.isdir(parent):
            fail(f"--json {args.json_out}: the directory {parent} does not exist; create it "
                 f"first (mkdir -p {parent}) or pick a path in an existing directory")
    return args


SIZES = ("model.n_layer", "model.n_head", "model.n_embd", "model.block_size",
         "model.vocab_size", "training.micro_batch")


def check_sizes(overrides):
    """Rejects a non-positive model size or batch (--model.n_layer 0) before any run."""
    pairs, i = [], 0
    while i < len(overrides):
        o = overrides[i]
        if "=" in o:
            pairs.append(tuple(o[2:].split("=", 1)))
            i += 1
        else:
            pairs.append((o[2:], overrides[i + 1] if i + 1 < len(overrides) else ""))
            i += 2
    for key, value in pairs:
        if key not in SIZES:
            continue
        try:
            ok = int(value) >= 1
        except ValueError:
            continue  # not an integer: torch_gpt_train.py names it ("expected int")
        if not ok:
            fail(f"--{key} {value}: a model size / batch must be an integer ≥ 1; "
                 f"pass e.g. --{key} 1 or leave the config's value")


def check_python(python):
    """The interpreter that runs the children must import torch (pyenv's python3 does not)."""
    try:
        proc = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True)
    except OSError as e:
        fail(f"--python {python}: cannot run it ({e}); run it with /usr/bin/python3 "
             f"(Debian's python3-torch)")
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["import torch failed"])[-1]
        fail(f"{python} cannot import torch ({why}); run it with /usr/bin/python3 "
             f"(Debian's python3-torch), e.g. /usr/bin/python3 bench/torch_best.py ...")


def build_dir(root, build):
    return os.path.join(root, "usr", "lib", "x86_64-linux-gnu", f"openblas-{build}")


def ensure_builds(root, builds):
    """Unpacks Debian's OpenBLAS builds under root (apt-get download + dpkg -x) if missing."""
    for build in builds:
        if os.path.isfile(os.path.join(build_dir(root, build), "libblas.so.3")):
            continue
        pkg = BUILDS[build][0]
        print(f"== unpacking Debian's {pkg} into {root}", file=sys.stderr)
        os.makedirs(root, exist_ok=True)
        try:
            subprocess.run(["apt-get", "download", pkg], cwd=root, check=True,
                           stdout=subprocess.DEVNULL)
            debs = sorted(glob.glob(os.path.join(root, f"{pkg}_*.deb")))
            subprocess.run(["dpkg", "-x", debs[-1], "."], cwd=root, check=True)
        except (OSError, subprocess.CalledProcessError, IndexError) as e:
            fail(f"cannot unpack {pkg} into {root} ({e}); run apt-get update, or unpack it by "
                 f"hand: cd {root} && apt-get download {pkg} && dpkg -x {pkg}_*.deb .")


def run_one(args, cores, build, coretype, t, b, precision):
    """One torch_gpt_train.py process under the setting; its JSON plus the check's verdict."""
    setting = {"cores": cores, "build": build, "coretype": coretype, "torch_threads": t,
               "blas_threads": b, "precision": precision}
    env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(b),
               LD_LIBRARY_PATH=build_dir(args.blas_root, build))
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype != "auto":
        env["OPENBLAS_CORETYPE"] = coretype
    cmd = ["taskset", "-c", ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:cores]),
           args.python, TRAIN, "--config", args.config, "--threads", str(t),
           "--blas-threads", str(b), "--precision", precision, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--json"] + (["--data", args.data] if args.data else [])
    cmd += args.overrides
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        if proc.returncode == 2:  # torch_gpt_train.py's bad-argument exit: the user's, not a run's
            sys.stderr.write(proc.stderr)
            sys.exit(2)
        tail = proc.stderr.strip().splitlines()[-5:] or ["(no stderr)"]
        return {"setting": setting, "error": proc.stderr.strip()[-500:], "verified": False,
                "mismatch": [f"process failed (exit {proc.returncode}): " + " | ".join(tail)]}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["setting"] = setting
    res["mismatch"] = verify(res["blas_runtime"], args.blas_root, setting)
    res["verified"] = not res["mismatch"]
    return res


def verify(rt, root, s):
    """What in the process's own report disagrees with the setting asked for (empty: none)."""
    want_dir = os.path.realpath(build_dir(root, s["build"]))
    checks = [
        ("libopenblas from " + want_dir, rt.get("openblas") and
         os.path.dirname(rt["openblas"]) == want_dir, rt.get("openblas")),
        (f"openblas_get_parallel {BUILDS[s['build']][1]}",
         rt.get("parallel") == BUILDS[s["build"]][1], rt.get("parallel")),
        (f"openblas_get_num_threads {s['blas_threads']}",
         rt.get("num_threads") == s["blas_threads"], rt.get("num_threads")),
        (f"torch threads {s['torch_threads']}", rt.get("torch_threads") == s["torch_threads"],
         rt.get("torch_threads")),
        (f"{s['cores']} CPUs allowed", rt.get("cpus_allowed") == s["cores"],
         rt.get("cpus_allowed")),
        (f"corename {s['coretype']}", s["coretype"] == "auto" or
         rt.get("corename", "").lower() == s["coretype"].lower(), rt.get("corename")),
    ]
    return [f"expected {what}, got {got}" for what, ok, got in checks if not ok]


def thread_grid(build, cores):
    if build == "openmp":  # OpenBLAS-OpenMP takes omp_get_max_threads() at each call
        return [(t, t) for t in range(1, cores + 1)]
    return [(t, b) for t in range(1, cores + 1) for b in range(1, cores + 1)]


def ms(r):
    return r.get("ms_per_step", float("inf")) if r["verified"] else float("inf")


def search(args):
    runs, chosen = [], {}
    for build in args.builds:  # the kernels: once per build, 1 core, fp32
        trial = [run_one(args, 1, build, ct, 1, 1, "fp32") for ct in args.coretypes]
        runs += trial
        chosen[build] = min(trial, key=ms)["setting"]["coretype"]
    for cores in args.cores:
        for build in args.builds:
            for t, b in thread_grid(build, cores):
                for precision in args.precisions:
                    if (cores, t, b, precision) == (1, 1, 1, "fp32"):
                        continue  # measured in the coretype trial above
                    runs.append(run_one(args, cores, build, chosen[build], t, b, precision))
    best = []
    for cores in args.cores:
        for precision in args.precisions:
            cands = [r for r in runs if r["setting"]["cores"] == cores
                     and r["setting"]["precision"] == precision and r["verified"]]
            if cands:
                r = min(cands, key=ms)
                best.append({"cores": cores, "precision": precision,
                             "ms_per_step": r["ms_per_step"], "tokens_per_s": r["tokens_per_s"],
                             "setting": r["setting"], "blas_runtime": r["blas_runtime"],
                             "verified": True, "params": r["params"],
                             "flops_per_token": r["flops_per_token"]})
    return runs, chosen, best


def describe(s):
    return (f"{s['build']} OpenBLAS ({s['coretype']} kernels), torch {s['torch_threads']} thr, "
            f"BLAS {s['blas_threads']} thr")


def report(args, runs, chosen, best):
    print(f"PyTorch at its best: {args.config} {' '.join(args.overrides)}, median of "
          f"{args.steps} steps after {args.warmup}; coretype chosen per build: {chosen}")
    print(f"  {'cores':>5}  {'precision':<9}  {'ms/step':>9}  setting")
    for b in best:
        print(f"  {b['cores']:>5}  {b['precision']:<9}  {b['ms_per_step']:>9.2f}  "
              f"{describe(b['setting'])} (verified: {b['blas_runtime']['corename']}, "
              f"parallel {b['blas_runtime']['parallel']}, "
              f"{b['blas_runtime']['num_threads']} BLAS thr)")
    print("  every run:")
    for r in runs:
        s = r["setting"]
        val = f"{r['ms_per_step']:9.2f}" if "ms_per_step" in r else "   failed"
        note = "" if r["verified"] else "  NOT VERIFIED: " + "; ".join(r["mismatch"])
        print(f"    {s['cores']} core(s) {s['precision']:<4} {val}  {describe(s)}{note}")


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main():
    args = parse_args()
    if not os.path.isfile(args.config):
        fail(f"--config {args.config}: no such file")
    ensure_builds(args.blas_root, args.builds)
    runs, chosen, best = search(args)
    report(args, runs, chosen, best)
    if args.json_out:
        out = {"torch": next((r["torch"] for r in runs if "torch" in r), None),
               "cpu": cpu_model(), "args": {k: v for k, v in vars(args).items()},
               "coretype": chosen, "runs": runs, "best": best}
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
