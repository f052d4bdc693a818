"""ggml's repeat-broadcasting expressed as numpy broadcasting.

ggml repeats a smaller operand whenever each dimension of the larger one is a multiple of the
smaller's (index i of the big one reads i % n of the small one). numpy only broadcasts
dimensions of size 1, so each dimension where the sizes differ and the small one is not 1 is
split into (big // small, small) on the big side and (1, small) on the small side. Splitting a
dimension is always a zero-copy view, strided or not.
"""

from __future__ import annotations

from typing import Any, Sequence


def split_shapes(big: Sequence[int], small: Sequence[int]) -> tuple[tuple, tuple]:
    big_out: list[int] = []
    small_out: list[int] = []
    for b, s in zip(big, small):
        if s == b or s == 1:
            big_out.append(b)
            small_out.append(s)
        else:
            big_out += [b // s, s]
            small_out += [1, s]
    return tuple(big_out), tuple(small_out)


def repeat_views(big_arrays: Sequence[Any], small: Any) -> tuple[list[Any], Any]:
    """Reshape arrays of the big shape and one of the small shape so numpy broadcasts them
    with ggml's repeat semantics."""
    big_shape, small_shape = split_shapes(big_arrays[0].shape, small.shape)
    if big_shape == tuple(big_arrays[0].shape):
        return list(big_arrays), small
    return [a.reshape(big_shape) for a in big_arrays], small.reshape(small_shape)
