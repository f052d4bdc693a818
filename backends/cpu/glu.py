"""GLU (SWIGLU, GEGLU) of float32 rows in the compiled kernels (native/glu.c).

The array kernel computes silu(x) * g as four numpy calls per block of rows (gelu(x) * g as
ten): on a decode step's row (5632 values at the 1B class) about 39 µs, ten times the
arithmetic. The compiled kernel does them in one pass (native/glu.c: the same float32
operations, GELU's tanh apart).
"""

from __future__ import annotations

from typing import Callable

from polydev.backends.array.rows import as_rows
from polydev.ops import GluOp, GluParams
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .native import kernels, loaded_kernels
from .native.arguments import GluArguments
from .replay import CallCode, replayable

F32 = GGMLType.F32
_FUNCTIONS = {GluOp.SWIGLU: 0, GluOp.GEGLU: 1}      # glu.c's GLU_SWIGLU, GLU_GEGLU


def native_glu_ok(node: Tensor) -> bool:
    srcs = [s for s in node.src if s is not None]
    return (loaded_kernels() is not None and GluParams.of(node).fn in _FUNCTIONS
            and node.type == F32 and all(s.type == F32 for s in srcs))


def bind_native_glu(env, node: Tensor) -> Callable[[], None]:
    d, a = env.view(node), env.view(node.src[0])
    n = d.shape[-1]
    if len(node.src) > 1 and node.src[1] is not None:
        x, g = a, env.view(node.src[1])
    else:
        x, g = a[..., :n], a[..., n:]
        if GluParams.of(node).swapped:              # [gate, x]
            x, g = g, x
    d2, x2, g2 = as_rows(d, n), as_rows(x, n), as_rows(g, n)
    if d2 is None or x2 is None or g2 is None:      # not rows of one stride: the array kernel
        from polydev.backends.array.elementwise import bind_glu
        return bind_glu(env, node)
    args = GluArguments(fn=_FUNCTIONS[GluParams.of(node).fn], x=x2.ctypes.data,
                        xs=x2.strides[0] // 4, g=g2.ctypes.data, gs=g2.strides[0] // 4,
                        d=d2.ctypes.data, ds=d2.strides[0] // 4, n_rows=d2.shape[0], n=n,
                        n_threads=env.n_threads)
    glu, where = kernels().glu_f32_packed, args.address

    def run() -> None:
        glu(where)
    run.keep_alive = args
    return replayable(run, CallCode.GLU, args)
