"""SET_ROWS of float32 rows into float32 or fp16 rows (the KV cache) in the compiled kernels.

A decode step writes one K and one V row per layer; as numpy fancy indexing with an index
check and a float16 conversion each write cost about 25 µs. The compiled kernel checks every
index first (nothing is written when one is out of range, and the array kernel's check then
raises the same OutOfBoundsError), broadcasts the indices as ggml does, and rounds to fp16 as
numpy does.
"""

from __future__ import annotations

from typing import Callable

from polydev.backends.array.movement import bind_set_rows
from polydev.tensor import Tensor
from polydev.types import TYPE_TRAITS, GGMLType

from .native import kernels, loaded_kernels
from .native.arguments import SetRowsArguments, TensorWords
from .replay import CallCode, replayable

_DST_TYPES = (GGMLType.F32, GGMLType.F16)


def native_set_rows_ok(node: Tensor) -> bool:
    b, c = node.src[0], node.src[1]
    return (loaded_kernels() is not None and b.type == GGMLType.F32 and node.type in _DST_TYPES
            and c.type in (GGMLType.I32, GGMLType.I64) and b.nb[0] == 4
            and node.nb[0] == TYPE_TRAITS[node.type].type_size)


def bind_native_set_rows(env, node: Tensor) -> Callable[[], None]:
    b, c = node.src[0], node.src[1]
    args = SetRowsArguments(src=TensorWords.of(env.view(b).ctypes.data, b),
                            dst=TensorWords.of(env.view(node).ctypes.data, node),
                            idx=TensorWords.of(env.view(c).ctypes.data, c),
                            idx64=int(c.type == GGMLType.I64),
                            dst_f16=int(node.type == GGMLType.F16))
    set_rows, where = kernels().set_rows_f32_packed, args.address
    checked = bind_set_rows(env, node)   # raises the error for a bad index; fp16 without F16C

    def run() -> None:
        if set_rows(where):
            checked()
    run.keep_alive = args
    return replayable(run, CallCode.SET_ROWS, args)
