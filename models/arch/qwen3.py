"""``qwen3``: qwen2's block without biases, with an RMS norm of each q and k head before RoPE
(llama.cpp's ``llm_build_qwen3``)."""

from __future__ import annotations

from polydev import RopeMode, Tensor, ops

from ..layers import (Weights, attention, named, embed, feed_forward, norm, output_head,
                       select_outputs)
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    hp = s.hp
    x = embed(s, w["token_embd"])
    for il in range(hp.n_layer):
        h = norm(s, x, w.layer(il, "attn_norm"), hp.rms_eps)
        h = attention(s, w, il, h, rope_mode=RopeMode.NEOX, freq_base=hp.rope_freq_base,
                      qk_norm=True)
        if il == hp.n_layer - 1:
            h, x = select_outputs(s, h, x)
        x = ops.add(s.ctx, h, x)
        h = norm(s, x, w.layer(il, "ffn_norm"), hp.rms_eps)
        x = named(ops.add(s.ctx, feed_forward(s, w, il, h, "silu"), x), "l_out", il)
    return output_head(s, w, x)
