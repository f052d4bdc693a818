"""The CPU backend's products from weights with 16 rows interleaved (native/interleaved.c):
a weights buffer's quantized matrix multiplied by any number of activation rows under fast
numerics gives the int16 kernels' results on the weight's own layout, within the int16
activations' rounding of float64, and follows a rewrite of the weights; MUL_MAT_ID sorts its
pairs by expert in the kernels and checks the expert ids before writing; non-finite
activations are carried (under "fast" and "int8": test_cpu_int8.py has the rest of int8)."""

from __future__ import annotations

import numpy as np
import pytest

import polydev
from polydev import Context, GGMLType, alloc_ctx_tensors, build_graph, dequantize, ops
from polydev.backends.cpu.product_path import BLOCK_PRODUCT_ROWS
from polydev.backends.cpu.native import kernels
from polydev.buffer import BufferUsage
from polydev.errors import OutOfBoundsError, PolydevError

from conftest import nmse
from test_cpu_native import int16_error_bound
from test_ops import f32, random_blocks

INTERLEAVED_TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
                     GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]


def _interleaved_bytes(qtype: GGMLType, m: int, k: int) -> int:
    lib = kernels()
    return 0 if lib is None else lib.interleaved_bytes(int(qtype), m, k)


pytestmark = pytest.mark.skipif(
    _interleaved_bytes(GGMLType.Q4_K, 16, 256) == 0,
    reason="this build of the CPU kernels has no interleaved products (they need AVX2)")


class WeightProduct:
    """x W^T on a CPU backend, W (raw rows of ``qtype``) in a buffer of weights that can be
    rewritten, x in a compute buffer; one graph, computed again for each x."""

    def __init__(self, backend, raw: np.ndarray, qtype: GGMLType, n_rows: int) -> None:
        m, k = raw.shape[0], raw.shape[1] // qtype.traits.type_size * qtype.traits.block_size
        self.backend = backend
        wctx, ctx = Context(), Context()
        self.w = wctx.new_tensor_2d(qtype, k, m, name="w")
        self.x = ctx.new_tensor_2d(GGMLType.F32, k, n_rows, name="x")
        self.out = ops.mul_mat(ctx, self.w, self.x)
        self.graph = build_graph(self.out)
        self.wbuf = alloc_ctx_tensors(wctx, backend)
        self.wbuf.usage = BufferUsage.WEIGHTS
        self.buf = alloc_ctx_tensors(ctx, backend)
        self.w.set_data(raw)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.x.set_data(x)
        self.backend.graph_compute(self.graph)
        return self.out.numpy().reshape(x.shape[0], -1)

    def close(self) -> None:
        self.buf.close()
        self.wbuf.close()


def _row_by_row(backend, raw, qtype, x):
    """The same product with the weight in a compute buffer: the int16 kernels on the weight's
    own layout (row by row, or the GEMM of the K-quants from 8 rows on)."""
    ctx = Context()
    w = ctx.new_tensor_2d(qtype, x.shape[1], raw.shape[0])
    xt = ctx.new_tensor_2d(GGMLType.F32, x.shape[1], x.shape[0])
    out = ops.mul_mat(ctx, w, xt)
    with alloc_ctx_tensors(ctx, backend):
        w.set_data(raw)
        xt.set_data(x)
        backend.graph_compute(build_graph(out))
        return out.numpy().reshape(x.shape[0], -1)


@pytest.mark.parametrize("qtype", INTERLEAVED_TYPES, ids=str)
# 1: decode; 4, 5, 8 and 9: a tile of four or eight rows and one after it (AVX2's tiles are
# four rows, AVX-512's eight; more rows than a tile unpack the weights once for all tiles);
# 70: a prompt's tiles and rows left over
@pytest.mark.parametrize("n", [1, 4, 5, 8, 9, 70])
def test_interleaved_product_is_the_int16_product(fast_cpu, rng, qtype, n):
    m, k = 48, 768                        # three groups of 16 rows; three 256-value blocks
    if qtype.traits.block_size == 32:
        k = 32 * 19         # unpacked eight 32-value blocks at a time: two spans and a part
    raw = random_blocks(rng, qtype, m, k)
    x = f32(rng, (n, k))
    x[:, :qtype.traits.block_size] *= 1e-3      # a block of small values keeps its precision
    product = WeightProduct(fast_cpu, raw, qtype, n)
    try:
        out = product(x)
        cache = fast_cpu.device.weight_cache
        assert cache.nbytes == _interleaved_bytes(qtype, m, k)     # the interleaved copy ran
    finally:
        product.close()
    if n <= BLOCK_PRODUCT_ROWS or qtype.traits.block_size == 256:
        # the same int16 activations and integer sums (more rows of the 32-value types go
        # through BLAS in float32 on their own layout)
        alone = _row_by_row(fast_cpu, raw, qtype, x)
        np.testing.assert_allclose(out, alone, rtol=1e-5, atol=1e-5 * np.abs(alone).max())
    w = dequantize(raw, qtype).reshape(m, k).astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    assert np.all(np.abs(out - ref) <= int16_error_bound(x, w, qtype.traits.block_size))


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q8_0], ids=str)
def test_a_prompt_in_several_passes_gives_each_pass_alone(integer_cpu, rng, qtype):
    """A prompt whose integer activations outgrow one pass over the weights (about 512 KiB:
    32 rows of 8192 int16, 64 of int8) is multiplied a pass at a time: its rows have the
    bits of the same rows multiplied on their own in one pass, within the rounding bound."""
    m, k, n, per_pass = 16, 8192, 80, 32
    raw = random_blocks(rng, qtype, m, k)
    x = f32(rng, (n, k))
    whole = WeightProduct(integer_cpu, raw, qtype, n)
    piece = WeightProduct(integer_cpu, raw, qtype, per_pass)
    try:
        out = whole(x)
        for r0 in range(0, n - per_pass + 1, per_pass):
            np.testing.assert_array_equal(out[r0:r0 + per_pass], piece(x[r0:r0 + per_pass]))
    finally:
        whole.close()
        piece.close()
    if integer_cpu.numerics == "fast":
        w = dequantize(raw, qtype).reshape(m, k).astype(np.float64)
        bound = int16_error_bound(x, w, qtype.traits.block_size)
        assert np.all(np.abs(out - x.astype(np.float64) @ w.T) <= bound)


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q8_0], ids=str)
def test_a_rewritten_weight_is_interleaved_again(fast_cpu, rng, qtype):
    """The copy belongs to the buffer's contents: a plan bound before a rewrite multiplies
    the new values."""
    first, second = (random_blocks(rng, qtype, 32, 512) for _ in range(2))
    x = f32(rng, (1, 512))
    product = WeightProduct(fast_cpu, first, qtype, 1)
    try:
        before = product(x)
        product.w.set_data(second)
        after = product(x)
    finally:
        product.close()
    for out, raw in ((before, first), (after, second)):
        alone = _row_by_row(fast_cpu, raw, qtype, x)
        np.testing.assert_allclose(out, alone, rtol=1e-5, atol=1e-5 * np.abs(alone).max())


@pytest.mark.parametrize("m, numerics", [(40, "fast"),      # not a multiple of 16
                                         (32, "exact")])    # float32 products
@pytest.mark.parametrize("rows", [1, 9])
def test_where_it_does_not_apply_nothing_is_interleaved(rng, m, numerics, rows):
    qtype = GGMLType.Q4_K
    raw = random_blocks(rng, qtype, m, 256)
    x = f32(rng, (rows, 256))
    with polydev.init_backend("CPU") as backend:
        backend.set_numerics(numerics)
        product = WeightProduct(backend, raw, qtype, rows)
        try:
            out = product(x)
            assert backend.device.weight_cache.nbytes == 0
        finally:
            product.close()
        w = dequantize(raw, qtype).reshape(m, 256).astype(np.float64)
        ref = x.astype(np.float64) @ w.T
        assert np.all(np.abs(out - ref) <= int16_error_bound(x, w, 256))


@pytest.fixture(params=["fast", "int8"])
def integer_cpu(request):
    """The CPU backend under each numerics whose interleaved products take integers."""
    with polydev.init_backend("CPU") as backend:
        backend.set_numerics(request.param)
        yield backend


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                                   GGMLType.Q8_0], ids=str)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_interleaved_product_carries_non_finite_activations(integer_cpu, rng, qtype, bad):
    raw = random_blocks(rng, qtype, 16, 512)
    x = f32(rng, (2, 512))
    x[1, 300] = bad
    product = WeightProduct(integer_cpu, raw, qtype, 2)
    try:
        out = product(x)
    finally:
        product.close()
    assert np.all(np.isfinite(out[0])) and not np.any(np.isfinite(out[1]))


def _experts_product(backend, blocks, qtype, n_expert, x, ids, before=None):
    """MUL_MAT_ID with the experts (raw rows) in a weights buffer, its result filled with
    ``before`` first where given: (the result or the error raised, the weight cache's bytes)."""
    k, n_tokens = x.shape[-1], x.shape[1]
    m = blocks.shape[0] // n_expert
    wctx, ctx = Context(), Context()
    experts = wctx.new_tensor(qtype, (k, m, n_expert), name="experts")
    xt = ctx.new_tensor(GGMLType.F32, (k, 1, n_tokens))
    it = ctx.new_tensor(GGMLType.I32, (ids.shape[1], n_tokens))
    out = ops.mul_mat_id(ctx, experts, xt, it)
    with alloc_ctx_tensors(wctx, backend) as wbuf, alloc_ctx_tensors(ctx, backend):
        wbuf.usage = BufferUsage.WEIGHTS
        experts.set_data(blocks)
        xt.set_data(x)
        it.set_data(ids)
        if before is not None:
            out.set_data(before)
        try:
            backend.graph_compute(build_graph(out))
        except PolydevError as e:                 # what the test expects, with what is left
            return e, out.numpy()
        return out.numpy(), backend.device.weight_cache.nbytes


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K], ids=str)
@pytest.mark.parametrize("n_tokens,k", [(1, 512), (40, 512), (200, 4096)],
                         ids=["decode", "prompt", "rows-in-passes"])
def test_mul_mat_id_multiplies_the_experts_interleaved_copy(integer_cpu, rng, qtype, n_tokens,
                                                            k):
    """The experts of a weights buffer are interleaved as one matrix (each expert's rows a
    whole number of groups); the pairs are sorted by expert in the kernels, and every expert
    in use multiplies from its part of the copy, with int16 or int8 activations (an expert's
    100 rows of 4096 values go in passes of fewer)."""
    from test_ops_products import _mul_mat_id_ref, _routing

    n_expert, m = 6, 32
    blocks = random_blocks(rng, qtype, n_expert * m, k)
    ids = _routing(rng, n_tokens, 3, n_expert)
    x = f32(rng, (1, n_tokens, 1, k))
    got, cached = _experts_product(integer_cpu, blocks, qtype, n_expert, x, ids)
    assert cached == n_expert * _interleaved_bytes(qtype, m, k)
    w = dequantize(blocks, qtype).reshape(n_expert, m, k).astype(np.float64)
    ref = _mul_mat_id_ref(w, x[0].astype(np.float64), ids)
    # int8 activations are off by up to 1/254 of their 32 values' largest: 1e-5 of the power
    int8 = integer_cpu.numerics == "int8" and kernels().has_int8_products
    assert nmse(got[0], ref) < (1e-4 if int8 else 1e-8)


@pytest.mark.parametrize("bad", [-1, 6])
def test_mul_mat_id_of_an_expert_out_of_range_writes_nothing(fast_cpu, rng, bad):
    n_expert, m, k = 6, 32, 256
    blocks = random_blocks(rng, GGMLType.Q4_K, n_expert * m, k)
    ids = np.array([[0, 1], [2, bad]], dtype=np.int32)
    x = f32(rng, (1, 2, 1, k))
    before = np.full((2, 2, m), 7.0, dtype=np.float32)
    error, left = _experts_product(fast_cpu, blocks, GGMLType.Q4_K, n_expert, x, ids, before)
    assert isinstance(error, OutOfBoundsError) and "mul_mat_id" in str(error)
    assert np.all(left == 7.0)
