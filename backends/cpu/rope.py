"""ROPE of float32 rows in the normal and NeoX modes, in the compiled kernels.

A decode step ropes Q and K of every layer for one token: as numpy calls each ROPE cost about
45 µs of call overhead for microseconds of arithmetic. The call computes its angles itself
(kernels.c's rope_angles: the array kernel's float32 operations, with libm's cosf and sinf
where numpy's float32 ones are an ulp off in about 1 case in 7) into tables the ROPEs of a step
share: the first to run with new positions fills them, the others find them filled. So a ROPE
is one replayable call with nothing to do in Python between steps (as the array kernel's
functions, once per step through a prepare, the angles took about 0.15 ms of a qwen3moe
1B-class decode step with its caches cold), and it may read positions a graph computes.
"""

from __future__ import annotations

import ctypes
from typing import Callable

import numpy as np

from polydev.backends.array.env import same_memory
from polydev.backends.array.rope import RopeTables
from polydev.ops import RopeMode, RopeParams, RopeSources, yarn_mscale
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .native import kernels, loaded_kernels
from .native.arguments import RopeAngles, RopeArguments, TensorWords, address_of
from .replay import CallCode, replayable


def native_rope_ok(node: Tensor) -> bool:
    """Float32 rows in the normal or NeoX mode, the positions (and frequency factors)
    contiguous: the kernel reads them where they are, every step."""
    a, pos, freq_factors = RopeSources.of(node)
    return (loaded_kernels() is not None
            and RopeParams.of(node).mode in (RopeMode.NORMAL, RopeMode.NEOX)
            and a.type == GGMLType.F32 and node.type == GGMLType.F32
            and a.nb[0] == 4 and node.nb[0] == 4
            and pos.type == GGMLType.I32 and pos.is_contiguous()
            and (freq_factors is None or (freq_factors.type == GGMLType.F32
                                          and freq_factors.is_contiguous())))


def bind_native_rope(env, node: Tensor) -> Callable[[], None]:
    params = RopeParams.of(node)
    half = params.n_dims // 2
    a, pos_t, ff_t = RopeSources.of(node)
    angles = AngleTable.shared(env, params, env.view(pos_t).reshape(-1),
                               env.view(ff_t).reshape(-1) if ff_t is not None else None)
    args = RopeArguments(a=TensorWords.of(env.view(a).ctypes.data, a),
                         d=TensorWords.of(env.view(node).ctypes.data, node),
                         n_offs=params.n_offs, half=half,
                         neox=int(params.mode == RopeMode.NEOX),
                         copy_rest=int(not same_memory(node, a)), angles=angles.address)
    rope, where = kernels().rope_f32_packed, args.address

    def run() -> None:
        rope(where)
    run.keep_alive = (args, angles)
    return replayable(run, CallCode.ROPE, args)


class AngleTable:
    """The angle tables (kernels.c's pd_rope_angles) of the ROPEs that read the same positions
    with the same parameters, shared through the stream's env while a bound call holds them:
    the first call of a step with new positions (or frequency factors) fills them, the others
    compare them."""

    def __init__(self, params: RopeParams, pos: np.ndarray,
                 freq_factors: np.ndarray | None) -> None:
        half = params.n_dims // 2
        _, freq_base, freq_scale, ext_factor, attn_factor, _, _ = params.yarn
        ramp = RopeTables(np, RopeMode.NORMAL, params.n_dims, half, params).ramp_mix
        tables = np.empty((2, pos.size, half), np.float32)
        seen = np.empty(pos.size + half, np.int32)      # positions, then factors' bits
        self._arrays = (pos, freq_factors, ramp, tables, seen)   # the C side reads them
        self._record = RopeAngles(
            pos=pos.ctypes.data, n_tokens=pos.size, half=half,
            freq_factors=address_of(freq_factors), ramp_mix=address_of(ramp),
            theta_scale=float(np.float32(freq_base) ** np.float32(-2.0 / params.n_dims)),
            freq_scale=freq_scale,
            mscale=float(yarn_mscale(attn_factor, freq_scale, ext_factor)),
            cos_t=tables[0].ctypes.data, sin_t=tables[1].ctypes.data, seen=seen.ctypes.data,
            valid=0)

    @property
    def address(self) -> int:
        """Where the C struct is: what a ROPE's record points to."""
        return ctypes.addressof(self._record)

    @classmethod
    def shared(cls, env, params: RopeParams, pos: np.ndarray,
               freq_factors: np.ndarray | None) -> "AngleTable":
        """The table of ``env``'s ROPEs with these positions (their memory) and parameters,
        made where none is held."""
        key = ("rope-angles", pos.ctypes.data, pos.size, address_of(freq_factors),
               params.n_dims, params.yarn)
        table = env.shared.get(key)
        if table is None:
            table = env.shared[key] = cls(params, pos, freq_factors)
        return table
