"""Pairs of graph nodes the CUDA backend computes with one kernel, as ggml-cuda fuses them: a
norm (NORM, RMS_NORM, L2_NORM) directly followed by the MUL of its result by a weight, which
every transformer layer computes twice per token.

Only adjacent computing nodes are fused (views between them compute nothing): nothing runs
between the two, so the product's memory cannot still be in use and the weight is ready. The
fused kernel writes the norm's result too, so whatever else reads it (through a view, or in a
later part of a graph cut for a callback) finds it; the MUL's own call then does nothing.
Unfused, the MUL ran after the whole norm; fused, one row's product is written while other
blocks still read their rows, so the pair is fused only where the bytes the kernel writes
(the norm's result, the product) and those it reads (the norm's source, the weight) are
apart or the very same tensor (the allocator may give the product the norm's source once the
norm is its last reader).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from polydev.ops import NormParams, Op
from polydev.tensor import Tensor

from .binders import NORM_KINDS, Launcher, binary_ok, norm_ok, row_geometry, tensor_args


def norm_then_mul(norm: Tensor, mul: Tensor) -> bool:
    """Whether ``mul`` multiplies ``norm``'s result (its first operand, the weight repeated
    over it) and both are float32 rows the fused kernel computes."""
    return (norm.op in NORM_KINDS and norm_ok(norm) and mul.op == Op.MUL
        and mul.src[0] is norm and binary_ok(mul))


def apart_or_alike(launcher: Launcher, a: Tensor, b: Tensor) -> bool:
    """Whether two tensors' bytes are disjoint, or the same bytes in the same layout (each
    element then read and written by one thread, in order)."""
    start_a, start_b = launcher.address(a), launcher.address(b)
    if start_a == start_b and a.ne == b.ne and a.nb == b.nb:
        return True
    return start_a + a.nbytes <= start_b or start_b + b.nbytes <= start_a


def fusable_memory(launcher: Launcher, norm: Tensor, mul: Tensor) -> bool:
    """Whether what the fused kernel writes (the norm's result, the product) and what its
    other blocks may still read (the norm's source, the weight) keep out of each other."""
    source, weight = norm.src[0], mul.src[1]
    return all(apart_or_alike(launcher, written, read)
               for written in (norm, mul) for read in (source, weight)) and apart_or_alike(
        launcher, mul, norm)


def bind_norm_mul(launcher: Launcher, norm: Tensor, mul: Tensor) -> Callable[[], None]:
    args = (tensor_args(launcher, norm.src[0]) + tensor_args(launcher, norm)
        + [np.float32(NormParams.of(norm).eps), np.int32(NORM_KINDS[norm.op])]
        + tensor_args(launcher, mul.src[1]) + tensor_args(launcher, mul))
    return launcher.launch("norm_mul_f32", *row_geometry(norm.src[0]), args)


def bind_nodes(launcher: Launcher, nodes: Sequence[Tensor],
               bind: Callable[[Tensor], Callable[[], None]]) -> list[Callable[[], None]]:
    """One call per computing node of ``nodes`` (in order), ``bind``'s, except that a norm and
    the MUL after it are bound together: the norm's call computes both, the MUL's is empty."""
    calls: list[Callable[[], None]] = []
    i = 0
    while i < len(nodes):
        node = nodes[i]
        following = nodes[i + 1] if i + 1 < len(nodes) else None
        if (following is not None and norm_then_mul(node, following)
                and fusable_memory(launcher, node, following)):
            calls += [bind_norm_mul(launcher, node, following), fused_away]
            i += 2
            continue
        calls.append(bind(node))
        i += 1
    return calls


def fused_away() -> None:
    """The call of a node another node's kernel computes: nothing."""
