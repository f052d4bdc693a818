"""``smollm3``: llama's block without RoPE on every fourth layer (NoPE: layers 3, 7, 11, ...,
llama.cpp's ``n_no_rope_layer_step`` of 4) (llama.cpp's ``llm_build_smollm3``)."""

from __future__ import annotations

from polydev import RopeMode, Tensor

from ..layers import Weights, pre_norm_decoder
from ..step import StepGraph

NO_ROPE_LAYER_STEP = 4


def build(s: StepGraph, w: Weights) -> Tensor:
    return pre_norm_decoder(s, w, rope_mode=RopeMode.NORMAL,
                            use_rope=lambda il: (il + 1) % NO_ROPE_LAYER_STEP != 0)
