"""The CPU backend (numpy): the reference every other backend is compared against.

Registered through the ``polydev.backends`` entry point ``cpu = polydev.backends.cpu:register``.
"""

from __future__ import annotations

from polydev.device import Reg

from .backend import CPUBackend, CPUGraphPlan
from .buffer import CPUBufferType, CPUMappedBufferType, HostBuffer
from .device import CPUDevice

_reg: Reg | None = None


def register() -> Reg:
    """The CPU reg (one per process)."""
    global _reg
    if _reg is None:
        from .device import make_reg
        _reg = make_reg()
    return _reg


__all__ = ["register", "CPUBackend", "CPUGraphPlan", "CPUBufferType", "CPUMappedBufferType",
           "HostBuffer", "CPUDevice"]
