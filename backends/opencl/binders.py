"""Binding graph nodes to OpenCL kernels: argument packing and one binder per kernel family.

A binder builds the node's own kernel object (so replays only enqueue), sets its arguments once
and returns the call that enqueues it on the backend's queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from polydev.ops import (ArangeParams, ClampParams, ConcatParams, DiagMaskParams, FillParams,
                         FlashAttnParams, FlashAttnSources, GluParams, GroupNormParams,
                         LeakyReluParams, NormParams, Op, PadParams, PadReflect1dParams,
                         RollParams, RopeMode, RopeParams, RopeSources, ScaleParams,
                         SoftMaxParams, SoftMaxSources, SortOrder, SortParams,
                         TimestepEmbeddingParams, UnaryParams, alibi_params,
                         yarn_corr_dims)
from polydev.tensor import Tensor


from .types import (ENCODABLE, F16, F32, FLASH_ATTN_ROWS_MAX_DV, FN_CODES, FN_DEFINES, I32, I64,
                    MAT_VEC_MAX_COLUMNS, MV_GROUP, PLAIN_NAMES, QUANT_NAMES, VEC_DECODED,
                    VEC_QUANTS)

if TYPE_CHECKING:
    from .backend import OpenCLBackend


# --- argument packing -------------------------------------------------------------------------

def tensor_args(backend: "OpenCLBackend", t: Tensor | None) -> list:
    """The ten arguments TENSOR(t) of common.h: buffer, offset, ne[4], nb[4]."""
    if t is None:          # an absent optional source: any valid buffer, never read
        return [backend.device.scratch, np.uint64(0)] + [np.int32(1)] * 4 + [np.uint64(0)] * 4
    return ([t.buffer.cl_buffer, np.uint64(t.offset)] + [np.int32(n) for n in t.ne]
        + [np.uint64(n) for n in t.nb])


class _Launch:
    """One bound node: its kernel object with its arguments set, enqueued on each call.

    It holds the arguments too: clSetKernelArg does not retain a cl.Buffer, so a buffer made
    for this node alone (a constant table) must live as long as the call.
    """

    __slots__ = ("enqueue", "queue", "kernel", "global_size", "local_size", "args", "backend",
                 "checks_indices")

    def __init__(self, backend: "OpenCLBackend", kernel: Any, args: list, global_size,
                 local_size, checks_indices: bool) -> None:
        kernel.set_args(*args)
        self.enqueue = backend.device.cl.enqueue_nd_range_kernel
        self.queue, self.kernel, self.args, self.backend = backend.queue, kernel, args, backend
        self.global_size = tuple(int(g) for g in global_size)
        self.local_size = local_size
        self.checks_indices = checks_indices

    def __call__(self) -> None:
        self.enqueue(self.queue, self.kernel, self.global_size, self.local_size)
        if self.checks_indices:          # its flag is read when the backend synchronizes
            self.backend.kernel_errors.launched()


def _launch(backend: "OpenCLBackend", kernel: Any, args: list, global_size, local_size=None,
            checks_indices: bool = False) -> Callable[[], None]:
    """The call enqueuing ``kernel``; ``checks_indices``: it may flag a bad index."""
    if min(int(g) for g in global_size) == 0:
        return lambda: None
    return _Launch(backend, kernel, args, global_size, local_size, checks_indices)


def _grid(t: Tensor) -> tuple[int, int, int]:
    return t.ne[0], t.ne[1], t.ne[2] * t.ne[3]


def _type_defines(node: Tensor, *srcs: Tensor | None) -> dict[str, str]:
    defines = {"DST_T": PLAIN_NAMES.get(node.type, "f32")}
    for i, s in enumerate(srcs):
        if s is not None and s.type in PLAIN_NAMES:
            defines[f"SRC{i}_T"] = PLAIN_NAMES[s.type]
    return defines


def _rows_launch(backend, node: Tensor, name: str, extra: list, rows_of: Tensor,
                 *srcs: Tensor | None, **defines) -> Callable[[], None]:
    """A one-work-group-per-row kernel of rows.cl."""
    ls = backend.device.row_group_size
    k = backend.device.programs.kernel("rows", name, **_type_defines(node, *srcs), **defines)
    args = [a for s in srcs for a in tensor_args(backend, s)] + tensor_args(backend, node) + extra
    grid = (ls, rows_of.ne[1], rows_of.ne[2] * rows_of.ne[3])
    return _launch(backend, k, args, grid, (ls, 1, 1))


# --- binders ----------------------------------------------------------------------------------

def _elementwise(backend, node: Tensor, name: str, *srcs: Tensor | None) -> Any:
    return backend.device.programs.kernel("elementwise", name, **_type_defines(node, *srcs),
                                          **FN_DEFINES)


def _unary_scalars(node: Tensor) -> tuple[float, float]:
    """The two scalars unary.cl's functions read: SCALE's scale and bias, CLAMP's bounds,
    LEAKY_RELU's slope, FILL's value; zeros for the rest."""
    if node.op == Op.SCALE:
        params = ScaleParams.of(node)
        return params.scale, params.bias
    if node.op == Op.CLAMP:
        params = ClampParams.of(node)
        return params.min, params.max
    if node.op == Op.LEAKY_RELU:
        return LeakyReluParams.of(node).negative_slope, 0.0
    if node.op == Op.FILL:
        return FillParams.of(node).value, 0.0
    return 0.0, 0.0


def bind_unary(backend, node: Tensor) -> Callable[[], None]:
    src = node.src[0]
    fn = UnaryParams.of(node).fn.name if node.op == Op.UNARY else node.op.name
    params = _unary_scalars(node)
    k = _elementwise(backend, node, "unary", src)
    args = tensor_args(backend, src) + tensor_args(backend, node) + [
        np.int32(FN_CODES[fn]), np.float32(params[0]), np.float32(params[1])]
    return _launch(backend, k, args, _grid(node))


def bind_binary(backend, node: Tensor) -> Callable[[], None]:
    a, b = node.src[0], node.src[1]
    fn = "ADD" if node.op == Op.ADD1 else node.op.name     # ADD1: b is one value, repeated
    k = _elementwise(backend, node, "binary", a, b)
    args = (tensor_args(backend, a) + tensor_args(backend, b) + tensor_args(backend, node)
        + [np.int32(FN_CODES[fn])])
    return _launch(backend, k, args, _grid(node))


def bind_glu(backend, node: Tensor) -> Callable[[], None]:
    params = GluParams.of(node)
    fn, alpha, limit = params.fn, params.alpha, params.limit
    a = node.src[0]
    b = node.src[1] if len(node.src) > 1 else None
    k = _elementwise(backend, node, "glu", a, b)
    args = tensor_args(backend, a) + tensor_args(backend, b) + tensor_args(backend, node) + [
        np.int32(FN_CODES[fn.name]), np.int32(b is not None), np.int32(params.swapped),
        np.float32(alpha), np.float32(limit)]
    return _launch(backend, k, args, _grid(node))


def bind_copy(backend, node: Tensor) -> Callable[[], None]:
    src = node.src[0]
    args = tensor_args(backend, src) + tensor_args(backend, node)
    programs = backend.device.programs
    if node.type in ENCODABLE:           # one work-item per destination block
        k = programs.kernel("quantize", "copy_to_blocks", **_type_defines(node, src),
                            QUANT_T=QUANT_NAMES[node.type], ENCODE=True)
        return _launch(backend, k, args, (node.nelements // 32,))
    if src.type in QUANT_NAMES:
        k = programs.kernel("quantize", "copy_from_blocks", **_type_defines(node),
                            QUANT_T=QUANT_NAMES[src.type])
        return _launch(backend, k, args, (node.nelements,))
    k = _elementwise(backend, node, "copy_i32" if src.type == I32 else "copy", src)
    return _launch(backend, k, args, (node.nelements,))


def bind_repeat(backend, node: Tensor) -> Callable[[], None]:
    k = _elementwise(backend, node, "repeat", node.src[0])
    args = tensor_args(backend, node.src[0]) + tensor_args(backend, node)
    return _launch(backend, k, args, _grid(node))


def bind_concat(backend, node: Tensor) -> Callable[[], None]:
    a, b = node.src[0], node.src[1]
    k = _elementwise(backend, node, "concat", a, b)
    args = (tensor_args(backend, a) + tensor_args(backend, b) + tensor_args(backend, node)
        + [np.int32(ConcatParams.of(node).dim)])
    return _launch(backend, k, args, _grid(node))


def bind_diag_mask_inf(backend, node: Tensor) -> Callable[[], None]:
    k = _elementwise(backend, node, "diag_mask_inf", node.src[0])
    args = (tensor_args(backend, node.src[0]) + tensor_args(backend, node)
        + [np.int32(DiagMaskParams.of(node).n_past)])
    return _launch(backend, k, args, _grid(node))


def bind_sum_rows(backend, node: Tensor) -> Callable[[], None]:
    src = node.src[0]
    return _rows_launch(backend, node, "sum_rows", [np.int32(node.op == Op.MEAN)], src, src)


def bind_sum(backend, node: Tensor) -> Callable[[], None]:
    src, ls = node.src[0], backend.device.row_group_size
    k = backend.device.programs.kernel("rows", "sum_all", **_type_defines(node, src))
    args = tensor_args(backend, src) + tensor_args(backend, node)
    return _launch(backend, k, args, (ls,), (ls,))


def bind_argmax(backend, node: Tensor) -> Callable[[], None]:
    src = node.src[0]
    return _rows_launch(backend, node, "argmax", [], src, src)


NORM_KINDS = {Op.NORM: 0, Op.RMS_NORM: 1, Op.L2_NORM: 2}


def bind_norm(backend, node: Tensor) -> Callable[[], None]:
    src = node.src[0]
    extra = [np.float32(NormParams.of(node).eps), np.int32(NORM_KINDS[node.op])]
    return _rows_launch(backend, node, "norm", extra, src, src)


def alibi_args(n_head: int, max_bias: float) -> list:
    """ALiBi's m0, m1 and n_head_log2, as ggml derives the per-head slopes from them."""
    m0, m1, n_head_log2 = alibi_params(n_head, max_bias)
    return [m0, m1, np.int32(n_head_log2)]


def bind_soft_max(backend, node: Tensor) -> Callable[[], None]:
    src, mask, sinks = SoftMaxSources.of(node)
    params = SoftMaxParams.of(node)
    scale, max_bias = params.scale, params.max_bias
    extra = ([np.float32(scale), np.float32(max_bias)] + alibi_args(src.ne[2], max_bias)
        + [np.int32(mask is not None), np.int32(sinks is not None)])
    defines = {"MASK_T": PLAIN_NAMES[mask.type]} if mask is not None else {}
    ls = backend.device.row_group_size
    k = backend.device.programs.kernel("rows", "soft_max", **_type_defines(node, src), **defines)
    args = (tensor_args(backend, src) + tensor_args(backend, mask) + tensor_args(backend, sinks)
        + tensor_args(backend, node) + extra)
    return _launch(backend, k, args, (ls, src.ne[1], src.ne[2] * src.ne[3]), (ls, 1, 1))


def bind_rope(backend, node: Tensor) -> Callable[[], None]:
    src, pos, ff = RopeSources.of(node)
    params = RopeParams.of(node)
    n_dims, mode = params.n_dims, params.mode
    n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = params.yarn
    low, high = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    theta_scale = np.float32(freq_base) ** np.float32(-2.0 / n_dims)   # as the CPU backend
    k = backend.device.programs.kernel("rope", "rope", **_type_defines(node, src))
    args = (tensor_args(backend, src) + tensor_args(backend, pos) + tensor_args(backend, ff)
        + tensor_args(backend, node) + [
            np.int32(n_dims), np.int32(mode == RopeMode.NEOX), np.float32(freq_scale),
            np.float32(ext_factor), np.float32(attn_factor), np.float32(low), np.float32(high),
            np.float32(theta_scale), np.int32(ff is not None)])
    return _launch(backend, k, args, (src.ne[1], src.ne[2], src.ne[3]))


def bind_get_rows(backend, node: Tensor) -> Callable[[], None]:
    src, idx = node.src[0], node.src[1]
    name, defines = "get_rows", _type_defines(node, src)
    if src.type == I32:
        name = "get_rows_i32"
    elif src.type in QUANT_NAMES:
        defines["QUANT_T"] = QUANT_NAMES[src.type]
    k = backend.device.programs.kernel("rows", name, **defines)
    args = (tensor_args(backend, src) + tensor_args(backend, idx) + tensor_args(backend, node)
        + [backend.error_flag(node)])
    return _launch(backend, k, args, (node.ne[0], idx.ne[0], idx.ne[1] * idx.ne[2]),
                   checks_indices=True)


def bind_set_rows(backend, node: Tensor) -> Callable[[], None]:
    rows, idx = node.src[0], node.src[1]
    defines = _type_defines(node, rows)
    defines["IDX_T"] = "long" if idx.type == I64 else "int"
    args = (tensor_args(backend, rows) + tensor_args(backend, idx) + tensor_args(backend, node)
        + [backend.error_flag(node)])
    grid = (rows.ne[0], rows.ne[1], rows.ne[2] * rows.ne[3])
    if node.type in ENCODABLE:           # one work-item per block of a row
        k = backend.device.programs.kernel("quantize", "set_rows_blocks", **defines,
                                           QUANT_T=QUANT_NAMES[node.type], ENCODE=True)
        return _launch(backend, k, args, (rows.ne[0] // 32,) + grid[1:], checks_indices=True)
    k = backend.device.programs.kernel("rows", "set_rows", **defines)
    return _launch(backend, k, args, grid, checks_indices=True)


def bind_mul_mat(backend, node: Tensor) -> Callable[[], None]:
    a, b = node.src[0], node.src[1]
    device = backend.device
    defines = _type_defines(node, a, b)
    if a.type in QUANT_NAMES:
        defines["QUANT_T"] = QUANT_NAMES[a.type]
    args = tensor_args(backend, a) + tensor_args(backend, b) + tensor_args(backend, node)
    batches = b.ne[2] * b.ne[3]
    # a CPU device (barrier-free work-groups) runs the rows kernel for every batch: there it
    # beat the tiles 10-17x from 8 to 64 columns (PoCL, Q4_K 2048 x 2048), so many sequences
    # decoding together, and prompts, stay on it
    if device.barrier_free and _whole_chunks(a, b):
        if a.type in VEC_QUANTS:
            defines["VEC_QUANTS"] = True
        elif a.type in VEC_DECODED:
            defines["VEC_DEQ"] = True
        if a.type == F16:
            defines["SRC0_IS_F16"] = True
        k = device.programs.kernel("mul_mat", "mul_mat_vec_rows", **defines)
        groups = -(-a.ne[1] // MV_GROUP)
        return _launch(backend, k, args, (groups * MV_GROUP, b.ne[1] * batches), (MV_GROUP, 1))
    if b.ne[1] <= MAT_VEC_MAX_COLUMNS:
        ls = device.row_group_size
        k = device.programs.kernel("mul_mat", "mul_mat_vec", **defines)
        return _launch(backend, k, args, (ls, a.ne[1], b.ne[1] * batches), (ls, 1, 1))
    ts = device.tile_size
    k = device.programs.kernel("mul_mat", "mul_mat_tiled", **defines)
    grid = (-(-a.ne[1] // ts) * ts, -(-b.ne[1] // ts) * ts, batches)
    return _launch(backend, k, args, grid, (ts, ts, 1))


def _whole_chunks(a: Tensor, b: Tensor) -> bool:
    """mul_mat_vec_rows reads src0 rows as whole 32-value chunks and src1 columns as
    contiguous f32."""
    if b.type != F32 or b.nb[0] != 4 or a.ne[0] % 32:
        return False
    return a.type in QUANT_NAMES or a.nb[0] == a.type.traits.type_size


def bind_mul_mat_id(backend, node: Tensor) -> Callable[[], None]:
    experts, b, ids = node.src[0], node.src[1], node.src[2]
    defines = _type_defines(node, experts, b)
    if experts.type in QUANT_NAMES:
        defines["QUANT_T"] = QUANT_NAMES[experts.type]
    ls = backend.device.row_group_size
    k = backend.device.programs.kernel("mul_mat", "mul_mat_id_vec", **defines)
    args = ([a for t in (experts, b, ids, node) for a in tensor_args(backend, t)]
        + [backend.error_flag(node)])
    return _launch(backend, k, args, (ls, experts.ne[1], node.ne[1] * node.ne[2]), (ls, 1, 1),
                   checks_indices=True)


def bind_flash_attn_ext(backend, node: Tensor) -> Callable[[], None]:
    q, k_t, v_t, mask, sinks = FlashAttnSources.of(node)
    params = FlashAttnParams.of(node)
    scale, max_bias, softcap = params.kernel_scale, params.max_bias, params.softcap
    defines = {"SRC1_T": PLAIN_NAMES.get(k_t.type, "f32")}
    if k_t.type in QUANT_NAMES:
        defines["QUANT_T"] = QUANT_NAMES[k_t.type]
    args = [a for t in (q, k_t, v_t, mask, sinks, node) for a in tensor_args(backend, t)]
    args += ([np.float32(scale), np.float32(softcap), np.float32(max_bias)]
        + alibi_args(q.ne[2], max_bias) + [np.int32(mask is not None), np.int32(sinks is not None)])
    if backend.device.barrier_free and max(q.ne[0], v_t.ne[0]) <= FLASH_ATTN_ROWS_MAX_DV:
        if (k_t.type == v_t.type == F16 and k_t.nb[0] == v_t.nb[0] == 2
                and q.ne[0] % 16 == 0 and v_t.ne[0] % 16 == 0):
            defines["KV_F16X16"] = True
        kernel = backend.device.programs.kernel("attention", "flash_attn_rows", **defines)
        return _launch(backend, kernel, args, (q.ne[1], q.ne[2] * q.ne[3]), (1, 1))
    ls = backend.device.row_group_size
    kernel = backend.device.programs.kernel("attention", "flash_attn", **defines)
    return _launch(backend, kernel, args, (ls, q.ne[1], q.ne[2] * q.ne[3]), (ls, 1, 1))


def _misc(backend, node: Tensor, name: str, *srcs: Tensor | None) -> Any:
    return backend.device.programs.kernel("misc", name, **_type_defines(node, *srcs))


def bind_argsort(backend, node: Tensor) -> Callable[[], None]:
    src = node.src[0]
    descending = node.op == Op.TOP_K or SortParams.of(node).order == SortOrder.DESC
    args = tensor_args(backend, src) + tensor_args(backend, node) + [np.int32(descending)]
    return _launch(backend, _misc(backend, node, "argsort", src), args, _grid(src))


def bind_cumsum(backend, node: Tensor) -> Callable[[], None]:
    src = node.src[0]
    args = tensor_args(backend, src) + tensor_args(backend, node)
    return _launch(backend, _misc(backend, node, "cumsum", src), args, src.ne[1:])


def bind_pad(backend, node: Tensor) -> Callable[[], None]:
    src, params = node.src[0], PadParams.of(node)
    args = (tensor_args(backend, src) + tensor_args(backend, node)
        + [np.int32(p) for p in params.left] + [np.int32(params.circular)])
    return _launch(backend, _misc(backend, node, "pad", src), args, _grid(node))


def bind_arange(backend, node: Tensor) -> Callable[[], None]:
    params = ArangeParams.of(node)
    start, step = params.start, params.step
    args = tensor_args(backend, node) + [np.float32(start), np.float32(step)]
    return _launch(backend, _misc(backend, node, "arange"), args, (node.ne[0],))


def bind_group_norm(backend, node: Tensor) -> Callable[[], None]:
    src = node.src[0]
    params = GroupNormParams.of(node)
    n_groups, eps = params.n_groups, params.eps
    group_size = -(-src.ne[2] // n_groups)            # ggml's ceil(C / G) channels per group
    ls = backend.device.row_group_size
    args = (tensor_args(backend, src) + tensor_args(backend, node)
        + [np.int32(group_size), np.float32(eps)])
    return _launch(backend, _misc(backend, node, "group_norm", src), args,
                   (ls, n_groups, src.ne[3]), (ls, 1, 1))


def bind_roll(backend, node: Tensor) -> Callable[[], None]:
    """ROLL is a circular PAD of nothing: d[i] = a[(i - shift) mod n]."""
    src, shifts = node.src[0], RollParams.of(node).shifts
    args = (tensor_args(backend, src) + tensor_args(backend, node)
        + [np.int32(s % max(n, 1)) for s, n in zip(shifts, src.ne)] + [np.int32(1)])
    return _launch(backend, _misc(backend, node, "pad", src), args, _grid(node))


def bind_pad_reflect_1d(backend, node: Tensor) -> Callable[[], None]:
    src = node.src[0]
    p0 = PadReflect1dParams.of(node).p0
    args = tensor_args(backend, src) + tensor_args(backend, node) + [np.int32(p0)]
    return _launch(backend, _misc(backend, node, "pad_reflect_1d", src), args, _grid(node))


def bind_timestep_embedding(backend, node: Tensor) -> Callable[[], None]:
    steps = node.src[0]
    params = TimestepEmbeddingParams.of(node)
    dim, max_period = params.dim, params.max_period
    half = dim // 2
    # the frequencies in the CPU backend's float32 arithmetic, uploaded once per plan
    j = np.arange(half, dtype=np.float32)
    freqs = np.exp(-np.log(np.float32(max_period)) * j / np.float32(half)).astype(np.float32)
    cl = backend.device.cl
    table = cl.Buffer(backend.device.platform.context,
                      cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=freqs)
    table_args = [table, np.uint64(0), np.int32(half), np.int32(1), np.int32(1), np.int32(1),
                  np.uint64(4), np.uint64(4 * half), np.uint64(4 * half), np.uint64(4 * half)]
    args = (tensor_args(backend, steps) + table_args + tensor_args(backend, node)
        + [np.int32(half)])
    return _launch(backend, _misc(backend, node, "timestep_embedding"), args,
                   (node.ne[0], node.ne[1]))


def bind_ssm_conv(backend, node: Tensor) -> Callable[[], None]:
    sx, c = node.src[0], node.src[1]
    args = tensor_args(backend, sx) + tensor_args(backend, c) + tensor_args(backend, node)
    return _launch(backend, _misc(backend, node, "ssm_conv", sx, c), args, node.ne[:3])
