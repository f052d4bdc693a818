"""``qwen3moe``: qwen3's attention with a mixture of experts in place of the feed-forward
(llama.cpp's ``llm_build_qwen3moe``): router softmax, top-k, renormalised weights."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NEOX, qk_norm=True, use_moe=True)
