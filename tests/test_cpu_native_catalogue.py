"""The compiled CPU kernels against the numpy path over `polydev compare`'s catalogue: every
case of an op the kernels compute (every type and shape the catalogue has for it), computed
by the CPU backend as it runs by default and by the same device with only the shared array
kernels (the numpy path, what POLYDEV_CPU_NATIVE=0 runs), compared node by node with ggml's
thresholds, as `polydev compare` compares a device with the CPU."""

from __future__ import annotations

import numpy as np
import pytest

import polydev
from polydev.backends.array import TABLE
from polydev.backends.cpu.device import CPUDevice
from polydev.backends.cpu.kernels import CPU_TABLE
from polydev.backends.cpu.native import kernels
from polydev.tools.compare.catalogue import eval_cases, select
from polydev.tools.compare.runner import run_test

pytestmark = pytest.mark.skipif(kernels() is None, reason="no compiled CPU kernels here")


class NumpyPathCPU(CPUDevice):
    """The CPU device with the shared array kernels only."""

    @property
    def kernels(self):
        return TABLE


def _native_ops() -> list[str]:
    """The ops (and GLU/UNARY functions) the CPU backend computes with its own kernels."""
    return sorted({key[1].name if isinstance(key, tuple) else key.name
                   for key in CPU_TABLE._kernels if key not in TABLE._kernels
                   or CPU_TABLE._kernels[key] is not TABLE._kernels.get(key)}
                  - {name for name in ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE")})


def test_compiled_kernels_match_the_numpy_path_over_the_catalogue():
    ops = [op for op in _native_ops() if op in {c.op for c in eval_cases()}]
    assert {"MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT", "ROPE", "RMS_NORM"} <= set(ops)
    cases = list(select(eval_cases(), ops, None))
    rng = np.random.default_rng(0)
    numpy_path = NumpyPathCPU()
    with polydev.init_backend("CPU") as native, numpy_path.init_backend() as reference:
        results = [run_test(c, native, reference, rng) for c in cases]
    tested = [r for r in results if r.supported]
    failed = [f"{r.case_name}: {r.message}" for r in tested if not r.passed]
    assert len(tested) > 0.9 * len(cases)
    assert not failed, f"{len(failed)} of {len(tested)} cases:\n" + "\n".join(failed[:20])
