"""ggml's element types: numeric ids, block traits, row sizes and the numpy codecs.

The ids are ggml's (and GGUF's), so a tensor's type read from a GGUF file is used as is. Every
type has its block geometry, so any GGUF tensor can be sized and moved; ``can_dequantize`` and
``can_quantize`` say which ones polydev can also convert to and from float32.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import quants
from .errors import TensorTypeError, ShapeError


class GGMLType(enum.IntEnum):
    """ggml's type enum with its numeric ids (gaps are ids ggml retired)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41

    @property
    def traits(self) -> "TypeTraits":
        """The type's traits: block size, bytes per block, numpy dtype, codecs."""
        return TYPE_TRAITS[self]

    def __str__(self) -> str:  # ggml prints types in lower case ("f32", "q4_K")
        return self.traits.name

    @classmethod
    def parse(cls, value: "GGMLType | str | int") -> "GGMLType":
        """Accept a GGMLType, its id, or its name in any case ("f16", "Q4_K")."""
        if isinstance(value, GGMLType):
            return value
        try:
            if isinstance(value, str):
                return (cls[value.upper()] if value.upper() in cls.__members__
                    else _BY_LOWER_NAME[value.lower()])
            return cls(int(value))
        except (KeyError, ValueError):
            known = ", ".join(t.traits.name for t in cls)
            raise TensorTypeError(f"unknown tensor type {value!r}; known types: {known}") from None


@dataclass(frozen=True)
class TypeTraits:
    """What ggml's type_traits says of a type, plus the numpy side of it."""

    name: str
    block_size: int          # elements per block (1 for plain types)
    type_size: int           # bytes per block
    np_dtype: np.dtype       # element dtype for plain types; uint8 (raw bytes) for block formats
    is_quantized: bool
    dequantize: Callable[..., np.ndarray] | None = None   # raw block bytes -> float32
    quantize: Callable[[np.ndarray], np.ndarray] | None = None  # float32 -> raw block bytes

    @property
    def can_dequantize(self) -> bool:
        return self.dequantize is not None

    @property
    def can_quantize(self) -> bool:
        return self.quantize is not None

    @property
    def is_float(self) -> bool:
        return self.name in ("f32", "f16", "bf16", "f64")

    def row_size(self, n: int) -> int:
        """Bytes of a row of ``n`` elements (ggml_row_size); ``n`` must fill whole blocks."""
        if n % self.block_size:
            raise ShapeError(f"a {self.name} row of {n} elements is not a whole number of "
                             f"{self.block_size}-element blocks")
        return n // self.block_size * self.type_size


def _plain(name: str, dtype: type) -> TypeTraits:
    dt = np.dtype(dtype)
    return TypeTraits(name, 1, dt.itemsize, dt, False)


def _block(name: str, block_size: int, type_size: int, dequantize=None, quantize=None) -> TypeTraits:
    return TypeTraits(name, block_size, type_size, np.dtype(np.uint8), True, dequantize, quantize)


def _f16_dequantize(raw, out=None):
    values = np.ascontiguousarray(raw).view(np.float16).astype(np.float32)
    if out is None:
        return values
    np.copyto(out, values.reshape(out.shape))
    return out


def _bf16_dequantize(raw, out=None):
    values = quants.bf16_to_f32(np.ascontiguousarray(raw).view(np.uint16))
    if out is None:
        return values
    np.copyto(out, values.reshape(out.shape))
    return out


_F16 = TypeTraits("f16", 1, 2, np.dtype(np.float16), False, _f16_dequantize,
                  lambda x: np.asarray(x, dtype=np.float32).astype(np.float16))
# numpy has no bfloat16: BF16 elements are held as their uint16 bit patterns.
_BF16 = TypeTraits("bf16", 1, 2, np.dtype(np.uint16), False, _bf16_dequantize, quants.f32_to_bf16)

TYPE_TRAITS: dict[GGMLType, TypeTraits] = {
    GGMLType.F32: _plain("f32", np.float32),
    GGMLType.F16: _F16,
    GGMLType.BF16: _BF16,
    GGMLType.F64: _plain("f64", np.float64),
    GGMLType.I8: _plain("i8", np.int8),
    GGMLType.I16: _plain("i16", np.int16),
    GGMLType.I32: _plain("i32", np.int32),
    GGMLType.I64: _plain("i64", np.int64),
    GGMLType.Q4_0: _block("q4_0", 32, 18, quants.dequantize_q4_0, quants.quantize_q4_0),
    GGMLType.Q4_1: _block("q4_1", 32, 20, quants.dequantize_q4_1, quants.quantize_q4_1),
    GGMLType.Q5_0: _block("q5_0", 32, 22, quants.dequantize_q5_0, quants.quantize_q5_0),
    GGMLType.Q5_1: _block("q5_1", 32, 24, quants.dequantize_q5_1, quants.quantize_q5_1),
    GGMLType.Q8_0: _block("q8_0", 32, 34, quants.dequantize_q8_0, quants.quantize_q8_0),
    GGMLType.Q8_1: _block("q8_1", 32, 40),
    GGMLType.Q2_K: _block("q2_K", 256, 84, quants.dequantize_q2_k),
    GGMLType.Q3_K: _block("q3_K", 256, 110, quants.dequantize_q3_k),
    GGMLType.Q4_K: _block("q4_K", 256, 144, quants.dequantize_q4_k, quants.quantize_q4_k),
    GGMLType.Q5_K: _block("q5_K", 256, 176, quants.dequantize_q5_k, quants.quantize_q5_k),
    GGMLType.Q6_K: _block("q6_K", 256, 210, quants.dequantize_q6_k, quants.quantize_q6_k),
    GGMLType.Q8_K: _block("q8_K", 256, 292),
    GGMLType.IQ2_XXS: _block("iq2_xxs", 256, 66),
    GGMLType.IQ2_XS: _block("iq2_xs", 256, 74),
    GGMLType.IQ3_XXS: _block("iq3_xxs", 256, 98),
    GGMLType.IQ1_S: _block("iq1_s", 256, 50),
    GGMLType.IQ4_NL: _block("iq4_nl", 32, 18, quants.dequantize_iq4_nl),
    GGMLType.IQ3_S: _block("iq3_s", 256, 110),
    GGMLType.IQ2_S: _block("iq2_s", 256, 82),
    GGMLType.IQ4_XS: _block("iq4_xs", 256, 136, quants.dequantize_iq4_xs),
    GGMLType.IQ1_M: _block("iq1_m", 256, 56),
    GGMLType.TQ1_0: _block("tq1_0", 256, 54),
    GGMLType.TQ2_0: _block("tq2_0", 256, 66),
    GGMLType.MXFP4: _block("mxfp4", 32, 17),
    GGMLType.NVFP4: _block("nvfp4", 64, 36),
    GGMLType.Q1_0: _block("q1_0", 128, 18),
}

_BY_LOWER_NAME = {tr.name.lower(): t for t, tr in TYPE_TRAITS.items()}

# numpy dtype -> the ggml type a user means by it
_FROM_NUMPY = {np.dtype(tr.np_dtype): t for t, tr in TYPE_TRAITS.items()
               if not tr.is_quantized and t is not GGMLType.BF16}


def type_from_numpy(dtype: np.dtype | type) -> GGMLType:
    """The ggml type of a numpy dtype (float32 -> F32, int32 -> I32, ...)."""
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise TensorTypeError(f"numpy dtype {np.dtype(dtype)} has no ggml type") from None


def row_size(type_: GGMLType, n: int) -> int:
    """Bytes of a row of ``n`` elements of ``type_`` (ggml_row_size)."""
    return TYPE_TRAITS[type_].row_size(n)


def dequantize(raw: np.ndarray, type_: GGMLType, out: np.ndarray | None = None) -> np.ndarray:
    """Decode rows of ``type_`` bytes (last axis = row bytes) to float32 values."""
    tr = TYPE_TRAITS[type_]
    if not tr.is_quantized and type_ not in (GGMLType.F16, GGMLType.BF16):
        values = np.ascontiguousarray(raw).view(tr.np_dtype).astype(np.float32)
        return values if out is None else _copy_into(out, values)
    if tr.dequantize is None:
        raise TensorTypeError(f"polydev cannot dequantize {tr.name}")
    return tr.dequantize(raw, out)


def quantize(values: np.ndarray, type_: GGMLType) -> np.ndarray:
    """Encode float32 rows (last axis a multiple of the block size) as ``type_`` bytes."""
    tr = TYPE_TRAITS[type_]
    values = np.asarray(values, dtype=np.float32)
    if values.shape and values.shape[-1] % tr.block_size:
        raise ShapeError(f"cannot quantize rows of {values.shape[-1]} elements to {tr.name}: "
                         f"not a multiple of its block size {tr.block_size}")
    if not tr.is_quantized and type_ not in (GGMLType.F16, GGMLType.BF16):
        return values.astype(tr.np_dtype)
    if tr.quantize is None:
        raise TensorTypeError(f"polydev cannot quantize to {tr.name}")
    return tr.quantize(values)


def _copy_into(out: np.ndarray, values: np.ndarray) -> np.ndarray:
    np.copyto(out, values.reshape(out.shape))
    return out


# byte offsets of the fp16 scale (and min) fields in each block layout polydev can decode
_SCALE_FIELDS = {
    "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q8_0": (0,), "q2_K": (80, 82),
    "q3_K": (108,), "q4_K": (0, 2), "q5_K": (0, 2), "q6_K": (208,), "iq4_nl": (0,),
    "iq4_xs": (0,),
}


def random_blocks(type_: GGMLType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """``n_blocks`` valid random blocks of a block type, as raw bytes of shape (n, type_size).

    Random bytes everywhere except the fp16 scale fields, which get small finite values, so
    every block decodes to finite numbers of a sane size. This is how test data reaches the
    types polydev can decode but not encode (Q2_K, Q3_K, the IQ4 formats).
    """
    tr = TYPE_TRAITS[type_]
    if tr.name not in _SCALE_FIELDS:
        raise TensorTypeError(f"polydev does not know the block layout of {tr.name}")
    raw = rng.integers(0, 256, size=(n_blocks, tr.type_size), dtype=np.uint8)
    for off in _SCALE_FIELDS[tr.name]:
        scales = rng.uniform(0.001, 0.02, size=n_blocks).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw
