"""``granite`` (dense): llama's block with IBM's multipliers: the embeddings times
``embedding_scale``, each block's output times ``residual_scale`` before it joins the
residual stream, ``attention.scale`` in place of 1/sqrt(head size), and the logits divided
by ``logit_scale``; no RoPE at all when ``rope.scaling.finetuned`` is false (llama.cpp's
``llm_build_granite``)."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    hp = s.hp
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NORMAL, rope_freqs=w.get("rope_freqs"),
                            use_rope=lambda il: hp.rope_finetuned,
                            q_scale=hp.attention_scale or None)
