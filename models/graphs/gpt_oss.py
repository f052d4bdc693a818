"""``gpt-oss`` (llama.cpp's ``openai-moe``): sliding-window attention on every other layer
(``il % 2 == 0``), each layer with its own RoPE base; q/k/v and output biases; a learned sink
logit per head in the softmax; YaRN RoPE scaling; a norm before the experts; experts chosen
by raw router logit (router bias included) and weighted by a softmax over the chosen ones;
each expert's biases; the clamped SwiGLU (alpha 1.702, limit 7) (llama.cpp's
``llm_build_openai_moe_iswa``)."""

from __future__ import annotations

import math

from polydev import RopeMode, Tensor, ops

from ..layers import Weights, attention, embed, moe, named, norm, output_head, select_outputs
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    hp = s.hp
    x = embed(s, w["token_embd"])
    for il in range(hp.n_layer):
        base = hp.rope_freq_base_swa if hp.is_swa(il) else hp.rope_freq_base
        h = norm(s, x, w.layer(il, "attn_norm"), hp.rms_eps)
        h = attention(s, w, il, h, rope_mode=RopeMode.NEOX, freq_base=base,
                      q_scale=1.0 / math.sqrt(hp.head_dim_rot),
                      sinks=w.layer(il, "attn_sinks"))
        if il == hp.n_layer - 1:
            h, x = select_outputs(s, h, x)
        x = ops.add(s.ctx, h, x)
        h = norm(s, x, w.layer(il, "post_attention_norm"), hp.rms_eps)
        h = moe(s, w, il, h, gating="softmax_weight", act="swiglu_oai")
        x = named(ops.add(s.ctx, h, x), "l_out", il)
    return output_head(s, w, x)
