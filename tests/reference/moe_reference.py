#!/usr/bin/python3
"""PyTorch reference for meshtrain's SparseMoeBlock (issue 14, "Layer" test).

    PYTHONPATH=.pydeps /usr/bin/python3 tests/reference/moe_reference.py A.safetensors [B ...]

Each file is written by moe_dump (tests/reference/moe_dump.cpp): the weights of one MoE block
(Hugging Face Mixtral names), an input x [N, C], a fixed random R [N, C], and what meshtrain
computed: the output, the router logits, the aux and z losses, the per-expert counts and the
gradients of L = sum(out * R) + aux + z with respect to x and every weight.

The reference is Hugging Face transformers' own MixtralSparseMoeBlock (transformers 4.36.2 on
Debian's torch 1.13, installed by scripts/setup.sh into .pydeps). It has no capacity, so for the
capacity variants the script uses `capacity_moe` below, written from the Switch Transformer rule
(Fedus et al. 2021, §2.2 eq. 3: capacity = ⌈(N·k / E) · capacity_factor⌉, Megatron-LM's
get_capacity over the N·k top-k assignments) with Megatron-LM's drop policies ("probs": an
over-full expert keeps its assignments of highest renormalised weight; "position": the earliest
tokens), its experts being the HF block's own modules. The losses are written from the papers:
  aux = coeff · E · Σᵢ fᵢ·Pᵢ (Switch eq. 4–6; Megatron switch_load_balancing_loss_func), fᵢ the
        fraction of the N·k top-k assignments routed to expert i before dropping, Pᵢ the mean
        full-softmax probability of expert i;
  z   = coeff · mean(logsumexp(logits)²) (ST-MoE, Zoph et al. 2022, eq. 5).
HF 4.36.2's own load_balancing_loss_func is printed beside it: it is NOT that loss. It takes the
softmax over the k selected logits only and averages it over the k slots, so its "P" is 1/k for
every token and it returns E/k whatever the routing, with no gradient to the router; the script
checks that it equals E/k, which documents the difference (later transformers versions changed
the function).

Tolerances (the issue's): output, logits and the scalar losses 1e-5, gradients 1e-4, each as
max|Δ| / max|reference| per tensor (a nearly zero element has no meaningful relative error).
fp32 on both sides; the longest sums are 48-term GEMMs, so ~1e-7 is expected. Measured (Dec
2026, 2 threads, all four files): out 1.4e-7, logits 1.0e-7, loss ≤ 6.3e-7, load balance 0,
router z 9.6e-8, counts exact, grad.x ≤ 2.2e-7, weight gradients ≤ 5.5e-7. What the checks see,
measured by perturbing the PyTorch side: the capacity_probs file against the "position" policy
moves the output by 0.14; leaving out the aux (z) term's gradient in the "losses" file moves the
router's gradient by 9.4e-4 (3.6e-3). Exits 1 naming the tensor when one is outside its
tolerance.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import read_safetensors  # noqa: E402

try:
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import (MixtralSparseMoeBlock,
                                                              load_balancing_loss_func)
except ImportError as e:  # the pinned transformers lives in .pydeps (scripts/setup.sh)
    sys.exit(f"moe_reference: cannot import transformers ({e}); run scripts/setup.sh, which "
             "installs transformers==4.36.2 into .pydeps, and set PYTHONPATH=.pydeps")

FORMAT_VERSION = 1
PREFIX = "model.layers.0.block_sparse_moe."
OUT_TOL = 1e-5
LOSS_TOL = 1e-5
GRAD_TOL = 1e-4


def max_rel(ours, ref):
    ours, ref = ours.double(), ref.double()
    scale = ref.abs().max().item()
    diff = (ours - ref).abs().max().item()
    return diff / scale if scale > 0 else diff


def capacity_moe(block, x, capacity_factor, policy):
    """MixtralSparseMoeBlock's routing plus the Switch/Megatron capacity rule (see the module
    docstring); returns (out, logits, top-k experts [N, k], kept assignments [N, k])."""
    N = x.shape[0]
    E, k = block.num_experts, block.top_k
    logits = block.gate(x)
    weights, chosen = torch.topk(F.softmax(logits, dim=1, dtype=torch.float), k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    capacity = math.ceil((N * k / E) * capacity_factor)
    keep = torch.zeros(N, k, dtype=torch.bool)
    for e in range(E):
        n, j = torch.where(chosen == e)  # row-major: token order
        if policy == "probs":  # highest weight first; stable, so ties keep token order
            order = torch.sort(weights.detach()[n, j], descending=True, stable=True).indices
            n, j = n[order], j[order]
        keep[n[:capacity], j[:capacity]] = True
    out = torch.zeros_like(x)
    for e in range(E):
        n, j = torch.where((chosen == e) & keep)
        if n.numel() > 0:
            out = out.index_add(0, n, block.experts[e](x[n], weights[n, j, None]))
    return out, logits, chosen, keep


def router_losses(logits, chosen, E, k, aux_coeff, z_coeff):
    N = logits.shape[0]
    probs = F.softmax(logits, dim=1)
    routed = torch.bincount(chosen.flatten(), minlength=E).to(logits.dtype)  # before dropping
    load_balance = E * torch.sum(routed / (N * k) * probs.mean(dim=0))
    router_z = torch.mean(torch.logsumexp(logits, dim=-1) ** 2)
    return load_balance, router_z, routed


def check_file(path, report):
    t, meta = read_safetensors(path)
    if int(meta.get("format_version", -1)) != FORMAT_VERSION:
        sys.exit(f"{path}: format_version {meta.get('format_version')} != {FORMAT_VERSION}; "
                 "regenerate with build/tests/reference/moe_dump OUT VARIANT")
    cfg = json.loads(meta["config"])
    C, Fh, E, k = cfg["n_embd"], cfg["ffn_hidden"], cfg["experts"], cfg["top_k"]
    hf_cfg = MixtralConfig(hidden_size=C, intermediate_size=Fh, num_local_experts=E,
                           num_experts_per_tok=k, hidden_act="silu")
    block = MixtralSparseMoeBlock(hf_cfg)
    state = {name[len(PREFIX):]: torch.from_numpy(v) for name, v in t.items()
             if name.startswith(PREFIX)}
    block.load_state_dict(state, strict=True)
    x = torch.from_numpy(t["x"]).requires_grad_(True)
    R = torch.from_numpy(t["R"])
    if cfg["capacity_factor"] == 0:
        out, logits = block(x.view(cfg["batch"], -1, C))
        out = out.reshape(-1, C)
        chosen = torch.topk(logits.detach(), k, dim=-1).indices
        kept = torch.bincount(chosen.flatten(), minlength=E)
    else:
        out, logits, chosen, keep = capacity_moe(block, x, cfg["capacity_factor"],
                                                 cfg["drop_policy"])
        kept = torch.bincount(chosen[keep], minlength=E)
    load_balance, router_z, routed = router_losses(logits, chosen, E, k, cfg["aux_loss_coeff"],
                                                   cfg["z_loss_coeff"])
    aux = cfg["aux_loss_coeff"] * load_balance
    z = cfg["z_loss_coeff"] * router_z
    loss = (out * R).sum() + aux + z
    loss.backward()

    label = f"{os.path.basename(path)} ({cfg['variant']})"
    report(label, "out", max_rel(torch.from_numpy(t["out"]), out.detach()), OUT_TOL)
    report(label, "logits", max_rel(torch.from_numpy(t["logits"]), logits.detach()), OUT_TOL)
    ours_loss = (torch.from_numpy(t["out"]).double() * R.double()).sum() + float(
        t["aux_loss"][0]) + float(t["z_loss"][0])
    report(label, "loss", max_rel(ours_loss, loss.detach()), LOSS_TOL)
    for name, ref in (("load_balance", load_balance), ("router_z", router_z)):
        report(label, name, max_rel(torch.from_numpy(t[name]), ref.detach().reshape(1)), LOSS_TOL)
    routed_ours = torch.from_numpy(t["routed_per_expert"]).long()
    report(label, "routed_per_expert", float((routed_ours != routed.long()).sum()), 0.0)
    kept_ours = torch.from_numpy(t["tokens_per_expert"]).long()
    report(label, "tokens_per_expert", float((kept_ours != kept).sum()), 0.0)
    report(label, "grad.x", max_rel(torch.from_numpy(t["grad.x"]), x.grad), GRAD_TOL)
    worst = max((max_rel(torch.from_numpy(t["grad." + PREFIX + n]), p.grad), n)
                for n, p in block.named_parameters())
    for n, p in block.named_parameters():
        report(label, "grad." + n, max_rel(torch.from_numpy(t["grad." + PREFIX + n]), p.grad),
               GRAD_TOL, quiet=n != "gate.weight")  # the router's: where aux and z enter
    report(label, f"worst weight grad ({worst[1]})", worst[0], GRAD_TOL)
    hf_aux = load_balancing_loss_func(logits.detach(), E, k).item()
    print(f"  {label}: HF 4.36.2 load_balancing_loss_func = {hf_aux:.6f} (E/k = {E / k:.6f}; "
          f"Switch/Megatron E·Σ fP = {load_balance.item():.6f})")
    report(label, "HF load_balancing_loss_func − E/k", abs(hf_aux - E / k), 1e-6)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    failures = []

    def report(label, name, value, tol, quiet=False):
        bad = not (value <= tol)
        if bad:
            failures.append(f"{label}: {name} = {value:.3e} > {tol:.0e}")
        if bad or not quiet:
            print(f"  {label}: {name:<48} {value:.3e}  (tol {tol:.0e}){'  FAIL' if bad else ''}")

    for path in sys.argv[1:]:
        check_file(path, report)
    if failures:
        print("moe_reference: FAILED\n  " + "\n  ".join(failures))
        return 1
    print("moe_reference: all within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
