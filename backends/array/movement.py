"""Data movement: DUP/CONT/CPY with type conversion, REPEAT, CONCAT, PAD, GET_ROWS, SET_ROWS."""

from __future__ import annotations

from typing import Callable

from polydev.errors import OutOfBoundsError
from polydev.tensor import Tensor

from .broadcast import repeat_views
from .env import needs_codec, storage, values_of


def _in_element_order(values, shape):
    """``values`` laid out in ``shape``, keeping row-major element order (ggml's cpy)."""
    return values if tuple(values.shape) == tuple(shape) else values.reshape(shape)


def bind_copy(env, node: Tensor) -> Callable[[], None]:
    """DUP, CONT and CPY: copy src0 into the node's memory in element order, converting."""
    xp = env.xp
    src = node.src[0]
    dst = storage(env, node)
    if not needs_codec(src.type) and not needs_codec(node.type):
        s = env.view(src)
        return lambda: xp.copyto(dst, _in_element_order(s, dst.shape), casting="unsafe")
    encode = needs_codec(node.type)

    def run() -> None:
        values = _in_element_order(values_of(env, src), node.shape)
        if encode:
            values = env.quantize(xp.ascontiguousarray(values, dtype=xp.float32), node.type)
        xp.copyto(dst, values.reshape(dst.shape), casting="unsafe")
    return run


def bind_repeat(env, node: Tensor) -> Callable[[], None]:
    (d,), a = repeat_views([env.view(node)], env.view(node.src[0]))
    return lambda: env.xp.copyto(d, a, casting="unsafe")


def bind_concat(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    axis = 3 - node.op_params[0]
    a, b, d = env.view(node.src[0]), env.view(node.src[1]), env.view(node)
    n = a.shape[axis]
    head = (slice(None),) * axis
    d_a, d_b = d[head + (slice(0, n),)], d[head + (slice(n, None),)]

    def run() -> None:
        xp.copyto(d_a, a, casting="unsafe")
        xp.copyto(d_b, b, casting="unsafe")
    return run



def bind_pad(env, node: Tensor) -> Callable[[], None]:
    """PAD: the source in the middle, zeros (or, circular, wrapped values) around it."""
    xp = env.xp
    a, d = env.view(node.src[0]), env.view(node)
    params = node.op_params
    # numpy axis k is ggml dimension 3 - k
    left = [params[2 * (3 - k)] for k in range(4)]
    if params[8]:
        index = [(xp.arange(d.shape[k]) - left[k]) % a.shape[k] for k in range(4)]

        def run_circular() -> None:
            xp.copyto(d, a[xp.ix_(*index)], casting="unsafe")
        return run_circular
    centre = tuple(slice(left[k], left[k] + a.shape[k]) for k in range(4))
    borders = []          # the padding as disjoint slabs: axis k's slabs span the centre of axes < k
    for k in range(4):
        head = centre[:k]
        if left[k] > 0:
            borders.append(d[head + (slice(0, left[k]),)])
        if centre[k].stop < d.shape[k]:
            borders.append(d[head + (slice(centre[k].stop, None),)])
    inner = d[centre]

    def run() -> None:
        for slab in borders:
            slab.fill(0)
        xp.copyto(inner, a, casting="unsafe")
    return run

def _check_indices(xp, idx, limit: int, op: str) -> None:
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= limit):
        raise OutOfBoundsError(f"{op}: row index out of range [0, {limit}): "
                               f"min {int(idx.min())}, max {int(idx.max())}")


def bind_get_rows(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    a_t, idx_t = node.src[0], node.src[1]
    src = storage(env, a_t)                      # (a3, a2, a1, row)
    idx = env.view(idx_t)[0]                     # (a3, a2, n)
    d = env.view(node)                           # (a3, a2, n, ne0)
    a3, a2, a1 = src.shape[:3]
    decode = needs_codec(a_t.type)
    i3, i2 = xp.arange(a3)[:, None, None], xp.arange(a2)[None, :, None]

    if a3 == 1 and a2 == 1 and not decode and src.dtype == d.dtype:
        rows, flat_idx, out = src[0, 0], idx.reshape(-1), d[0, 0]

        def run_take() -> None:
            _check_indices(xp, flat_idx, a1, "get_rows")
            xp.take(rows, flat_idx, axis=0, out=out)
        return run_take

    def run() -> None:
        _check_indices(xp, idx, a1, "get_rows")
        gathered = src[i3, i2, idx]
        if decode:
            gathered = env.dequantize(gathered, a_t.type)
        xp.copyto(d, gathered.reshape(d.shape), casting="unsafe")
    return run


def bind_set_rows(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    b_t, c_t = node.src[0], node.src[1]
    dst = storage(env, node)                     # (a3, a2, a1, row)
    rows = env.view(b_t)                         # (a3, a2, n, ne0)
    idx_all = env.view(c_t)[0]                   # (c2, c1, n)
    a3, a2, a1 = dst.shape[:3]
    # ggml broadcasts the indices over dims 2 and 3 with i % c.ne
    ci3 = xp.arange(a3)[:, None] % idx_all.shape[0]
    ci2 = xp.arange(a2)[None, :] % idx_all.shape[1]
    i3, i2 = xp.arange(a3)[:, None, None], xp.arange(a2)[None, :, None]
    encode = needs_codec(node.type)

    def run() -> None:
        idx = idx_all[ci3, ci2]                  # (a3, a2, n)
        _check_indices(xp, idx, a1, "set_rows")
        values = rows
        if encode:
            values = env.quantize(xp.ascontiguousarray(rows, dtype=xp.float32), node.type)
        dst[i3, i2, idx] = values
    return run
