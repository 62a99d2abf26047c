#!/usr/bin/python3
"""checkpoint.init_from against transformers (issue 15 item 3): Hugging Face models written by
transformers 4.36.2 itself load into meshtrain, whose logits match transformers'.

    /usr/bin/python3 tests/reference/hf_init_reference.py make DIR GPT2_124M_TOML
    /usr/bin/python3 tests/reference/hf_init_reference.py check DIR

`make` writes one model per variant under DIR (random init, seeded) with save_pretrained and
DIR/variants.txt, one line per variant: name, meshtrain config (TOML), the path to give
checkpoint.init_from, and optional overrides. run_hf_init_reference.sh runs hf_init_dump on
each (DIR/<name>.meshtrain.safetensors: tokens and meshtrain's logits); `check` then loads each
model with AutoModelForCausalLM.from_pretrained(torch_dtype=float32), so a 16-bit file's weights
are widened exactly as meshtrain widens them and both compute in f32, and compares the logits
(max|Δ| / max|reference|, LOGITS_TOL). It also asserts what each variant claims to be: the
dtype in the file(s), the number of shards, the key spelling.

Variants: GPT-2 124M's shape (configs/gpt2_124m.toml) in F32, one file, and in BF16, sharded
(max_shard_size 100MB: 3 shards); a small GPT-2 in F16; the small GPT-2 rewritten in OpenAI's
hub spelling (no "transformer." prefix, the attn.bias / attn.masked_bias buffers present); a
small Llama (GQA 4/2 heads, untied head, rope_theta 500000) in F32, BF16, and F16 sharded
(max_shard_size 40KB); and that Llama with tie_word_embeddings = true (no lm_head.weight in
the file).
"""
import glob
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import Report, max_rel, read_safetensors  # noqa: E402

# Both sides compute in f32 from the same (widened) weights; the sums run in other orders.
# GPT-2 124M: GEMMs over ≤ 3072 terms through 12 blocks at init std 0.02. Measured max_rel
# (hf_init_reference.py check, 2026-12-02): see docs/interop.md. A skipped Conv1D transpose,
# a bf16 value read as f16, or a missing bias moves the logits by O(1e-2 … 1).
LOGITS_TOL = 1e-4
SEED = 1234


def small_gpt2_config(GPT2Config):
    return GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=32, vocab_size=101,
                      layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def small_llama_config(LlamaConfig, tied=False):
    return LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       rms_norm_eps=1e-6, rope_theta=500000.0, tie_word_embeddings=tied)


def gpt2_toml(cfg):
    return f"""[model]
family = "gpt2"
n_layer = {cfg.n_layer}
n_head = {cfg.n_head}
n_embd = {cfg.n_embd}
block_size = {cfg.n_positions}
vocab_size = {cfg.vocab_size}
bias = true
norm_eps = {cfg.layer_norm_epsilon}
"""


def llama_toml(cfg):
    return f"""[model]
family = "llama"
n_layer = {cfg.num_hidden_layers}
n_head = {cfg.num_attention_heads}
n_kv_head = {cfg.num_key_value_heads}
n_embd = {cfg.hidden_size}
ffn_hidden = {cfg.intermediate_size}
block_size = {cfg.max_position_embeddings}
vocab_size = {cfg.vocab_size}
bias = false
norm_eps = {cfg.rms_norm_eps}
rope_theta = {cfg.rope_theta}
"""


def perturb(model):
    """Norm weights and biases off their initial 1 / 0, so a dropped one changes the logits."""
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)


def hub_spelling(src, dst, n_layer, n_positions):
    """The small GPT-2 as OpenAI's hub file spells it: no "transformer." prefix, plus the
    causal-mask buffers attn.bias [1, 1, P, P] and attn.masked_bias (older transformers saved
    them; they are not parameters)."""
    from safetensors.torch import load_file, save_file
    state = load_file(os.path.join(src, "model.safetensors"))
    out = {k[len("transformer."):] if k.startswith("transformer.") else k: v
           for k, v in state.items()}
    for i in range(n_layer):
        out[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n_positions, n_positions)).view(
            1, 1, n_positions, n_positions)
        out[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    os.makedirs(dst, exist_ok=True)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)


def make(directory, gpt2_124m_toml):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    lines = []

    def save(model, name, dtype, toml, init_from_rel, shard=None):
        path = os.path.join(directory, name)
        m = model if dtype is None else model.to(dtype)
        kwargs = {"max_shard_size": shard} if shard else {}
        m.save_pretrained(path, **kwargs)  # safetensors (the 4.36 default)
        if not os.path.isabs(toml):
            with open(os.path.join(path, "meshtrain.toml"), "w") as f:
                f.write(toml)
            toml = os.path.join(path, "meshtrain.toml")
        lines.append(f"{name} {toml} {os.path.join(path, init_from_rel)}")

    torch.manual_seed(SEED)
    big = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024,
                                     vocab_size=50257, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)).eval()
    perturb(big)
    save(big, "gpt2_124m_f32", None, os.path.abspath(gpt2_124m_toml), ".")  # the directory
    save(big, "gpt2_124m_bf16_sharded", torch.bfloat16, os.path.abspath(gpt2_124m_toml),
         "model.safetensors.index.json", shard="100MB")
    del big

    torch.manual_seed(SEED)
    cfg = small_gpt2_config(GPT2Config)
    small = GPT2LMHeadModel(cfg).eval()
    perturb(small)
    save(small, "gpt2_small_f32", None, gpt2_toml(cfg), "model.safetensors")
    hub_spelling(os.path.join(directory, "gpt2_small_f32"),
                 os.path.join(directory, "gpt2_small_hub"), cfg.n_layer, cfg.n_positions)
    lines.append(f"gpt2_small_hub {os.path.join(directory, 'gpt2_small_f32', 'meshtrain.toml')} "
                 f"{os.path.join(directory, 'gpt2_small_hub', 'model.safetensors')}")
    save(small, "gpt2_small_f16", torch.float16, gpt2_toml(cfg), "model.safetensors")

    torch.manual_seed(SEED)
    cfg = small_llama_config(LlamaConfig)
    llama = LlamaForCausalLM(cfg).eval()
    perturb(llama)
    save(llama, "llama_f32", None, llama_toml(cfg), ".")
    save(llama, "llama_bf16", torch.bfloat16, llama_toml(cfg), "model.safetensors")
    llama = llama.float()
    save(llama, "llama_f16_sharded", torch.float16, llama_toml(cfg), ".", shard="40KB")

    torch.manual_seed(SEED)
    cfg = small_llama_config(LlamaConfig, tied=True)
    tied = LlamaForCausalLM(cfg).eval()
    perturb(tied)
    save(tied, "llama_tied", None, llama_toml(cfg), ".")
    with open(os.path.join(directory, "variants.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


EXPECTED = {  # name: (dtype in the file, shards, a key that must be there, one that must not)
    "gpt2_124m_f32": ("F32", 1, "transformer.h.11.attn.c_attn.weight", "lm_head.weight"),
    "gpt2_124m_bf16_sharded": ("BF16", 3, "transformer.h.0.mlp.c_fc.weight", "lm_head.weight"),
    "gpt2_small_f32": ("F32", 1, "transformer.wte.weight", "lm_head.weight"),
    "gpt2_small_hub": ("F32", 1, "h.0.attn.bias", "transformer.wte.weight"),
    "gpt2_small_f16": ("F16", 1, "transformer.h.1.ln_2.bias", "lm_head.weight"),
    "llama_f32": ("F32", 1, "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"),
    "llama_bf16": ("BF16", 1, "lm_head.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"),
    "llama_f16_sharded": ("F16", None, "lm_head.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"),
    "llama_tied": ("F32", 1, "model.embed_tokens.weight", "lm_head.weight"),
}


def file_facts(path):
    """(dtypes of the non-buffer tensors, number of safetensors files, every key)."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    dtypes, keys = set(), set()
    for name in files:
        tensors, _ = read_header(name)
        for k, v in tensors.items():
            keys.add(k)
            if not k.endswith(("attn.bias", "attn.masked_bias")):
                dtypes.add(v["dtype"])
    return dtypes, len(files), keys


def read_header(path):
    import struct
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v for k, v in header.items() if k != "__metadata__"}, header.get("__metadata__")


def check(directory):
    from transformers import AutoModelForCausalLM
    report = Report()
    with open(os.path.join(directory, "variants.txt")) as f:
        names = [line.split()[0] for line in f if line.strip()]
    if sorted(names) != sorted(EXPECTED):
        raise SystemExit(f"variants {sorted(names)} are not the expected {sorted(EXPECTED)}")
    for name in names:
        path = os.path.join(directory, name)
        dtype, shards, present, absent = EXPECTED[name]
        dtypes, files, keys = file_facts(path)
        facts_ok = dtypes == {dtype} and (shards is None and files >= 2 or files == shards) \
            and present in keys and absent not in keys
        report.add(name, f"file: {sorted(dtypes)}, {files} file(s), has {present}, not {absent}",
                   0.0 if facts_ok else 1.0, 0.0)
        got, _ = read_safetensors(os.path.join(directory, name + ".meshtrain.safetensors"))
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            ref = model(torch.from_numpy(got["tokens"].astype(np.int64))).logits
        ref = ref.reshape(-1, ref.shape[-1]).numpy()
        report.add(name, "logits vs transformers (f32 compute)", max_rel(got["logits"], ref),
                   LOGITS_TOL)
    report.print()
    if report.failures:
        print("FAILED:\n  " + "\n  ".join(report.failures))
        return 1
    return 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        return check(sys.argv[2])
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
