"""The CUDA backend (CuPy): a device per GPU the CUDA driver shows.

Registered through the ``polydev.backends`` entry point ``cuda``. Without CuPy, without a
driver, or without a GPU, the reg has no devices and says why (``polydev devices
--verbose``); a GPU whose NVRTC build of the backend's kernels fails is left out with the
compiler's message; importing this package never raises and never touches CUDA.
"""

from __future__ import annotations

import logging

from polydev.device import ExcludedDevice, Reg
from polydev.probes import cached_probes
from polydev.registry import reg_once

log = logging.getLogger(__name__)


def _make_reg() -> Reg:
    """One device per GPU the CUDA driver shows, or the reason for none."""
    try:
        import cupy
    except Exception as e:       # not installed, or one of its CUDA libraries failed to load
        return Reg("CUDA", unavailable_reason=f"CuPy is not usable ({e}); "
                   f"pip install 'polydev[cuda]' (or [cuda13] for a CUDA 13 driver)")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:       # CUDARuntimeError: no driver (35), no GPU (100), ...
        return Reg("CUDA", unavailable_reason=f"CUDA is not usable: {e}{_version_hint(cupy)}")
    if count == 0:
        return Reg("CUDA", unavailable_reason="the CUDA driver shows no GPU")
    from .device import CUDADevice
    from .programs import gpu_name
    devices: list[CUDADevice] = []
    excluded: list[ExcludedDevice] = []
    for index, (answer, fresh) in enumerate(_probe_gpus(cupy, count)):
        if answer is None:
            devices.append(CUDADevice(index, cupy, devices, ordinal=len(devices)))
            continue
        label = f"GPU {index} {gpu_name(cupy.cuda.runtime.getDeviceProperties(index))}"
        excluded.append(ExcludedDevice(label, answer))
        # said loudly once, when found; later processes read the answer from the cache
        log.log(logging.WARNING if fresh else logging.INFO, "CUDA device left out: %s: %s",
                label, answer)
    reason = None if devices else f"no GPU can run the backend's kernels ({excluded[0].reason})"
    return Reg("CUDA", devices, unavailable_reason=reason, excluded=excluded,
               procs={"set_numerics": _set_numerics})


def _set_numerics(backend, numerics: str) -> None:
    backend.set_numerics(numerics)


def _version_hint(cupy) -> str:
    """Why a driver refuses this CuPy, where that is the reason: CuPy built for a newer CUDA
    than the driver runs (cupy-cuda13x under a CUDA 12 driver)."""
    try:
        driver = cupy.cuda.runtime.driverGetVersion()       # 0 without a driver
        built = cupy.cuda.runtime.runtimeGetVersion()
    except Exception:
        return ""
    if not driver or driver >= built:
        return ""
    def version(v: int) -> str:
        return f"{v // 1000}.{v % 1000 // 10}"
    return (f" (the driver runs CUDA {version(driver)}, this CuPy is built for CUDA "
            f"{version(built)}: pip install 'polydev[cuda{driver // 1000}]')")


def _probe_gpus(cupy, count: int) -> list[tuple[str | None, bool]]:
    """Whether each GPU builds and loads the backend's kernels (NVRTC through CuPy): None
    where it does, else the compiler's message; each answer kept per GPU, driver and
    compiler (``polydev.probes``), so a later process skips the build."""
    from .programs import KernelModule, build_error, build_key

    def build(indices: list[int]) -> list[str | None]:
        answers: list[str | None] = []
        for index in indices:
            try:
                KernelModule(cupy, index).build()
                answers.append(None)
            except Exception as e:     # CompileError, CUDADriverError, ...
                answers.append(build_error(e))
        return answers

    return cached_probes("cuda", [build_key(cupy, i) for i in range(count)], build)


register = reg_once(_make_reg)

__all__ = ["register"]
