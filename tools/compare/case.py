"""One test case of ``polydev compare``: how its graph is built, filled and judged.

A case is data: the op name, its parameters (printed as test-backend-ops prints ``vars()``),
a builder that makes the graph in a ``CaseContext`` and returns the output, the error
threshold, and for ``perf`` the FLOPs of one run. The context remembers how each input is to be
initialized and puts a guard tensor after every tensor it creates, so an out-of-bounds write
shows up as changed guard bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from polydev import Context, GGMLType, Op, Tensor
from polydev.buffer import tensor_memset, tensor_set
from polydev.types import TYPE_TRAITS, random_blocks

GUARD_ELEMENTS = 1024   # float32 values in each guard (ggml's sentinel_size)

Init = Callable[[np.random.Generator, Tensor], np.ndarray]
"""Returns an input's values (numpy shape reversed(ne)), or raw uint8 bytes for block types."""

ErrorFunction = Callable[[np.ndarray, np.ndarray, Tensor], float]
"""``err(values_under_test, reference_values, node_under_test)``."""


# --- initializers ---------------------------------------------------------------------------

def uniform(lo: float = -1.0, hi: float = 1.0) -> Init:
    """Values uniform in [lo, hi), quantized on upload for block types; random valid blocks
    for the block types polydev can decode but not encode."""
    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        tr = TYPE_TRAITS[t.type]
        if tr.is_quantized and not tr.can_quantize:
            return random_blocks(t.type, t.nelements // tr.block_size, rng)
        return rng.uniform(lo, hi, size=t.shape).astype(np.float32)
    return init


def integers(lo: int, hi: int) -> Init:
    """Integers uniform in [lo, hi): row ids, positions, counts."""
    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        return rng.integers(lo, hi, size=t.shape)
    return init


def distinct_per_row(n: int) -> Init:
    """Each row holds distinct integers from [0, n): expert ids, permutations."""
    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        rows = int(np.prod(t.shape[:-1]))
        keys = rng.random((rows, n))
        return np.argsort(keys, axis=1)[:, :t.ne[0]].reshape(t.shape)
    return init


def shuffled_rows() -> Init:
    """Each row a shuffle of distinct values (argsort and top-k need no ties)."""
    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        rows = int(np.prod(t.shape[:-1]))
        keys = np.argsort(rng.random((rows, t.ne[0])), axis=1).astype(np.float32)
        return (keys / t.ne[0] - 0.5).reshape(t.shape)
    return init


def default_init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """test-backend-ops' default: uniform in [-1, 1]; small integers for integer types."""
    if t.type in (GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64):
        return rng.integers(-100, 100, size=t.shape)
    return uniform()(rng, t)


# --- the case context -----------------------------------------------------------------------

class CaseContext(Context):
    """A ``Context`` for one case: guard tensors, input initializers and a weights context.

    Every tensor created here (inputs and op results alike) is followed by a guard of
    ``GUARD_ELEMENTS`` floats when ``guards`` is on. ``weights`` holds tensors the harness
    allocates in a buffer of WEIGHTS usage, as a model's weights would be.
    """

    def __init__(self, guards: bool = True) -> None:
        super().__init__("case")
        self._guarded = guards
        self.guards: list[Tensor] = []
        self.initializers: dict[int, Init] = {}
        self.weights = Context("case weights")

    def new_tensor(self, type_, ne: Sequence[int], name: str = "") -> Tensor:
        t = super().new_tensor(type_, ne, name)
        self.add_guard(self)
        return t

    def add_guard(self, ctx: Context) -> None:
        if self._guarded:
            guard = Context.new_tensor(ctx, GGMLType.F32, (GUARD_ELEMENTS,),
                                       f"guard_{len(self.guards)}")
            self.guards.append(guard)

    def input(self, type_, ne: Sequence[int], name: str = "", init: Init | None = None) -> Tensor:
        """A leaf tensor the harness fills with ``init`` (default: uniform in [-1, 1])."""
        t = self.new_tensor(type_, ne, name)
        if init is not None:
            self.initializers[id(t)] = init
        return t

    def weight(self, type_, ne: Sequence[int], name: str = "", init: Init | None = None) -> Tensor:
        """A leaf tensor in the weights context."""
        t = self.weights.new_tensor(type_, ne, name)
        self.add_guard(self.weights)
        if init is not None:
            self.initializers[id(t)] = init
        return t

    def strided_input(self, type_, ne: Sequence[int], name: str = "",
                      init: Init | None = None) -> Tensor:
        """A non-contiguous input: a view of the first third of each row of a wider tensor
        (test-backend-ops' ``v=1``)."""
        ne = tuple(ne) + (1,) * (4 - len(ne))
        wide = self.input(type_, (ne[0] * 3,) + ne[1:], f"{name} (wide)", init)
        view = self.view_4d(wide, *ne, wide.nb[1], wide.nb[2], wide.nb[3], 0)
        view.name = name
        return view

    def maybe_strided(self, strided: bool, type_, ne: Sequence[int], name: str = "",
                      init: Init | None = None) -> Tensor:
        return (self.strided_input if strided else self.input)(type_, ne, name, init)

    def initialize(self, rng: np.random.Generator) -> None:
        """Fill every leaf with its initializer and every op result with NaN bytes.

        ggml fills results with random numbers, which the graph copy then gives both backends;
        NaN (all bytes 0xFF) makes a kernel that leaves part of its output unwritten fail the
        NaN check instead of passing with the copied random data.
        """
        for ctx in (self.weights, self):
            for t in ctx.tensors:
                if t.view_src is not None or t.is_empty():
                    continue
                if t.op != Op.NONE:
                    tensor_memset(t, 0xFF)
                    continue
                _write(t, self.initializers.get(id(t), default_init)(rng, t))


def _write(t: Tensor, values: np.ndarray) -> None:
    tr = TYPE_TRAITS[t.type]
    if tr.is_quantized and values.dtype == np.uint8:      # raw blocks
        tensor_set(t, values)
    elif tr.is_quantized or t.type in (GGMLType.F16, GGMLType.BF16):
        t.set_data(values.astype(np.float32, copy=False))  # encoded on upload
    else:
        t.set_data(values.astype(tr.np_dtype, copy=False))


# --- error functions ------------------------------------------------------------------------

def nmse(a: np.ndarray, b: np.ndarray, node: Tensor) -> float:
    """Normalized mean squared error Σ(a-b)² / Σb² (test-backend-ops' default; b is the
    reference)."""
    a = a.astype(np.float64, copy=False).ravel()
    b = b.astype(np.float64, copy=False).ravel()
    denom = float(np.dot(b, b))
    num = float(np.dot(a - b, a - b))
    return num / denom if denom else num


def index_set_mismatch(a: np.ndarray, b: np.ndarray, node: Tensor) -> float:
    """TOP_K without ties: each row must hold the same set of indices, in any order."""
    rows_a = np.sort(a.reshape(-1, a.shape[-1]), axis=1)
    rows_b = np.sort(b.reshape(-1, b.shape[-1]), axis=1)
    return float(np.count_nonzero(np.any(rows_a != rows_b, axis=1)))


# --- the case -------------------------------------------------------------------------------

def _render(value: object) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, GGMLType):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_render(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    if hasattr(value, "name") and hasattr(value, "value"):   # enums
        return value.name.lower()
    return str(value)


@dataclass(frozen=True)
class Case:
    """One op under test: ``build(ctx)`` returns the output tensor of the case's graph."""

    op: str
    params: tuple[tuple[str, object], ...]
    build: Callable[[CaseContext], Tensor] = field(repr=False, compare=False)
    max_err: float = 1e-7
    err: ErrorFunction = field(default=nmse, repr=False, compare=False)
    flops: Callable[[Tensor], int] | None = field(default=None, repr=False, compare=False)

    @property
    def vars(self) -> str:
        """The parameters as test-backend-ops prints them: ``type=f32,ne=[4,3,2,1]``."""
        return ",".join(f"{k}={_render(v)}" for k, v in self.params)

    @property
    def name(self) -> str:
        return f"{self.op}({self.vars})"


def case(op: str, build: Callable[[CaseContext], Tensor], *, max_err: float = 1e-7,
         err: ErrorFunction = nmse, flops: Callable[[Tensor], int] | None = None,
         **params: object) -> Case:
    """A ``Case`` with its parameters given as keywords, in print order."""
    return Case(op, tuple(params.items()), build, max_err, err, flops)
