"""FLASH_ATTN_EXT: fused attention as batched BLAS products over blocks of queries.

ggml's CPU kernel runs an online softmax per query row. Here each block of query rows runs
as three batched products (scores = q k^T, softmax, p v) for all heads at once: heads are
split into (kv_head, group) so grouped-query heads share one K/V matrix by broadcasting,
without copies. Blocks keep the score matrix small enough to stay in cache; a fully masked
row gives zeros, as in ggml.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.ops import FlashAttnParams, FlashAttnSources, alibi_slopes
from polydev.tensor import Tensor

from .env import needs_codec, values_of

# scores per block of query rows, in elements: on a GPU 64 MiB of float32, so each block is a
# few large calls; on the host 1 MiB, which stays in cache: 2 MiB ran SmolLM2's pp512 about 10%
# faster than 64 MiB blocks, and 1 MiB no slower than 2 with 2 MiB less peak memory
SCORE_BLOCK = 1 << 24
HOST_SCORE_BLOCK = 1 << 18


def _mask_by_head(xp, mask, n_seq: int, n_head_kv: int, group: int, n_q: int):
    """The F16 mask (m3, m2, rows, n_kv) as (n_seq or 1, kv_heads or 1, group or 1, n_q, n_kv)
    following ggml's repeat (head h reads mask head h % m2, sequence s reads s % m3)."""
    m3, m2 = mask.shape[0], mask.shape[1]
    rows = mask[:, :, :n_q]
    n_head = n_head_kv * group
    if m2 == 1:
        by_head = rows[:, :, None]
    elif m2 == n_head:
        by_head = rows.reshape(m3, n_head_kv, group, n_q, rows.shape[-1])
    else:
        by_head = rows[:, xp.arange(n_head) % m2].reshape(m3, n_head_kv, group, n_q, -1)
    if m3 not in (1, n_seq):
        by_head = by_head[xp.arange(n_seq) % m3]
    return by_head


def bind_flash_attn_ext(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    q_t, k_t, v_t, mask_t, sinks_t = FlashAttnSources.of(node)
    params = FlashAttnParams.of(node)
    scale, max_bias, softcap = params.kernel_scale, params.max_bias, params.softcap
    n_seq, n_head, n_q, _ = q_t.shape
    n_head_kv = k_t.ne[2]
    group = n_head // n_head_kv
    q = env.view(q_t).reshape(n_seq, n_head_kv, group, n_q, -1)
    out = env.view(node).reshape(n_seq, n_q, n_head_kv, group, -1)
    per_head = (1, n_head_kv, group, 1, 1)
    slopes = (xp.asarray(alibi_slopes(n_head, max_bias)).reshape(per_head) if max_bias > 0
        else None)
    sinks = env.view(sinks_t).reshape(per_head) if sinks_t is not None else None
    budget = HOST_SCORE_BLOCK if xp is np else SCORE_BLOCK
    block = max(1, budget // max(1, n_head * k_t.ne[1]))

    def run() -> None:
        mask = (_mask_by_head(xp, env.view(mask_t), n_seq, n_head_kv, group, n_q)
            if mask_t is not None else None)
        # on a GPU, reading the visible range back would synchronise the stream each call
        lo, hi = _visible_cells(xp, mask, k_t.ne[1]) if xp is np else (0, k_t.ne[1])
        if hi <= lo:                                # every score masked: zeros, as ggml
            out[...] = 0
            return
        k = _cells_f32(env, k_t, lo, hi)[:, :, None]   # (s, hkv, 1, cells, D)
        v = _cells_f32(env, v_t, lo, hi)[:, :, None]
        k_t_ = xp.swapaxes(k, -1, -2)
        if mask is not None:
            mask = mask[..., lo:hi]
        for q0 in range(0, n_q, block):
            q1 = min(n_q, q0 + block)
            scores = xp.matmul(q[:, :, :, q0:q1], k_t_)      # (s, hkv, group, rows, cells)
            scores *= xp.float32(scale)
            if softcap:
                xp.tanh(scores, out=scores)
                scores *= xp.float32(softcap)
            if mask is not None:
                m = mask[..., q0:q1, :]
                scores += m * slopes if slopes is not None else m
            out[:, q0:q1] = xp.moveaxis(_softmax_times_v(xp, scores, v, sinks), 3, 1)
    return run


def _visible_cells(xp, mask, n_kv: int) -> tuple[int, int]:
    """The range of KV cells some query sees: cells outside it are -inf for every query and
    add nothing (ggml's CPU kernel skips them too), so neither K nor V is read there."""
    if mask is None:
        return 0, n_kv
    seen = xp.flatnonzero((mask != -xp.inf).any(axis=tuple(range(mask.ndim - 1))))
    if seen.size == 0:
        return 0, 0
    return int(seen[0]), int(seen[-1]) + 1


def _cells_f32(env, t: Tensor, lo: int, hi: int):
    """Cells [lo, hi) of a K or V tensor (s, heads, cells, D) as float32."""
    if needs_codec(t.type):
        return env.xp.asarray(values_of(env, t)[:, :, lo:hi], dtype=env.xp.float32)
    return env.float32(env.view(t)[:, :, lo:hi])


def _softmax_times_v(xp, scores, v, sinks):
    """softmax(scores) @ v, with the sinks' logits in the denominator; overwrites scores."""
    row_max = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        row_max = xp.maximum(row_max, sinks)
    # a row with every score -inf has no finite max: shift by 0 so exp gives zeros
    row_max = xp.where(xp.isfinite(row_max), row_max, xp.float32(0))
    scores -= row_max
    xp.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total += xp.exp(sinks - row_max)
    weighted = xp.matmul(scores, v)
    weighted *= xp.where(total > 0, 1 / xp.where(total > 0, total, 1), 0)
    return weighted
