"""Embeddings: a text's vector from the model's last hidden state (the final norm's output,
llama.cpp's ``t_embd``), pooled over the text's tokens and normalized as llama-server does.

Pooling (llama.cpp's ``pooling_type``): "mean" of every token's row, "cls" the first token's,
"last" the last token's, "none" every token's row. A file says which in
``<arch>.pooling_type``; a model without it (a generative one) pools by "mean" unless told.
Normalization is llama-server's ``embd_normalize``: 2 (Euclidean, the default), 1 (taxicab),
0 (max absolute value, scaled to int16's range), -1 (none), p > 2 (p-norm).

``embed`` evaluates many texts in one batch, a sequence of the cache each, and frees their
cells afterwards; attention stays causal, as llama.cpp runs a generative model's embeddings.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from polydev.errors import ContextFullError, InvalidArgumentError

from .batch import Batch
from .kv_cells import MAX_SEQUENCES

__all__ = ["POOLING", "embed", "file_pooling", "normalize"]

POOLING = ("none", "mean", "cls", "last")
_GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last"}   # llama_pooling_type


def file_pooling(file, arch: str) -> str | None:
    """The pooling a GGUF file declares (``<arch>.pooling_type``), or None."""
    value = file.get(f"{arch}.pooling_type")
    if value is None:
        return None
    if int(value) not in _GGUF_POOLING:
        raise InvalidArgumentError(f"{arch}.pooling_type {value} is not one polydev computes "
                                   "(0 none, 1 mean, 2 cls, 3 last)")
    return _GGUF_POOLING[int(value)]


def normalize(vectors: np.ndarray, kind: int = 2) -> np.ndarray:
    """Each row of ``vectors`` normalized as llama-server's ``embd_normalize`` (see the
    module doc); a zero row stays zero."""
    x = vectors.astype(np.float64)
    if kind < 0:
        return x.astype(np.float32)
    if kind == 0:
        scale = np.abs(x).max(axis=-1, keepdims=True) / 32760.0
    elif kind == 2:
        scale = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    else:
        scale = (np.abs(x) ** kind).sum(axis=-1, keepdims=True) ** (1.0 / kind)
    return np.divide(x, scale, out=np.zeros_like(x), where=scale > 0).astype(np.float32)


def embed(model, inputs: Sequence[Sequence[int]], pooling: str = "mean",
          normalization: int = 2) -> list[np.ndarray]:
    """The embedding of each input (token ids): [n_embd] per input, or [n_tokens, n_embd]
    with pooling "none". Takes the first sequences of ``model``'s cache (what they held is
    gone) and frees them."""
    if pooling not in POOLING:
        raise InvalidArgumentError(f"pooling must be one of {POOLING}, got {pooling!r}")
    inputs = [[int(t) for t in ids] for ids in inputs]
    for i, ids in enumerate(inputs):
        if not ids:
            raise InvalidArgumentError(f"input {i} has no tokens")
        if len(ids) > model.n_ctx:
            raise ContextFullError(f"input {i} has {len(ids)} tokens; the context holds "
                                   f"{model.n_ctx}")
    out: list[np.ndarray] = []
    for group in _groups(inputs, model.n_ctx):
        out += _embed_group(model, group, pooling, normalization)
    return out


def _groups(inputs: list[list[int]], n_ctx: int) -> list[list[list[int]]]:
    """Consecutive inputs that fit the cache together, a sequence each."""
    groups: list[list[list[int]]] = [[]]
    cells = 0
    for ids in inputs:
        if groups[-1] and (cells + len(ids) > n_ctx or len(groups[-1]) == MAX_SEQUENCES):
            groups.append([])
            cells = 0
        groups[-1].append(ids)
        cells += len(ids)
    return groups


def _embed_group(model, group: list[list[int]], pooling: str,
                 normalization: int) -> list[np.ndarray]:
    evaluator, kv = model.evaluator, model.memory
    batch = Batch()
    for seq, ids in enumerate(group):
        kv.seq_rm(seq)
        batch.add_sequence(ids, seq, logits="all")
    was = evaluator.embeddings
    evaluator.embeddings = True
    try:
        rows = evaluator.decode(batch)
    finally:
        evaluator.embeddings = was
        for seq in range(len(group)):
            kv.seq_rm(seq)
    out, start = [], 0
    for ids in group:
        mine = rows[start:start + len(ids)]
        start += len(ids)
        if pooling == "none":
            out.append(normalize(mine, normalization))
            continue
        pooled = {"mean": lambda: mine.astype(np.float64).mean(axis=0),
                  "cls": lambda: mine[0], "last": lambda: mine[-1]}[pooling]()
        out.append(normalize(pooled[None, :], normalization)[0])
    return out
