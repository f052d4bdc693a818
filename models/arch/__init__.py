"""Architectures: each one's hyperparameter keys and tensors as data (``table.py``, in the
records of ``schema.py``) and its graph builder (``<module>.py``, nothing else).

A builder takes the step (``StepGraph``: context, inputs, KV cache) and the model's weights and
returns the logits tensor. ``architecture(name)`` looks an entry up, ``builder(name)`` imports
its builder (on first use: the tables must not pull the graph code into ``polydev info``).
"""

from __future__ import annotations

import importlib
from typing import Callable

from polydev.errors import UnsupportedError

from .schema import REQUIRED, Architecture, ExpectedTensor, Key, TensorSpec
from .table import ARCHITECTURES

__all__ = ["ARCHITECTURES", "Architecture", "ExpectedTensor", "Key", "REQUIRED", "TensorSpec",
           "architecture", "builder", "supported"]


def supported() -> list[str]:
    """The names of the architectures polydev runs, sorted."""
    return sorted(ARCHITECTURES)


def architecture(name: str) -> Architecture:
    """The table entry of ``general.architecture`` ``name``; an UnsupportedError naming the
    ones polydev runs otherwise."""
    try:
        return ARCHITECTURES[name]
    except (KeyError, TypeError):
        raise UnsupportedError(f"architecture {name!r} is not supported (polydev runs "
                               f"{', '.join(supported())})") from None


def builder(name: str) -> Callable:
    """The graph builder of architecture ``name``."""
    module = importlib.import_module(f".{architecture(name).module}", __name__)
    return module.build
