"""``gemma2``: embeddings scaled by sqrt(n_embd); sliding-window attention on every other
layer (``il % 2 == 0`` unless the file says otherwise); Q scaled by 1/sqrt(key_length)
(1/sqrt(n_embd / n_head) for the 27B, as llama.cpp); attention logits soft-capped; norms
after attention and after the feed-forward; GEGLU with tanh GELU; final logits soft-capped;
the token embedding as the output matrix (llama.cpp's ``llm_build_gemma2_iswa``)."""

from __future__ import annotations

import math

from polydev import RopeMode, Tensor, ops

from ..layers import (Weights, attention, embed, feed_forward, named, norm, output_head,
                      select_outputs)
from ..step import StepGraph

_GEMMA2_27B_LAYERS = 46             # llama.cpp's LLM_TYPE_27B, whose query scale differs


def build(s: StepGraph, w: Weights) -> Tensor:
    hp = s.hp
    x = embed(s, w["token_embd"], math.sqrt(hp.n_embd))
    q_scale = 1.0 / math.sqrt(hp.n_embd // hp.n_head if hp.n_layer == _GEMMA2_27B_LAYERS
                              else hp.n_embd_head_k)
    for il in range(hp.n_layer):
        base = hp.rope_freq_base_swa if hp.is_swa(il) else hp.rope_freq_base
        h = norm(s, x, w.layer(il, "attn_norm"), hp.rms_eps)
        h = attention(s, w, il, h, rope_mode=RopeMode.NEOX, freq_base=base, q_scale=q_scale)
        if il == hp.n_layer - 1:
            h, x = select_outputs(s, h, x)
        h = norm(s, h, w.layer(il, "post_attention_norm"), hp.rms_eps)
        x = ops.add(s.ctx, h, x)
        h = norm(s, x, w.layer(il, "ffn_norm"), hp.rms_eps)
        h = feed_forward(s, w, il, h, "gelu")
        h = norm(s, h, w.layer(il, "post_ffw_norm"), hp.rms_eps)
        x = named(ops.add(s.ctx, h, x), "l_out", il)
    return output_head(s, w, x, hp.final_logit_softcap)
