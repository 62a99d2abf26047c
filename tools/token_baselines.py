#!/usr/bin/env python3
"""Reference losses for a prepared token dataset: what a model that learned nothing beyond
token frequencies (unigram) or one previous token (bigram) scores on the val split.

Usage: token_baselines.py <prepared dir>   (train.bin / val.bin / meta.json from `meshtrain prepare`)

All figures are mean cross-entropies over val.bin in nats per token, the unit of meshtrain's
val_loss:
  uniform  ln(vocab_size): the loss of an untrained model with a uniform output.
  unigram  train-split token counts, add-0.5 smoothed over the vocabulary (so a token unseen in
           train costs a finite amount): p(w) = (c(w) + 0.5) / (N + 0.5 V).
  bigram   0.5 · c(v, w) / c(v) + 0.5 · unigram(w), counts from the train split (Jelinek–Mercer
           interpolation with a fixed weight 0.5, not tuned on val). Scored on val's consecutive
           pairs, so over len(val) - 1 tokens.
"""
import json
import math
import sys
from pathlib import Path

import numpy as np


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    d = Path(sys.argv[1])
    meta = json.loads((d / "meta.json").read_text())
    vocab = int(meta["vocab_size"])
    dtype = np.dtype(meta["token_dtype"])
    train = np.fromfile(d / "train.bin", dtype=dtype).astype(np.int64)
    val = np.fromfile(d / "val.bin", dtype=dtype).astype(np.int64)

    counts = np.bincount(train, minlength=vocab).astype(np.float64)
    unigram = (counts + 0.5) / (counts.sum() + 0.5 * vocab)

    # Bigram counts as sorted pair keys v * vocab + w, looked up with searchsorted.
    keys, pair_counts = np.unique(train[:-1] * vocab + train[1:], return_counts=True)
    query = val[:-1] * vocab + val[1:]
    pos = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    c_vw = np.where(keys[pos] == query, pair_counts[pos], 0).astype(np.float64)
    c_v = np.bincount(train[:-1], minlength=vocab).astype(np.float64)[val[:-1]]
    bigram = 0.5 * np.where(c_v > 0, c_vw / np.maximum(c_v, 1.0), 0.0) + 0.5 * unigram[val[1:]]

    print(f"{d}: vocab {vocab}, {len(train)} train / {len(val)} val tokens")
    print(f"  val tokens unseen in train: {int((counts[val] == 0).sum())}")
    print(f"  uniform  ln(V)  {math.log(vocab):.4f} nats/token")
    print(f"  unigram         {-np.log(unigram[val]).mean():.4f} nats/token")
    print(f"  bigram (λ 0.5)  {-np.log(bigram).mean():.4f} nats/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
