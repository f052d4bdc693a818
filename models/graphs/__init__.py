"""The graph builders, one module per architecture of the tables (``models/arch``): each
``build`` takes the step (``StepGraph``: context, inputs, KV cache) and the model's weights
(``layers.Weights``, by the short names its table declares) and returns the logits tensor.

The arrows run one way: this package imports ``layers`` and ``step``, which import the
tables; of the rest of the model layer only the evaluator imports it, and the tables import
nothing of it (tests/test_import_directions.py).
"""

from __future__ import annotations

from typing import Callable

from polydev import Tensor

from ..arch import architecture
from ..layers import Weights
from ..step import StepGraph
from . import (deepseek2, gemma2, gemma3, gpt_oss, granite, llama, mistral3, olmo2, phi3, qwen2,
               qwen2moe, qwen3, qwen3moe, smollm3)

__all__ = ["Builder", "BUILDERS", "builder"]

Builder = Callable[[StepGraph, Weights], Tensor]
"""A graph builder: the step and the weights in, the logits out."""

BUILDERS: dict[str, Builder] = {
    "llama": llama.build,
    "qwen2": qwen2.build,
    "qwen3": qwen3.build,
    "qwen3moe": qwen3moe.build,
    "gemma3": gemma3.build,
    "gemma2": gemma2.build,
    "smollm3": smollm3.build,
    "granite": granite.build,
    "olmo2": olmo2.build,
    "qwen2moe": qwen2moe.build,
    "phi3": phi3.build,
    "gpt-oss": gpt_oss.build,
    "deepseek2": deepseek2.build,
    "mistral3": mistral3.build,
}
"""Each table entry's builder, by ``general.architecture``."""


def builder(name: str) -> Builder:
    """The graph builder of architecture ``name``; an UnsupportedError naming the ones
    polydev runs where the tables have no such entry."""
    return BUILDERS[architecture(name).name]
