"""``gemma3``: gemma's sandwich block (``layers.sandwich_decoder``) with per-head q/k RMS
norms, ``rope.freq_base_swa`` on the sliding-window layers (``il % 6 < 5``) and
``rope.freq_base`` on the others, Q scaled by 1/sqrt(key_length), and optional final logit
softcapping (llama.cpp's ``llm_build_gemma3_iswa``). The converter already folded gemma's
``1 + w`` into the norms."""

from __future__ import annotations

import math

from polydev import Tensor

from ..layers import Weights, sandwich_decoder
from ..step import StepGraph


def build(s: StepGraph, w: Weights) -> Tensor:
    return sandwich_decoder(s, w, q_scale=1.0 / math.sqrt(s.hp.n_embd_head_k), qk_norm="head")
