"""Consecutive products of one activation, replayed as one compiled call.

A layer's q, k and v products multiply one activation, as do its gate and up; the model's
graph puts each such set next to each other (``StepGraph.together``). Replayed one by one, each
product quantizes the activation again and opens a parallel region of its own, and a small one
(a 1B-class llama's k and v: 512 rows, a third of a megabyte) spends much of its time on that
and on the ramp of its threads' streams: at decode those read their weights at 24-26 GB/s
where the large products read 33-35. Here a replayed run's consecutive products from
interleaved copies whose records share the activation (its address, stride and rows, K, the
threads and the integers it is quantized to) over types with one block size become one
``MUL_MAT_INTERLEAVED_SHARED`` call (``pd_mul_mat_interleaved_shared``, native/interleaved.c):
one quantization and one parallel region over all their weights. A mixture's gate and up
experts (MUL_MAT_ID of one activation and one routing) join the same way
(``pd_mul_mat_id_interleaved_shared``): the pairs sorted by expert, their rows gathered and
quantized once, one parallel region over both weights' experts in use.

The joined call reads each member's own record, so the members' prepares (which write their
copies' addresses) work as before; a status other than 0 makes the replay run the members'
Python calls one by one, which raise the error it stands for.
"""

from __future__ import annotations

import ctypes
from typing import Callable

from .call_record import CallCode, CallRecord
from .native import kernels
from .native.arguments import SharedInputArguments

Call = Callable[[], None]

MAX_SHARED = 8                       # SHARED_MAX in interleaved.c
# a joinable call's code: the joined call's code, and the record's words the calls must share
_JOINS = {
    CallCode.MUL_MAT_INTERLEAVED: (CallCode.MUL_MAT_INTERLEAVED_SHARED,
                                   ("x", "x_stride", "n_rows", "K", "n_threads", "bits")),
    CallCode.MUL_MAT_ID_INTERLEAVED: (CallCode.MUL_MAT_ID_INTERLEAVED_SHARED,
                                      ("K", "b", "n_b", "ids", "ids_stride", "n_tokens",
                                       "n_used", "n_threads", "bits")),
}


class SharedInputCall:
    """The record of one replayed call standing for ``calls``, products of one activation
    (``shared_input_groups`` made the group)."""

    def __init__(self, calls: list[Call]) -> None:
        members = [call.native.args for call in calls]     # the calls keep them alive
        self._addresses = (ctypes.c_int64 * len(members))(*(m.address for m in members))
        self.args = SharedInputArguments(n_products=len(members),
                                         records=ctypes.addressof(self._addresses))
        joined, _ = _JOINS[CallCode(calls[0].native.record.op)]
        self.record = CallRecord(int(joined), self.args.address, 0.0, 0.0)


def shared_input_groups(calls: list[Call]) -> list[list[Call]]:
    """``calls`` (replayable ones) in order, in groups: each run of consecutive products of one
    activation together, every other call alone."""
    groups: list[list[Call]] = []
    for call in calls:
        last = groups[-1] if groups else None
        if last is not None and len(last) < MAX_SHARED and _share_input(last[0], call):
            last.append(call)
        else:
            groups.append([call])
    return groups


def _share_input(first: Call, call: Call) -> bool:
    a, b = first.native, call.native
    join = _JOINS.get(a.record.op)
    if join is None or b.record.op != a.record.op:
        return False
    block_size = kernels().block_size
    return (all(getattr(a.args, word) == getattr(b.args, word) for word in join[1])
            and block_size(a.args.type) == block_size(b.args.type))
