"""``deepseek2`` (DeepSeek-V2, V2-Lite, V2.5): multi-head latent attention over a compressed
KV cache, the first ``leading_dense_block_count`` layers dense and the rest a mixture of
experts with shared experts, softmax or sigmoid routing (with a selection bias and grouped
routing where the file has them), and YaRN RoPE with DeepSeek's magnitude correction
(llama.cpp's ``llm_build_deepseek2``, its MLA path).

The cache holds, per token, one row shared by every head: the normalised compressed kv
(``kv_lora_rank`` values) followed by the roped part of k (``rope.dimension_count``); V is its
first ``kv_lora_rank`` values. Each head's q is "absorbed": its non-rope part multiplied by
``attn_k_b`` into the compressed space, so attention runs as multi-query attention over the
compressed rows, and ``attn_v_b`` recovers each head's values from the result.
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
    x = embed(s, w["token_embd"])
    for il in range(hp.n_layer):
        h = norm(s, x, w.layer(il, "attn_norm"), hp.rms_eps)
        h = latent_attention(s, w, il, h)
        if il == hp.n_layer - 1:
            h, x = select_outputs(s, h, x)
        x = ops.add(s.ctx, h, x)
        h = norm(s, x, w.layer(il, "ffn_norm"), hp.rms_eps)
        h = (feed_forward(s, w, il, h) if il < hp.n_layer_dense_lead
             else moe(s, w, il, h, gating=_GATING[hp.expert_gating_func]))
        x = named(ops.add(s.ctx, h, x), "l_out", il)
    return output_head(s, w, x)


def kq_scale(hp: HParams) -> float:
    """1/sqrt(key_length_mla), times YaRN's magnitude correction squared as llama.cpp
    pre-scales it for DeepSeek (its rope's own correction undone first)."""
    inv = 1.0 / hp.rope_freq_scale
    original = hp.rope_attn_factor * (1.0 + 0.1 * math.log(inv))
    mscale = original * (1.0 + 0.1 * hp.rope_yarn_log_mul * math.log(inv))
    return mscale * mscale / math.sqrt(hp.n_embd_head_k_mla)


def latent_attention(s: StepGraph, w: Weights, il: int, x: Tensor) -> Tensor:
    """Multi-head latent attention of layer ``il`` (see the module docstring)."""
    hp, ctx = s.hp, s.ctx
    n_tokens, n_head, n_rot, rank = x.ne[1], hp.n_head, hp.head_dim_rot, hp.n_lora_kv
    n_nope = hp.n_embd_head_k_mla - n_rot
    if hp.n_lora_q > 0:
        q = ops.mul_mat(ctx, w.layer(il, "attn_q_a"), x)
        q = norm(s, q, w.layer(il, "attn_q_a_norm"), hp.rms_eps)
        q = ops.mul_mat(ctx, w.layer(il, "attn_q_b"), q)
    else:
        q = ops.mul_mat(ctx, w.layer(il, "attn_q"), x)
    q = ctx.reshape(q, hp.n_embd_head_k_mla, n_head, n_tokens)
    kv = ops.mul_mat(ctx, w.layer(il, "attn_kv_a_mqa"), x)          # [rank + n_rot, n_tokens]
    compressed = ops.cont(ctx, ctx.view_2d(kv, rank, n_tokens, kv.nb[1], 0))
    k_rope = ops.cont(ctx, ctx.view_3d(kv, n_rot, 1, n_tokens, kv.nb[1], kv.nb[1],
                                       kv.traits.row_size(rank)))
    rope = rope_params(hp, RopeMode.NORMAL, hp.rope_freq_base, n_rot)
    k_rope = ops.rope_ext(ctx, k_rope, s.positions(), None, **rope)
    compressed = norm(s, compressed, w.layer(il, "attn_kv_a_norm"), hp.rms_eps)
    q_nope = ctx.view_3d(q, n_nope, n_head, n_tokens, q.nb[1], q.nb[2], 0)
    q_rope = ops.cont(ctx, ctx.view_3d(q, n_rot, n_head, n_tokens, q.nb[1], q.nb[2],
                                       q.traits.row_size(n_nope)))
    q_rope = ops.rope_ext(ctx, q_rope, s.positions(), None, **rope)
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
