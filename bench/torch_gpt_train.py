#!/usr/bin/python3
"""PyTorch baseline for the main job: nanoGPT's training step on the same model and data.

    /usr/bin/python3 bench/torch_gpt_train.py [--config configs/shakespeare_char.toml]
        [--threads 2] [--blas-threads N] [--precision fp32|bf16] [--steps 60] [--warmup 10]
        [--json] [--section.key value ...]

Model, batch and optimizer come from the meshtrain config (model.*, training.micro_batch,
lr, betas, weight_decay, grad_clip); the model class is tests/reference/gpt_reference.py's,
the one the reference test checks against meshtrain. The loop is nanoGPT's train.py on CPU
in fp32 (or, with --precision bf16, under torch.autocast('cpu', dtype=torch.bfloat16): PyTorch
1.13's CPU mixed precision, fp32 weights and AdamW, bf16 matmuls through its oneDNN): warmup + cosine learning rate, random batches from train.bin (uint16 memmap),
forward, loss, backward, clip_grad_norm_, AdamW (2-D params decayed), zero_grad. A step is timed from fetching its
batch to the end of the optimizer step, like meshtrain's step_time_s. PyTorch 1.13 has no
torch.compile and no scaled_dot_product_attention, so this is eager mode with nanoGPT's
manual attention; AdamW uses foreach=True (PyTorch's faster multi-tensor path).

`--section.key value` overrides a setting of the config as meshtrain's command line does
(e.g. --model.n_layer 6 --model.n_embd 384 --training.micro_batch 4); only the model.*,
training.* and data.dir settings this script reads are accepted, anything else exits 2.
--blas-threads N calls openblas_set_num_threads(N) when OpenBLAS is loaded (its pthread build
ignores torch.set_num_threads; its OpenMP build follows the OpenMP thread count at each call).

Prints a one-line summary, or with --json one JSON object: ms_per_step (median),
ms_per_step_mean, tokens_per_s, threads, steps, warmup, first_loss, last_loss, torch,
params, flops_per_token, blas (the BLAS libraries loaded), blas_is_reference, precision,
config (the model/training settings used), and blas_runtime: what the process verified about
the BLAS it ran on, read after the timed steps — "openblas" (the libopenblas file mapped, or
null), its corename (the kernels DYNAMIC_ARCH picked), config string, parallel (0 sequential,
1 pthreads, 2 OpenMP, as openblas_get_parallel) and num_threads (openblas_get_num_threads);
torch_threads (torch.get_num_threads), cpus_allowed (the affinity mask's size), omp_max_threads, and the environment's
OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / OPENBLAS_CORETYPE. Exit 2 on bad arguments.
"""
import argparse
import contextlib
import ctypes
import json
import math
import os
import re
import statistics
import sys
import time
import tomllib

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from gpt_reference import GPT, adamw_param_groups, loss_fn  # noqa: E402


def init_gpt2_(model, n_layer, std):
    """GPT-2 initialisation as meshtrain's (and nanoGPT's): N(0, std²) weights and embeddings,
    std/√(2·n_layer) for the residual projections c_proj, zero biases, unit LayerNorm."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("c_proj.weight"):
                p.normal_(0.0, std / math.sqrt(2 * n_layer))
            elif p.dim() >= 2:
                p.normal_(0.0, std)
            elif "ln_" in name and name.endswith(".weight"):
                p.fill_(1.0)
            else:
                p.zero_()


def loaded_blas():
    """The BLAS libraries mapped into this process (Debian's torch calls libblas.so.3)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if re.search(r"lib(open)?blas|libmkl|libblis", os.path.basename(path)):
                libs.add(os.path.realpath(path))
    return sorted(libs)


# The settings this script reads, with their types: what --section.key may override.
OVERRIDABLE = {
    "model": {"n_layer": int, "n_head": int, "n_embd": int, "block_size": int, "bias": bool,
              "dropout": float},
    "training": {"micro_batch": int, "accumulation": int, "max_steps": int, "lr": float,
                 "min_lr": float, "warmup_steps": int, "lr_decay_steps": int,
                 "weight_decay": float, "beta1": float, "beta2": float, "eps": float,
                 "grad_clip": float, "seed": int},
    "data": {"dir": str},
}


def parse_value(key, kind, text):
    """One override's value as the setting's type; ValueError naming the setting otherwise."""
    if kind is bool:
        if text not in ("true", "false"):
            raise ValueError(f"{key} = '{text}': expected true or false")
        return text == "true"
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{key} = '{text}': expected {kind.__name__}") from None
    if kind in (int, float) and not math.isfinite(value):
        raise ValueError(f"{key} = '{text}': expected a finite number")
    return value


def apply_overrides(cfg, rest):
    """Applies ['--section.key', 'value', ...] to the loaded TOML dict, meshtrain's CLI style."""
    i = 0
    while i < len(rest):
        arg = rest[i]
        if not arg.startswith("--") or "." not in arg:
            raise ValueError(f"unknown argument '{arg}' (overrides are --section.key value)")
        name, _, inline = arg[2:].partition("=")
        section, _, key = name.partition(".")
        kind = OVERRIDABLE.get(section, {}).get(key)
        if kind is None:
            known = ", ".join(f"{s}.{k}" for s, ks in OVERRIDABLE.items() for k in ks)
            raise ValueError(f"unknown setting '{name}' (this script reads: {known})")
        if inline:
            text, i = inline, i + 1
        elif i + 1 < len(rest):
            text, i = rest[i + 1], i + 2
        else:
            raise ValueError(f"override '{arg}' has no value")
        cfg.setdefault(section, {})[key] = parse_value(name, kind, text)


def openblas_handle():
    """ctypes handle of the libopenblas mapped into this process, and its path (or None)."""
    for lib in loaded_blas():
        if "openblas" in os.path.basename(lib):
            return ctypes.CDLL(lib), lib
    return None, None


def blas_runtime():
    """What this process runs on, read from the libraries themselves (not from settings)."""
    info = {"openblas": None, "torch_threads": torch.get_num_threads(),
            "cpus_allowed": len(os.sched_getaffinity(0)),
            "env": {k: os.environ.get(k) for k in
                    ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
                     "LD_LIBRARY_PATH")}}
    with contextlib.suppress(OSError):
        gomp = ctypes.CDLL("libgomp.so.1")
        info["omp_max_threads"] = gomp.omp_get_max_threads()
    lib, path = openblas_handle()
    if lib is not None:
        lib.openblas_get_config.restype = ctypes.c_char_p
        lib.openblas_get_corename.restype = ctypes.c_char_p
        info.update(openblas=path, corename=lib.openblas_get_corename().decode(),
                    openblas_config=lib.openblas_get_config().decode(),
                    parallel=lib.openblas_get_parallel(),
                    num_threads=lib.openblas_get_num_threads())
    return info


def flops_per_token(model, n_layer, n_embd, block):
    """6·N + 12·L·C·T with N without wpe, as meshtrain's GptModel::flops_per_token."""
    n = sum(p.numel() for name, p in model.named_parameters() if "wpe" not in name)
    return 6 * n + 12 * n_layer * n_embd * block


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "shakespeare_char.toml"))
    ap.add_argument("--data", default=None, help="prepared data dir (default: the config's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=60, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps before")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="openblas_set_num_threads(N) if OpenBLAS is loaded")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--json", action="store_true")
    args, rest = ap.parse_known_args()
    for name, value in (("--threads", args.threads), ("--steps", args.steps),
                        ("--blas-threads", args.blas_threads or 1)):
        if value < 1:
            ap.error(f"{name} {value}: must be ≥ 1")
    if args.warmup < 0:
        ap.error(f"--warmup {args.warmup}: must be ≥ 0")

    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)
    try:
        apply_overrides(cfg, rest)
    except ValueError as e:
        ap.error(str(e))  # exit 2, usage + message
    m, t = cfg["model"], cfg["training"]
    data_dir = args.data or cfg.get("data", {}).get("dir", "data/prepared/shakespeare_char")
    if not os.path.isabs(data_dir):
        data_dir = os.path.join(ROOT, data_dir)
    with open(os.path.join(data_dir, "meta.json")) as f:
        vocab_size = json.load(f)["vocab_size"]

    torch.set_num_threads(args.threads)
    if args.blas_threads is not None:
        lib, _ = openblas_handle()
        if lib is not None:
            lib.openblas_set_num_threads(args.blas_threads)
    torch.manual_seed(int(t.get("seed", 1337)))
    block, batch = int(m["block_size"]), int(t["micro_batch"]) * int(t.get("accumulation", 1))
    model = GPT(int(m["n_layer"]), int(m["n_head"]), int(m["n_embd"]), block, vocab_size,
                bool(m.get("bias", False)))
    init_gpt2_(model, int(m["n_layer"]), 0.02)
    optimizer = torch.optim.AdamW(adamw_param_groups(model, float(t["weight_decay"])),
                                  lr=float(t["lr"]), betas=(float(t["beta1"]), float(t["beta2"])),
                                  eps=float(t.get("eps", 1e-8)), foreach=True)
    grad_clip = float(t["grad_clip"])

    train = np.memmap(os.path.join(data_dir, "train.bin"), dtype=np.uint16, mode="r")

    def get_batch():  # nanoGPT train.py get_batch, CPU branch
        ix = torch.randint(len(train) - block, (batch,))
        x = torch.stack([torch.from_numpy(train[i:i + block].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(train[i + 1:i + 1 + block].astype(np.int64))
                         for i in ix])
        return x, y

    peak, min_lr = float(t["lr"]), float(t.get("min_lr", t["lr"]))
    warmup_iters = int(t.get("warmup_steps", 0))
    decay_iters = int(t.get("lr_decay_steps", 0)) or int(t.get("max_steps", 2000))

    def get_lr(it):  # nanoGPT train.py get_lr, as meshtrain's lr_at
        if it < warmup_iters:
            return peak * (it + 1) / (warmup_iters + 1)
        if it > decay_iters:
            return min_lr
        ratio = (it - warmup_iters) / (decay_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak - min_lr)

    times, losses = [], []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = get_lr(step)
        x, y = get_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(x)
        loss = loss_fn(logits.float(), y)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        losses.append(loss.item())
        if step >= args.warmup:
            times.append(elapsed)

    median = statistics.median(times)
    blas = loaded_blas()
    runtime = blas_runtime()
    result = {
        "ms_per_step": median * 1e3,
        "ms_per_step_mean": statistics.fmean(times) * 1e3,
        "tokens_per_s": batch * block / median,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "warmup": args.warmup,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "torch": torch.__version__,
        "params": sum(p.numel() for p in model.parameters()),
        "flops_per_token": flops_per_token(model, int(m["n_layer"]), int(m["n_embd"]), block),
        "blas": blas,
        # Debian's reference BLAS lives in .../blas/libblas.so.3 (alternatives' fallback).
        "blas_is_reference": any(re.search(r"/blas/libblas\.so", b) for b in blas),
        "blas_runtime": runtime,
        "precision": args.precision,
        "config": {"model": m, "training": t, "data_dir": data_dir, "vocab_size": vocab_size},
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"torch {torch.__version__} {args.precision}, {result['threads']} threads: "
              f"{result['ms_per_step']:.2f} ms/step median over {args.steps} steps "
              f"(mean {result['ms_per_step_mean']:.2f}), {result['tokens_per_s']:.0f} tokens/s, "
              f"loss {losses[0]:.3f} → {losses[-1]:.3f}; BLAS {', '.join(blas) or 'none found'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
