"""Differential tests against ggml itself (ggml-python's CPU backend), when it is installed.

Each case builds the same op in ggml and in polydev, feeds both the same random inputs and
requires test-backend-ops' NMSE thresholds. ggml's CPU kernels have their own approximations:
GELU uses an fp16 lookup table and quantized MUL_MAT quantizes the activations to Q8, so those
cases use the thresholds that cover them.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from polydev import GGMLType, ops

from conftest import compute, nmse
from test_ops import QTYPES, random_blocks

ggml = pytest.importorskip("ggml", reason="ggml-python (the optional ggml oracle) is not installed")

pytestmark = pytest.mark.ggml


def ggml_compute(backend, build, arrays, types):
    """Compute build(ctx, *tensors) on ggml's CPU backend; returns the output as float32/int."""
    params = ggml.ggml_init_params(mem_size=ggml.ggml_tensor_overhead() * 256
                                   + ggml.ggml_graph_overhead(), mem_buffer=None, no_alloc=True)
    ctx = ggml.ggml_init(params)
    try:
        tensors = []
        for arr, ty in zip(arrays, types):
            ne = (ctypes.c_int64 * 4)(*[int(n) for n in arr_ne(arr, ty)])
            tensors.append(ggml.ggml_new_tensor(ctx, int(ty), 4, ne))
        out = build(ctx, *tensors)
        graph = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(graph, out)
        buf = ggml.ggml_backend_alloc_ctx_tensors(ctx, backend)
        for t, arr in zip(tensors, arrays):
            data = np.ascontiguousarray(arr)
            ggml.ggml_backend_tensor_set(t, data.ctypes.data_as(ctypes.c_void_p), 0, data.nbytes)
        ggml.ggml_backend_graph_compute(backend, graph)
        ne = tuple(out.contents.ne[i] for i in range(4))
        dtype = {int(GGMLType.I32): np.int32, int(GGMLType.I64): np.int64}.get(
            out.contents.type, np.float32)
        result = np.empty(ne[::-1], dtype)
        ggml.ggml_backend_tensor_get(out, result.ctypes.data_as(ctypes.c_void_p), 0, result.nbytes)
        ggml.ggml_backend_buffer_free(buf)
        return result
    finally:
        ggml.ggml_free(ctx)


def arr_ne(arr, ty):
    """ggml ne of an input array: raw quantized rows are (..., rows, row_bytes) uint8."""
    if GGMLType(ty).traits.is_quantized:
        ne0 = arr.shape[-1] // ty.traits.type_size * ty.traits.block_size
        ne = (ne0,) + arr.shape[-2::-1]
    else:
        ne = arr.shape[::-1]
    return tuple(ne) + (1,) * (4 - len(ne))


def check(cpu, ggml_backend, ours, theirs, arrays, types, threshold=1e-7, post=None):
    """ours and theirs agree within ``threshold`` (NMSE) on ``arrays``; ``post`` maps both
    results first (e.g. sorts where ggml leaves an order open)."""
    ref = ggml_compute(ggml_backend, theirs, arrays, types)
    pd_arrays = [a.tobytes() if t.traits.is_quantized else a for a, t in zip(arrays, types)]
    out = _compute_raw(cpu, ours, pd_arrays, arrays, types)
    assert out.shape == ref.shape
    if post is not None:
        out, ref = post(out), post(ref)
    err = nmse(out, ref)
    assert err <= threshold, f"NMSE vs ggml {err:.3e} > {threshold:.0e}"


def _compute_raw(cpu, build, data, arrays, types):
    from polydev import Context, alloc_ctx_tensors, build_graph
    ctx = Context()
    inputs = [ctx.new_tensor(t, arr_ne(a, t)) for a, t in zip(arrays, types)]
    out = build(ctx, *inputs)
    with alloc_ctx_tensors(ctx, cpu):
        for t, d in zip(inputs, data):
            t.set_data(d)
        cpu.graph_compute(build_graph(out))
        return out.numpy()


F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32


def u(rng, shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def test_binary_broadcast(cpu, ggml_backend, rng):
    a, b = u(rng, (3, 4, 6, 10)), u(rng, (1, 2, 3, 5), 0.5, 1.5)
    for ours, theirs in [(ops.add, ggml.ggml_add), (ops.mul, ggml.ggml_mul),
                         (ops.div, ggml.ggml_div), (ops.sub, ggml.ggml_sub)]:
        check(cpu, ggml_backend, ours, theirs, [a, b], [F32, F32])


def test_norms_and_scale(cpu, ggml_backend, rng):
    a = u(rng, (2, 3, 5, 77), -4, 4)
    check(cpu, ggml_backend, lambda c, x: ops.rms_norm(c, x, 1e-5),
          lambda c, x: ggml.ggml_rms_norm(c, x, 1e-5), [a], [F32])
    check(cpu, ggml_backend, lambda c, x: ops.norm(c, x, 1e-3),
          lambda c, x: ggml.ggml_norm(c, x, 1e-3), [a], [F32])
    check(cpu, ggml_backend, lambda c, x: ops.scale(c, x, 0.3, -1.0),
          lambda c, x: ggml.ggml_scale_bias(c, x, 0.3, -1.0), [a], [F32])
    check(cpu, ggml_backend, ops.sum_rows, ggml.ggml_sum_rows, [a], [F32])


@pytest.mark.parametrize("name,threshold", [
    ("silu", 1e-7), ("gelu", 1e-5), ("tanh", 1e-7), ("sigmoid", 1e-7), ("relu", 1e-7),
    ("sgn", 0.0), ("step", 0.0), ("elu", 1e-7), ("gelu_erf", 1e-7), ("gelu_quick", 1e-5),
    ("hardswish", 1e-7), ("hardsigmoid", 1e-7), ("exp", 1e-7), ("expm1", 1e-7),
    ("softplus", 1e-7), ("floor", 0.0), ("ceil", 0.0), ("round", 0.0), ("trunc", 0.0)])
def test_unary(cpu, ggml_backend, rng, name, threshold):
    a = u(rng, (1, 3, 7, 33), -5, 5)
    a[0, 0, 0, :6] = [0.0, -0.0, 0.5, -0.5, 2.5, -1.5]     # signs of zero, ties for rounding
    ours = getattr(ops, name if hasattr(ops, name) else f"{name}_")
    check(cpu, ggml_backend, ours, getattr(ggml, f"ggml_{name}"), [a], [F32], threshold)


@pytest.mark.parametrize("name", ["reglu", "geglu_erf", "geglu_quick"])
def test_other_glus(cpu, ggml_backend, rng, name):
    fn = {"reglu": ops.GluOp.REGLU, "geglu_erf": ops.GluOp.GEGLU_ERF,
          "geglu_quick": ops.GluOp.GEGLU_QUICK}[name]
    a, b = u(rng, (1, 2, 3, 40), -3, 3), u(rng, (1, 2, 3, 40))
    check(cpu, ggml_backend, lambda c, x: ops.glu(c, x, fn), getattr(ggml, f"ggml_{name}"),
          [a], [F32], 1e-5)
    check(cpu, ggml_backend, lambda c, x, y: ops.glu_split(c, x, y, fn),
          getattr(ggml, f"ggml_{name}_split"), [a, b], [F32, F32], 1e-5)


def test_swiglu_fused_and_split(cpu, ggml_backend, rng):
    a, b = u(rng, (1, 2, 3, 40), -3, 3), u(rng, (1, 2, 3, 40))
    check(cpu, ggml_backend, lambda c, x: ops.swiglu(c, x), ggml.ggml_swiglu, [a], [F32])
    check(cpu, ggml_backend, lambda c, x, y: ops.swiglu(c, x, y), ggml.ggml_swiglu_split,
          [a, b], [F32, F32])


@pytest.mark.parametrize("max_bias", [0.0, 4.0])
def test_soft_max_ext(cpu, ggml_backend, rng, max_bias):
    a = u(rng, (1, 8, 6, 33), -5, 5)
    mask = u(rng, (1, 4, 9, 33), -3, 0).astype(np.float16)
    check(cpu, ggml_backend, lambda c, x, m: ops.soft_max_ext(c, x, m, 0.7, max_bias),
          lambda c, x, m: ggml.ggml_soft_max_ext(c, x, m, 0.7, max_bias), [a, mask], [F32, F16],
          1e-6)


@pytest.mark.parametrize("mode", [0, 2])
@pytest.mark.parametrize("yarn", [False, True])
def test_rope_ext(cpu, ggml_backend, rng, mode, yarn):
    a = u(rng, (1, 7, 4, 96))
    pos = np.array([0, 5, 31, 700, 1500, 3000, 8191], dtype=np.int32)
    ff = rng.uniform(1.0, 3.0, size=(40,)).astype(np.float32)
    args = (80, mode, 4096, 500000.0, 0.5 if yarn else 1.0, 1.0 if yarn else 0.0, 1.0, 32.0, 1.0)
    check(cpu, ggml_backend, lambda c, x, p, f: ops.rope_ext(c, x, p, f, *args),
          lambda c, x, p, f: ggml.ggml_rope_ext(c, x, p, f, *args), [a, pos, ff], [F32, I32, F32])


@pytest.mark.parametrize("qtype", [F32, F16] + QTYPES, ids=str)
def test_mul_mat(cpu, ggml_backend, rng, qtype):
    m, n, k = 9, 5, 512
    if qtype.traits.is_quantized:
        w = random_blocks(rng, qtype, m, k)
    else:
        w = u(rng, (m, k)).astype(np.float16 if qtype == F16 else np.float32)
    x = u(rng, (1, 1, n, k))
    w_in = w if qtype.traits.is_quantized else w.reshape(1, 1, m, k)
    check(cpu, ggml_backend, ops.mul_mat, ggml.ggml_mul_mat, [w_in, x], [qtype, F32], 5e-4)


@pytest.mark.parametrize("qtype", QTYPES, ids=str)
def test_get_rows_quantized(cpu, ggml_backend, rng, qtype):
    w = random_blocks(rng, qtype, 12, 256)
    idx = np.array([11, 0, 4, 4, 7], dtype=np.int32)
    check(cpu, ggml_backend, ops.get_rows, ggml.ggml_get_rows, [w, idx], [qtype, I32], 0.0)


def test_diag_mask_inf(cpu, ggml_backend, rng):
    a = u(rng, (1, 2, 6, 8))
    # -inf entries: compared for exact equality rather than by NMSE
    ref = ggml_compute(ggml_backend, lambda c, x: ggml.ggml_diag_mask_inf(c, x, 1), [a], [F32])
    ours = compute(cpu, lambda c, x: ops.diag_mask_inf(c, x, 1), a)
    np.testing.assert_array_equal(ours, ref)
    assert math.isinf(ref[0, 0, 0, 7])


def test_pad(cpu, ggml_backend, rng):
    a = u(rng, (2, 3, 4, 5))
    check(cpu, ggml_backend, lambda c, x: ops.pad_ext(c, x, 1, 2, 0, 3, 2, 0, 0, 1),
          lambda c, x: ggml.ggml_pad_ext(c, x, 1, 2, 0, 3, 2, 0, 0, 1), [a], [F32], 0.0)
    if hasattr(ggml, "ggml_pad_ext_circular"):
        check(cpu, ggml_backend, lambda c, x: ops.pad_ext(c, x, 1, 2, 0, 3, circular=True),
              lambda c, x: ggml.ggml_pad_ext_circular(c, x, 1, 2, 0, 3, 0, 0, 0, 0), [a], [F32],
              0.0)


def _ggml_quantize(x: np.ndarray, qtype: GGMLType) -> np.ndarray:
    rows, n = x.shape
    tr = qtype.traits
    dst = np.zeros((rows, n // tr.block_size * tr.type_size), np.uint8)
    ggml.ggml_quantize_chunk(int(qtype), x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                             dst.ctypes.data_as(ctypes.c_void_p), 0, rows, n, None)
    return dst


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K], ids=str)
@pytest.mark.parametrize("data", ["gaussian", "heavy-tailed", "cos"])
def test_k_quant_error_is_close_to_ggml(rng, qtype, data):
    from polydev import dequantize, quantize
    x = {"gaussian": lambda: rng.standard_normal((8, 2048)),
         "heavy-tailed": lambda: rng.standard_t(3, (8, 2048)),
         "cos": lambda: 0.1 + 2 * np.cos(np.arange(8 * 2048)).reshape(8, 2048)}[data]()
    x = np.ascontiguousarray(x, dtype=np.float32)
    ours = np.sqrt(np.mean((dequantize(quantize(x, qtype), qtype) - x) ** 2))
    theirs = np.sqrt(np.mean((dequantize(_ggml_quantize(x, qtype), qtype) - x) ** 2))
    assert ours <= 1.15 * theirs, f"RMSE {ours:.5f} vs ggml's {theirs:.5f}"
