"""``qwen2moe``: qwen2's attention (biases, NeoX RoPE) with a mixture of experts whose weights
are not renormalised, plus a shared expert behind a sigmoid gate (llama.cpp's
``llm_build_qwen2moe``)."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NEOX, use_moe=True)
