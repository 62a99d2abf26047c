#!/usr/bin/python3
"""PyTorch check of `meshtrain export` (issue 6 item 4): the export loads as Hugging Face's
GPT2LMHeadModel / LlamaForCausalLM would load it, and reproduces meshtrain's logits.

    /usr/bin/python3 tests/reference/hf_export_reference.py DIR [DIR ...]

Each DIR comes from run_export_reference.sh: DIR/hf/model.safetensors and DIR/hf/config.json
(written by `meshtrain export`), DIR/expected.safetensors (tokens and meshtrain's logits, from
export_dump). The model is built from config.json alone and loaded with strict=True from the
export's tensors alone, under their file names:
  gpt2   Hugging Face's GPT2LMHeadModel written out in torch: Conv1D layers (y = x @ W + b,
         W [in, out]) for attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj; q, k, v the thirds of
         c_attn's output columns; LayerNorm with bias; GELU "gelu_new" (tanh); LM head tied to
         transformer.wte (not in the file).
  llama  LlamaForCausalLM as in gpt_reference.py (nn.Linear [out, in], rotate_half RoPE,
         repeat_kv GQA, RMSNorm, untied lm_head), sized from config.json.
  mixtral  transformers' own MixtralForCausalLM (4.36.2, which scripts/setup.sh installs into
         .pydeps; the CTest test sets PYTHONPATH), built from MixtralConfig.from_json_file of
         config.json: a sparse MoE block (router block_sparse_moe.gate, experts.{j}.w1/w2/w3)
         in every layer, softmax → top-k → renormalised weights.
When transformers is importable the script also loads the export with from_pretrained (the
directory alone) and checks its logits too; without it only the mixtral variant fails.
Prints a table and exits 1 when any check is outside its tolerance.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import Llama, Report, max_rel, read_safetensors  # noqa: E402

# Mixtral: the same GEMMs plus the router, whose top-k choice is discontinuous; with the
# weights moved by ±0.05 noise no token sits within rounding of a tie, so the routings agree
# and the logits differ by fp32 rounding only (measured 5.1e-7). A w1/w3 swap (0.26),
# a transposed expert or two experts' w2 swapped (0.52) move them by O(1e-2 … 1).
# Logits: max|Δ| / max|reference|. The same fp32 math as gpt_reference.py's logits check (GEMMs
# over ≤ 4·C = 256 terms through 2 blocks; measured there ≤ 3.9e-7), with weights moved off
# their initial values (±0.05 noise on every tensor). 1e-4 keeps its margin; a transposed
# Conv1D weight, a missing bias or norm weight, swapped q/k/v thirds or a different RoPE
# pairing move the logits by O(1e-2 … 1).
LOGITS_TOL = 1e-4


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: weight [in, out], y = x @ weight + bias."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], self.weight.shape[1])


class HfGpt2Attention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(n_embd, 3 * n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class HfGpt2Mlp(nn.Module):
    def __init__(self, n_embd, n_inner):
        super().__init__()
        self.c_fc = Conv1D(n_embd, n_inner)
        self.c_proj = Conv1D(n_inner, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # gelu_new


class HfGpt2Block(nn.Module):
    def __init__(self, n_embd, n_head, n_inner, eps):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
        self.attn = HfGpt2Attention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
        self.mlp = HfGpt2Mlp(n_embd, n_inner)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class HfGpt2(nn.Module):
    """GPT2LMHeadModel's parameters under its names (transformer.*; lm_head tied)."""

    def __init__(self, cfg):
        super().__init__()
        C = cfg["n_embd"]
        n_inner = cfg.get("n_inner") or 4 * C
        eps = cfg["layer_norm_epsilon"]
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg["vocab_size"], C),
            wpe=nn.Embedding(cfg["n_positions"], C),
            h=nn.ModuleList(HfGpt2Block(C, cfg["n_head"], n_inner, eps)
                            for _ in range(cfg["n_layer"])),
            ln_f=nn.LayerNorm(C, eps=eps),
        ))

    def forward(self, idx):
        B, T = idx.shape
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(T))
        for block in tr.h:
            x = block(x)
        return F.linear(tr.ln_f(x), tr.wte.weight).view(B * T, -1)


class HfMixtral(nn.Module):
    """transformers' MixtralForCausalLM from config.json, returning logits [B·T, V]."""

    def __init__(self, config_path):
        super().__init__()
        try:
            from transformers import MixtralConfig, MixtralForCausalLM
        except ImportError as e:
            raise SystemExit(f"hf_export_reference: the mixtral variant needs transformers ({e}); "
                             "run scripts/setup.sh (transformers==4.36.2 into .pydeps) and set "
                             "PYTHONPATH=.pydeps")
        config = MixtralConfig.from_json_file(config_path)
        self.model = MixtralForCausalLM(config)

    def load_state_dict(self, state, strict=True):
        return self.model.load_state_dict(state, strict=strict)

    def forward(self, idx):
        logits = self.model(idx).logits
        return logits.reshape(-1, logits.shape[-1])


def build(cfg, config_path):
    if cfg["model_type"] == "mixtral":
        assert cfg["architectures"] == ["MixtralForCausalLM"] and cfg["hidden_act"] == "silu"
        return HfMixtral(config_path)
    if cfg["model_type"] == "gpt2":
        assert cfg["activation_function"] == "gelu_new" and cfg["tie_word_embeddings"]
        return HfGpt2(cfg)
    if cfg["model_type"] == "llama":
        assert cfg["hidden_act"] == "silu" and not cfg["tie_word_embeddings"]
        return Llama(cfg["num_hidden_layers"], cfg["num_attention_heads"],
                     cfg["num_key_value_heads"], cfg["hidden_size"], cfg["intermediate_size"],
                     cfg["vocab_size"], cfg["rope_theta"], cfg["rms_norm_eps"])
    raise ValueError(f"model_type {cfg['model_type']!r}")


def transformers_logits(hf_dir, tokens):
    """Logits from transformers' own class, or None when transformers is not installed."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.from_numpy(tokens.astype(np.int64))).logits
    return out.reshape(-1, out.shape[-1]).numpy()


def check(directory, report):
    label = os.path.basename(directory.rstrip("/"))
    hf_dir = os.path.join(directory, "hf")
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    tensors, meta = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    if meta.get("format") != "pt":
        raise SystemExit(f"{label}: metadata format {meta.get('format')!r}; transformers needs 'pt'")
    expected, _ = read_safetensors(os.path.join(directory, "expected.safetensors"))
    model = build(cfg, os.path.join(hf_dir, "config.json"))
    state = {k: torch.from_numpy(v) for k, v in tensors.items()}
    model.load_state_dict(state, strict=True)  # every name and shape, nothing extra
    model.eval()
    tokens = expected["tokens"]
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens.astype(np.int64))).numpy()
    how = "MixtralForCausalLM, strict load_state_dict" if cfg["model_type"] == "mixtral" \
        else "Hugging Face layout, hand-written"
    report.add(label, f"logits ({cfg['model_type']}, {how})",
               max_rel(expected["logits"], logits), LOGITS_TOL)
    hf = transformers_logits(hf_dir, tokens)
    if hf is not None:
        report.add(label, "logits (transformers from_pretrained)", max_rel(expected["logits"], hf),
                   LOGITS_TOL)


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    torch.manual_seed(0)
    report = Report()
    for directory in sys.argv[1:]:
        check(directory, report)
    report.print()
    if report.failures:
        print("FAILED:\n  " + "\n  ".join(report.failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
