"""``phi3`` (Phi-3, Phi-3.5, Phi-4-mini): llama's pre-norm block with q/k/v fused in
``attn_qkv`` and gate/up fused in ``ffn_up`` (SwiGLU of its halves), NeoX RoPE with LongRoPE's
per-dimension factors: the long ones when the context is longer than the original one, the
short ones otherwise, and ``rope.scaling.attn_factor`` on RoPE's magnitude (llama.cpp's
``llm_build_phi3``; its sliding window is off there too)."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    long_context = s.kv.n_ctx > s.hp.n_ctx_orig
    factors = w.get("rope_factors_long" if long_context else "rope_factors_short")
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NEOX, rope_freqs=factors)
