"""Finding OpenCL devices: one shared context per platform, and ggml-style selection.

All devices of a platform share one ``cl.Context``, so events and buffer-to-buffer copies work
between them. ``POLYDEV_OPENCL_PLATFORM`` and ``POLYDEV_OPENCL_DEVICE`` narrow the choice, as
GGML_OPENCL_PLATFORM / GGML_OPENCL_DEVICE do: each is an index or a case-insensitive part of
the name.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

log = logging.getLogger(__name__)

PLATFORM_ENV = "POLYDEV_OPENCL_PLATFORM"
DEVICE_ENV = "POLYDEV_OPENCL_DEVICE"


class PlatformContext:
    """One OpenCL platform, its context over the chosen devices, and their live queues."""

    def __init__(self, cl: Any, platform: Any, devices: list) -> None:
        self.cl = cl
        self.platform = platform
        self.name = platform.name.strip()
        self.context = cl.Context(devices)
        self._queues: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()

    def track(self, queue_owner: Any) -> None:
        """Remember a backend whose queue blocking transfers must wait for."""
        with self._lock:
            self._queues.add(queue_owner)

    def finish_all(self) -> None:
        """Wait for every live backend queue of this context.

        A blocking read or write must see the kernels and copies queued before it, whichever
        backend queued them (a cross-device copy runs on its source's queue).
        """
        with self._lock:
            owners = list(self._queues)
        for owner in owners:
            owner.finish_queue()


def _matches(value: str | None, index: int, name: str) -> bool:
    if value is None or value == "":
        return True
    if value.strip().isdigit():
        return int(value) == index
    return value.strip().lower() in name.lower()


def discover(cl: Any) -> tuple[list[tuple[PlatformContext, Any]], str | None]:
    """Every selected (platform context, cl.Device), and the reason when there is none."""
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:            # no ICD: PLATFORM_NOT_FOUND_KHR
        return [], f"no OpenCL platform ({e})"
    want_platform, want_device = os.environ.get(PLATFORM_ENV), os.environ.get(DEVICE_ENV)
    found: list[tuple[PlatformContext, Any]] = []
    for p_index, platform in enumerate(platforms):
        if not _matches(want_platform, p_index, platform.name):
            continue
        try:
            devices = platform.get_devices(device_type=cl.device_type.ALL)
        except cl.Error as e:
            log.info("OpenCL platform %s lists no devices: %s", platform.name, e)
            continue
        chosen = [d for i, d in enumerate(devices) if _matches(want_device, i, d.name)]
        if not chosen:
            continue
        try:
            ctx = PlatformContext(cl, platform, chosen)
        except cl.Error as e:
            log.warning("cannot create an OpenCL context on %s: %s", platform.name, e)
            continue
        found += [(ctx, d) for d in chosen]
    if found:
        return found, None
    if want_platform or want_device:
        return [], (f"no OpenCL device matches {PLATFORM_ENV}={want_platform!r} "
                    f"{DEVICE_ENV}={want_device!r}")
    return [], "the OpenCL platforms have no devices"
