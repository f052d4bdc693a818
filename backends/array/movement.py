"""Data movement: DUP/CONT/CPY with type conversion, REPEAT, CONCAT, PAD, PAD_REFLECT_1D, ROLL,
ACC, SET, GET_ROWS, GET_ROWS_BACK and SET_ROWS."""

from __future__ import annotations

from typing import Callable

from polydev.errors import OutOfBoundsError
from polydev.ops import ConcatParams, Op, PadParams, PadReflect1dParams, RollParams, WindowParams
from polydev.tensor import Tensor

from .broadcast import repeat_views
from .env import needs_codec, same_memory, storage, values_of, window


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
    axis = 3 - ConcatParams.of(node).dim
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
    params = PadParams.of(node)
    left = params.left[::-1]                    # numpy axis k is ggml dimension 3 - k
    if params.circular:
        index = [(xp.arange(d.shape[k]) - left[k]) % a.shape[k] for k in range(4)]

        def run_circular() -> None:
            xp.copyto(d, a[xp.ix_(*index)], casting="unsafe")
        return run_circular
    centre = tuple(slice(left[k], left[k] + a.shape[k]) for k in range(4))
    # the padding as disjoint slabs: axis k's slabs span the centre of axes < k
    borders = []
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


def bind_pad_reflect_1d(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    params = PadReflect1dParams.of(node)
    p0, p1 = params.p0, params.p1
    a, d = env.view(node.src[0]), env.view(node)
    n = a.shape[-1]
    inner = d[..., p0:p0 + n]
    # the mirrored edges exclude the edge element itself: d[p0 - i] = a[i], d[p0+n-1 + i] = a[n-1-i]
    left, left_src = d[..., :p0], a[..., p0:0:-1]
    right, right_src = (d[..., p0 + n:], a[..., n - 2:n - 2 - p1:-1] if n - 2 - p1 >= 0
        else a[..., n - 2::-1])

    def run() -> None:
        xp.copyto(inner, a)
        xp.copyto(left, left_src)
        xp.copyto(right, right_src)
    return run


def _roll_pieces(d, a, shifts_by_axis):
    """(destination, source) slab pairs that together rotate ``a`` into ``d``."""
    pairs = [((), ())]
    for axis, shift in enumerate(shifts_by_axis):
        n = a.shape[axis]
        s = shift % n
        if s == 0:
            pairs = [(dk + (slice(None),), sk + (slice(None),)) for dk, sk in pairs]
            continue
        splits = [(slice(s, None), slice(0, n - s)), (slice(0, s), slice(n - s, None))]
        pairs = [(dk + (ds,), sk + (ss,)) for dk, sk in pairs for ds, ss in splits]
    return [(d[dk], a[sk]) for dk, sk in pairs]


def bind_roll(env, node: Tensor) -> Callable[[], None]:
    """ROLL: d[i] = a[(i - shift) mod n] along each dimension, as at most 16 slab copies."""
    xp = env.xp
    shifts = RollParams.of(node).shifts[::-1]               # numpy's axis order
    pieces = _roll_pieces(env.view(node), env.view(node.src[0]), shifts)

    def run() -> None:
        for dst, src in pieces:
            xp.copyto(dst, src)
    return run


def bind_window(env, node: Tensor) -> Callable[[], None]:
    """ACC and SET: copy a (unless in place), then add or write b into the strided window."""
    xp = env.xp
    a_t, b_t = node.src[0], node.src[1]
    params = WindowParams.of(node)
    nb1, nb2, nb3, offset = params.nb1, params.nb2, params.nb3, params.offset
    d, a, b = env.view(node), env.view(a_t), env.view(b_t)
    target = window(env, node, b_t.ne, (node.traits.type_size, nb1, nb2, nb3), offset)
    copy_first = not same_memory(node, a_t)
    accumulate = node.op == Op.ACC

    def run() -> None:
        if copy_first:
            xp.copyto(d, a)
        if accumulate:
            xp.add(target, b, out=target)
        else:
            xp.copyto(target, b)
    return run


def check_indices(xp, idx, limit: int, op: str) -> None:
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
            check_indices(xp, flat_idx, a1, "get_rows")
            xp.take(rows, flat_idx, axis=0, out=out)
        return run_take

    def run() -> None:
        check_indices(xp, idx, a1, "get_rows")
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
        check_indices(xp, idx, a1, "set_rows")
        values = rows
        if encode:
            values = env.quantize(xp.ascontiguousarray(rows, dtype=xp.float32), node.type)
        dst[i3, i2, idx] = values
    return run


def bind_get_rows_back(env, node: Tensor) -> Callable[[], None]:
    """GET_ROWS_BACK: zero the result, then add row i of a into row b[i] (repeats add up)."""
    xp = env.xp
    a, idx = env.view(node.src[0])[0, 0], env.view(node.src[1]).reshape(-1)
    d = env.view(node)[0, 0]

    def run() -> None:
        check_indices(xp, idx, d.shape[0], "get_rows_back")
        d.fill(0)
        xp.add.at(d, idx, a)
    return run
