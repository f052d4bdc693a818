"""``qwen3``: qwen2's block without biases, with an RMS norm of each q and k head before RoPE
(llama.cpp's ``llm_build_qwen3``)."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NEOX, qk_norm=True)
