"""The CUDA backend (CuPy): a device per GPU the CUDA driver shows.

Registered through the ``polydev.backends`` entry point ``cuda``. Without CuPy, without a
driver, or without a GPU, the reg has no devices and says why (``polydev devices
--verbose``); importing this package never raises and never touches CUDA.
"""

from __future__ import annotations

from polydev.device import Reg
from polydev.registry import reg_once


def _make_reg() -> Reg:
    """One device per GPU the CUDA driver shows, or the reason for none."""
    try:
        import cupy
    except Exception as e:       # not installed, or one of its CUDA libraries failed to load
        return Reg("CUDA", unavailable_reason=f"CuPy is not usable ({e}); "
                   f"pip install 'polydev[cuda]'")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:       # CUDARuntimeError: no driver (35), no GPU (100), ...
        return Reg("CUDA", unavailable_reason=f"CUDA is not usable: {e}")
    if count == 0:
        return Reg("CUDA", unavailable_reason="the CUDA driver shows no GPU")
    from .device import CUDADevice
    devices: list[CUDADevice] = []
    for index in range(count):
        devices.append(CUDADevice(index, cupy, devices))
    return Reg("CUDA", devices)


register = reg_once(_make_reg)

__all__ = ["register"]
