"""The devices the placement knobs name: the offload devices (``devices``), and the device a
rule or a map points at (a ``Device``, an index among the offload devices, or a name)."""

from __future__ import annotations

from typing import Any, Sequence

import polydev
from polydev.device import Device, DeviceType
from polydev.errors import InvalidArgumentError

__all__ = ["offload_devices", "map_target"]


def offload_devices(devices: Sequence[str | Device] | None, cpu: Device) -> list[Device]:
    """The devices to offload to: those given (the CPU is never one; it is the host that takes
    what is not offloaded), or by default every GPU, else every integrated GPU."""
    if devices is None:
        every = polydev.devices()
        gpus = [d for d in every if d.type == DeviceType.GPU]
        return gpus or [d for d in every if d.type == DeviceType.IGPU]
    out: list[Device] = []
    for d in devices:
        dev = polydev.device(d)
        if dev is not cpu and dev not in out:
            out.append(dev)
    return out


def map_target(target: Any, offload: list[Device], cpu: Device) -> Device:
    """A device named in a knob: a Device, an index among the offload devices, or a name,
    looked up among the devices in play before the registry ("GPU1", "cuda:0", "cpu")."""
    if isinstance(target, Device):
        return target
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < len(offload):
            raise InvalidArgumentError(f"device index {target} is not an offload device "
                                       f"(there are {len(offload)})")
        return offload[target]
    for device in (*offload, cpu):
        if isinstance(target, str) and device.name.lower() == target.strip().lower():
            return device
    return polydev.device(target)
