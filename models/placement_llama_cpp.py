"""llama.cpp's placement policy (``llama_model::load_tensors``), exactly:

- ``split_mode="none"`` uses the offload device ``main_gpu`` alone; "layer" uses them all.
- ``n_gpu_layers`` offloads the last layers: layer ``il`` (``il == n_layer`` is the output
  layer) is offloaded when ``il >= max(n_layer + 1 - ngl, 0)``; -1 offloads all.
- Offloaded layers go to device ``upper_bound(splits, (il - first) / n_offloaded)``, where the
  splits are the cumulative, normalised ``tensor_split`` (default: each device's free memory).
- ``override_tensor`` rules (``regex=device``, first match wins, as ``-ot``) pick a tensor's
  device; ``cpu_moe`` adds ``\\.ffn_(up|down|gate)_(ch|)exps=CPU`` after them.

Which buffer type a weight then gets is ``placement_buffers`` (select_weight_buft).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from polydev.device import Device
from polydev.errors import InvalidArgumentError

from .placement_settings import PlacementSettings

__all__ = ["CPU_MOE_PATTERN", "split_mode_devices", "llama_cpp_layers", "override_rules"]

CPU_MOE_PATTERN = r"\.ffn_(up|down|gate)_(ch|)exps"


def split_mode_devices(offload: list[Device], settings: PlacementSettings) -> list[Device]:
    """The offload devices ``split_mode`` leaves in play."""
    if settings.split_mode == "layer" or not offload:
        return offload
    main_gpu = settings.main_gpu
    if main_gpu >= len(offload):
        raise InvalidArgumentError(f"main_gpu {main_gpu} is out of range: there are "
                                   f"{len(offload)} offload devices "
                                   f"({', '.join(d.name for d in offload)})")
    return [offload[main_gpu]]


def llama_cpp_layers(n_layer: int, settings: PlacementSettings, offload: list[Device],
                     cpu: Device) -> list[Device]:
    """llama.cpp's layer-to-device rule; entry ``n_layer`` is the output layer."""
    n_gpu_layers = settings.n_gpu_layers
    ngl = n_layer + 1 if n_gpu_layers == -1 else n_gpu_layers
    splits = _split_points(offload, settings.tensor_split, cpu)
    first = max(n_layer + 1 - ngl, 0)
    n_offloaded = 0 if not offload else min(ngl, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < first or il - first >= n_offloaded:
            out.append(cpu)
            continue
        # upper_bound over the split points, in float32 as llama.cpp computes it
        x = np.float32(il - first) / np.float32(n_offloaded)
        out.append(offload[min(int(np.searchsorted(splits, x, side="right")), len(offload) - 1)])
    return out


def _split_points(offload: list[Device], tensor_split: tuple[float, ...],
                  cpu: Device) -> np.ndarray:
    """Cumulative, normalised split proportions (llama.cpp computes them in float32)."""
    if not offload:
        return np.zeros(0, np.float32)
    if len(tensor_split) > len(offload):
        raise InvalidArgumentError(f"tensor_split has {len(tensor_split)} entries for "
                                   f"{len(offload)} devices")
    props = list(tensor_split) + [0.0] * (len(offload) - len(tensor_split))
    if not any(props):
        props = [float(d.memory()[0] or cpu.memory()[0]) for d in offload]
    cum = np.cumsum(np.asarray(props, dtype=np.float32), dtype=np.float32)
    return cum / cum[-1]


def override_rules(settings: PlacementSettings) -> list[tuple[re.Pattern, Any]]:
    """The ``-ot`` rules in order, then ``--cpu-moe``'s."""
    rules = list(settings.override_tensor)
    if settings.cpu_moe:
        rules.append((re.compile(CPU_MOE_PATTERN), "CPU"))
    return rules
