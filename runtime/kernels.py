"""Kernel tables: which ops a backend computes, and how it binds them (docs/design.md,
decision 3).

A table maps a key (the op, or ``(Op.UNARY, fn)`` / ``(Op.GLU, fn)``) to a ``Kernel``: a type
rule ``accepts(node)`` and ``bind(backend, node)``, which returns the call that computes the
node. ``Device.supports_op`` and ``Backend.bind`` both read the device's table, so what a
device claims and what its backend runs can never disagree. A table may fall back to another
(the CUDA backend: its own kernels, then the array kernels through CuPy), and may reach its
kernels' bind target through the backend (``target``: the array kernels bind to the
backend's array namespace, not to the backend itself). View ops and NONE compute nothing and
are in every table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping

from .ops import VIEW_OPS, GluParams, Op, UnaryParams
from .tensor import Tensor

__all__ = ["Kernel", "KernelTable", "kernel_key", "key_name"]

BoundCall = Callable[[], None]


@dataclass(frozen=True)
class Kernel:
    """A type rule and a binder: ``bind(target, node)`` returns the call computing ``node``."""

    accepts: Callable[[Tensor], bool]
    bind: Callable[[Any, Tensor], BoundCall]


def kernel_key(node: Tensor) -> Hashable:
    """The table key of ``node``: its op, or (op, function) for UNARY and GLU."""
    if node.op == Op.UNARY:
        return (Op.UNARY, UnaryParams.of(node).fn)
    if node.op == Op.GLU:
        return (Op.GLU, GluParams.of(node).fn)
    return node.op


def key_name(key: Hashable) -> str:
    """An op's name, or a unary/glu function's own name (ggml's test-backend-ops names)."""
    return key[1].name if isinstance(key, tuple) else key.name


def _nothing(target: Any, node: Tensor) -> BoundCall:
    return _no_op


def _no_op() -> None:
    pass


_VIEW_KERNEL = Kernel(lambda node: True, _nothing)


class KernelTable:
    """Kernels by key, each bound through ``target(backend)``, else those of ``fallback``."""

    def __init__(self, kernels: Mapping[Hashable, Kernel],
                 target: Callable[[Any], Any] | None = None,
                 fallback: "KernelTable | None" = None) -> None:
        self._kernels = {key: _through(k, target) for key, k in kernels.items()}
        for op in (Op.NONE, *VIEW_OPS):
            self._kernels[op] = _VIEW_KERNEL
        self.fallback = fallback

    def find(self, node: Tensor) -> Kernel | None:
        """The kernel computing ``node`` with its types, or None where there is none."""
        k = self._kernels.get(kernel_key(node))
        if k is not None and k.accepts(node):
            return k
        return self.fallback.find(node) if self.fallback is not None else None

    def op_names(self) -> list[str]:
        """Every op (unary and glu functions by their own names) some kernel computes."""
        names = {key_name(key) for key in self._kernels}
        if self.fallback is not None:
            names.update(self.fallback.op_names())
        return sorted(names)


def _through(kernel: Kernel, target: Callable[[Any], Any] | None) -> Kernel:
    """``kernel`` binding to ``target(backend)`` instead of the backend itself."""
    if target is None:
        return kernel
    bind = kernel.bind
    return Kernel(kernel.accepts, lambda backend, node: bind(target(backend), node))
