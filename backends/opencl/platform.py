"""Finding OpenCL devices: one shared context per platform, and ggml-style selection.

All devices of a platform share one ``cl.Context``, so events and buffer-to-buffer copies work
between them. ``POLYDEV_OPENCL_PLATFORM`` and ``POLYDEV_OPENCL_DEVICE`` narrow the choice, as
GGML_OPENCL_PLATFORM / GGML_OPENCL_DEVICE do: each is an index or a case-insensitive part of
the name.

Every device proves at discovery that it builds and runs a kernel (``probe.py``); one that
cannot is left out with the compiler's own message, and a physical device that two platforms
offer (two PoCL installs, say) is offered once, by the first platform that works.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from polydev.device import ExcludedDevice

from .probe import probe_devices

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


def physical_identity(cl: Any, device: Any) -> tuple:
    """What tells one physical device from another across platforms: every CPU device is this
    host's CPU; a GPU is its PCI address where the driver reports one, else its vendor, name
    and memory size."""
    if device.type & cl.device_type.CPU:
        return ("host CPU",)
    try:
        info = cl.device_info
        return ("pci", int(device.get_info(info.PCI_DOMAIN_ID_NV)),
                int(device.get_info(info.PCI_BUS_ID_NV)), int(device.get_info(info.PCI_SLOT_ID_NV)))
    except Exception:                 # not NVIDIA's driver: each vendor's query differs
        pass
    try:
        topology = device.get_info(cl.device_info.TOPOLOGY_AMD)
        return ("pci", topology.bus, topology.device, topology.function)
    except Exception:
        pass
    return ("device", int(device.vendor_id), device.name.strip(), int(device.global_mem_size))


@dataclass
class Discovery:
    """The devices to offer (each with its platform's context), those left out and why, and
    why there is none when there is none."""

    found: list[tuple[PlatformContext, Any]] = field(default_factory=list)
    excluded: list[ExcludedDevice] = field(default_factory=list)
    reason: str | None = None


def discover(cl: Any) -> Discovery:
    """Every selected device that builds and runs a kernel, once per physical device (the
    first platform that offers it wins), and the devices left out with their reasons."""
    result = Discovery()
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:            # no ICD: PLATFORM_NOT_FOUND_KHR
        result.reason = f"no OpenCL platform ({e})"
        return result
    want_platform, want_device = os.environ.get(PLATFORM_ENV), os.environ.get(DEVICE_ENV)
    offered: dict[tuple, tuple[int, str]] = {}     # physical identity -> (platform, name)
    for p_index, platform in enumerate(platforms):
        if not _matches(want_platform, p_index, platform.name):
            continue
        try:
            devices = platform.get_devices(device_type=cl.device_type.ALL)
        except cl.Error as e:
            log.info("OpenCL platform %s lists no devices: %s", platform.name, e)
            continue
        chosen = [(i, d) for i, d in enumerate(devices) if _matches(want_device, i, d.name)]
        working = _working_devices(cl, p_index, platform, chosen, offered, result)
        if not working:
            continue
        try:
            ctx = PlatformContext(cl, platform, working)
        except cl.Error as e:
            log.warning("cannot create an OpenCL context on %s: %s", platform.name, e)
            continue
        for d in working:
            offered.setdefault(physical_identity(cl, d), (p_index, f"OpenCL{len(result.found)}"))
            result.found.append((ctx, d))
    if not result.found:
        result.reason = _why_none(result.excluded, want_platform, want_device)
    return result


def _working_devices(cl: Any, p_index: int, platform: Any, chosen: list[tuple[int, Any]],
                     offered: dict[tuple, tuple[int, str]], result: Discovery) -> list:
    """The chosen devices of one platform that pass the probe and that no earlier platform
    offers already; the others go to ``result.excluded``, logged."""
    working = []
    answers = probe_devices(p_index, platform, chosen) if chosen else []
    for (_, device), (answer, fresh) in zip(chosen, answers):
        label = (f"platform {p_index} {platform.name.strip()} ({platform.version.strip()}): "
                 f"{device.name.strip()}")
        twin = offered.get(physical_identity(cl, device))
        if answer is None and twin is not None and twin[0] != p_index:
            answer, fresh = f"the same device as {twin[1]}, offered by an earlier platform", False
        if answer is None:
            working.append(device)
            continue
        result.excluded.append(ExcludedDevice(label, answer))
        # said loudly once, when found; later processes read the answer from the cache
        log.log(logging.WARNING if fresh else logging.INFO, "OpenCL device left out: %s: %s",
                label, answer)
    return working


def _why_none(excluded: list[ExcludedDevice], want_platform: str | None,
              want_device: str | None) -> str:
    if excluded:
        first = excluded[0]
        more = f" (and {len(excluded) - 1} more)" if len(excluded) > 1 else ""
        return f"no OpenCL device works: {first.description}: {first.reason}{more}"
    if want_platform or want_device:
        return (f"no OpenCL device matches {PLATFORM_ENV}={want_platform!r} "
                f"{DEVICE_ENV}={want_device!r}")
    return "the OpenCL platforms have no devices"
