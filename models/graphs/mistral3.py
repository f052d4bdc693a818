"""``mistral3`` (the text model of Ministral 3 and Mistral Small 3): llama's block with YaRN
RoPE and, where the file sets ``attention.temperature_scale``, llama 4's attention
temperature tuning: q times log(floor(pos / original context) + 1) * scale + 1 (llama.cpp's
``llm_build_mistral3``)."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NORMAL, rope_freqs=w.get("rope_freqs"),
                            use_moe=s.hp.n_expert > 0,
                            q_factor=s.attn_scale if s.hp.attn_temp_scale else None)
