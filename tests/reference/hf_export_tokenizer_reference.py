#!/usr/bin/python3
"""`meshtrain export` with the run's tokenizer (issue 15 item 3): transformers' AutoTokenizer and
AutoModelForCausalLM load the export directory alone, the tokenizer gives the reference ids and
the model meshtrain's logits.

    /usr/bin/python3 tests/reference/hf_export_tokenizer_reference.py make DIR GPT2_TOKENIZER_DIR TEXT
    /usr/bin/python3 tests/reference/hf_export_tokenizer_reference.py check DIR GPT2_TOKENIZER_DIR

`make` writes, per variant, DIR/<name>/hf_in (a model transformers made, random init, seeded),
DIR/<name>/meshtrain.toml, DIR/<name>/meta.json (the meta.json a run's final checkpoint carries,
format meshtrain-tokens-v2 or meshtrain-char-v1) and the tokenizer's files in DIR/<name>/tok/,
and DIR/variants.txt (name, tokenizer kind). run_export_tokenizer_reference.sh turns each into a
meshtrain final checkpoint (hf_init_dump --checkpoint-out, plus the tokenizer's files beside
meta.json, as the checkpoint carries them) and runs `meshtrain export` into DIR/<name>/out.
`check` then loads DIR/<name>/out with from_pretrained:
  gpt2           a GPT-2 with GPT-2's 50257 ids; AutoTokenizer (GPT2TokenizerFast) and
                 GPT2Tokenizer give tiktoken's ids (an Encoding built from the same encoder.json
                 and vocab.bpe with tiktoken's "gpt2" pattern and <|endoftext|> = 50256) on every
                 TEXTS entry, and decode them back to the text;
  sp_llama       a small Llama with a SentencePiece BPE trained on TEXT with Llama's settings
                 (identity normalisation, spaces kept, byte fallback): AutoTokenizer
                 (LlamaTokenizerFast) and LlamaTokenizer give SentencePiece's ids;
  sp_default     the same with SentencePiece's default normalisation (NFKC, extra spaces
                 removed) and bos/eos ids 2/1: LlamaTokenizer (use_fast=False) gives
                 SentencePiece's ids (the fast
                 conversion does not model that normaliser; docs/interop.md);
  char           meshtrain's char vocabulary: no tokenizer files are written (the export goes
                 into a directory holding the GPT-2 export's, which it removes);
and for every variant AutoModelForCausalLM's logits on meshtrain's tokens match meshtrain's
(max|Δ| / max|reference| ≤ 1e-4, both in f32), and config.json's bos_token_id /
eos_token_id are the tokenizer's (null for char, so generate() never stops at GPT-2's 50256).
"""
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import Report, max_rel, read_safetensors  # noqa: E402
from hf_init_reference import gpt2_toml, llama_toml, perturb  # noqa: E402

LOGITS_TOL = 1e-4
SEED = 99
TEXTS = [
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.",
    "It's 2026; they'll say we've re-done it: 12345 + 678 = 13023!",
    "日本語のテキスト、中文文本 and 한국어 🙂🚀👩‍👩‍👧 e\u0301 n\u0303 café",
    "tabs\tand  double  spaces, a newline\n  indented",
    "ends with a document<|endoftext|>starts another",
]
TOKENIZER_FILES = ("tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "special_tokens_map.json")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def meta_v2(kind, files, vocab_size, eot_id):
    return {"format": "meshtrain-tokens-v2", "tokenizer": {"kind": kind, "files": files},
            "vocab_size": vocab_size, "token_dtype": "uint16", "eot_id": eot_id,
            "sources": ["data/tinyshakespeare.txt"], "document_separator": None,
            "val_fraction": 0.1, "train_tokens": 0, "val_tokens": 0}


def make(directory, gpt2_dir, text_file):
    import sentencepiece as spm
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    variants = []

    def variant(name, model, toml, meta, kind):
        path = os.path.join(directory, name)
        os.makedirs(os.path.join(path, "tok"), exist_ok=True)
        perturb(model)
        model.save_pretrained(os.path.join(path, "hf_in"))
        with open(os.path.join(path, "meshtrain.toml"), "w") as f:
            f.write(toml)
        write_json(os.path.join(path, "meta.json"), meta)
        variants.append(f"{name} {kind}")
        return path

    torch.manual_seed(SEED)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=50257)
    path = variant("gpt2", GPT2LMHeadModel(cfg).eval(), gpt2_toml(cfg),
                   meta_v2("gpt2", ["encoder.json", "vocab.bpe"], 50257, 50256), "gpt2")
    for f in ("encoder.json", "vocab.bpe"):
        shutil.copy(os.path.join(gpt2_dir, f), os.path.join(path, "tok", f))

    with open(text_file, encoding="utf-8") as f:
        corpus = os.path.join(directory, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as out:
            out.write(f.read()[:200000])
    for name, kwargs in (("sp_llama", dict(normalization_rule_name="identity",
                                           remove_extra_whitespaces=False, byte_fallback=True)),
                         # bos and eos swapped, so that LlamaConfig's defaults (1, 2) are wrong
                         ("sp_default", dict(bos_id=2, eos_id=1))):
        prefix = os.path.join(directory, name + "_sp")
        spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=400,
                                       model_type="bpe", minloglevel=2, **kwargs)
        torch.manual_seed(SEED)
        cfg = LlamaConfig(vocab_size=400, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=64, rms_norm_eps=1e-5)
        eos = spm.SentencePieceProcessor(model_file=prefix + ".model").eos_id()
        path = variant(name, LlamaForCausalLM(cfg).eval(), llama_toml(cfg),
                       meta_v2("sentencepiece", ["tokenizer.model"], 400, eos), "sentencepiece")
        shutil.copy(prefix + ".model", os.path.join(path, "tok", "tokenizer.model"))

    torch.manual_seed(SEED)
    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=32, vocab_size=65)
    chars = sorted(set(open(text_file, "rb").read()))
    variant("char", GPT2LMHeadModel(cfg).eval(), gpt2_toml(cfg),
            {"format": "meshtrain-char-v1", "vocab_size": 65, "chars": chars,
             "source": "data/tinyshakespeare.txt", "train_tokens": 0, "val_tokens": 0}, "char")
    with open(os.path.join(directory, "variants.txt"), "w") as f:
        f.write("\n".join(variants) + "\n")


def tiktoken_gpt2(gpt2_dir):
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(gpt2_dir, "vocab.bpe"),
        encoder_json_file=os.path.join(gpt2_dir, "encoder.json"))
    return tiktoken.Encoding(name="gpt2-local", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def check_tokenizer(name, kind, path, gpt2_dir, report):
    from transformers import AutoTokenizer
    out = os.path.join(path, "out")
    if kind == "char":
        present = [f for f in TOKENIZER_FILES if os.path.exists(os.path.join(out, f))]
        report.add(name, f"no tokenizer files written (found: {present})", len(present), 0)
        return
    if kind == "gpt2":
        enc = tiktoken_gpt2(gpt2_dir)
        want = [enc.encode(t, allowed_special={"<|endoftext|>"}) for t in TEXTS]
        loaders = [("AutoTokenizer", {}), ("GPT2Tokenizer (use_fast=False)", {"use_fast": False})]
    else:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=os.path.join(path, "tok", "tokenizer.model"))
        want = [sp.encode(t) for t in TEXTS]
        loaders = [("LlamaTokenizer (use_fast=False)", {"use_fast": False})]
        if name == "sp_llama":
            loaders.insert(0, ("AutoTokenizer", {}))
    for label, kwargs in loaders:
        tok = AutoTokenizer.from_pretrained(out, **kwargs)
        got = [tok(t)["input_ids"] for t in TEXTS]
        bad = [i for i in range(len(TEXTS)) if got[i] != want[i]]
        report.add(name, f"{label} ({type(tok).__name__}) ids = reference on {len(TEXTS)} texts "
                   f"(differ: {bad})", len(bad), 0)
        if kind == "gpt2":
            back = [i for i in range(len(TEXTS)) if tok.decode(got[i]) != TEXTS[i]]
            report.add(name, f"{label} decode round trip (differ: {back})", len(back), 0)


def check_special_ids(name, kind, path, model, report):
    """config.json's bos/eos are the tokenizer's (GPT-2: 50256 both; SentencePiece: its bos and
    eos pieces); a char model has none, and generate() then stops only at max_new_tokens instead
    of at GPT2Config's default 50256, an id outside its 65."""
    from transformers import AutoTokenizer
    out = os.path.join(path, "out")
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    got = (config.get("bos_token_id", "absent"), config.get("eos_token_id", "absent"))
    if kind == "char":
        want = (None, None)
    elif kind == "gpt2":
        want = (50256, 50256)
    else:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=os.path.join(path, "tok", "tokenizer.model"))
        want = (sp.bos_id(), sp.eos_id())
    report.add(name, f"config.json bos/eos_token_id {got} = the tokenizer's {want}",
               int(got != want), 0)
    if kind != "char":
        tok = AutoTokenizer.from_pretrained(out, use_fast=False)
        report.add(name, f"config.json eos_token_id {got[1]} = AutoTokenizer's eos "
                   f"{tok.eos_token_id}", int(got[1] != tok.eos_token_id), 0)
        return
    prompt = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        ids = model.generate(prompt, max_new_tokens=6, do_sample=False)
    report.add(name, f"generate(): eos {model.generation_config.eos_token_id}, "
               f"{ids.shape[1] - 3} of 6 new tokens, all < 65",
               int(model.generation_config.eos_token_id is not None or ids.shape[1] != 9
                   or int(ids.max()) >= 65), 0)


def check(directory, gpt2_dir):
    from transformers import AutoModelForCausalLM
    report = Report()
    with open(os.path.join(directory, "variants.txt")) as f:
        variants = [line.split() for line in f if line.strip()]
    for name, kind in variants:
        path = os.path.join(directory, name)
        check_tokenizer(name, kind, path, gpt2_dir, report)
        got, _ = read_safetensors(os.path.join(path, "meshtrain.safetensors"))
        model = AutoModelForCausalLM.from_pretrained(os.path.join(path, "out"),
                                                     torch_dtype=torch.float32).eval()
        with torch.no_grad():
            ref = model(torch.from_numpy(got["tokens"].astype(np.int64))).logits
        ref = ref.reshape(-1, ref.shape[-1]).numpy()
        report.add(name, "AutoModelForCausalLM logits of the export vs meshtrain's",
                   max_rel(got["logits"], ref), LOGITS_TOL)
        check_special_ids(name, kind, path, model, report)
    report.print()
    if report.failures:
        print("FAILED:\n  " + "\n  ".join(report.failures))
        return 1
    return 0


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "check":
        return check(sys.argv[2], sys.argv[3])
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
