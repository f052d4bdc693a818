"""Op parameters as typed records: what each op's ``op_params`` mean, read and written here only.

A node keeps ggml's flat ``op_params`` tuple (plans, the wire to remote devices and graph
copies compare and send it as it is); builders write it with ``Record(...).pack()`` and every
backend reads it with ``Record.of(node)``, so the positions of ggml's layout live in this file
alone. The ops whose sources have names (ROPE, SOFT_MAX, FLASH_ATTN_EXT) have a record of
those too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, TypeVar

from ..errors import InvalidArgumentError
from ..tensor import Tensor
from .catalogue import GluOp, Op, PoolOp, SortOrder, UnaryOp

__all__ = [
    "OpParams", "UnaryParams", "GluParams", "ScaleParams", "ClampParams", "LeakyReluParams",
    "FillParams", "NormParams", "GroupNormParams", "SoftMaxParams", "DiagMaskParams",
    "RopeParams", "FlashAttnParams", "Im2ColParams", "Conv2dParams", "ConvTranspose1dParams",
    "ConvTranspose2dParams", "Pool1dParams", "Pool2dParams", "ArangeParams",
    "TimestepEmbeddingParams", "SortParams", "ConcatParams", "PadParams", "PadReflect1dParams",
    "RollParams", "UpscaleParams", "WindowParams", "ViewParams", "PermuteParams",
    "GatedLinearAttnParams", "SoftMaxSources", "RopeSources", "FlashAttnSources",
]

P = TypeVar("P", bound="OpParams")


def _expect(node: Tensor, ops: frozenset, what: str) -> None:
    if node.op not in ops:
        names = ", ".join(sorted(op.name for op in ops))
        raise InvalidArgumentError(f"{what} describes {names}, not {node.op.name} "
                                   f"({node.name or '<unnamed>'})")


@dataclass(frozen=True)
class OpParams:
    """A record of one op family's parameters; fields in ggml's ``op_params`` order unless a
    subclass packs them otherwise."""

    OPS: ClassVar[frozenset] = frozenset()

    @classmethod
    def of(cls: type[P], node: Tensor) -> P:
        """``node``'s parameters (a typed error for a node of another op)."""
        _expect(node, cls.OPS, cls.__name__)
        return cls._unpack(tuple(node.op_params))

    @classmethod
    def _unpack(cls: type[P], params: tuple) -> P:
        return cls(*params[:len(dataclasses.fields(cls))])

    def pack(self) -> tuple:
        """The flat ``op_params`` tuple a node stores."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))


# --- element-wise ----------------------------------------------------------------------------

@dataclass(frozen=True)
class UnaryParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.UNARY})
    fn: UnaryOp

    @classmethod
    def _unpack(cls, params: tuple) -> "UnaryParams":
        return cls(UnaryOp(params[0]))

    def pack(self) -> tuple:
        return (int(self.fn),)


@dataclass(frozen=True)
class GluParams(OpParams):
    """A gated linear unit; ``swapped``: the gate is the first half; alpha and limit are
    SWIGLU_OAI's (0 elsewhere)."""

    OPS: ClassVar[frozenset] = frozenset({Op.GLU})
    fn: GluOp
    swapped: bool = False
    alpha: float = 0.0
    limit: float = 0.0

    @classmethod
    def _unpack(cls, params: tuple) -> "GluParams":
        alpha, limit = (params[2], params[3]) if len(params) >= 4 else (0.0, 0.0)
        return cls(GluOp(params[0]), bool(params[1]), alpha, limit)

    def pack(self) -> tuple:
        head = (int(self.fn), int(self.swapped))
        if self.fn != GluOp.SWIGLU_OAI:
            return head
        return head + (float(self.alpha), float(self.limit))


@dataclass(frozen=True)
class ScaleParams(OpParams):
    """SCALE: a * scale + bias."""

    OPS: ClassVar[frozenset] = frozenset({Op.SCALE})
    scale: float
    bias: float = 0.0


@dataclass(frozen=True)
class ClampParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.CLAMP})
    min: float
    max: float


@dataclass(frozen=True)
class LeakyReluParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.LEAKY_RELU})
    negative_slope: float


@dataclass(frozen=True)
class FillParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.FILL})
    value: float


# --- norms and attention ---------------------------------------------------------------------

@dataclass(frozen=True)
class NormParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.NORM, Op.RMS_NORM, Op.L2_NORM})
    eps: float


@dataclass(frozen=True)
class GroupNormParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.GROUP_NORM})
    n_groups: int
    eps: float


@dataclass(frozen=True)
class SoftMaxParams(OpParams):
    """softmax(x * scale + slope * mask); ALiBi's slopes when max_bias > 0."""

    OPS: ClassVar[frozenset] = frozenset({Op.SOFT_MAX})
    scale: float = 1.0
    max_bias: float = 0.0


@dataclass(frozen=True)
class DiagMaskParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO})
    n_past: int


@dataclass(frozen=True)
class RopeParams(OpParams):
    """ROPE's parameters. ggml's layout: [0, n_dims, mode, 0, n_ctx_orig, freq_base,
    freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, sections[4], n_offs], where
    n_offs is the first rotated channel."""

    OPS: ClassVar[frozenset] = frozenset({Op.ROPE})
    n_dims: int
    mode: int
    n_ctx_orig: int = 0
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    sections: tuple[int, int, int, int] = (0, 0, 0, 0)
    n_offs: int = 0

    @classmethod
    def _unpack(cls, params: tuple) -> "RopeParams":
        return cls(params[1], params[2], *params[4:11], tuple(params[11:15]), params[15])

    def pack(self) -> tuple:
        return ((0, int(self.n_dims), int(self.mode), 0, int(self.n_ctx_orig),
                 float(self.freq_base), float(self.freq_scale), float(self.ext_factor),
                 float(self.attn_factor), float(self.beta_fast), float(self.beta_slow))
                + tuple(int(s) for s in self.sections) + (int(self.n_offs),))

    @property
    def yarn(self) -> tuple[int, float, float, float, float, float, float]:
        """(n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast,
        beta_slow): what the rotation angles depend on besides the positions."""
        return (self.n_ctx_orig, self.freq_base, self.freq_scale, self.ext_factor,
                self.attn_factor, self.beta_fast, self.beta_slow)


@dataclass(frozen=True)
class FlashAttnParams(OpParams):
    """softmax(softcap(scale * q.k) + slope * mask) @ v; ``precision`` is ggml's (0 default)."""

    OPS: ClassVar[frozenset] = frozenset({Op.FLASH_ATTN_EXT})
    scale: float
    max_bias: float = 0.0
    softcap: float = 0.0
    precision: int = 0

    @property
    def kernel_scale(self) -> float:
        """What the kernels multiply q.k by before the soft cap: ``scale / softcap`` where
        there is a cap, since the capped score softcap * tanh(scale * q.k / softcap) is then
        softcap * tanh(kernel_scale * q.k) (ggml's form), else ``scale``."""
        return self.scale / self.softcap if self.softcap else self.scale


@dataclass(frozen=True)
class GatedLinearAttnParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.GATED_LINEAR_ATTN})
    scale: float


def _src(node: Tensor, i: int) -> Tensor | None:
    return node.src[i] if len(node.src) > i else None


class SoftMaxSources(NamedTuple):
    """SOFT_MAX's sources: the logits, the optional mask and attention sinks."""

    x: Tensor
    mask: Tensor | None
    sinks: Tensor | None

    @classmethod
    def of(cls, node: Tensor) -> "SoftMaxSources":
        _expect(node, SoftMaxParams.OPS, cls.__name__)
        return cls(node.src[0], _src(node, 1), _src(node, 2))


class RopeSources(NamedTuple):
    """ROPE's sources: the rows, their I32 positions and the optional frequency factors."""

    x: Tensor
    pos: Tensor
    freq_factors: Tensor | None

    @classmethod
    def of(cls, node: Tensor) -> "RopeSources":
        _expect(node, RopeParams.OPS, cls.__name__)
        return cls(node.src[0], node.src[1], _src(node, 2))


class FlashAttnSources(NamedTuple):
    """FLASH_ATTN_EXT's sources: q, k, v, the optional mask and attention sinks."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    sinks: Tensor | None

    @classmethod
    def of(cls, node: Tensor) -> "FlashAttnSources":
        _expect(node, FlashAttnParams.OPS, cls.__name__)
        return cls(node.src[0], node.src[1], node.src[2], _src(node, 3), _src(node, 4))


# --- convolution and pooling -----------------------------------------------------------------

@dataclass(frozen=True)
class Conv2dParams(OpParams):
    """Stride, padding and dilation along dimensions 0 and 1."""

    OPS: ClassVar[frozenset] = frozenset({Op.CONV_2D, Op.CONV_2D_DW})
    s0: int
    s1: int
    p0: int
    p1: int
    d0: int
    d1: int


@dataclass(frozen=True)
class Im2ColParams(Conv2dParams):
    """A convolution's geometry, and whether it is 2-D (else dimension 1's values are 1)."""

    OPS: ClassVar[frozenset] = frozenset({Op.IM2COL})
    is_2d: bool = True


@dataclass(frozen=True)
class ConvTranspose1dParams(OpParams):
    """ggml's layout [s0, p0, d0]; ggml only implements p0 = 0 and d0 = 1."""

    OPS: ClassVar[frozenset] = frozenset({Op.CONV_TRANSPOSE_1D})
    s0: int
    p0: int = 0
    d0: int = 1


@dataclass(frozen=True)
class ConvTranspose2dParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.CONV_TRANSPOSE_2D})
    stride: int


@dataclass(frozen=True)
class Pool1dParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.POOL_1D})
    op: PoolOp
    k0: int
    s0: int
    p0: int

    @classmethod
    def _unpack(cls, params: tuple) -> "Pool1dParams":
        return cls(PoolOp(params[0]), *params[1:4])

    def pack(self) -> tuple:
        return (int(self.op), int(self.k0), int(self.s0), int(self.p0))


@dataclass(frozen=True)
class Pool2dParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.POOL_2D})
    op: PoolOp
    k0: int
    k1: int
    s0: int
    s1: int
    p0: int
    p1: int

    @classmethod
    def _unpack(cls, params: tuple) -> "Pool2dParams":
        return cls(PoolOp(params[0]), *params[1:7])

    def pack(self) -> tuple:
        return (int(self.op),) + tuple(int(v) for v in (self.k0, self.k1, self.s0, self.s1,
                                                        self.p0, self.p1))


# --- generators, layout, views ---------------------------------------------------------------

@dataclass(frozen=True)
class ArangeParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.ARANGE})
    start: float
    stop: float
    step: float


@dataclass(frozen=True)
class TimestepEmbeddingParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.TIMESTEP_EMBEDDING})
    dim: int
    max_period: int


@dataclass(frozen=True)
class SortParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.ARGSORT})
    order: SortOrder

    @classmethod
    def _unpack(cls, params: tuple) -> "SortParams":
        return cls(SortOrder(params[0]))

    def pack(self) -> tuple:
        return (int(self.order),)


@dataclass(frozen=True)
class ConcatParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.CONCAT})
    dim: int


@dataclass(frozen=True)
class PadParams(OpParams):
    """PAD: ``left[d]``/``right[d]`` elements before/after dimension d; zeros, or with
    ``circular`` the values wrapped around. ggml's layout: [lp0, rp0, ..., lp3, rp3, circular]."""

    OPS: ClassVar[frozenset] = frozenset({Op.PAD})
    left: tuple[int, int, int, int]
    right: tuple[int, int, int, int]
    circular: bool = False

    @classmethod
    def _unpack(cls, params: tuple) -> "PadParams":
        return cls(tuple(params[0:8:2]), tuple(params[1:8:2]), bool(params[8]))

    def pack(self) -> tuple:
        pairs = tuple(int(p) for d in range(4) for p in (self.left[d], self.right[d]))
        return pairs + (int(self.circular),)


@dataclass(frozen=True)
class PadReflect1dParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.PAD_REFLECT_1D})
    p0: int
    p1: int


@dataclass(frozen=True)
class _PerDimension(OpParams):
    """A record of one value per dimension, ggml's order (dimension 0 first)."""

    @classmethod
    def _unpack(cls, params: tuple):
        return cls(tuple(params[:4]))

    def pack(self) -> tuple:
        (values,) = (getattr(self, f.name) for f in dataclasses.fields(self))
        return tuple(int(v) for v in values)


@dataclass(frozen=True)
class RollParams(_PerDimension):
    """ROLL: ``shifts[d]`` along dimension d."""

    OPS: ClassVar[frozenset] = frozenset({Op.ROLL})
    shifts: tuple[int, int, int, int]


@dataclass(frozen=True)
class UpscaleParams(OpParams):
    """UPSCALE's ScaleMode: the interpolation in the low byte, flags above."""

    OPS: ClassVar[frozenset] = frozenset({Op.UPSCALE})
    mode: int


@dataclass(frozen=True)
class WindowParams(OpParams):
    """ACC and SET: b placed in a's bytes at ``offset`` with strides nb1..nb3."""

    OPS: ClassVar[frozenset] = frozenset({Op.ACC, Op.SET})
    nb1: int
    nb2: int
    nb3: int
    offset: int
    inplace: bool


@dataclass(frozen=True)
class ViewParams(OpParams):
    OPS: ClassVar[frozenset] = frozenset({Op.VIEW})
    offset: int


@dataclass(frozen=True)
class PermuteParams(_PerDimension):
    """PERMUTE: source dimension d becomes dimension ``axes[d]``."""

    OPS: ClassVar[frozenset] = frozenset({Op.PERMUTE})
    axes: tuple[int, int, int, int]
