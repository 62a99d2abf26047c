#!/usr/bin/python3
"""PyTorch reference for meshtrain's single-process GPT-2 and Llama (DESIGN invariant 4).

    /usr/bin/python3 tests/reference/gpt_reference.py OUT.safetensors [MORE.safetensors ...]

Each file is written by reference_dump (tests/reference/reference_dump.cpp): the initial
weights, a batch, and what meshtrain computed from them. This script rebuilds the same model
in PyTorch (Debian python3-torch 1.13, fp32 by default) from the file's config: family "gpt2"
as nanoGPT's GPT-2 (tied head, optional biases), family "llama" as Hugging Face's
LlamaForCausalLM written out by hand in torch (RMSNorm, rotary embedding, grouped-query
attention, SwiGLU, untied head; transformers is not used). It loads the weights and checks
  1. logits and the mean cross-entropy loss of the initial weights,
  2. every parameter gradient after one backward,
  3. the losses and pre-clipping grad norms of the training steps (torch.optim.AdamW with
     meshtrain's parameter groups + torch.nn.utils.clip_grad_norm_), from PyTorch's own
     gradients: the end-to-end trajectory,
  4. the parameters after each step when torch.optim.AdamW + clip_grad_norm_ are fed
     meshtrain's own gradients (opt.grad<k>.*): the optimizer alone, well conditioned.
It prints a table of the measured errors and exits 1 if any is over its tolerance, naming the
tensor, else 0. The model class is also used by bench/torch_gpt_train.py.
"""
import argparse
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FORMAT_VERSION = 1
# Everything in a reference_dump file that is not a parameter, its gradient or an opt.* tensor.
DATA_TENSORS = {"tokens", "targets", "logits", "loss", "losses", "grad_norms", "clip_coefs"}
REGENERATE = "build/tests/reference/reference_dump OUT.safetensors [--no-bias | --llama]"

# --------------------------------------------------------------------------------------------
# Tolerances. fp32 unit roundoff is 6e-8. Measured with the tp-capable layers (issue 3: the
# vocabulary-parallel loss and the GQA attention kernel; fp32 PyTorch, both GPT-2 files, 2
# threads): loss 1.1e-7, logits 2.1e-7, gradients ≤ 5.2e-7, trajectory losses ≤ 1.1e-7, grad
# norms ≤ 4.0e-7, replayed clipped gradients ≤ 3.9e-7, replayed parameters ≤ 3.5e-7. The Llama file (GQA 4/2 heads, RoPE, SwiGLU, RMSNorm, untied head), measured when
# it was added, needs no different tolerance: loss 1.1e-7, logits 3.9e-7, gradients ≤ 6.0e-7
# (layers.1 k_proj), trajectory losses ≤ 1.1e-7, grad norms ≤ 8.5e-8, replayed clipped
# gradients ≤ 1.9e-7, replayed parameters ≤ 1.2e-7. Perturbing the PyTorch Llama shows what
# the checks see: kv head h % Hkv instead of h // (H/Hkv) moves the logits by 1.0 and the loss
# by 1.8e-3; interleaved (GPT-J) RoPE pairs instead of rotate_half move the logits by 9.5e-3,
# every gradient by ≥ 6e-3, but the loss by only 2.6e-5, so the logits and gradients, not the
# loss, are what pin the RoPE convention.
# A failure a little above a tolerance means "investigate", not "loosen".
#
# The loss is a mean over 64 tokens of lse − logit[target] (softmax over 65 classes); two
# correct fp32 implementations that sum in different orders differ by ~sqrt(n)·eps ≈ 1e-6 at
# worst. 1e-5 relative (~80 ulp) leaves room for that and still catches a formula error
# (a missing 1/N, a wrong scale or eps moves it by ≥ 1e-3).
LOSS_RTOL = 1e-5
# Logits and gradients: max|Δ| / max|reference| per tensor. Normalised by the tensor's largest
# element because an element that is nearly zero (a cancelled gradient) has no meaningful
# relative error. The longest chains are fp32 GEMMs over ≤ 4·C = 256 terms through 2 blocks
# and the tied head, ~1e-6 of the largest element; 1e-4 leaves margin, while a wrong factor
# or a missing term (say the tied head's share of wte's gradient, a bias gradient, or one
# kv head's share of the GQA gradient) is O(1e-2 … 1).
TENSOR_TOL = 1e-4
# Trajectory losses: relative, per step. PyTorch's and meshtrain's gradients differ by ~1e-7,
# which Adam amplifies only for elements whose gradient is ~eps; those carry almost no loss,
# so the curves agree to ~1e-7. Sensitivity, measured by perturbing PyTorch's side (relative
# change of the step-3 loss): beta2 0.99 instead of 0.95 → 2e-4, beta1 0.95 → 6e-4, no
# clipping → 9e-4, eps 1e-6 → 1e-4, decay on every tensor → 3.5e-5, no decay → 2.3e-5. Adam
# cancels a constant gradient scale, so a clip coefficient wrong by a constant factor (clip
# 0.55 instead of 0.5: 1e-7) is invisible here: the grad-norm and replay checks cover it.
TRAJ_LOSS_RTOL = 1e-5
# Grad norms and clip coefficients: relative. A sum of ~1e5 squares: meshtrain accumulates in
# double, PyTorch takes the fp32 norm of per-tensor fp32 norms (~1e-7 relative); a dp-style
# factor error is O(1).
GRAD_NORM_RTOL = 1e-5
# Optimizer replay: PyTorch's clip_grad_norm_ and AdamW run on meshtrain's raw gradients
# (opt.grad<k>.*); then max|Δ| / max|reference| per tensor of the clipped gradients (against
# opt.clipped<k>.*: the clip coefficient, GRAD_NORM_RTOL) and of the parameters after step k
# (opt.param<k>.*). Both sides round the same fp32 operations in the same order, so the
# parameters agree to a few ulp of the largest element; decay applied to the wrong tensors,
# or missing, moves the largest element by lr·wd·|w| = 1e-4·|w| per step, 10× this
# tolerance, and an error in the Adam update (≈ lr = 1e-3 per element) is larger still.
REPLAY_TOL = 1e-5


# --------------------------------------------------------------------------------------------
# safetensors without the safetensors package: u64 LE header length, JSON header, raw data.
_DTYPES = {"F32": np.float32, "I32": np.int32, "F64": np.float64, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = memoryview(blob)[8 + n:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=_DTYPES[info["dtype"]])
        tensors[name] = arr.reshape(info["shape"]).copy()
    return tensors, meta


# --------------------------------------------------------------------------------------------
# The model: GPT-2 as nanoGPT writes it, attributes named so that named_parameters() gives
# the Hugging Face names meshtrain uses; nn.Linear layout [out, in]; LM head tied to wte.
class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (torch 1.13's nn.LayerNorm cannot drop only the bias)."""

    def __init__(self, n, bias, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, bias):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # [q | k | v], head h at columns h·hd
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, n_embd, bias):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, bias):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, bias)
        self.ln_2 = LayerNorm(n_embd, bias)
        self.mlp = Mlp(n_embd, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size, bias):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList(Block(n_embd, n_head, bias) for _ in range(n_layer)),
            ln_f=LayerNorm(n_embd, bias),
        ))

    def forward(self, idx):
        """idx [B, T] int64 → logits [B·T, V]."""
        B, T = idx.shape
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(T, device=idx.device))
        for block in tr.h:
            x = block(x)
        x = tr.ln_f(x)
        return F.linear(x, tr.wte.weight).view(B * T, -1)  # tied LM head


def loss_fn(logits, targets):
    return F.cross_entropy(logits, targets.reshape(-1))


def adamw_param_groups(model, weight_decay):
    """meshtrain's (and nanoGPT's) rule: 2-D tensors decay, biases and norms do not."""
    params = list(model.parameters())
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


# --------------------------------------------------------------------------------------------
# The Llama model: Hugging Face LlamaForCausalLM's math written out in torch 1.13 (which has no
# scaled_dot_product_attention), attributes named so that named_parameters() gives the Hugging
# Face names; no biases; LM head untied from embed_tokens.
class LlamaRMSNorm(nn.Module):
    """HF LlamaRMSNorm: x · rsqrt(mean(x², -1) + eps) · weight, computed in fp32 (or fp64)."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float64 if dtype == torch.float64 else torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    """HF Llama's convention: the two halves of the head dimension are the pairs."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(T, head_dim, theta, dtype, device):
    """cos, sin [T, head_dim] for positions 0..T-1 (HF LlamaRotaryEmbedding, default type):
    computed in fp32 as HF does, or in fp64 under --dtype float64."""
    ft = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).to(ft) / head_dim))
    freqs = torch.outer(torch.arange(T, device=device).to(ft), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class LlamaAttention(nn.Module):
    def __init__(self, n_embd, n_head, n_kv_head, rope_theta):
        super().__init__()
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.head_dim = n_embd // n_head
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(n_embd, n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(n_embd, n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(n_embd, n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_head * self.head_dim, n_embd, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        hd = self.head_dim
        q = self.q_proj(x).view(B, T, self.n_head, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, hd).transpose(1, 2)
        cos, sin = rope_cos_sin(T, hd, self.rope_theta, x.dtype, x.device)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA (HF repeat_kv): query head h reads kv head h // (n_head / n_kv_head).
        rep = self.n_head // self.n_kv_head
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, self.n_head * hd)
        return self.o_proj(y)


class LlamaMlp(nn.Module):
    def __init__(self, n_embd, ffn_hidden):
        super().__init__()
        self.gate_proj = nn.Linear(n_embd, ffn_hidden, bias=False)
        self.up_proj = nn.Linear(n_embd, ffn_hidden, bias=False)
        self.down_proj = nn.Linear(ffn_hidden, n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, n_embd, n_head, n_kv_head, ffn_hidden, rope_theta, eps):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(n_embd, eps)
        self.self_attn = LlamaAttention(n_embd, n_head, n_kv_head, rope_theta)
        self.post_attention_layernorm = LlamaRMSNorm(n_embd, eps)
        self.mlp = LlamaMlp(n_embd, ffn_hidden)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, n_layer, n_embd, n_head, n_kv_head, ffn_hidden, vocab_size, rope_theta,
                 eps):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, n_embd)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(n_embd, n_head, n_kv_head, ffn_hidden, rope_theta, eps)
            for _ in range(n_layer))
        self.norm = LlamaRMSNorm(n_embd, eps)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Llama(nn.Module):
    """LlamaForCausalLM: model.* trunk and an untied lm_head."""

    def __init__(self, n_layer, n_head, n_kv_head, n_embd, ffn_hidden, vocab_size, rope_theta,
                 eps):
        super().__init__()
        self.model = LlamaModel(n_layer, n_embd, n_head, n_kv_head, ffn_hidden, vocab_size,
                                rope_theta, eps)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx):
        """idx [B, T] int64 → logits [B·T, V]."""
        B, T = idx.shape
        return self.lm_head(self.model(idx)).view(B * T, -1)


def build_model(cfg):
    family = cfg.get("family", "gpt2")
    if family == "gpt2":
        return GPT(cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["block_size"],
                   cfg["vocab_size"], cfg["bias"])
    if family == "llama":
        if cfg["bias"]:
            raise ValueError("llama with biases: the reference has none (neither has HF Llama)")
        return Llama(cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"], cfg["n_embd"],
                     cfg["ffn_hidden"], cfg["vocab_size"], cfg["rope_theta"],
                     cfg["layer_norm_eps"])
    raise ValueError(f"unknown model family {family!r}")


# --------------------------------------------------------------------------------------------
class Report:
    def __init__(self):
        self.rows = []
        self.failures = []

    def add(self, label, check, measured, tol):
        ok = bool(measured <= tol)  # NaN fails
        self.rows.append((label, check, measured, tol, ok))
        if not ok:
            self.failures.append(f"{label}: {check}: {measured:.3e} > {tol:.0e}")

    def print(self):
        w = max(len(r[1]) for r in self.rows)
        print(f"{'file':<22} {'check':<{w}}  {'measured':>10}  {'tolerance':>9}  result")
        for label, check, measured, tol, ok in self.rows:
            print(f"{label:<22} {check:<{w}}  {measured:10.3e}  {tol:9.0e}  "
                  f"{'ok' if ok else 'FAIL'}")


def max_rel(ours, ref):
    """max|Δ| / max|ref| (0 when both are zero)."""
    scale = float(np.max(np.abs(ref)))
    diff = float(np.max(np.abs(ours.astype(np.float64) - ref.astype(np.float64))))
    return diff / scale if scale > 0 else diff


def rel(ours, ref):
    return abs(float(ours) - float(ref)) / abs(float(ref))


def report_worst(report, label, check, tol, pairs):
    """One row for a group of tensors: the worst max_rel, naming its tensor; every tensor
    over the tolerance is named among the failures."""
    errs = {n: max_rel(ours, ref) for n, (ours, ref) in pairs.items()}
    worst = max(errs, key=lambda n: errs[n])
    report.add(label, f"{check} (worst: {worst})", errs[worst], tol)
    for n, e in errs.items():
        if n != worst and not e <= tol:
            report.failures.append(f"{label}: {check}: {n}: {e:.3e} > {tol:.0e}")


def check_file(path, label, dtype, report):
    t, meta = read_safetensors(path)
    if meta.get("format_version") != str(FORMAT_VERSION):
        report.failures.append(f"{label}: format_version {meta.get('format_version')!r}, this "
                               f"script reads {FORMAT_VERSION}; regenerate: {REGENERATE}")
        return
    cfg = json.loads(meta["config"])
    opt = json.loads(meta["optimizer"])
    try:
        model = build_model(cfg).to(dtype)
    except (KeyError, ValueError) as e:
        report.failures.append(f"{label}: cannot build the model from config {cfg}: {e!r}")
        return
    names = [n for n, _ in model.named_parameters()]
    ours = {n for n in t if n not in DATA_TENSORS and not n.startswith(("grad.", "opt."))}
    if set(names) != ours:
        report.failures.append(f"{label}: parameter names differ: only in meshtrain "
                               f"{sorted(ours - set(names))}, only in PyTorch "
                               f"{sorted(set(names) - ours)}")
        return
    init = {n: torch.from_numpy(t[n]).to(dtype) for n in names}

    def load(m, values):
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.copy_(values[n])

    tokens = torch.from_numpy(t["tokens"]).long()
    targets = torch.from_numpy(t["targets"]).long()

    # 1–3: PyTorch's own trajectory from the same weights.
    load(model, init)
    params = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(adamw_param_groups(model, opt["weight_decay"]), lr=opt["lr"],
                                  betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    losses, norms = [], []
    for k in range(1, opt["steps"] + 1):
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = loss_fn(logits, targets)
        loss.backward()
        if k == 1:
            report.add(label, "loss", rel(t["loss"][0], loss.item()), LOSS_RTOL)
            report.add(label, "logits", max_rel(t["logits"], logits.detach().numpy()), TENSOR_TOL)
            for n in names:
                report.add(label, f"grad.{n}", max_rel(t["grad." + n], params[n].grad.numpy()),
                           TENSOR_TOL)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), opt["grad_clip"])
        optimizer.step()
        losses.append(loss.item())
        norms.append(norm.item())
    for k, (ref_loss, ref_norm) in enumerate(zip(losses, norms), start=1):
        report.add(label, f"losses[{k}]", rel(t["losses"][k - 1], ref_loss), TRAJ_LOSS_RTOL)
        report.add(label, f"grad_norms[{k}]", rel(t["grad_norms"][k - 1], ref_norm),
                   GRAD_NORM_RTOL)
    clipped = sum(1 for nrm in norms if nrm > opt["grad_clip"])
    print(f"{label}: PyTorch grad norms {['%.4f' % x for x in norms]}, clip at "
          f"{opt['grad_clip']}: {clipped}/{len(norms)} steps clipped")
    if clipped == 0:
        report.failures.append(f"{label}: no step clipped: the clipping path is untested")

    # 4: the optimizer alone, replayed on meshtrain's gradients.
    load(model, init)
    optimizer = torch.optim.AdamW(adamw_param_groups(model, opt["weight_decay"]), lr=opt["lr"],
                                  betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    for k in range(1, opt["steps"] + 1):
        for n, p in params.items():
            p.grad = torch.from_numpy(t[f"opt.grad{k}.{n}"]).to(dtype)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), opt["grad_clip"])
        report.add(label, f"replay grad_norm[{k}]", rel(t["grad_norms"][k - 1], norm.item()),
                   GRAD_NORM_RTOL)
        report_worst(report, label, f"replay clipped{k}", GRAD_NORM_RTOL,
                     {n: (t[f"opt.clipped{k}.{n}"], p.grad.numpy()) for n, p in params.items()})
        optimizer.step()
        report_worst(report, label, f"replay param{k}", REPLAY_TOL,
                     {n: (t[f"opt.param{k}.{n}"], p.detach().numpy()) for n, p in params.items()})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="safetensors files written by reference_dump")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                    help="PyTorch's precision (float64 shows meshtrain's own rounding)")
    args = ap.parse_args()
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    report = Report()
    for path in args.files:
        label = path.rsplit("/", 1)[-1].removesuffix(".safetensors")[:22]
        check_file(path, label, dtype, report)
    if report.rows:
        report.print()
    if report.failures:
        print(f"\nFAILED ({len(report.failures)}):", file=sys.stderr)
        for f in report.failures:
            print("  " + f, file=sys.stderr)
        return 1
    print(f"\nall {len(report.rows)} checks within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
