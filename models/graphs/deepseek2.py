"""``deepseek2`` (DeepSeek-V2, V2-Lite, V2.5): multi-head latent attention, the first
``leading_dense_block_count`` layers dense and the rest a mixture of experts with shared
experts, softmax or sigmoid routing (with a selection bias and grouped routing where the file
has them), and YaRN RoPE with DeepSeek's magnitude correction (llama.cpp's
``llm_build_deepseek2``).

Each token's kv is compressed to ``kv_lora_rank`` values (normalised), beside a rope part of k
that every head shares; q has a rope part per head. Files come in two forms (``hp.is_mla``):

- llama.cpp's MLA form (``latent_attention``): the cache holds, per token, one row shared by
  every head: the compressed kv followed by the roped part of k; V is its first
  ``kv_lora_rank`` values. Each head's q is "absorbed": its non-rope part multiplied by
  ``attn_k_b`` into the compressed space, so attention runs as multi-query attention over the
  compressed rows, and ``attn_v_b`` recovers each head's values from the result.
- the older form (``decompressed_attention``): ``attn_kv_b`` decompresses every head's k
  (its non-rope part) and v, each head's k is joined to the shared rope part, and the cache
  holds every head's K and V as standard multi-head attention does.
"""

from __future__ import annotations

import math

from polydev import RopeMode, Tensor, ops

from ..hparams import HParams
from ..kv_shift import KeyRope
from ..layers import (Weights, embed, feed_forward, moe, named, norm, output_head,
                      rope_params, select_outputs)
from ..step import StepGraph

_GATING = {0: "softmax", 1: "softmax", 2: "sigmoid"}     # llama.cpp's expert_gating_func


def build(s: StepGraph, w: Weights) -> Tensor:
    hp = s.hp
    attention = latent_attention if hp.is_mla else decompressed_attention
    x = embed(s, w["token_embd"])
    for il in range(hp.n_layer):
        h = norm(s, x, w.layer(il, "attn_norm"), hp.rms_eps)
        h = attention(s, w, il, h)
        if il == hp.n_layer - 1:
            h, x = select_outputs(s, h, x)
        x = ops.add(s.ctx, h, x)
        h = norm(s, x, w.layer(il, "ffn_norm"), hp.rms_eps)
        h = (feed_forward(s, w, il, h) if il < hp.n_layer_dense_lead
             else moe(s, w, il, h, gating=_GATING[hp.expert_gating_func]))
        x = named(ops.add(s.ctx, h, x), "l_out", il)
    return output_head(s, w, x)


def kq_scale(hp: HParams) -> float:
    """1/sqrt(decompressed k head), times YaRN's magnitude correction squared as llama.cpp
    pre-scales it for DeepSeek (its rope's own correction undone first)."""
    inv = 1.0 / hp.rope_freq_scale
    original = hp.rope_attn_factor * (1.0 + 0.1 * math.log(inv))
    mscale = original * (1.0 + 0.1 * hp.rope_yarn_log_mul * math.log(inv))
    return mscale * mscale / math.sqrt(hp.n_embd_head_k_mla)


def latent_attention(s: StepGraph, w: Weights, il: int, x: Tensor) -> Tensor:
    """Layer ``il``'s attention in llama.cpp's MLA form (see the module docstring)."""
    hp, ctx = s.hp, s.ctx
    n_tokens, n_head, n_rot, rank = x.ne[1], hp.n_head, hp.head_dim_rot, hp.n_lora_kv
    q_nope, q_rope, rope = _queries(s, w, il, x)
    compressed, k_rope = _compressed_kv(s, w, il, x, rope)
    # each head's non-rope q taken into the compressed space: [rank, n_tokens, n_head]
    absorbed = ops.mul_mat(ctx, w.layer(il, "attn_k_b"), ctx.permute(q_nope, 0, 2, 1, 3))
    absorbed = ctx.permute(absorbed, 0, 2, 1, 3)                    # [rank, n_head, n_tokens]
    q = named(ops.concat(ctx, absorbed, q_rope, 0), "Qcur", il)     # [rank + n_rot, ...]
    compressed = ctx.reshape(compressed, rank, 1, n_tokens)
    k = named(ops.concat(ctx, compressed, k_rope, 0), "Kcur", il)
    s.key_rope[il] = KeyRope(None, rope, first=rank, width=n_rot)   # behind the compressed kv
    k_all, v_all = s.kv.store_and_view(ctx, il, k, None, s.cells, s.shape.n_kv)  # V in K
    out = ops.flash_attn_ext(ctx, ctx.permute(q, 0, 2, 1, 3), k_all, v_all, s.mask_for(il),
                             kq_scale(hp))                           # [rank, n_head, n_tokens]
    out = ops.mul_mat(ctx, w.layer(il, "attn_v_b"), ctx.permute(out, 0, 2, 1, 3))
    out = ops.cont(ctx, ctx.permute(out, 0, 2, 1, 3))               # [head_v, n_head, tokens]
    out = ctx.reshape(named(out, "kqv_out", il), hp.n_embd_head_v_mla * n_head, n_tokens)
    return named(ops.mul_mat(ctx, w.layer(il, "attn_output"), out), "attn_out", il)


def decompressed_attention(s: StepGraph, w: Weights, il: int, x: Tensor) -> Tensor:
    """Layer ``il``'s attention in the older form with ``attn_kv_b`` (see the module
    docstring): multi-head attention over the cached decompressed heads."""
    hp, ctx = s.hp, s.ctx
    n_tokens, n_head, n_rot = x.ne[1], hp.n_head, hp.head_dim_rot
    head_v, n_nope = hp.n_embd_head_v_mla, hp.n_embd_head_k_mla - hp.head_dim_rot
    q_nope, q_rope, rope = _queries(s, w, il, x)
    compressed, k_rope = _compressed_kv(s, w, il, x, rope)
    kv = ops.mul_mat(ctx, w.layer(il, "attn_kv_b"), compressed)     # per head: k_nope, v
    head_kv = kv.traits.row_size(n_nope + head_v)
    k_nope = ctx.view_3d(kv, n_nope, n_head, n_tokens, head_kv, kv.nb[1], 0)
    v = ops.cont(ctx, ctx.view_3d(kv, head_v, n_head, n_tokens, head_kv, kv.nb[1],
                                  kv.traits.row_size(n_nope)))
    q = named(ops.concat(ctx, q_nope, q_rope, 0), "Qcur", il)       # [head_k, n_head, tokens]
    # the shared rope part joined to every head's k, as llama.cpp repeats it
    k = named(ops.concat(ctx, k_nope, ops.repeat(ctx, k_rope, q_rope), 0), "Kcur", il)
    s.key_rope[il] = KeyRope(None, rope, first=n_nope, width=n_rot)  # each head's last n_rot
    k_all, v_all = s.kv.store_and_view(ctx, il, k, v, s.cells, s.shape.n_kv)
    out = ops.flash_attn_ext(ctx, ctx.permute(q, 0, 2, 1, 3), k_all, v_all, s.mask_for(il),
                             kq_scale(hp))                         # [head_v, n_head, n_tokens]
    out = ctx.reshape(named(out, "kqv_out", il), head_v * n_head, n_tokens)
    return named(ops.mul_mat(ctx, w.layer(il, "attn_output"), out), "attn_out", il)


def _queries(s: StepGraph, w: Weights, il: int,
             x: Tensor) -> tuple[Tensor, Tensor, dict]:
    """Each head's q in two parts, [n, n_head, n_tokens] each: the non-rope part (a view)
    and the rope part, roped; and the rope's arguments (k's rope part takes the same).
    q comes through its low-rank compression where the file has one (V2-Lite's does not)."""
    hp, ctx = s.hp, s.ctx
    n_tokens, n_head, n_rot = x.ne[1], hp.n_head, hp.head_dim_rot
    n_nope = hp.n_embd_head_k_mla - n_rot
    if hp.n_lora_q > 0:
        q = ops.mul_mat(ctx, w.layer(il, "attn_q_a"), x)
        q = norm(s, q, w.layer(il, "attn_q_a_norm"), hp.rms_eps)
        q = ops.mul_mat(ctx, w.layer(il, "attn_q_b"), q)
    else:
        q = ops.mul_mat(ctx, w.layer(il, "attn_q"), x)
    q = ctx.reshape(q, hp.n_embd_head_k_mla, n_head, n_tokens)
    q_nope = ctx.view_3d(q, n_nope, n_head, n_tokens, q.nb[1], q.nb[2], 0)
    q_rope = ops.cont(ctx, ctx.view_3d(q, n_rot, n_head, n_tokens, q.nb[1], q.nb[2],
                                       q.traits.row_size(n_nope)))
    rope = rope_params(hp, RopeMode.NORMAL, hp.rope_freq_base, n_rot)
    return q_nope, ops.rope_ext(ctx, q_rope, s.positions, None, **rope), rope


def _compressed_kv(s: StepGraph, w: Weights, il: int, x: Tensor,
                   rope: dict) -> tuple[Tensor, Tensor]:
    """The token's compressed kv, normalised, [rank, n_tokens], and the rope part of k that
    every head shares, roped, [n_rot, 1, n_tokens]."""
    hp, ctx = s.hp, s.ctx
    n_tokens, n_rot, rank = x.ne[1], hp.head_dim_rot, hp.n_lora_kv
    kv = ops.mul_mat(ctx, w.layer(il, "attn_kv_a_mqa"), x)          # [rank + n_rot, n_tokens]
    compressed = ops.cont(ctx, ctx.view_2d(kv, rank, n_tokens, kv.nb[1], 0))
    k_rope = ops.cont(ctx, ctx.view_3d(kv, n_rot, 1, n_tokens, kv.nb[1], kv.nb[1],
                                       kv.traits.row_size(rank)))
    k_rope = ops.rope_ext(ctx, k_rope, s.positions, None, **rope)
    return norm(s, compressed, w.layer(il, "attn_kv_a_norm"), hp.rms_eps), k_rope
