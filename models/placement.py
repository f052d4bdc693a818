"""Which device and buffer type holds each weight, and where each layer's KV cache goes:
``plan_placement(file, settings)`` and its result, ``Placement``.

The knobs are one record, ``PlacementSettings`` (``placement_settings``). Which device each
layer goes to is a policy's: llama.cpp's (``n_gpu_layers``, ``tensor_split``, ``split_mode``,
``main_gpu``; ``placement_llama_cpp``) by default, accelerate's (``device_map``,
``max_memory``; ``placement_accelerate``) when those are given. What every policy shares is
here:

- The offload devices are the given ones (default: every GPU, else every integrated GPU; the
  CPU backend is never one of them, it is the host that takes what is not offloaded).
- The token embedding (the input layer) stays on the CPU: it is read with GET_ROWS.
- Override rules (``-ot``, ``cpu_moe``, a ``device_map``'s tensor-name keys) pick a tensor's
  device, first match wins; any other weight goes where its layer went, on the first buffer
  type whose device can run the op the weight is used in (``placement_buffers``). The file
  is checked against its architecture's table first (``model_check``).
- A model without ``output.weight`` uses the token embedding as its output matrix: it is
  placed again as the output layer's ``output.weight``.
- Each layer's KV cache goes with the layer (``no_kv_offload``: to the CPU), sized for
  ``n_ctx`` tokens padded to 256 cells.

The result is a ``Placement``: per tensor its device, buffer type, bytes and the reason; per
device its layers and totals of weights, KV cache and estimated compute memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import polydev
from polydev import GGMLType
from polydev.buffer import BufferType
from polydev.device import Device

from .arch import ExpectedTensor
from .gguf import GGUFFile, GGUFTensorInfo
from .hparams import HParams
from .model_check import check_tensors
from .placement_accelerate import fits_memory, fitted_layers, mapped_layers
from .placement_buffers import WeightBufferChooser
from .placement_devices import in_service, map_target, offload_devices
from .placement_llama_cpp import llama_cpp_layers, override_rules, split_mode_devices
from .placement_settings import PlacementSettings, settings_from

__all__ = ["Placement", "TensorPlacement", "DeviceUsage", "plan_placement", "kv_size", "KV_PAD"]

KV_PAD = 256                      # llama.cpp pads the KV cache to 256 cells


@dataclass(frozen=True)
class TensorPlacement:
    """Where one weight goes. ``name`` is the model's name for it; ``source`` the GGUF tensor
    whose bytes it holds (they differ for a tied output matrix)."""

    name: str
    source: str
    type: GGMLType
    ne: tuple[int, ...]
    nbytes: int
    layer: int | None            # None: the input layer; n_layer: the output layer
    op: str
    device: Device
    buffer_type: BufferType
    cause: str


@dataclass
class DeviceUsage:
    """What one device holds: its layers and byte totals (compute is an estimate)."""

    device: Device
    layers: list[int] = field(default_factory=list)
    weights: int = 0
    kv_cache: int = 0
    compute: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute


@dataclass
class Placement:
    """The inspectable result of ``plan_placement``."""

    hparams: HParams
    cpu: Device
    offload_devices: list[Device]
    layer_devices: list[Device]          # n_layer + 1 entries: the last is the output layer
    kv_devices: list[Device]             # per layer
    kv_cells: list[int]                  # per layer: cells of its KV cache
    tensors: dict[str, TensorPlacement]
    usage: dict[str, DeviceUsage]
    settings: PlacementSettings          # the knobs it was planned with

    @property
    def output_device(self) -> Device:
        return self.layer_devices[-1]

    def device_of(self, name: str) -> Device:
        """The device of the weight named ``name``."""
        return self.tensors[name].device

    def applied_settings(self) -> dict[str, Any]:
        """The knobs as plain data, ``devices`` being the offload devices they came to."""
        return {**self.settings.as_dict(), "devices": [d.name for d in self.offload_devices]}

    def as_dict(self) -> dict[str, Any]:
        """Plain data (what ``polydev info --json`` prints)."""
        return {
            "settings": self.applied_settings(),
            "layers": [d.name for d in self.layer_devices[:-1]],
            "output": self.output_device.name,
            "kv_cache": [d.name for d in self.kv_devices],
            "devices": [{"device": u.device.name, "layers": u.layers, "weights": u.weights,
                         "kv_cache": u.kv_cache, "compute": u.compute, "total": u.total}
                        for u in self.usage.values()],
            "tensors": [{"name": t.name, "source": t.source, "type": str(t.type),
                         "ne": list(t.ne), "bytes": t.nbytes, "layer": t.layer, "op": t.op,
                         "device": t.device.name, "buffer_type": t.buffer_type.name,
                         "cause": t.cause} for t in self.tensors.values()],
        }


# --- planning -----------------------------------------------------------------------------------

def plan_placement(f: GGUFFile, settings: PlacementSettings | None = None,
                   **knobs: Any) -> Placement:
    """Place every weight of ``f`` as ``settings`` say (see the module docstring for the
    rules); keywords change single knobs of it: ``plan_placement(f, n_gpu_layers=10)``."""
    settings = settings_from(settings, knobs)
    hp = HParams.from_gguf(f)
    cpu = polydev.registry().device("CPU")
    offload, settings = in_service(offload_devices(settings.devices, cpu), settings)
    offload = split_mode_devices(offload, settings)
    kv_cells = [kv_size(settings.n_ctx)] * hp.n_layer
    kv_bytes = [_kv_layer_bytes(hp, il, kv_cells[il], settings.type_k, settings.type_v)
                for il in range(hp.n_layer)]
    roles = _roles(check_tensors(f, hp), hp.n_layer)
    infos = _model_tensors(f)
    compute = _compute_estimate(hp, settings.n_ctx, settings.n_batch)
    layer_devices, map_rules = _layer_devices(settings, hp.n_layer, infos, roles, offload, cpu,
                                              kv_bytes, compute)
    rules = [(pattern, map_target(target, offload, cpu))
             for pattern, target in override_rules(settings) + map_rules]
    tensors = _place_tensors(hp, infos, roles, layer_devices, rules, cpu)
    kv_devices = [cpu if settings.no_kv_offload else layer_devices[il]
                  for il in range(hp.n_layer)]
    usage = _usage(cpu, offload, layer_devices, kv_devices, kv_bytes, tensors, compute)
    return Placement(hp, cpu, offload, layer_devices, kv_devices, kv_cells, tensors, usage,
                     settings)


def _layer_devices(settings: PlacementSettings, n_layer: int,
                   infos: Mapping[str, GGUFTensorInfo],
                   roles: Mapping[str, tuple[int | None, str]], offload: list[Device],
                   cpu: Device, kv_bytes: list[int],
                   compute: int) -> tuple[list[Device], list[tuple[re.Pattern, Any]]]:
    """Each layer's device (the output layer last) by the policy the knobs choose, and the
    override rules that policy adds."""
    if fits_memory(settings):
        return fitted_layers(settings, n_layer, infos, roles, offload, cpu, kv_bytes,
                             compute), []
    if settings.device_map is not None:
        return mapped_layers(settings, n_layer, offload, cpu)
    return llama_cpp_layers(n_layer, settings, offload, cpu), []


# --- per tensor ---------------------------------------------------------------------------------

def _place_tensors(hp: HParams, infos: Mapping[str, GGUFTensorInfo],
                   roles: Mapping[str, tuple[int | None, str]], layer_devices: list[Device],
                   rules: list[tuple[re.Pattern, Device]],
                   cpu: Device) -> dict[str, TensorPlacement]:
    """Each weight where the first override rule matching its name says, or where its layer
    went on a buffer type that can run its op (the input layer's on the CPU)."""
    chooser = WeightBufferChooser(hp, cpu)
    tensors: dict[str, TensorPlacement] = {}
    for name, info in infos.items():
        layer, op = roles[name]
        rule = next(((p, device) for p, device in rules if p.search(name)), None)
        if rule is not None:
            pattern, device = rule
            buft, cause = device.buffer_type, f"override {pattern.pattern}"
        else:
            device, buft, cause = chooser.choose(
                name, info, layer, op, cpu if layer is None else layer_devices[layer])
        tensors[name] = TensorPlacement(name, info.name, info.type, info.ne, info.nbytes, layer,
                                        op, device, buft, cause)
    return tensors


def _model_tensors(f: GGUFFile) -> dict[str, GGUFTensorInfo]:
    """The GGUF tensors plus, for a tied model, the output matrix as the token embedding."""
    infos = dict(f.tensors)
    if "output.weight" not in infos and "token_embd.weight" in infos:
        infos["output.weight"] = infos["token_embd.weight"]
    return infos


def _roles(present: Mapping[str, ExpectedTensor],
           n_layer: int) -> dict[str, tuple[int | None, str]]:
    """(layer, op) of each weight, as its architecture's table says (None: the input layer,
    n_layer: the output layer); a tied output matrix is the output layer's MUL_MAT."""
    roles = {name: (t.layer, t.spec.op) for name, t in present.items()}
    roles.setdefault("output.weight", (n_layer, "MUL_MAT"))
    return roles


# --- memory -------------------------------------------------------------------------------------

def kv_size(n_ctx: int) -> int:
    """Cells of each layer's KV cache: n_ctx padded to 256. Sliding-window layers keep a full
    cache too (their mask hides what is out of the window); llama.cpp's smaller ring cache
    for them is not built yet."""
    return -(-n_ctx // KV_PAD) * KV_PAD


def _kv_layer_bytes(hp: HParams, il: int, cells: int, type_k: GGMLType,
                    type_v: GGMLType) -> int:
    values = 0 if hp.v_in_k else type_v.traits.row_size(hp.n_embd_v_gqa(il))
    return cells * (type_k.traits.row_size(hp.n_embd_k_gqa(il)) + values)


def _compute_estimate(hp: HParams, n_ctx: int, n_batch: int) -> int:
    """A rough size of one device's compute buffers for a batch of ``n_batch`` tokens: the
    residual stream and its projections, the feed-forward activations, one layer's attention
    scores, and the logits of the batch (float32)."""
    per_token = 4 * hp.n_embd + 2 * max(hp.n_ff, hp.n_embd) + hp.n_head * min(n_ctx, 4096)
    return 4 * n_batch * per_token + 4 * hp.n_vocab


def _usage(cpu: Device, offload: list[Device], layer_devices: list[Device],
           kv_devices: list[Device], kv_bytes: list[int],
           tensors: Mapping[str, TensorPlacement], compute: int) -> dict[str, DeviceUsage]:
    usage = {d.name: DeviceUsage(d) for d in [*offload, cpu]}
    for il, d in enumerate(layer_devices):
        usage.setdefault(d.name, DeviceUsage(d)).layers.append(il)
    for il, d in enumerate(kv_devices):
        usage.setdefault(d.name, DeviceUsage(d)).kv_cache += kv_bytes[il]
    shared = set()         # a tied output matrix beside its source costs nothing more
    for t in tensors.values():
        if (t.source, t.buffer_type.name) in shared:
            continue
        shared.add((t.source, t.buffer_type.name))
        usage.setdefault(t.device.name, DeviceUsage(t.device)).weights += t.nbytes
    for u in usage.values():
        if u.layers or u.device is cpu:
            u.compute = compute
    return {name: u for name, u in usage.items() if u.layers or u.weights or u.kv_cache
            or u.device is cpu}
