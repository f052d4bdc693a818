"""``gemma3``: embeddings scaled by sqrt(n_embd), per-head q/k RMS norms, NeoX RoPE with
``rope.freq_base_swa`` on the sliding-window layers (``il % 6 < 5``) and ``rope.freq_base`` on
the others, each with its own mask, Q scaled by 1/sqrt(key_length), norms after attention and
after the feed-forward, GEGLU with tanh GELU, and optional final logit softcapping (llama.cpp's
``llm_build_gemma3_iswa``). The converter already folded gemma's ``1 + w`` into the norms."""

from __future__ import annotations

import math

from polydev import RopeMode, Tensor, ops

from ..layers import (Weights, attention, named, embed, feed_forward, norm, output_head,
                       select_outputs)
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    hp = s.hp
    x = embed(s, w["token_embd"], math.sqrt(hp.n_embd))
    for il in range(hp.n_layer):
        base = hp.rope_freq_base_swa if hp.is_swa(il) else hp.rope_freq_base
        h = norm(s, x, w.layer(il, "attn_norm"), hp.rms_eps)
        h = attention(s, w, il, h, rope_mode=RopeMode.NEOX, freq_base=base, qk_norm="head",
                      q_scale=1.0 / math.sqrt(hp.n_embd_head_k))
        h = norm(s, h, w.layer(il, "post_attention_norm"), hp.rms_eps)
        if il == hp.n_layer - 1:
            h, x = select_outputs(s, h, x)
        x = ops.add(s.ctx, h, x)
        h = norm(s, x, w.layer(il, "ffn_norm"), hp.rms_eps)
        h = feed_forward(s, w, il, h, "gelu")
        h = norm(s, h, w.layer(il, "post_ffw_norm"), hp.rms_eps)
        x = named(ops.add(s.ctx, h, x), "l_out", il)
    return output_head(s, w, x, hp.final_logit_softcap)
