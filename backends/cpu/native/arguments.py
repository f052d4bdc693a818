"""The argument records of the compiled kernels' ``*_packed`` entry points, field by field.

A binder binds a kernel call once and the plan replays it every step, so each packed entry
point takes the call's integer arguments (pointers, strides, sizes, flags) as one array of
int64 words, in the order of the unpacked C function's parameters, and a call converts that
one address through ctypes instead of each argument (about 0.3 µs apiece). A record here is
that array with a name per word: its fields are named as the C parameters they carry, so a
binder writes ``args.p = ...`` where it would patch ``args[1]``, and the test of the records
checks the names and their order against the C sources. Float arguments are passed beside the
record, as the packed function declares them.

A pointer is stored as its address (0 for NULL). The caller keeps the record alive for as long
as the bound call may run: the C side reads the record's own memory.
"""

from __future__ import annotations

import ctypes
from typing import Any, ClassVar

import numpy as np

__all__ = ["PackedArguments", "TensorWords", "address_of", "MulMatArguments",
           "MulMatInterleavedArguments", "SharedInputArguments",
           "MulMatIdInterleavedArguments", "GluArguments",
           "RopeArguments", "RopeAngles", "RmsNormArguments", "SetRowsArguments",
           "FlashAttnArguments", "BinaryArguments", "RowArguments", "GetRowsArguments",
           "GetF32RowsArguments"]

_word = ctypes.c_int64
_four_words = ctypes.c_int64 * 4


def address_of(array: np.ndarray | None) -> int:
    """The address of ``array``'s first byte, or 0 (NULL) for no array."""
    return 0 if array is None else array.ctypes.data


def _words(*names: str) -> list[tuple[str, Any]]:
    return [(name, _word) for name in names]


class TensorWords(ctypes.Structure):
    """A tensor argument (``pd_tensor`` in blocks.h, as the OpenCL and CUDA kernels take
    theirs): the address of its first byte, then ggml's ``ne`` and ``nb``."""

    _fields_ = [("data", _word), ("ne", _four_words), ("nb", _four_words)]

    @classmethod
    def of(cls, address: int, t: Any) -> "TensorWords":
        """Tensor ``t`` at ``address``; for an absent tensor (``t`` None) a NULL address, one
        element and no strides, which the kernels read as "none"."""
        if t is None:
            return cls(0, _four_words(1, 1, 1, 1), _four_words(0, 0, 0, 0))
        return cls(address, _four_words(*t.ne), _four_words(*t.nb))


class PackedArguments(ctypes.Structure):
    """The int64 words one packed entry point reads, named; ``C_FUNCTIONS`` are the unpacked
    C functions whose parameters they are (each packed as ``<name>_packed``)."""

    C_FUNCTIONS: ClassVar[tuple[str, ...]] = ()

    @property
    def address(self) -> int:
        """Where the words are: what a bound call passes to the packed entry point."""
        return ctypes.addressof(self)


class MulMatArguments(PackedArguments):
    """y = x W^T from W's blocks: ``pd_mul_mat`` (kernels.c, float32) and ``pd_mul_mat_int16``
    (int_dot.c, int16 activations) take the same arguments."""

    C_FUNCTIONS = ("pd_mul_mat", "pd_mul_mat_int16")
    _fields_ = _words("type", "w", "w_stride", "M", "K", "x", "x_stride", "n_rows", "y",
                      "y_stride", "n_threads")


class MulMatInterleavedArguments(PackedArguments):
    """y = x W^T from W's interleaved copy ``p`` (interleaved.c)."""

    C_FUNCTIONS = ("pd_mul_mat_interleaved",)
    _fields_ = _words("type", "p", "M", "K", "x", "x_stride", "n_rows", "y", "y_stride",
                      "n_threads", "bits")


class SharedInputArguments(PackedArguments):
    """The interleaved products of one activation run as one call: ``records`` is the address
    of ``n_products`` addresses of their MulMatInterleavedArguments (or, MUL_MAT_ID's of one
    routing too, their MulMatIdInterleavedArguments) (interleaved.c)."""

    C_FUNCTIONS = ("pd_mul_mat_interleaved_shared", "pd_mul_mat_id_interleaved_shared")
    _fields_ = _words("n_products", "records")


class MulMatIdInterleavedArguments(PackedArguments):
    """MUL_MAT_ID from the experts' interleaved copy ``p`` (interleaved.c)."""

    C_FUNCTIONS = ("pd_mul_mat_id_interleaved",)
    _fields_ = _words("type", "p", "n_expert", "M", "K", "b", "n_b", "ids", "ids_stride",
                      "n_tokens", "n_used", "d", "n_threads", "bits")


class GluArguments(PackedArguments):
    """d = act(x) * g over rows, act SWIGLU's silu or GEGLU's gelu by ``fn``, strides in
    floats (glu.c)."""

    C_FUNCTIONS = ("pd_glu_f32",)
    _fields_ = _words("fn", "x", "xs", "g", "gs", "d", "ds", "n_rows", "n", "n_threads")


class RopeArguments(PackedArguments):
    """ROPE of float32 rows (kernels.c), turned by the angles of a RopeAngles."""

    C_FUNCTIONS = ("pd_rope_f32",)
    _fields_ = [("a", TensorWords), ("d", TensorWords),
                *_words("n_offs", "half", "neox", "copy_rest", "angles")]


class RopeAngles(ctypes.Structure):
    """The angle tables the ROPEs of a step share (``pd_rope_angles`` in kernels.c, field by
    field): the positions and parameters they are computed from, the tables, and the
    positions they hold (``seen``, where ``valid``), which the kernel compares to decide
    whether to compute them again."""

    _fields_ = [("pos", ctypes.c_void_p), ("n_tokens", ctypes.c_int64), ("half", ctypes.c_int64),
                ("freq_factors", ctypes.c_void_p), ("ramp_mix", ctypes.c_void_p),
                ("theta_scale", ctypes.c_float), ("freq_scale", ctypes.c_float),
                ("mscale", ctypes.c_float), ("unused", ctypes.c_float),
                ("cos_t", ctypes.c_void_p), ("sin_t", ctypes.c_void_p), ("seen", ctypes.c_void_p),
                ("valid", ctypes.c_int64)]


class RmsNormArguments(PackedArguments):
    """RMS_NORM of float32 rows (kernels.c); ``eps`` is passed beside the record."""

    C_FUNCTIONS = ("pd_rms_norm_f32",)
    _fields_ = [("a", TensorWords), ("d", TensorWords), *_words("n_threads")]


class SetRowsArguments(PackedArguments):
    """SET_ROWS of float32 rows into float32 or fp16 rows (kernels.c)."""

    C_FUNCTIONS = ("pd_set_rows_f32",)
    _fields_ = [("src", TensorWords), ("dst", TensorWords), ("idx", TensorWords),
                *_words("idx64", "dst_f16")]


class FlashAttnArguments(PackedArguments):
    """FLASH_ATTN_EXT over an fp16 KV cache (attention.c); ``scale`` and ``softcap`` are
    passed beside the record."""

    C_FUNCTIONS = ("pd_flash_attn_f16",)
    _fields_ = [("q", TensorWords), ("k", TensorWords), ("v", TensorWords),
                ("mask", TensorWords), ("out", TensorWords),
                *_words("lo", "hi", "slopes", "sinks", "n_threads")]


class BinaryArguments(PackedArguments):
    """ADD, SUB, MUL or DIV of float32 tensors, b repeated over a as ggml repeats it
    (binary.c)."""

    C_FUNCTIONS = ("pd_binary_f32",)
    _fields_ = [("a", TensorWords), ("b", TensorWords), ("d", TensorWords),
                *_words("op", "n_threads")]


class RowArguments(PackedArguments):
    """A float32 row op from ``a`` into ``d`` (row_ops.c): SOFT_MAX (its scale passed beside
    the record), TOP_K, SUM_ROWS and CLAMP (its bounds beside the record)."""

    C_FUNCTIONS = ("pd_soft_max_f32", "pd_top_k_f32", "pd_sum_rows_f32", "pd_clamp_f32")
    _fields_ = [("a", TensorWords), ("d", TensorWords), *_words("n_threads")]


class GetRowsArguments(PackedArguments):
    """GET_ROWS of block-format rows decoded to float32 (kernels.c)."""

    C_FUNCTIONS = ("pd_get_rows_f32",)
    _fields_ = _words("type", "w", "w_stride", "n_src_rows", "idx", "n_idx", "K", "dst",
                      "dst_stride")


class GetF32RowsArguments(PackedArguments):
    """GET_ROWS of float32 rows by int32 indices, ggml's batched form (row_ops.c)."""

    C_FUNCTIONS = ("pd_get_f32_rows",)
    _fields_ = [("a", TensorWords), ("idx", TensorWords), ("d", TensorWords)]
