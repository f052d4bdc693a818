"""The CUDA backend's own kernels (cu/*.cu), compiled for the CPU against an emulation of the
CUDA execution model (tests/cuda_emu), checked against the CPU backend.

This runs everywhere a C++20 compiler exists, GPU or not: the kernels' arithmetic, indexing,
warp and block reductions, and the binders' launch geometry and argument packing are the
ones a GPU runs. CuPy, streams and the hardware itself are the ``cuda``-marked tests' part.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import polydev
from polydev import Context, GGMLType, alloc_ctx_tensors, build_graph, ops
from polydev.backends.cpu import CPUBackend, CPUDevice
from polydev.backends.cuda import binders, fusion
from polydev.backends.cuda.binders import ROW_TYPE_NAMES, dequantize_args
from polydev.backends.cuda.kernels import find_own_kernel
from polydev.backends.cuda.programs import kernel_source
from polydev.device import computing_nodes
from polydev.errors import OutOfBoundsError, UnsupportedOpError
from polydev.ops import VIEW_OPS, Op, op_desc
from polydev.tools.compare.catalogue import eval_cases
from polydev.tools.compare.runner import Status, run_test
from polydev.types import TYPE_TRAITS, dequantize, random_blocks

from cuda_emu import EmuLauncher, build, compiler

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler for the emulation")

OWN_OPS = {"MUL_MAT", "MUL_MAT_ID", "GET_ROWS", "NORM", "RMS_NORM", "L2_NORM", "SOFT_MAX",
           "ROPE", "SET_ROWS", "FLASH_ATTN_EXT", "ADD", "SUB", "MUL", "DIV", "REGLU", "GEGLU",
           "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK"}


class EmuBackend(CPUBackend):
    """CPU memory, the CUDA backend's own kernels run by the emulation."""

    def __init__(self, device) -> None:
        super().__init__(device)
        self.launcher = EmuLauncher(device.lib)
        self.kernel_errors = self.launcher.kernel_errors   # raised at synchronize, as on a GPU

    def bind(self, node):
        kernel = find_own_kernel(node)
        if kernel is None:
            raise UnsupportedOpError(f"no CUDA kernel of its own for {op_desc(node)}")
        return kernel.bind(self.launcher, node)

    def _read_error_flags(self) -> np.ndarray:
        flags = self.launcher.flags.copy()
        self.launcher.flags[:] = 0
        return flags


class EmuDevice(CPUDevice):
    def __init__(self, lib) -> None:
        super().__init__()
        self.name = "CUDAEmu"
        self.lib = lib

    def supports_op(self, op) -> bool:
        return op.op == Op.NONE or op.op in VIEW_OPS or find_own_kernel(op) is not None

    def _init_backend(self, params):
        return EmuBackend(self)


@pytest.fixture(scope="module")
def emu():
    device = EmuDevice(build(kernel_source()))
    with device.init_backend() as b:
        yield b


# The emulation runs a block's threads as OS threads, so the sweeps with the most blocks are
# sampled (every n-th case, each type still present); the others run whole. Flash attention
# (128 threads a block, seconds a case) has its features covered by a test of its own below.
SAMPLE_EVERY = {"MUL_MAT_ID": 4, "SOFT_MAX": 4, "FLASH_ATTN_EXT": 32, "ADD": 6, "SUB": 6,
                "MUL": 6, "DIV": 6, "REGLU": 3, "GEGLU": 3, "SWIGLU": 3, "GEGLU_ERF": 3,
                "GEGLU_QUICK": 3, "SWIGLU_OAI": 2}


def _cases():
    cases = [c for c in eval_cases() if c.op in OWN_OPS]
    seen: dict[str, int] = {}
    chosen = []
    for c in cases:
        i = seen[c.op] = seen.get(c.op, -1) + 1
        if i % SAMPLE_EVERY.get(c.op, 1) == 0:
            chosen.append(c)
    return chosen


@pytest.fixture(scope="module")
def catalogue_results(emu):
    cpu = polydev.init_backend("CPU")
    rng = np.random.default_rng(7)
    results = [run_test(case, emu, cpu, rng) for case in _cases()]
    cpu.close()
    return results


def test_catalogue_against_cpu(catalogue_results):
    """Every compare case of the ops with their own CUDA kernels that those kernels accept."""
    failed = [f"{r.case_name}: {r.error_message}" for r in catalogue_results
              if r.status == Status.FAIL]
    assert not failed, f"{len(failed)} failures:\n" + "\n".join(failed[:20])
    ran = {r.op_name for r in catalogue_results if r.status == Status.OK}
    assert ran == OWN_OPS, f"ops with no case the kernels accept: {OWN_OPS - ran}"


ROW_TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
             GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.F16, GGMLType.BF16]


def _random_rows(type_: GGMLType, m: int, k: int, rng) -> np.ndarray:
    tr = TYPE_TRAITS[type_]
    if tr.is_quantized:
        return random_blocks(type_, m * k // tr.block_size, rng).reshape(m, -1)
    return rng.standard_normal((m, k)).astype(np.float32)


def _stored_bytes(type_: GGMLType, rows: np.ndarray) -> np.ndarray:
    """Rows as the bytes a tensor of ``type_`` stores."""
    if type_ == GGMLType.F16:
        return rows.astype(np.float16).view(np.uint8)
    if type_ == GGMLType.BF16:
        return (rows.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return rows.view(np.uint8)


def _mat_vec(backend, type_: GGMLType, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    ctx = Context()
    a = ctx.new_tensor(type_, [x.shape[1], raw.shape[0]], name="a")
    b = ctx.new_tensor(GGMLType.F32, [x.shape[1], x.shape[0]], name="b")
    out = ops.mul_mat(ctx, a, b)
    with alloc_ctx_tensors(ctx, backend):
        a.set_data(raw)
        b.set_data(x)
        backend.graph_compute(build_graph(out))
        return out.numpy().copy()


@pytest.mark.parametrize("type_", ROW_TYPES, ids=lambda t: t.name)
def test_mat_vec_matches_cpu(emu, cpu, type_):
    cpu.set_numerics("exact")   # the CUDA mat-vec multiplies float32 activations, as exact does
    rng = np.random.default_rng(int(type_))
    raw = _random_rows(type_, 24, 512, rng)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    np.testing.assert_allclose(_mat_vec(emu, type_, raw, x), _mat_vec(cpu, type_, raw, x),
                               rtol=2e-5, atol=2e-4)


@pytest.mark.parametrize("type_", ROW_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_dequantize_matches_the_reference_decoder(emu, type_, dtype):
    """dequantize_{f32,f16}_<type> over strided rows (every other row of a 3-D stack)."""
    rng = np.random.default_rng(int(type_) + 100)
    raw = _stored_bytes(type_, _random_rows(type_, 2 * 6 * 5, 256, rng)).reshape(5, 12, -1)
    rows = raw[:, ::2]                                   # (ne2=5, ne1=6, row bytes), strided
    out = np.full((5, 6, 256), np.nan, dtype=dtype)
    grid, block, args = dequantize_args(rows.ctypes.data, (rows.strides[1], rows.strides[0], 0),
                                        (256, 6, 5, 1), out.ctypes.data)
    kind = "f16" if dtype == np.float16 else "f32"
    emu.launcher.launch(f"dequantize_{kind}_{ROW_TYPE_NAMES[type_]}", grid, block, args)()
    expected = dequantize(np.ascontiguousarray(rows), type_).reshape(out.shape).astype(dtype)
    np.testing.assert_allclose(out.astype(np.float32), expected.astype(np.float32), rtol=1e-6)


def test_get_rows_bad_index_sets_the_flag(emu):
    ctx = Context()
    a = ctx.new_tensor(GGMLType.Q8_0, [64, 4])
    idx = ctx.new_tensor(GGMLType.I32, [2])
    out = ops.get_rows(ctx, a, idx)
    with alloc_ctx_tensors(ctx, emu):
        a.set_data(np.ones((4, 64), np.float32))
        idx.set_data(np.array([1, 9], np.int32))
        with pytest.raises(OutOfBoundsError, match="emulated CUDA: an index outside its tensor "
                           "in GET_ROWS"):
            emu.graph_compute(build_graph(out))
        values = out.numpy()[0, 0]
        np.testing.assert_allclose(values[0], 1.0, atol=1e-3)     # Q8_0's rounding of 1
        assert np.isnan(values[1]).all()


def test_own_kernels_cover_the_inference_ops():
    assert {op.name for op in (Op.MUL_MAT, Op.MUL_MAT_ID, Op.GET_ROWS, Op.RMS_NORM,
                               Op.SOFT_MAX, Op.ROPE)} <= OWN_OPS


def _attention(backend, kv_type: GGMLType, dims: tuple[int, int], options: dict, rng):
    """FLASH_ATTN_EXT over 3 query rows of 4 heads (2 K/V heads) and 2 sequences, 200 cells
    (a tile and a part of one), with holes in the mask and a row of the second sequence that
    sees nothing."""
    (d, dv), n_q, n_kv, n_head, n_head_kv, n_seq = dims, 3, 200, 4, 2, 2
    mask = np.where(rng.random((n_seq, 1, n_q, n_kv)) < 0.3, -np.inf, 0).astype(np.float16)
    mask[1, 0, 2] = -np.inf
    values = {"q": rng.standard_normal((n_seq, n_head, n_q, d)).astype(np.float32),
              "k": rng.standard_normal((n_seq, n_head_kv, n_kv, d)).astype(np.float32),
              "v": rng.standard_normal((n_seq, n_head_kv, n_kv, dv)).astype(np.float32),
              "mask": mask, "sinks": rng.standard_normal(n_head).astype(np.float32)}
    ctx = Context()
    t = {"q": ctx.new_tensor(GGMLType.F32, [d, n_q, n_head, n_seq]),
         "k": ctx.new_tensor(kv_type, [d, n_kv, n_head_kv, n_seq]),
         "v": ctx.new_tensor(kv_type, [dv, n_kv, n_head_kv, n_seq]),
         "mask": ctx.new_tensor(GGMLType.F16, [n_kv, n_q, 1, n_seq]),
         "sinks": ctx.new_tensor(GGMLType.F32, [n_head])}
    out = ops.flash_attn_ext(ctx, t["q"], t["k"], t["v"], t["mask"], 0.125,
                             options.get("max_bias", 0.0), options.get("softcap", 0.0))
    if options.get("sinks"):
        ops.flash_attn_ext_add_sinks(out, t["sinks"])
    with alloc_ctx_tensors(ctx, backend):
        for name, tensor in t.items():
            tensor.set_data(values[name])
        backend.graph_compute(build_graph(out))
        return out.numpy().copy()


@pytest.mark.parametrize("kv_type", [GGMLType.F16, GGMLType.F32], ids=["f16", "f32"])
@pytest.mark.parametrize("options", [{}, {"sinks": True}, {"softcap": 30.0},
                                     {"max_bias": 8.0, "sinks": True}],
                         ids=["plain", "sinks", "softcap", "alibi-sinks"])
def test_flash_attention_vec_matches_cpu(emu, cpu, kv_type, options):
    """The cells split among blocks and merged (24 blocks of rows and heads: 6 splits)."""
    assert binders.flash_attn_splits(SimpleNamespace(ne=(64, 3, 4, 2)), 200) == 6
    seed = int(kv_type) + len(str(options))
    expected = _attention(cpu, kv_type, (64, 64), options, np.random.default_rng(seed))
    got = _attention(emu, kv_type, (64, 64), options, np.random.default_rng(seed))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert not got[1, 2].any()                         # the row that sees nothing: zeros


@pytest.mark.parametrize("kv_type", [GGMLType.F16, GGMLType.F32], ids=["f16", "f32"])
@pytest.mark.parametrize("options", [{}, {"max_bias": 8.0, "sinks": True}],
                         ids=["plain", "alibi-sinks"])
def test_flash_attention_vec_unsplit_matches_cpu(emu, cpu, kv_type, options, monkeypatch):
    """Rows and heads enough to fill the GPU: one block per row and head, no merge."""
    monkeypatch.setattr(binders, "FLASH_ATTN_TARGET_BLOCKS", 1)
    seed = int(kv_type) + len(str(options))
    expected = _attention(cpu, kv_type, (64, 64), options, np.random.default_rng(seed))
    got = _attention(emu, kv_type, (64, 64), options, np.random.default_rng(seed))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert not got[1, 2].any()


def test_flash_attention_splits_fill_the_gpu_and_keep_tiles_whole():
    one_token = SimpleNamespace(ne=(128, 1, 32, 1))
    assert binders.flash_attn_splits(one_token, 256) == 8            # 256 blocks
    assert binders.flash_attn_splits(one_token, 4096) == 8
    assert binders.flash_attn_splits(one_token, 40) == 1             # too few cells
    assert binders.flash_attn_splits(SimpleNamespace(ne=(128, 1, 2, 1)), 1 << 16) == 64
    assert binders.flash_attn_splits(SimpleNamespace(ne=(128, 16, 32, 1)), 4096) == 1


def test_flash_attention_vec_wide_heads(emu, cpu):
    """DeepSeek's 576-wide keys over 512-wide values: several channels per thread."""
    expected = _attention(cpu, GGMLType.F16, (576, 512), {}, np.random.default_rng(3))
    got = _attention(emu, GGMLType.F16, (576, 512), {}, np.random.default_rng(3))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_set_rows_bad_index_sets_the_flag(emu):
    ctx = Context()
    cache = ctx.new_tensor(GGMLType.F16, [8, 4])
    rows = ctx.new_tensor(GGMLType.F32, [8, 2])
    idx = ctx.new_tensor(GGMLType.I64, [2])
    out = ops.set_rows(ctx, cache, rows, idx)
    with alloc_ctx_tensors(ctx, emu):
        cache.set_data(np.zeros((4, 8), np.float16))
        rows.set_data(np.arange(16, dtype=np.float32).reshape(2, 8))
        idx.set_data(np.array([3, 4], np.int64))             # 4: there are 4 rows
        with pytest.raises(OutOfBoundsError, match="in SET_ROWS"):
            emu.graph_compute(build_graph(out))
        np.testing.assert_array_equal(cache.numpy()[0, 0, 3], np.arange(8))


def _norm_then_mul(backend, norm_op: str, fused: bool, rng) -> list[np.ndarray]:
    """norm(x) * w (w repeated over the rows), and norm(x) + x read after the product."""
    ctx = Context()
    x = ctx.new_tensor(GGMLType.F32, [96, 3, 2])
    w = ctx.new_tensor(GGMLType.F32, [96])
    normed = getattr(ops, norm_op)(ctx, x, 1e-5)
    outputs = [ops.mul(ctx, normed, w), ops.add(ctx, normed, x)]
    graph = build_graph(*outputs)
    with alloc_ctx_tensors(ctx, backend):
        x.set_data(rng.standard_normal((2, 3, 96)).astype(np.float32))
        w.set_data(rng.standard_normal(96).astype(np.float32))
        if fused:
            calls = fusion.bind_nodes(backend.launcher, computing_nodes(graph), backend.bind)
            assert calls[1] is fusion.fused_away      # the MUL: done by the norm's kernel
            for call in calls:
                call()
        else:
            backend.graph_compute(graph)
        return [t.numpy().copy() for t in outputs]


@pytest.mark.parametrize("norm_op", ["rms_norm", "norm", "l2_norm"])
def test_a_norm_and_the_mul_after_it_run_as_one_kernel(emu, cpu, norm_op):
    expected = _norm_then_mul(cpu, norm_op, False, np.random.default_rng(5))
    got = _norm_then_mul(emu, norm_op, True, np.random.default_rng(5))
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_a_norm_is_not_fused_with_a_mul_of_something_else():
    ctx = Context()
    x = ctx.new_tensor(GGMLType.F32, [32, 2])
    normed = ops.rms_norm(ctx, x, 1e-5)
    assert fusion.norm_then_mul(normed, ops.mul(ctx, normed, x))
    assert not fusion.norm_then_mul(normed, ops.mul(ctx, x, normed))      # not its first operand
    assert not fusion.norm_then_mul(normed, ops.add(ctx, normed, x))


def test_row_kernels_leave_what_a_grid_cannot_hold_to_the_array_kernels():
    ctx = Context()
    tall = ctx.new_tensor(GGMLType.F32, [4, 1, 70000])
    assert find_own_kernel(ops.add(ctx, tall, tall)) is None
    assert find_own_kernel(ops.rms_norm(ctx, tall, 1e-5)) is None
    fits = ctx.new_tensor(GGMLType.F32, [4, 1, 65535])
    assert find_own_kernel(ops.add(ctx, fits, fits)) is not None


def test_a_norm_is_fused_only_with_memory_that_keeps_apart(emu):
    ctx = Context()
    big = ctx.new_tensor(GGMLType.F32, [64 * 5])
    with alloc_ctx_tensors(ctx, emu):
        rows = ops.view_2d(ctx, big, 64, 2, 256, 0)            # rows 0 and 1
        shifted = ops.view_2d(ctx, big, 64, 2, 256, 256)       # rows 1 and 2
        apart = ops.view_2d(ctx, big, 64, 2, 256, 512)         # rows 2 and 3
        assert fusion.apart_or_alike(emu.launcher, rows, rows)
        assert fusion.apart_or_alike(emu.launcher, rows, apart)
        assert not fusion.apart_or_alike(emu.launcher, rows, shifted)
        normed = ops.rms_norm(ctx, rows, 1e-5)
        normed.buffer, normed.offset = big.buffer, 512          # the norm's result in rows 2-3
        weight = ops.view_1d(ctx, big, 64, 1024)                # row 4
        product = ops.mul(ctx, normed, weight)
        product.buffer, product.offset = big.buffer, 256        # over the source's second row
        assert not fusion.fusable_memory(emu.launcher, normed, product)
        product.offset = 0                                      # the source itself: fine
        assert fusion.fusable_memory(emu.launcher, normed, product)
        product.offset = 1024 - 256                             # over the weight: not
        assert not fusion.fusable_memory(emu.launcher, normed, product)
