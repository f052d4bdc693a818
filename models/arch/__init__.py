"""The architectures polydev runs, as data: each one's hyperparameter keys, tensors and
conditions (``table.py``, in the records of ``schema.py``, its shapes and conditions in the
checked expressions of ``expressions.py``).

This package is the tables only and imports nothing of the model code: hparams, model_check,
placement, layers and ``polydev info`` read it, and the graph builders, one per entry, live
apart in ``models/graphs`` (``polydev.models.graphs.builder``), so that the arrows run one
way: graphs -> layers, step -> tables. ``architecture(name)`` looks an entry up.
"""

from __future__ import annotations

from polydev.errors import UnsupportedError

from .schema import REQUIRED, Architecture, ExpectedTensor, Key, TensorSpec
from .table import ARCHITECTURES

__all__ = ["ARCHITECTURES", "Architecture", "ExpectedTensor", "Key", "REQUIRED", "TensorSpec",
           "architecture", "supported"]


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
