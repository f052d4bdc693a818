"""The CPU backend (numpy): the reference every other backend is compared against.

Registered through the ``polydev.backends`` entry point ``cpu = polydev.backends.cpu:register``.
"""

from __future__ import annotations

from polydev.registry import reg_once

from .backend import CPUBackend
from .buffer import CPUBuffer, CPUBufferType, CPUMappedBufferType
from .device import CPUDevice, make_reg

register = reg_once(make_reg)

__all__ = ["register", "CPUBackend", "CPUBuffer", "CPUBufferType", "CPUMappedBufferType",
           "CPUDevice"]
