"""``phi3`` (Phi-3, Phi-3.5, Phi-4-mini): llama's pre-norm block with q/k/v fused in
``attn_qkv`` and gate/up fused in ``ffn_up`` (SwiGLU of its halves), NeoX RoPE with LongRoPE's
per-dimension factors: the long ones when the context, padded to 256 cells as llama.cpp pads
it, is longer than the original one, the short ones otherwise, and
``rope.scaling.attn_factor`` on RoPE's magnitude (llama.cpp's ``llm_build_phi3``; its
sliding window is off there too)."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    # llama.cpp compares its n_ctx_seq, the context asked for padded to a multiple of 256:
    # the cache's size (an original context of 300 takes the long factors at n_ctx 290)
    long_context = s.kv.size > s.hp.n_ctx_orig
    factors = w.get("rope_factors_long" if long_context else "rope_factors_short")
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NEOX, rope_freqs=factors)
