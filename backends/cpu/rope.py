"""ROPE of float32 rows in the normal and NeoX modes, in the compiled kernels.

A decode step ropes Q and K of every layer for one token: as numpy calls each ROPE cost about
45 µs of call overhead for microseconds of arithmetic. The angles are still computed by the
array kernel's functions, once per step (shared through the backend's memo); the rotation is
one compiled call, with the array kernel's float32 operations, so results are equal.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.backends.array.env import same_memory
from polydev.backends.array.rope import RopeTables, rope_cos_sin, rope_thetas
from polydev.ops import Op, RopeMode, RopeParams, RopeSources
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .native import kernels, loaded_kernels
from .native.arguments import RopeArguments, TensorWords
from .replay import CallCode, replayable


def native_rope_ok(node: Tensor) -> bool:
    a = node.src[0]
    return (loaded_kernels() is not None
            and RopeParams.of(node).mode in (RopeMode.NORMAL, RopeMode.NEOX)
            and a.type == GGMLType.F32 and node.type == GGMLType.F32
            and a.nb[0] == 4 and node.nb[0] == 4)


def bind_native_rope(env, node: Tensor) -> Callable[[], None]:
    params = RopeParams.of(node)
    n_dims, mode, n_offs, sections = params.n_dims, params.mode, params.n_offs, params.sections
    half = n_dims // 2
    a, pos_t, ff_t = RopeSources.of(node)
    pos = env.view(pos_t).reshape(-1)
    freq_factors = env.view(ff_t).reshape(-1) if ff_t is not None else None

    tables = RopeTables(np, mode, n_dims, half, params)

    def angles():
        thetas = rope_thetas(np, pos, n_dims, half, params.freq_base, tables)
        cos, sin = rope_cos_sin(np, thetas, params, tables, freq_factors)
        cos = np.ascontiguousarray(cos, dtype=np.float32)
        sin = np.ascontiguousarray(sin, dtype=np.float32)
        # the addresses too: an array's .ctypes took about 3 µs, as long as the rotation
        return cos, sin, cos.ctypes.data, sin.ctypes.data
    # ROPEs of a step share one computation of the angles (this key holds contiguous float32
    # arrays and their addresses, which the memo keeps alive)
    key = ("rope-native", mode, n_dims, half, params.yarn, sections)
    inputs = (pos,) if freq_factors is None else (pos, freq_factors)
    args = RopeArguments(a=TensorWords.of(env.view(a).ctypes.data, a),
                         d=TensorWords.of(env.view(node).ctypes.data, node), n_offs=n_offs,
                         half=half, neox=int(mode == RopeMode.NEOX),
                         copy_rest=int(not same_memory(node, a)))
    rope, where = kernels().rope_f32_packed, args.address

    def run() -> None:
        _, _, cos, sin = env.memo(key, inputs, angles)
        rope(where, cos, sin)
    run.keep_alive = args

    if not all(is_input(t) for t in (pos_t, ff_t) if t is not None):
        return run          # a prepare runs before its run's calls: it would read them early
    replayable(run, CallCode.ROPE, args)
    record = run.native.record        # (the prepare holds the record, not the call: no cycle)
    held = [None]

    def set_angles() -> bool:
        """The replay's prepare: this step's angle tables, beside the record, held here (a
        later ROPE of the run with other inputs replaces the memo's entry before this one's
        call reads the tables)."""
        held[0] = env.memo(key, inputs, angles)
        _, _, record.p0, record.p1 = held[0]
        return False
    run.native.prepare = set_angles
    return run


def is_input(t: Tensor) -> bool:
    """Whether ``t``'s values are set before a graph runs (a leaf, or a view of one), not
    computed by one of its nodes."""
    while t.view_src is not None:
        t = t.view_src
    return t.op == Op.NONE
