"""accelerate's placement policy, for users coming from Hugging Face:

- ``device_map``: layers (an int, a ``range``, "3", "0-11") or "output" to a device (a name
  such as "CUDA0", "cuda:0", "cpu", or an int: the index among the offload devices); a key
  that is not a layer is a tensor-name regex, a rule as ``-ot``'s. Layers it does not name
  stay on the CPU. ``device_map="auto"`` fits the model instead.
- ``max_memory``: bytes per device; with it (or with ``device_map="auto"``) layers fill the
  devices in priority order, each keeping room for its layers' KV cache and an estimate of
  its compute buffers. Accelerators it does not name are not used; the CPU, unless named,
  takes whatever is left.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from polydev.device import Device
from polydev.errors import AllocationError, InvalidArgumentError

from .gguf import GGUFTensorInfo
from .placement_devices import map_target
from .placement_settings import PlacementSettings, layer_range

__all__ = ["fits_memory", "fitted_layers", "mapped_layers"]


def fits_memory(settings: PlacementSettings) -> bool:
    """Whether the layers are fitted to memory (``device_map="auto"``, or ``max_memory``
    without a map) rather than placed by a rule."""
    return settings.device_map == "auto" or (settings.max_memory is not None
                                             and settings.device_map is None)


def mapped_layers(settings: PlacementSettings, n_layer: int, offload: list[Device],
                  cpu: Device) -> tuple[list[Device], list[tuple[re.Pattern, Any]]]:
    """An explicit ``device_map``: the device of each layer (the output layer last), and the
    rules of its tensor-name keys."""
    layers: list[Device] = [cpu] * (n_layer + 1)
    rules = []
    for key, target in settings.device_map:
        device = map_target(target, offload, cpu)
        span = _layer_span(key, n_layer)
        if span is None:
            rules.append((re.compile(key), device))
            continue
        for il in span:
            layers[il] = device
    return layers, rules


def _layer_span(key: int | range | str, n_layer: int) -> range | None:
    """The layers a device_map key names (``n_layer`` = the output layer), or None for a
    tensor-name pattern."""
    if isinstance(key, int):
        span = range(key, key + 1)
    elif isinstance(key, range):
        span = key
    elif key == "output":
        return range(n_layer, n_layer + 1)
    elif (bounds := layer_range(key)) is not None:
        span = range(bounds[0], bounds[1] + 1)
    else:
        return None
    if not span or span.start < 0 or span.stop > n_layer + 1:
        raise InvalidArgumentError(f"device_map key {key!r} names layers outside 0..{n_layer} "
                                   f"(the model has {n_layer} layers; {n_layer} is the output)")
    return span


def fitted_layers(settings: PlacementSettings, n_layer: int,
                  infos: Mapping[str, GGUFTensorInfo],
                  roles: Mapping[str, tuple[int | None, str]], offload: list[Device],
                  cpu: Device, kv_bytes: list[int], compute: int) -> list[Device]:
    """accelerate's sequential fit: layers (then the output layer) fill the devices in
    priority order, each device keeping room for its KV cache and compute buffers."""
    left = _budgets(offload, cpu, settings.max_memory)
    layer_bytes, input_bytes = _bytes_per_layer(n_layer, infos, roles)
    order = [d for d in offload if d.name in left] + [cpu]
    for device in order:
        left[device.name] -= compute
    left[cpu.name] -= input_bytes
    out, k = [], 0
    for il in range(n_layer + 1):
        kv = kv_bytes[il] if il < n_layer else 0
        while True:
            device = order[k]
            kv_here = 0 if settings.no_kv_offload and device is not cpu else kv
            need = layer_bytes[il] + kv_here
            if need <= left[device.name]:
                left[device.name] -= need
                out.append(device)
                break
            if device is cpu:
                raise AllocationError(
                    f"the model does not fit in max_memory: layer {il} needs {need:,} bytes "
                    f"and the CPU has {max(left[cpu.name], 0):,} left")
            k += 1
    return out


def _bytes_per_layer(n_layer: int, infos: Mapping[str, GGUFTensorInfo],
                     roles: Mapping[str, tuple[int | None, str]]) -> tuple[list[int], int]:
    """The weight bytes of each layer (the output layer last), and of the input layer."""
    layer_bytes = [0] * (n_layer + 1)
    input_bytes = 0
    for name, info in infos.items():
        layer, _ = roles[name]
        if layer is None:
            input_bytes += info.nbytes
        else:
            layer_bytes[layer] += info.nbytes
    return layer_bytes, input_bytes


def _budgets(offload: list[Device], cpu: Device,
             max_memory: tuple[tuple[Any, int], ...] | None) -> dict[str, float]:
    """Bytes each device may take: what ``max_memory`` says (default: the free memory of
    every offload device); the CPU, unless it is named, takes whatever is left."""
    if max_memory is None:
        budgets: dict[str, float] = {d.name: d.memory()[0] for d in offload}
    else:
        budgets = {map_target(key, offload, cpu).name: size for key, size in max_memory}
    budgets.setdefault(cpu.name, math.inf)
    return budgets
