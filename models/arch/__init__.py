"""Graph builders, one per ``general.architecture``; nothing else lives here.

A builder takes the step (``StepGraph``: context, inputs, KV cache) and the model's weights and
returns the logits tensor. ``builder(name)`` looks one up.
"""

from __future__ import annotations

from typing import Callable

from polydev.errors import UnsupportedError

from . import gemma3, llama, qwen2, qwen3, qwen3moe

__all__ = ["ARCHITECTURES", "builder"]

ARCHITECTURES: dict[str, Callable] = {
    "llama": llama.build,
    "qwen2": qwen2.build,
    "qwen3": qwen3.build,
    "qwen3moe": qwen3moe.build,
    "gemma3": gemma3.build,
}


def builder(arch: str) -> Callable:
    """The graph builder of ``arch``."""
    try:
        return ARCHITECTURES[arch]
    except KeyError:
        raise UnsupportedError(f"architecture {arch!r} is not supported (polydev runs "
                               f"{', '.join(sorted(ARCHITECTURES))})") from None
