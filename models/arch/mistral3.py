"""``mistral3`` (the text model of Ministral 3 and Mistral Small 3): llama's block, read
under its own name (llama.cpp's ``llm_build_mistral3``; its llama-4 attention temperature
tuning is refused when a file asks for it)."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NORMAL, rope_freqs=w.get("rope_freqs"),
                            use_moe=s.hp.n_expert > 0)
