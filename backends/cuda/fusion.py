"""Pairs of graph nodes the CUDA backend computes with one kernel, as ggml-cuda fuses them: a
norm (NORM, RMS_NORM, L2_NORM) directly followed by the MUL of its result by a weight, which
every transformer layer computes twice per token.

Only adjacent computing nodes are fused (views between them compute nothing): nothing runs
between the two, so the product's memory cannot still be in use and the weight is ready. The
fused kernel writes the norm's result too, so whatever else reads it (through a view, or in a
later part of a graph cut for a callback) finds it; the MUL's own call then does nothing.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from polydev.ops import NormParams, Op
from polydev.tensor import Tensor

from .binders import F32, NORM_KINDS, Launcher, binary_ok, norm_ok, row_geometry, tensor_args


def norm_then_mul(norm: Tensor, mul: Tensor) -> bool:
    """Whether ``mul`` multiplies ``norm``'s result (its first operand, the weight repeated
    over it) and both are float32 rows the fused kernel computes."""
    return (norm.op in NORM_KINDS and norm_ok(norm) and mul.op == Op.MUL
        and mul.src[0] is norm and binary_ok(mul) and mul.src[1].type == F32)


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
        if following is not None and norm_then_mul(node, following):
            calls += [bind_norm_mul(launcher, node, following), _nothing]
            i += 2
            continue
        calls.append(bind(node))
        i += 1
    return calls


def _nothing() -> None:
    """The call of a node another node's kernel computes."""
