"""What a test needs from the machine, and what happens where it is missing.

A test that needs something a machine may lack (a real model file, llama.cpp, llama.cpp's
tokenizer test vectors, OpenCL devices) asks here. Where it is missing the test skips and its
reason says what is missing and how to get it; where the matching ``POLYDEV_REQUIRE_*``
variable is set (README's test command and CI set them all) it fails instead, so a run that
is meant to test everything can never pass by skipping.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn

import pytest

import polydev

SETUP = "bash tests/setup.sh installs it"
# where tests/setup.sh puts llama.cpp's tokenizer test vectors
VOCAB_DIR = Path(__file__).resolve().parent.parent / ".test-data" / "llama-vocab"
OPENCL = [d for d in polydev.devices() if d.reg is not None and d.reg.name == "OpenCL"]


def missing(flag: str, why: str) -> NoReturn:
    """Skip with ``why``, or fail with it where the environment variable ``flag`` is set."""
    if os.environ.get(flag):
        pytest.fail(f"{flag} is set but {why}")
    pytest.skip(why)


def llama_cpp() -> Any:
    """The ``llama_cpp`` module (llama-cpp-python), llama.cpp itself as an oracle."""
    try:
        import llama_cpp
    except ImportError:
        missing("POLYDEV_REQUIRE_LLAMA_CPP", f"llama-cpp-python (llama.cpp, the oracle) is not "
                f"installed ({SETUP})")
    return llama_cpp


def vocab_dir() -> Path:
    """The folder of llama.cpp's ``ggml-vocab-*.gguf`` with their ``.inp``/``.out`` vectors:
    ``$POLYDEV_LLAMA_VOCAB_DIR``, else where tests/setup.sh puts them."""
    root = Path(os.environ.get("POLYDEV_LLAMA_VOCAB_DIR") or VOCAB_DIR)
    if len(list(root.glob("ggml-vocab-*.gguf.inp"))) < 10:
        missing("POLYDEV_REQUIRE_LLAMA_CPP", f"llama.cpp's tokenizer test vectors are not in "
                f"{root} ({SETUP}, or set POLYDEV_LLAMA_VOCAB_DIR)")
    return root


def templates_dir() -> Path:
    """The folder of the real models' chat templates that llama.cpp tests with
    (``models/templates/*.jinja``), where tests/setup.sh puts them."""
    root = VOCAB_DIR.parent / "llama-templates"
    if len(list(root.glob("*.jinja"))) < 10:
        missing("POLYDEV_REQUIRE_LLAMA_CPP", f"llama.cpp's chat templates are not in {root} "
                f"({SETUP})")
    return root


def opencl_devices(count: int = 1) -> list:
    """The first ``count`` OpenCL devices."""
    if len(OPENCL) < count:
        missing("POLYDEV_REQUIRE_OPENCL", f"needs {count} OpenCL devices, this machine has "
                f"{len(OPENCL)} (PoCL gives two with POCL_DEVICES=\"pthread pthread\")")
    return OPENCL[:count]


def opencl_mark(count: int = 1) -> pytest.MarkDecorator:
    """A mark for tests that need ``count`` OpenCL devices: a skip with the reason, or (with
    POLYDEV_REQUIRE_OPENCL set) nothing, so the test runs and fails at its first use."""
    lacking = len(OPENCL) < count and not os.environ.get("POLYDEV_REQUIRE_OPENCL")
    return pytest.mark.skipif(lacking, reason=f"needs {count} OpenCL device(s), this machine "
                              f"has {len(OPENCL)} (pip install -e '.[opencl]'; "
                              f"POCL_DEVICES=\"pthread pthread\" gives two)")


def device_params() -> list:
    """Every registered device as a fixture parameter, marked with its vendor's marker (``-m
    cuda`` runs the per-device suite on the GPUs alone)."""
    params = []
    for device in polydev.devices():
        reg = device.reg.name.lower() if device.reg is not None else ""
        marks = [getattr(pytest.mark, reg)] if reg in ("cuda", "opencl") else []
        params.append(pytest.param(device.name, marks=marks, id=device.name))
    return params
