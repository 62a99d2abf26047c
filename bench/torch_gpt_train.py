#!/usr/bin/python3
"""PyTorch baseline for the main job: nanoGPT's training step on the same model and data.

    /usr/bin/python3 bench/torch_gpt_train.py [--config configs/shakespeare_char.toml]
        [--threads 2] [--steps 60] [--warmup 10] [--json]

Model, batch and optimizer come from the meshtrain config (model.*, training.micro_batch,
lr, betas, weight_decay, grad_clip); the model class is tests/reference/gpt_reference.py's,
the one the reference test checks against meshtrain. The loop is nanoGPT's train.py on CPU
in fp32: warmup + cosine learning rate, random batches from train.bin (uint16 memmap),
forward, loss, backward, clip_grad_norm_, AdamW (2-D params decayed), zero_grad. A step is timed from fetching its
batch to the end of the optimizer step, like meshtrain's step_time_s. PyTorch 1.13 has no
torch.compile and no scaled_dot_product_attention, so this is eager mode with nanoGPT's
manual attention; AdamW uses foreach=True (PyTorch's faster multi-tensor path).

Prints a one-line summary, or with --json one JSON object: ms_per_step (median),
ms_per_step_mean, tokens_per_s, threads, steps, warmup, first_loss, last_loss, torch,
params, flops_per_token, blas (the BLAS libraries loaded), blas_is_reference.
"""
import argparse
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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)
    m, t = cfg["model"], cfg["training"]
    data_dir = args.data or cfg.get("data", {}).get("dir", "data/prepared/shakespeare_char")
    if not os.path.isabs(data_dir):
        data_dir = os.path.join(ROOT, data_dir)
    with open(os.path.join(data_dir, "meta.json")) as f:
        vocab_size = json.load(f)["vocab_size"]

    torch.set_num_threads(args.threads)
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
        loss = loss_fn(model(x), y)
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
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"torch {torch.__version__}, {result['threads']} threads: "
              f"{result['ms_per_step']:.2f} ms/step median over {args.steps} steps "
              f"(mean {result['ms_per_step_mean']:.2f}), {result['tokens_per_s']:.0f} tokens/s, "
              f"loss {losses[0]:.3f} → {losses[-1]:.3f}; BLAS {', '.join(blas) or 'none found'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
