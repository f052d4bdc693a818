"""numpy's BLAS beside the compiled kernels (backends/cpu/blas.py): a small product runs with
the BLAS pool limited to one thread, then the pool is as it was; a large one keeps the pool."""

from __future__ import annotations

import numpy as np
import pytest

import polydev
from polydev import ops
from polydev.backends.cpu.blas import SMALL_PRODUCT_MACS, openblas_threads, sized_for_blas

from conftest import assert_close, compute
from test_ops import f32

openblas = openblas_threads()
pytestmark = pytest.mark.skipif(openblas is None,
                                reason="numpy's BLAS is not OpenBLAS, or no threadpoolctl")


@pytest.fixture
def two_blas_threads():
    """numpy's BLAS pool at two threads for the test, then as it was."""
    get_threads, set_threads = openblas
    before = get_threads()
    set_threads(2)
    yield get_threads
    set_threads(before)


def test_small_product_runs_on_one_thread_then_the_pool_is_restored(two_blas_threads):
    seen = []
    sized_for_blas(lambda: seen.append(two_blas_threads()), SMALL_PRODUCT_MACS - 1)()
    assert seen == [1]
    assert two_blas_threads() == 2


def test_large_product_keeps_the_pool(two_blas_threads):
    seen = []
    sized_for_blas(lambda: seen.append(two_blas_threads()), SMALL_PRODUCT_MACS)()
    assert seen == [2]


def test_pool_restored_when_the_product_raises(two_blas_threads):
    def fails() -> None:
        raise MemoryError("no memory")

    with pytest.raises(MemoryError):
        sized_for_blas(fails, 16)()
    assert two_blas_threads() == 2


@pytest.mark.parametrize("n_rows, expect_threads", [(8, 1), (512, 2)])
def test_cpu_backend_float_product_threads_by_size(rng, monkeypatch, two_blas_threads, n_rows,
                                                   expect_threads):
    """An F32 weight's MUL_MAT (a mixture of experts' router) through the CPU backend: numpy's
    matmul sees one BLAS thread for 8 x 256 x 16, the pool for 512 x 2048 x 2048; the values
    are float64 numpy's either way."""
    k, m = (256, 16) if n_rows == 8 else (2048, 2048)
    assert (n_rows * k * m < SMALL_PRODUCT_MACS) == (expect_threads == 1)
    seen = []
    matmul = np.matmul

    def spy(*args, **kwargs):
        seen.append(two_blas_threads())
        return matmul(*args, **kwargs)
    monkeypatch.setattr(np, "matmul", spy)
    w, x = f32(rng, (1, 1, m, k)), f32(rng, (1, 1, n_rows, k))
    with polydev.init_backend("CPU") as cpu:
        out = compute(cpu, lambda ctx, a, b: ops.mul_mat(ctx, a, b), w, x)
    assert seen and set(seen) == {expect_threads}
    assert_close(out[0, 0], x[0, 0].astype(np.float64) @ w[0, 0].T.astype(np.float64), 1e-10)
