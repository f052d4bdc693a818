"""What a replayed call is to the C replay (native/replay.c): the code naming its kernel, and
the record the replay's table points to."""

from __future__ import annotations

import ctypes
from enum import IntEnum

__all__ = ["CallCode", "CallRecord"]


class CallCode(IntEnum):
    """The kernel a replayed call runs (``PD_CALL_*`` in native/replay.c)."""

    MUL_MAT = 0
    MUL_MAT_INT16 = 1
    MUL_MAT_INTERLEAVED = 2
    MUL_MAT_ID_INTERLEAVED = 3
    ROPE = 4
    RMS_NORM = 5
    SET_ROWS = 6
    FLASH_ATTN = 7
    GLU = 8
    BINARY = 9
    SOFT_MAX = 10
    TOP_K = 11
    SUM_ROWS = 12
    CLAMP = 13
    GET_F32_ROWS = 14
    GET_ROWS = 15
    MUL_MAT_INTERLEAVED_SHARED = 16
    MUL_MAT_ID_INTERLEAVED_SHARED = 17


class CallRecord(ctypes.Structure):
    """One replayed call (``pd_call``): its code, its argument record's address, and the
    float arguments its entry point takes beside the record."""

    _fields_ = [("op", ctypes.c_int64), ("args", ctypes.c_int64), ("f0", ctypes.c_float),
                ("f1", ctypes.c_float)]
