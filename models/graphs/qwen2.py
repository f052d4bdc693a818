"""``qwen2``: llama's block with q/k/v biases and NeoX RoPE (llama.cpp's ``llm_build_qwen2``)."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NEOX)
