"""``olmo2`` (OLMo 2, and OLMo 3 with its sliding-window layers): no norm before attention or
the feed-forward; RMS norms of the whole q and k projections; norms after attention and
after the feed-forward, inside the residual branch; NeoX RoPE, unscaled on sliding-window
layers (llama.cpp's ``llm_build_olmo2``)."""

from __future__ import annotations

from polydev import RopeMode, Tensor, ops

from ..layers import (Weights, attention, embed, feed_forward, named, norm, output_head,
                      select_outputs)
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    hp = s.hp
    x = embed(s, w["token_embd"])
    for il in range(hp.n_layer):
        h = attention(s, w, il, x, rope_mode=RopeMode.NEOX, freq_base=hp.rope_freq_base,
                      rope_scaling=not hp.is_swa(il), qk_norm="whole")
        if il == hp.n_layer - 1:
            h, x = select_outputs(s, h, x)
        h = norm(s, h, w.layer(il, "post_attention_norm"), hp.rms_eps)
        x = ops.add(s.ctx, h, x)
        h = feed_forward(s, w, il, x, "silu")
        h = norm(s, h, w.layer(il, "post_ffw_norm"), hp.rms_eps)
        x = named(ops.add(s.ctx, h, x), "l_out", il)
    return output_head(s, w, x)
