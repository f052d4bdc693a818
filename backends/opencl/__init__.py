"""The OpenCL backend (pyopencl): a device per OpenCL device of every platform.

Registered through the ``polydev.backends`` entry point ``opencl``. Without pyopencl, or
without an OpenCL platform, the reg has no devices and says why (``polydev devices
--verbose``), and a device whose driver cannot build and run a kernel is left out with the
reason; importing this package never raises.
"""

from __future__ import annotations

from polydev.device import Reg
from polydev.registry import reg_once


def _make_reg() -> Reg:
    """One device per selected device of every OpenCL platform, or the reason for none."""
    try:
        import pyopencl as cl
    except Exception as e:       # not installed, or its ICD loader is broken
        return Reg("OpenCL", unavailable_reason=f"pyopencl is not usable ({e}); "
                   f"pip install 'polydev[opencl]'")
    from .device import OpenCLDevice
    from .platform import discover
    found = discover(cl)
    devices = [OpenCLDevice(i, ctx, dev) for i, (ctx, dev) in enumerate(found.found)]
    return Reg("OpenCL", devices, unavailable_reason=found.reason, excluded=found.excluded)


register = reg_once(_make_reg)

__all__ = ["register"]
