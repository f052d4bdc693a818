"""``gemma2``: gemma's sandwich block (``layers.sandwich_decoder``) with sliding-window
attention on every other layer (``il % 2 == 0`` unless the file says otherwise), Q scaled by
1/sqrt(key_length) (1/sqrt(n_embd / n_head) for the 27B, as llama.cpp), attention logits
soft-capped (``attn_logit_softcapping``, 50 by default) and the final logits too (30), the
token embedding as the output matrix (llama.cpp's ``llm_build_gemma2_iswa``)."""

from __future__ import annotations

import math

from polydev import Tensor

from ..layers import Weights, sandwich_decoder
from ..step import StepGraph

_GEMMA2_27B_LAYERS = 46             # llama.cpp's LLM_TYPE_27B, whose query scale differs


def build(s: StepGraph, w: Weights) -> Tensor:
    hp = s.hp
    head = hp.n_embd // hp.n_head if hp.n_layer == _GEMMA2_27B_LAYERS else hp.n_embd_head_k
    return sandwich_decoder(s, w, q_scale=1.0 / math.sqrt(head))
