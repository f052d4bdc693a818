"""The devices the placement knobs name: the offload devices (``devices``), and the device a
rule or a map points at (a ``Device``, an index among the offload devices, or a name)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Sequence

import polydev
from polydev.device import Device, DeviceType, lost_text
from polydev.errors import InvalidArgumentError

if TYPE_CHECKING:
    from .placement_settings import PlacementSettings

__all__ = ["in_service", "map_target", "offload_devices"]

log = logging.getLogger(__name__)


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


def in_service(offload: list[Device], settings: "PlacementSettings"
               ) -> tuple[list[Device], "PlacementSettings"]:
    """The offload devices that are not lost (a remote device whose node is gone), and the
    settings without the lost ones' ``tensor_split`` shares: their layers go to the devices
    that remain (a model placed again after a node is lost runs on what is left). A lost
    ``main_gpu`` gives way to the first device that remains."""
    lost = {i for i, d in enumerate(offload) if d.lost is not None}
    if not lost:
        return offload, settings
    for i in sorted(lost):
        log.warning("%s: its layers go to the devices that remain",
                    lost_text(offload[i].name, offload[i].lost))
    split = tuple(x for i, x in enumerate(settings.tensor_split) if i not in lost)
    main = settings.main_gpu
    main = 0 if main in lost else main - sum(i < main for i in lost)
    return ([d for i, d in enumerate(offload) if i not in lost],
            dataclasses.replace(settings, tensor_split=split, main_gpu=max(main, 0)))


def map_target(target: Any, offload: list[Device], cpu: Device) -> Device:
    """A device named in a knob: a Device, an index among the offload devices, or a name,
    looked up among the devices in play before the registry ("GPU1", "cuda:0", "cpu")."""
    if isinstance(target, Device):
        return _unless_lost(target, cpu)
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < len(offload):
            raise InvalidArgumentError(f"device index {target} is not an offload device "
                                       f"(there are {len(offload)})")
        return offload[target]
    for device in (*offload, cpu):
        if isinstance(target, str) and device.name.lower() == target.strip().lower():
            return device
    return _unless_lost(polydev.device(target), cpu)


def _unless_lost(device: Device, cpu: Device) -> Device:
    if device.lost is None:
        return device
    log.warning("%s: what a rule puts there stays on the CPU", lost_text(device.name,
                                                                           device.lost))
    return cpu
