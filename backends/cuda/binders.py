"""Binding graph nodes to the CUDA backend's own kernels (``cu/*.cu``): launch geometry and
argument packing, one binder per kernel family, and the type rules that say when each applies.

A binder talks to a ``Launcher`` only: the CUDA backend launches on its stream with device
addresses, and the tests launch the same kernels compiled for the CPU (an emulation of the
CUDA execution model) with host addresses, so everything here runs under test without a GPU.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from polydev.ops import (FlashAttnParams, FlashAttnSources, GluParams, NormParams, Op, RopeMode,
                         RopeParams, RopeSources, SoftMaxParams, SoftMaxSources, alibi_params,
                         yarn_corr_dims, yarn_mscale, yarn_ramp_width)
from polydev.tensor import Tensor
from polydev.types import GGMLType


F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32

# the row types of quant.cu's ROW_KERNELS, by their kernel-name suffix
ROW_TYPE_NAMES = {
    F32: "f32", F16: "f16", BF16: "bf16",
    GGMLType.Q4_0: "q4_0", GGMLType.Q4_1: "q4_1", GGMLType.Q5_0: "q5_0",
    GGMLType.Q5_1: "q5_1", GGMLType.Q8_0: "q8_0",
    GGMLType.Q4_K: "q4_K", GGMLType.Q5_K: "q5_K", GGMLType.Q6_K: "q6_K",
}
# columns of src1 the mat-vec kernel takes (quant.cu's MMV_MAX_COLS is 8): its time grows with
# each column (on an H100, 8 columns of a 2048 x 5632 Q4_K took 6x one), where decoding the
# weight for cuBLAS costs the same for any count
MAT_VEC_MAX_COLS = 1
MAT_VEC_ROWS_PER_BLOCK = 4  # warps per block of the mat-vec kernels (one row each)
MUL_MAT_ID_VEC_MAX_TOKENS = 16   # above this, MUL_MAT_ID groups tokens by expert (cuBLAS)
# FLASH_ATTN_EXT: query rows up to this run attention.cu's kernel, a block per row and head;
# more rows (prompts) are batched products, which read each K/V cell once for many rows
FLASH_ATTN_VEC_MAX_ROWS = 32
FLASH_ATTN_VEC_THREADS = 128      # attention.cu's FA_THREADS
FLASH_ATTN_VEC_MAX_D = 1024       # attention.cu's FA_MAX_D
# Splits of the KV cells among blocks (attention.cu's flash decoding): enough blocks for an
# H100's or H200's 132 multiprocessors about twice over, each split at least a few tiles' worth
# of cells so that the merge stays a small part of the work.
FLASH_ATTN_TARGET_BLOCKS = 256
FLASH_ATTN_MIN_SPLIT_CELLS = 32
FLASH_ATTN_MAX_SPLITS = 64        # attention.cu's FA_MAX_SPLITS
SET_ROWS_KINDS = {F32: 0, F16: 1, BF16: 2}
NORM_KINDS = {Op.NORM: 0, Op.RMS_NORM: 1, Op.L2_NORM: 2}
BINARY_KINDS = {Op.ADD: 0, Op.SUB: 1, Op.MUL: 2, Op.DIV: 3}     # elementwise.cu's BIN_*


class Launcher(Protocol):
    """Where bound kernels run: the CUDA backend, or the CPU emulation in the tests."""

    def address(self, t: Tensor) -> int:
        """The address of ``t``'s first byte, as the kernels see it."""

    def error_flag(self, node: Tensor) -> Any:
        """The int* that ``node``'s kernel sets when it meets an index out of range."""

    def launch(self, name: str, grid: Sequence[int], block: Sequence[int], args: list,
               checks_indices: bool = False) -> Callable[[], None]:
        """The call that launches kernel ``name`` with ``args`` (bound once)."""

    def scratch(self, nbytes: int) -> tuple[int, Any]:
        """Memory of ``nbytes`` that kernels of one bound call share: its address, and what
        keeps it (the call holds it for as long as it lives)."""


def tensor_args(launcher: Launcher, t: Tensor | None) -> list:
    """The nine arguments TENSOR(t) of common.cuh: address, ne[4], nb[4]. An absent optional
    source is a null address the kernel never reads."""
    if t is None:
        return [np.uint64(0)] + [np.int32(1)] * 4 + [np.int64(0)] * 4
    return ([np.uint64(launcher.address(t))] + [np.int32(n) for n in t.ne]
        + [np.int64(n) for n in t.nb])


def _warps(n: int, most: int) -> int:
    """Threads for n work items: whole warps, at most ``most``."""
    return max(32, min(most, 32 * math.ceil(n / 32)))


# --- type rules ----------------------------------------------------------------------------------

def rows_fit_a_grid(t: Tensor) -> bool:
    """Whether a kernel of one block per row (grid (ne1, ne2, ne3)) can launch over ``t``: a
    grid's second and third sizes stop at 65535."""
    return t.ne[2] <= 65535 and t.ne[3] <= 65535


def _unit_rows(t: Tensor) -> bool:
    """Rows of contiguous elements (block formats: whole blocks)."""
    return t.is_contiguous_rows()


def mul_mat_vec_ok(node: Tensor) -> bool:
    """A few f32 columns times one matrix of a decodable non-f32 type (cuBLAS does f32)."""
    a, b = node.src[0], node.src[1]
    return (a.type in ROW_TYPE_NAMES and a.type != F32 and _unit_rows(a)
        and a.ne[2] == a.ne[3] == 1 and b.type == F32 and b.nb[0] == 4
        and b.ne[1] <= MAT_VEC_MAX_COLS and b.ne[2] == b.ne[3] == 1
        and node.type == F32 and node.nb[0] == 4)


def mul_mat_id_vec_ok(node: Tensor) -> bool:
    a, b, ids = node.src[0], node.src[1], node.src[2]
    return (a.type in ROW_TYPE_NAMES and _unit_rows(a) and b.type == F32 and b.nb[0] == 4
        and ids.type == I32 and node.type == F32 and b.ne[2] <= MUL_MAT_ID_VEC_MAX_TOKENS)


def get_rows_ok(node: Tensor) -> bool:
    a, idx = node.src[0], node.src[1]
    return a.type in ROW_TYPE_NAMES and _unit_rows(a) and idx.type == I32 and node.type == F32


def norm_ok(node: Tensor) -> bool:
    return node.type == F32 and node.src[0].type == F32 and rows_fit_a_grid(node)


def soft_max_ok(node: Tensor) -> bool:
    _, mask, sinks = SoftMaxSources.of(node)
    return (norm_ok(node) and (mask is None or mask.type in (F32, F16))
        and (sinks is None or sinks.type == F32))


def set_rows_ok(node: Tensor) -> bool:
    src, idx = node.src[0], node.src[1]
    return (node.type in SET_ROWS_KINDS and src.type in (F32, F16)
        and idx.type in (I32, GGMLType.I64))


def flash_attn_vec_ok(node: Tensor) -> bool:
    q, k, v, mask, sinks = FlashAttnSources.of(node)
    return (q.ne[1] <= FLASH_ATTN_VEC_MAX_ROWS and q.type == F32 and node.type == F32
        and k.type in (F32, F16) and v.type in (F32, F16)
        and max(q.ne[0], v.ne[0]) <= FLASH_ATTN_VEC_MAX_D
        and (mask is None or mask.type == F16) and (sinks is None or sinks.type == F32))


def binary_ok(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    return (node.type == a.type == b.type == F32 and node.ne == a.ne
        and all(m > 0 and n % m == 0 for n, m in zip(a.ne, b.ne)) and rows_fit_a_grid(node))


def _glu_sources(node: Tensor) -> tuple[Tensor, Tensor | None]:
    """A GLU's source, and its gate where it is a tensor of its own."""
    return node.src[0], node.src[1] if len(node.src) > 1 else None


def glu_ok(node: Tensor) -> bool:
    a, b = _glu_sources(node)
    return (node.type == a.type == F32 and (b is None or b.type == F32)
        and rows_fit_a_grid(node))


def rope_ok(node: Tensor) -> bool:
    x, pos, ff = RopeSources.of(node)
    params = RopeParams.of(node)
    return (params.mode in (RopeMode.NORMAL, RopeMode.NEOX) and params.n_offs == 0
        and node.type in (F32, F16) and x.type == node.type
        and pos.type == I32 and (ff is None or ff.type == F32) and rows_fit_a_grid(x))


# --- binders -------------------------------------------------------------------------------------

def bind_mul_mat_vec(launcher: Launcher, node: Tensor) -> Callable[[], None]:
    a, b = node.src[0], node.src[1]
    k, m, n = a.ne[0], a.ne[1], b.ne[1]
    args = [np.uint64(launcher.address(a)), np.int64(a.nb[1]),
            np.uint64(launcher.address(b)), np.int64(b.nb[1]),
            np.uint64(launcher.address(node)), np.int64(node.nb[1]),
            np.int32(k), np.int32(m), np.int32(n)]
    grid = (math.ceil(m / MAT_VEC_ROWS_PER_BLOCK),)
    return launcher.launch(f"mul_mat_vec_{ROW_TYPE_NAMES[a.type]}", grid,
                           (32, MAT_VEC_ROWS_PER_BLOCK), args)


def bind_mul_mat_id_vec(launcher: Launcher, node: Tensor) -> Callable[[], None]:
    a, b, ids = node.src[0], node.src[1], node.src[2]
    args = (tensor_args(launcher, a) + tensor_args(launcher, b) + tensor_args(launcher, ids)
        + tensor_args(launcher, node) + [launcher.error_flag(node)])
    grid = (math.ceil(a.ne[1] / MAT_VEC_ROWS_PER_BLOCK), node.ne[1] * node.ne[2])
    return launcher.launch(f"mul_mat_id_vec_{ROW_TYPE_NAMES[a.type]}", grid,
                           (32, MAT_VEC_ROWS_PER_BLOCK), args, checks_indices=True)


def bind_get_rows(launcher: Launcher, node: Tensor) -> Callable[[], None]:
    a, idx = node.src[0], node.src[1]
    args = (tensor_args(launcher, a) + tensor_args(launcher, idx) + tensor_args(launcher, node)
        + [launcher.error_flag(node)])
    block = (_warps(math.ceil(a.ne[0] / 32), 128),)
    grid = (idx.ne[0], idx.ne[1] * idx.ne[2])
    return launcher.launch(f"get_rows_{ROW_TYPE_NAMES[a.type]}", grid, block, args,
                           checks_indices=True)


def bind_binary(launcher: Launcher, node: Tensor) -> Callable[[], None]:
    a, b = node.src[0], node.src[1]
    args = (tensor_args(launcher, a) + tensor_args(launcher, b) + tensor_args(launcher, node)
        + [np.int32(BINARY_KINDS[node.op])])
    return launcher.launch("binary_f32", *row_geometry(node), args)


def bind_glu(launcher: Launcher, node: Tensor) -> Callable[[], None]:
    a, b = _glu_sources(node)
    params = GluParams.of(node)
    args = (tensor_args(launcher, a) + tensor_args(launcher, b) + tensor_args(launcher, node)
        + [np.int32(params.fn), np.int32(b is not None), np.int32(params.swapped),
           np.float32(params.alpha), np.float32(params.limit)])
    return launcher.launch("glu_f32", *row_geometry(node), args)


def row_geometry(t: Tensor) -> tuple[tuple[int, int, int], tuple[int]]:
    """One block per row; a thread per 4 values of it, in whole warps up to 1024."""
    return (t.ne[1], t.ne[2], t.ne[3]), (_warps(math.ceil(t.ne[0] / 4), 1024),)


def bind_norm(launcher: Launcher, node: Tensor) -> Callable[[], None]:
    src = node.src[0]
    args = (tensor_args(launcher, src) + tensor_args(launcher, node)
        + [np.float32(NormParams.of(node).eps), np.int32(NORM_KINDS[node.op])])
    return launcher.launch("norm_f32", *row_geometry(src), args)


def bind_soft_max(launcher: Launcher, node: Tensor) -> Callable[[], None]:
    src, mask, sinks = SoftMaxSources.of(node)
    params = SoftMaxParams.of(node)
    scale, max_bias = params.scale, params.max_bias
    m0, m1, n_head_log2 = alibi_params(src.ne[2], max_bias)
    mask_type = 0 if mask is None else 1 if mask.type == F32 else 2
    args = (tensor_args(launcher, src) + tensor_args(launcher, mask)
        + tensor_args(launcher, sinks) + tensor_args(launcher, node)
        + [np.float32(scale), np.float32(max_bias), m0, m1, np.int32(n_head_log2),
           np.int32(mask_type), np.int32(sinks is not None)])
    return launcher.launch("soft_max_f32", *row_geometry(src), args)


def bind_set_rows(launcher: Launcher, node: Tensor) -> Callable[[], None]:
    src, idx = node.src[0], node.src[1]
    args = (tensor_args(launcher, src) + tensor_args(launcher, idx) + tensor_args(launcher, node)
        + [np.int32(src.type == F16), np.int32(SET_ROWS_KINDS[node.type]),
           np.int32(idx.type == GGMLType.I64), launcher.error_flag(node)])
    block = (_warps(src.ne[0], 256),)
    return launcher.launch("set_rows", (src.ne[1], src.ne[2], src.ne[3]), block, args,
                           checks_indices=True)


def flash_attn_splits(q: Tensor, n_kv: int) -> int:
    """How many blocks share each (row, head, sequence)'s cells: one where the rows and heads
    fill the GPU by themselves, else enough splits for FLASH_ATTN_TARGET_BLOCKS blocks."""
    blocks = q.ne[1] * q.ne[2] * q.ne[3]
    wanted = math.ceil(FLASH_ATTN_TARGET_BLOCKS / blocks)
    return max(1, min(wanted, n_kv // FLASH_ATTN_MIN_SPLIT_CELLS, FLASH_ATTN_MAX_SPLITS))


def bind_flash_attn_vec(launcher: Launcher, node: Tensor) -> Callable[[], None]:
    q, k, v, mask, sinks = FlashAttnSources.of(node)
    params = FlashAttnParams.of(node)
    scale, max_bias, softcap = params.kernel_scale, params.max_bias, params.softcap
    m0, m1, n_head_log2 = alibi_params(q.ne[2], max_bias)
    n_splits = flash_attn_splits(q, k.ne[1])
    partial, kept = np.uint64(0), None
    if n_splits > 1:       # each split's max, sum and unnormalized output
        n_blocks = n_splits * q.ne[1] * q.ne[2] * q.ne[3]
        address, kept = launcher.scratch(4 * n_blocks * (v.ne[0] + 2))
        partial = np.uint64(address)
    args = (tensor_args(launcher, q) + tensor_args(launcher, k) + tensor_args(launcher, v)
        + tensor_args(launcher, mask) + tensor_args(launcher, sinks)
        + tensor_args(launcher, node)
        + [np.float32(scale), np.float32(softcap), np.float32(max_bias), m0, m1,
           np.int32(n_head_log2), np.int32(k.type == F16), np.int32(v.type == F16),
           np.int32(mask is not None), np.int32(sinks is not None), partial,
           np.int32(n_splits)])
    attend = launcher.launch("flash_attn_ext_vec", (q.ne[1] * n_splits, q.ne[2], q.ne[3]),
                             (FLASH_ATTN_VEC_THREADS,), args)
    if n_splits == 1:
        return attend
    combine = launcher.launch(
        "flash_attn_ext_combine", (q.ne[1], q.ne[2], q.ne[3]), (FLASH_ATTN_VEC_THREADS,),
        tensor_args(launcher, sinks) + tensor_args(launcher, node)
        + [partial, np.int32(n_splits), np.int32(sinks is not None)])

    def call(partials=kept) -> None:    # the partial results live as long as the call
        attend()
        combine()
    return call


def rope_scalars(params: RopeParams) -> list:
    """theta_scale, freq_scale, ext_factor, mscale, corr_low and corr_span, computed as the
    array kernels compute them (so the angles round alike)."""
    n_dims = params.n_dims
    n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = params.yarn
    theta_scale = np.float32(freq_base) ** np.float32(-2.0 / n_dims)
    mscale = yarn_mscale(attn_factor, freq_scale, ext_factor)
    low, span = 0.0, 1.0
    if ext_factor != 0.0:
        low, high = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
        span = yarn_ramp_width(low, high)
    return [np.float32(theta_scale), np.float32(freq_scale), np.float32(ext_factor),
            np.float32(mscale), np.float32(low), np.float32(span)]


def bind_rope(launcher: Launcher, node: Tensor) -> Callable[[], None]:
    src, pos, ff = RopeSources.of(node)
    params = RopeParams.of(node)
    n_dims, mode = params.n_dims, params.mode
    args = (tensor_args(launcher, src) + tensor_args(launcher, pos) + tensor_args(launcher, ff)
        + tensor_args(launcher, node)
        + [np.int32(n_dims), np.int32(mode == RopeMode.NEOX), np.int32(node.type == F16)]
        + rope_scalars(params) + [np.int32(ff is not None)])
    block = (_warps(max(n_dims // 2, src.ne[0] - n_dims), 256),)
    return launcher.launch("rope", (src.ne[1], src.ne[2], src.ne[3]), block, args)


def dequantize_args(address: int, row_strides: Sequence[int], ne: Sequence[int],
                    out_address: int) -> tuple[tuple[int], tuple[int], list]:
    """Grid, block and arguments of dequantize_{f32,f16}_<type>: rows (ne1, ne2, ne3) of K
    values at ``address`` with byte strides ``row_strides`` (nb1, nb2, nb3) into contiguous
    values at ``out_address``."""
    k, ne1, ne2, ne3 = ne
    n_chunks = math.ceil(k / 32) * ne1 * ne2 * ne3
    block = 256
    grid = (max(1, min(math.ceil(n_chunks / block), 1 << 20)),)   # the kernel grid-strides
    args = ([np.uint64(address)] + [np.int64(s) for s in row_strides]
        + [np.int32(ne1), np.int32(ne2), np.uint64(out_address), np.int32(k), np.int64(n_chunks)])
    return grid, (block,), args
