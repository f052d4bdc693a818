"""The CPU's compiled element-wise kernels that keep a decode layer in one replay run
(backends/cpu/binary.py, glu.py): ADD, SUB, MUL and DIV of float32 tensors with ggml's repeat
of b over a give numpy's float32 results exactly, and layouts they do not take (b's rows
overlapping the result's at an offset) go to numpy; GEGLU against float64, non-finite
activations as numpy carries them; SCALE as a MUL by its factor."""

from __future__ import annotations

import numpy as np
import pytest

import polydev
from polydev import ops
from polydev.backends.cpu.native import kernels

from conftest import assert_close, compute
from test_ops import f32

pytestmark = pytest.mark.skipif(kernels() is None, reason="no C compiler for the CPU kernels")

NUMPY_OF = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def _bound_compiled(cpu, build, *shapes) -> bool:
    """Whether the CPU backend binds the last node of ``build`` to a compiled call."""
    ctx = polydev.Context()
    out = build(ctx, *(ctx.new_tensor(polydev.GGMLType.F32, s) for s in shapes))
    with polydev.alloc_ctx_tensors(ctx, cpu):
        return getattr(cpu.bind(out), "native", None) is not None


@pytest.mark.parametrize("op", sorted(NUMPY_OF))
@pytest.mark.parametrize("b_shape", [(2, 3, 37), (1, 37), (2, 1, 37), (2, 3, 1), (1, 1, 1)],
                         ids=["same", "row", "repeat", "value-per-row", "one-value"])
def test_binary_repeats_b_as_ggml_and_equals_numpy(cpu, rng, op, b_shape):
    """ADD, SUB, MUL and DIV of float32 tensors, b repeated over a along any dimension: the
    compiled kernel, numpy's float32 results exactly."""
    a, b = f32(rng, (2, 3, 37)), f32(rng, b_shape, 0.5, 2)

    def build(ctx, x, y):
        return getattr(ops, op)(ctx, x, y)
    assert _bound_compiled(cpu, build, (37, 3, 2), tuple(reversed(b_shape)))
    got = compute(cpu, build, a, b)
    want = NUMPY_OF[op](a, b)
    np.testing.assert_array_equal(got.reshape(want.shape), want)


def test_binary_of_strided_views_equals_numpy(cpu, rng):
    a, b = f32(rng, (4, 40)), f32(rng, (4, 16))
    got = compute(cpu, lambda ctx, x, y: ops.add(
        ctx, ops.view_2d(ctx, x, 16, 4, x.nb[1], 8), y), a, b)
    np.testing.assert_array_equal(got.reshape(4, 16), a[:, 2:18] + b)


def test_a_result_overlapping_b_at_an_offset_goes_to_numpy(cpu, rng):
    """Rows 1..4 of t += rows 0..3 of t, in place: the result overlaps b a row later, and
    threads would read rows another had written, so numpy (which buffers the overlap)
    computes it."""
    values = f32(rng, (5, 16))

    def build(ctx, t):
        return ops.add(ctx, ops.view_2d(ctx, t, 16, 4, t.nb[1], t.nb[1]),
                       ops.view_2d(ctx, t, 16, 4, t.nb[1], 0), inplace=True)
    assert not _bound_compiled(cpu, build, (16, 5))
    got = compute(cpu, build, values)
    np.testing.assert_array_equal(got.reshape(4, 16), values[1:] + values[:4])


@pytest.mark.parametrize("inplace", [False, True])
def test_scale_is_compiled_and_equals_numpy(cpu, rng, inplace):
    """SCALE without a bias (gemma's embedding times sqrt(n_embd)): a compiled MUL by its
    factor, numpy's float32 results exactly, on strided rows too; with a bias it stays
    numpy's."""
    a = f32(rng, (3, 40), -4, 4)

    def build(ctx, x):
        return ops.scale(ctx, ops.view_2d(ctx, x, 16, 3, x.nb[1], 8), 25.29822, inplace=inplace)
    assert _bound_compiled(cpu, build, (40, 3))
    got = compute(cpu, build, a)
    np.testing.assert_array_equal(got.reshape(3, 16), a[:, 2:18] * np.float32(25.29822))
    assert not _bound_compiled(cpu, lambda ctx, x: ops.scale(ctx, x, 2.0, 1.0), (40, 3))


@pytest.mark.parametrize("rows,n", [(1, 2048), (3, 37)])
def test_geglu_equals_float64(cpu, rng, rows, n):
    """GEGLU with ggml's tanh GELU, over values where 1 + tanh is tiny (x near -8) too."""
    x, g = f32(rng, (1, 1, rows, n), -8, 8), f32(rng, (1, 1, rows, n))
    assert _bound_compiled(cpu, lambda ctx, a, b: ops.geglu(ctx, a, b), (n, rows), (n, rows))
    out = compute(cpu, lambda ctx, a, b: ops.geglu(ctx, a, b), x, g)
    x64 = x.astype(np.float64)
    gelu = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * x64 * (1 + 0.044715 * x64 ** 2)))
    assert_close(out, gelu * g, 1e-13)


def test_geglu_carries_non_finite_activations_as_numpy(cpu):
    """-inf, inf and NaN in every lane of a vector and in a row's tail: numpy's results."""
    x = np.array([[-np.inf, np.inf, np.nan, -30.0, 30.0, 0.0, -1.0, 1.0, -np.inf, np.nan]],
                 np.float32)
    g = np.full_like(x, 2.0)
    out = compute(cpu, lambda ctx, a, b: ops.geglu(ctx, a, b), x, g).reshape(x.shape)
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        want = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * x64 * (1 + 0.044715 * x64 ** 2)))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want * g))
    finite = ~np.isnan(out)
    np.testing.assert_allclose(out[finite], (want * g)[finite], rtol=1e-6, atol=1e-30)
