"""numerics="int8" on the CPU backend (native/interleaved_int8.c): a weights buffer's quantized
matrix times activation rows quantized to int8 with a scale per 32 values, for every
interleaved type and any number of rows, within those activations' rounding of float64; a
row's result the same bits whatever batch it is in (so a request's tokens do not depend on
the others a server batches with it). A build without the kernels (no AVX-512 VNNI) computes
"int8" as "fast". MUL_MAT_ID and non-finite activations under int8: test_cpu_interleaved.py."""

from __future__ import annotations

import numpy as np
import pytest

import polydev
from polydev import GGMLType, dequantize
from polydev.backends.cpu.native import kernels

from test_cpu_interleaved import INTERLEAVED_TYPES, WeightProduct, _interleaved_bytes
from test_ops import f32, random_blocks

pytestmark = pytest.mark.skipif(
    _interleaved_bytes(GGMLType.Q4_K, 16, 256) == 0,
    reason="this build of the CPU kernels has no interleaved products (they need AVX2)")

HAS_INT8 = kernels() is not None and kernels().has_int8_products


@pytest.fixture
def int8_cpu():
    with polydev.init_backend("CPU") as b:
        b.set_numerics("int8")
        yield b


def int8_error_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The most the int8 products may differ from float64 for activations x [n, K] and decoded
    weights w [M, K]: each activation is rounded to the nearest of its 32 values' steps of
    max|x| / 127 (half a step off at most), plus float32 rounding of the sums."""
    groups = np.abs(x.astype(np.float64)).reshape(x.shape[0], -1, 32).max(axis=2)
    half_step = np.repeat(groups / 127 / 2, 32, axis=1)
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w).T
    return (1 + 1e-6) * half_step @ np.abs(w).T + 1e-6 * magnitude


def _product(backend, raw, qtype, x, cached: list | None = None):
    """x W^T with W in a weights buffer; the weight cache's bytes appended to ``cached``."""
    product = WeightProduct(backend, raw, qtype, x.shape[0])
    try:
        out = product(x)
        if cached is not None:
            cached.append(backend.device.weight_cache.nbytes)
        return out
    finally:
        product.close()


@pytest.mark.skipif(not HAS_INT8, reason="this build has no int8 kernels (AVX-512 VNNI)")
@pytest.mark.parametrize("qtype", INTERLEAVED_TYPES, ids=str)
# 1: decode; 4, 5, 8, 9: a tile of four or eight rows and one after it; 70: a prompt's
# tiles from a span unpacked once, and rows left over
@pytest.mark.parametrize("n", [1, 4, 5, 8, 9, 70])
def test_int8_product_within_its_rounding_of_the_activations(int8_cpu, rng, qtype, n):
    m, k = 48, 768                        # three groups of 16 rows; three 256-value blocks
    if qtype.traits.block_size == 32:
        k = 32 * 19                       # spans of eight 32-value blocks: two and a part
    raw = random_blocks(rng, qtype, m, k)
    x = f32(rng, (n, k))
    x[:, :32] *= 1e-3                     # 32 small values keep their own scale
    cached = []
    out = _product(int8_cpu, raw, qtype, x, cached)
    assert cached == [_interleaved_bytes(qtype, m, k)]          # the interleaved copy ran
    w = dequantize(raw, qtype).reshape(m, k).astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    assert np.all(np.abs(out - ref) <= int8_error_bound(x, w))


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q4_0,
                                   GGMLType.Q8_0], ids=str)
def test_a_row_gives_the_same_bits_in_any_batch(int8_cpu, rng, qtype):
    """Alone (one row), in a tile, and among a prompt's rows: the integer sums are exact and
    the float steps after them the same, so a row's result does not depend on its batch."""
    m, k = 32, 1024
    raw = random_blocks(rng, qtype, m, k)
    x = f32(rng, (13, k))
    batch = _product(int8_cpu, raw, qtype, x)
    for r in (0, 8, 12):
        np.testing.assert_array_equal(_product(int8_cpu, raw, qtype, x[r:r + 1])[0], batch[r])
    np.testing.assert_array_equal(_product(int8_cpu, raw, qtype, x[4:9]), batch[4:9])


@pytest.mark.skipif(HAS_INT8, reason="this build has int8 kernels")
def test_without_int8_kernels_int8_computes_as_fast(int8_cpu, fast_cpu, rng):
    raw = random_blocks(rng, GGMLType.Q4_K, 32, 512)
    x = f32(rng, (3, 512))
    np.testing.assert_array_equal(_product(int8_cpu, raw, GGMLType.Q4_K, x),
                                  _product(fast_cpu, raw, GGMLType.Q4_K, x))
