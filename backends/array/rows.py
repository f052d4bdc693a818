"""Rows of an array without copies, and blocks of them that keep host temporaries small.

An element-wise kernel over a whole prompt makes temporaries as large as its tensors (a
512-token FFN activation is 3 MiB per temporary); run block by block on the host they stay
in cache and bound the kernel's working memory. On a GPU a whole-tensor call is better, so
callers block only numpy arrays.
"""

from __future__ import annotations

from typing import Any, Iterator

HOST_BLOCK_ELEMENTS = 1 << 16       # 256 KiB of float32 per temporary


def as_rows(a: Any, n: int) -> Any | None:
    """``a`` as a 2-D (rows, n) view with unit element stride, or None if that needs a copy."""
    if a.strides[-1] != a.itemsize:
        return None
    try:
        return a.reshape((-1, n), copy=False)
    except ValueError:                  # the rows are not one stride apart
        return None
    except TypeError:                   # numpy before 2.1, CuPy: no copy=; a view's shape
        rows = a.view()
        try:
            rows.shape = (-1, n)
        except AttributeError:
            return None
        return rows


def row_blocks(n_rows: int, n: int, budget: int | None = None) -> Iterator[slice]:
    """Slices of ``n_rows`` rows of ``n`` elements, each at most ``budget`` elements (by
    default ``HOST_BLOCK_ELEMENTS``), but at least one row."""
    step = max(1, (budget or HOST_BLOCK_ELEMENTS) // max(1, n))
    for r in range(0, n_rows, step):
        yield slice(r, min(n_rows, r + step))
