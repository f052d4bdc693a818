"""``llama`` (SmolLM2, TinyLlama, Llama 3, Mixtral): RMS norms, NORM RoPE with optional
``rope_freqs``, grouped-query attention, SwiGLU or a mixture of experts (llama.cpp's
``llm_build_llama``)."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NORMAL, rope_freqs=w.get("rope_freqs"),
                            use_moe=s.hp.n_expert > 0)
