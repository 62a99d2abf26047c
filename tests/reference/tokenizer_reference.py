"""meshtrain's tokenizers against the references people use (issue 15, "Tests").

Usage: tokenizer_reference.py MESHTRAIN REPO_ROOT WORK_DIR [LLAMA2_MODEL]
(WORK_DIR is emptied first; with LLAMA2_MODEL only that model is checked.)

For every shipped corpus (data/*.txt) and a text with CJK, emoji, combining marks and odd
whitespace, `meshtrain prepare` writes train.bin/val.bin, which must equal:
  - GPT-2: tiktoken's "gpt2" encoding built from the shipped encoder.json + vocab.bpe
    (tiktoken.load.data_gym_to_mergeable_bpe_ranks, local files, no network) and Hugging Face
    tokenizers' byte-level BPE on the same files, each side of nanoGPT's split (first 90 % of
    the characters train, the rest val) encoded on its own with encode_ordinary;
  - SentencePiece: Debian's python3-sentencepiece on models that `meshtrain tokenizer train`
    made (bpe and unigram), and the Llama 2 model when its path is given.
Round trips: the ids decode to the text (tiktoken, HF, and meshtrain's `tokenizer decode`);
invalid UTF-8 is encoded without error and its ids decode to the same bytes. Nothing
expected is stored: every reference runs live.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import sentencepiece as spm
import tiktoken
import tiktoken.load
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

MESHTRAIN, ROOT, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
LLAMA2 = sys.argv[4] if len(sys.argv) > 4 else None
GPT2_DIR = os.path.join(ROOT, "data", "tokenizers", "gpt2")
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

MIXED = (
    "Hello world! I'm sure we're fine, they'll say; you've 'quoted' it. 1234567 3.14\n"
    "日本語のテキストです。中文分词测试。한국어 문장입니다.\n"
    "Emoji: 😀🤖👍🏽 👨‍👩‍👧 flags 🇫🇷🇯🇵\n"
    "Combining: e\u0301 n\u0303 a\u030a\u0323 Z\u0351\u0334\u0322 — precomposed é ñ å\n"
    "Ünïcödé Ελληνικά Русский العربية עברית हिन्दी\n"
    "\u00a0nbsp\u3000ideographic space\t\ttabs\n\n\n   spaces   \r\n  trailing   "
)

failures = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    if not ok:
        failures.append(name)


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at {i}: {x} vs {y} (lengths {len(a)}, {len(b)})"
    return f"lengths {len(a)} vs {len(b)}"


def run(*args):
    out = subprocess.run([MESHTRAIN, *args], capture_output=True)
    if out.returncode != 0:
        raise SystemExit(f"meshtrain {' '.join(args)} exited {out.returncode}: {out.stderr.decode()}")
    return out.stdout


def prepare(text_files, tokenizer, name, *extra):
    out = os.path.join(WORK, name)
    run("prepare", *text_files, "--tokenizer", tokenizer, "--out", out, "--quiet", *extra)
    meta = json.load(open(os.path.join(out, "meta.json")))
    dtype = np.uint16 if meta["token_dtype"] == "uint16" else np.uint32
    train = np.fromfile(os.path.join(out, "train.bin"), dtype=dtype).tolist()
    val = np.fromfile(os.path.join(out, "val.bin"), dtype=dtype).tolist()
    check(f"{name}: meta.json counts", [meta["train_tokens"], meta["val_tokens"]] == [len(train), len(val)])
    return meta, train, val


def nanogpt_split(text):
    n = len(text)
    return text[: int(n * 0.9)], text[int(n * 0.9):]


# Pre-tokens of 20,000 characters (tiktoken 0.14 overflows its regex stack on megabyte runs,
# which meshtrain's unit test Gpt2Bpe.LongPiecesRoundTrip covers alone).
LONG_RUNS = ("x" + " " * 20000 + "y\n" + "\n" * 20000 + "z" + "a" * 20000 + " end " + "!" * 20000 +
             "1" * 20000 + "\n")


def corpora():
    mixed = os.path.join(WORK, "mixed.txt")
    with open(mixed, "w", encoding="utf-8", newline="") as f:
        f.write(MIXED * 3)
    long_runs = os.path.join(WORK, "long_runs.txt")
    with open(long_runs, "w", encoding="utf-8", newline="") as f:
        f.write(LONG_RUNS)
    shipped = sorted(os.path.join(ROOT, "data", f) for f in os.listdir(os.path.join(ROOT, "data"))
                     if f.endswith(".txt"))
    return shipped + [mixed, long_runs]


def read_text(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def gpt2_references():
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        os.path.join(GPT2_DIR, "vocab.bpe"), os.path.join(GPT2_DIR, "encoder.json"))
    tik = tiktoken.Encoding("gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256})
    hf = Tokenizer(models.BPE.from_file(os.path.join(GPT2_DIR, "encoder.json"),
                                        os.path.join(GPT2_DIR, "vocab.bpe")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    return tik, hf


def test_gpt2(paths):
    tik, hf = gpt2_references()
    for path in paths:
        name = "gpt2 " + os.path.basename(path)
        meta, train, val = prepare([path], "gpt2", name.replace(" ", "_"))
        check(f"{name}: meta", (meta["vocab_size"], meta["eot_id"], meta["token_dtype"],
                                meta["tokenizer"]["files"]) ==
              (50257, 50256, "uint16", ["encoder.json", "vocab.bpe"]), str(meta))
        for side, text, ids in zip(("train", "val"), nanogpt_split(read_text(path)), (train, val)):
            expected = tik.encode_ordinary(text)
            check(f"{name} {side}: ids = tiktoken", ids == expected, first_difference(ids, expected))
            hf_ids = hf.encode(text).ids
            check(f"{name} {side}: ids = HF tokenizers", ids == hf_ids, first_difference(ids, hf_ids))
            check(f"{name} {side}: tiktoken decodes them to the text", tik.decode(ids) == text)
            check(f"{name} {side}: HF decodes them to the text", hf.decode(ids) == text)
        if os.path.basename(path) == "tinyshakespeare.txt":
            check("gpt2 tinyshakespeare: nanoGPT's 301,966 / 36,059", (len(train), len(val)) == (301966, 36059),
                  f"{len(train)} / {len(val)}")
    mixed = MIXED
    ids = [int(i) for i in run("tokenizer", "encode", "--tokenizer", "gpt2", mixed).split()]
    check("gpt2 tokenizer encode (mixed): ids = tiktoken", ids == tik.encode_ordinary(mixed))
    decoded = run("tokenizer", "decode", "--tokenizer", "gpt2", " ".join(map(str, ids))).decode("utf-8")
    check("gpt2 tokenizer decode (mixed): meshtrain decodes to the text", decoded == mixed)


def test_gpt2_documents():
    """Several files and --document-separator: eot between documents, none at the ends."""
    tik, _ = gpt2_references()
    story = os.path.join(ROOT, "data", "tinystories_sample.txt")
    shakespeare = os.path.join(ROOT, "data", "tinyshakespeare.txt")
    _, train, val = prepare([story, shakespeare], "gpt2", "gpt2_documents",
                            "--document-separator", "<|endoftext|>")
    files = [read_text(story), read_text(shakespeare)]
    whole = "".join(files)
    cut = int(len(whole) * 0.9)
    # Each file is a document; the cut at character `cut` of the concatenation splits the
    # file it falls in; then each side splits its pieces at the separator, drops empty
    # documents and puts eot between the rest.
    sides, start = [[], []], 0
    for text in files:
        end = start + len(text)
        if end <= cut:
            sides[0].append(text)
        elif start >= cut:
            sides[1].append(text)
        else:
            sides[0].append(text[: cut - start])
            sides[1].append(text[cut - start:])
        start = end
    for side, pieces, ids in zip(("train", "val"), sides, (train, val)):
        docs = [d for piece in pieces for d in piece.split("<|endoftext|>") if d]
        expected = []
        for i, doc in enumerate(docs):
            if i:
                expected.append(50256)
            expected += tik.encode_ordinary(doc)
        check(f"gpt2 documents {side}: ids = tiktoken per document, eot between", ids == expected,
              first_difference(ids, expected))
    check("gpt2 documents: train holds eot ids between its documents", train.count(50256) > 3)


def test_invalid_utf8():
    path = os.path.join(WORK, "invalid.bin.txt")
    blob = (b"valid text \xff\xfe then \xc3 cut, overlong \xc0\xaf, surrogate \xed\xa0\x80 end\n" * 50 +
            "日本".encode() + b"\x80\x80" + b" more text " * 20)
    with open(path, "wb") as f:
        f.write(blob)
    out = os.path.join(WORK, "gpt2_invalid")
    run("prepare", path, "--tokenizer", "gpt2", "--out", out, "--quiet")
    train = np.fromfile(os.path.join(out, "train.bin"), dtype=np.uint16).tolist()
    val = np.fromfile(os.path.join(out, "val.bin"), dtype=np.uint16).tolist()
    tik, _ = gpt2_references()
    check("gpt2 invalid UTF-8: ids decode to the same bytes", tik.decode_bytes(train + val) == blob)


def sp_trained(model_type):
    out = os.path.join(WORK, f"sp_{model_type}")
    run("tokenizer", "train", "--input", os.path.join(ROOT, "data", "tinyshakespeare.txt"),
        os.path.join(ROOT, "data", "tinystories_sample.txt"), "--model-type", model_type,
        "--vocab-size", "2000", "--out", out)
    return os.path.join(out, "tokenizer.model")


def test_sentencepiece(model, label, paths):
    sp = spm.SentencePieceProcessor(model_file=model)
    for path in paths:
        name = f"{label} {os.path.basename(path)}"
        meta, train, val = prepare([path], model, name.replace(" ", "_"))
        check(f"{name}: meta", (meta["vocab_size"], meta["eot_id"], meta["tokenizer"]["kind"]) ==
              (sp.get_piece_size(), sp.eos_id(), "sentencepiece"), str(meta))
        for side, text, ids in zip(("train", "val"), nanogpt_split(read_text(path)), (train, val)):
            expected = sp.encode(text)
            check(f"{name} {side}: ids = python sentencepiece", ids == expected, first_difference(ids, expected))
    ids = [int(i) for i in run("tokenizer", "encode", "--tokenizer", model, MIXED).split()]
    check(f"{label} tokenizer encode (mixed): ids = python sentencepiece", ids == sp.encode(MIXED))
    decoded = run("tokenizer", "decode", "--tokenizer", model, " ".join(map(str, ids))).decode("utf-8")
    check(f"{label} tokenizer decode (mixed): = python sentencepiece's decode", decoded == sp.decode(ids))


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    paths = corpora()
    if LLAMA2:  # its own CTest test, registered only where the file exists
        test_sentencepiece(LLAMA2, "llama2", paths)
    else:
        test_gpt2(paths)
        test_gpt2_documents()
        test_invalid_utf8()
        for model_type in ("bpe", "unigram"):
            test_sentencepiece(sp_trained(model_type), f"sentencepiece-{model_type}", paths)
    if failures:
        raise SystemExit(f"{len(failures)} tokenizer checks failed: {failures}")
    print("all tokenizer checks passed")


if __name__ == "__main__":
    main()
