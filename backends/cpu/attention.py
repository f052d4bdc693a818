"""FLASH_ATTN_EXT over an fp16 KV cache, in the compiled kernels (native/attention.c).

A decode step's attention is a few small products per head: as numpy calls it costs far more
in calls and fp16 conversions than in arithmetic. The compiled kernel runs ggml's online
softmax per (sequence, query, head), reading K and V as fp16 and skipping the cells the mask
hides, as ggml's CPU kernel does. Many queries (a prompt) take its blocked form: tiles of
queries times blocks of cells converted to float32 once, multiplied in registers, blocks the
mask hides skipped whole; the array kernel's batched BLAS products computed every cell, and
materialized the scores of a long prompt (512 x 4096 x heads floats).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.ops import FlashAttnParams, FlashAttnSources, alibi_slopes
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .native import kernels, loaded_kernels
from .native.arguments import FlashAttnArguments, TensorWords, address_of
from .replay import CallCode, replayable

F16, F32 = GGMLType.F16, GGMLType.F32


def native_flash_attn_ok(node: Tensor) -> bool:
    q, k, v, mask, sinks = FlashAttnSources.of(node)
    return (loaded_kernels() is not None and q.type == F32 and k.type == F16 and v.type == F16
            and node.type == F32 and node.is_contiguous()
            and q.nb[0] == 4 and k.nb[0] == 2 and v.nb[0] == 2
            and (mask is None or mask.type == F16)
            and (sinks is None or (sinks.type == F32 and sinks.is_contiguous())))


def bind_native_flash_attn(env, node: Tensor) -> Callable[[], None]:
    lib = kernels()
    q, k, v, mask, sinks = FlashAttnSources.of(node)
    params = FlashAttnParams.of(node)
    scale, max_bias, softcap = params.kernel_scale, params.max_bias, params.softcap
    n_head = q.ne[2]
    slopes = (np.ascontiguousarray(alibi_slopes(n_head, max_bias), dtype=np.float32)
              if max_bias > 0 else None)

    def tensor(t: Tensor | None) -> TensorWords:
        return TensorWords.of(env.view(t).ctypes.data if t is not None else 0, t)
    # the cells [lo, hi): all of them (the kernel skips the ones the mask hides)
    args = FlashAttnArguments(q=tensor(q), k=tensor(k), v=tensor(v), mask=tensor(mask),
                              out=tensor(node), lo=0, hi=k.ne[1], slopes=address_of(slopes),
                              sinks=address_of(env.view(sinks) if sinks is not None else None),
                              n_threads=env.n_threads)
    run_kernel, where = lib.flash_attn_f16_packed, args.address

    def run() -> None:
        run_kernel(where, scale, softcap)
    run.keep_alive = (args, slopes)           # their memory outlives the bound call
    return replayable(run, CallCode.FLASH_ATTN, args, f0=scale, f1=softcap)
