"""Which device and buffer type holds each weight: llama.cpp's knobs and accelerate's.

llama.cpp's rules (``llama_model::load_tensors``), exactly:

- The offload devices are the given ones (default: every GPU, else every integrated GPU; the
  CPU backend is never one of them, it is the host that takes what is not offloaded).
- ``n_gpu_layers`` offloads the last layers: layer ``il`` (``il == n_layer`` is the output
  layer) is offloaded when ``il >= max(n_layer + 1 - ngl, 0)``; -1 offloads all.
- Offloaded layers go to device ``upper_bound(splits, (il - first) / n_offloaded)``, where the
  splits are the cumulative, normalised ``tensor_split`` (default: each device's free memory).
- ``split_mode="none"`` uses ``main_gpu`` alone; ``"row"`` is not supported.
- The token embedding (the input layer) stays on the CPU: it is read with GET_ROWS.
- ``override_tensor`` rules (``regex=device``, first match wins, as ``-ot``) pick a tensor's
  device; ``cpu_moe`` adds ``\\.ffn_(up|down|gate)_(ch|)exps=CPU`` after them.
- A tensor gets the first buffer type of its layer's list (the device's own, then the CPU's)
  whose device can run the op the tensor is used in (MUL_MAT, GET_ROWS, MUL_MAT_ID, ...: the
  op its architecture's table names, ``polydev.models.arch``), as ``select_weight_buft``; so a
  device that lacks an op never gets its weights. The file is checked against that table
  first (``model_check``).
- A model without ``output.weight`` uses the token embedding as its output matrix: it is
  placed again as the output layer's ``output.weight``.

accelerate's, for users coming from Hugging Face:

- ``device_map``: a dict from a layer (int), layers (``range``, ``"3"``, ``"0-11"``),
  ``"input"``/``"output"`` or a tensor-name regex to a device (a name such as ``"CUDA0"``,
  ``"cuda:0"``, ``"cpu"``, or an int: the index among the offload devices). Layers it does not
  name stay on the CPU. ``device_map="auto"`` fits the model instead.
- ``max_memory``: bytes per device (an int or ``"10GiB"``, ``"500MB"``); with it (or with
  ``device_map="auto"``) layers fill the devices in priority order, each keeping room for its
  layers' KV cache and an estimate of its compute buffers. Accelerators it does not name are
  not used; the CPU, unless named, takes whatever is left.

The result is a ``Placement``: per tensor its device, buffer type, bytes and the reason; per
device its layers and totals of weights, KV cache and estimated compute memory.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

import polydev
from polydev import Context, GGMLType, ops
from polydev.buffer import BufferType
from polydev.device import Device, DeviceType
from polydev.errors import AllocationError, InvalidArgumentError, PolydevError, UnsupportedError

from .arch import ExpectedTensor
from .gguf import GGUFFile, GGUFTensorInfo
from .hparams import HParams
from .model_check import check_tensors

__all__ = ["Placement", "TensorPlacement", "DeviceUsage", "plan_placement", "parse_size",
           "parse_overrides", "kv_size", "CPU_MOE_PATTERN", "KV_PAD"]

CPU_MOE_PATTERN = r"\.ffn_(up|down|gate)_(ch|)exps"
KV_PAD = 256                      # llama.cpp pads the KV cache to 256 cells
_PROBE_TOKENS = 512               # the batch size llama.cpp probes ops with
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


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
    settings: dict[str, Any]

    @property
    def output_device(self) -> Device:
        return self.layer_devices[-1]

    def device_of(self, name: str) -> Device:
        """The device of the weight named ``name``."""
        return self.tensors[name].device

    def as_dict(self) -> dict[str, Any]:
        """Plain data (what ``polydev info --json`` prints)."""
        return {
            "settings": self.settings,
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


# --- the knobs ----------------------------------------------------------------------------------

def parse_size(value: int | float | str, what: str = "size") -> int:
    """Bytes from an int or a string such as ``"10GiB"``, ``"500MB"``, ``"1.5 GB"``."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what}: {value!r} is not a size")
    if isinstance(value, (int, float)):
        if value < 0 or not math.isfinite(value):
            raise InvalidArgumentError(f"{what}: {value!r} is not a size")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise InvalidArgumentError(f"{what}: {value!r} is not a size (e.g. 2048, '10GiB', "
                                   "'500MB')")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_overrides(rules: Iterable[str | tuple[str, Any]]) -> list[tuple[re.Pattern, Any]]:
    """``["regex=device", ...]`` or ``[(regex, device), ...]`` as compiled rules (``-ot``
    also takes several comma-separated rules in one string)."""
    out = []
    for rule in rules:
        pairs = ([tuple(r.rsplit("=", 1)) for r in rule.split(",") if r.strip()]
                 if isinstance(rule, str) else [rule])
        for pair in pairs:
            if len(pair) != 2 or not str(pair[0]):
                raise InvalidArgumentError(f"override {rule!r} is not 'regex=device'")
            pattern, target = pair
            try:
                out.append((re.compile(pattern), target))
            except re.error as e:
                raise InvalidArgumentError(f"override {rule!r}: bad regex ({e})") from None
    return out


# --- planning -----------------------------------------------------------------------------------

def plan_placement(
    f: GGUFFile, *, devices: Sequence[str | Device] | None = None, n_gpu_layers: int = -1,
    split_mode: str = "layer", tensor_split: Sequence[float] | None = None, main_gpu: int = 0,
    override_tensor: Iterable[str | tuple[str, Any]] = (), cpu_moe: bool = False,
    no_kv_offload: bool = False, device_map: Mapping | str | None = None,
    max_memory: Mapping[Any, int | str] | None = None, n_ctx: int = 4096, n_batch: int = 512,
    type_k: str | GGMLType = "f16", type_v: str | GGMLType = "f16",
) -> Placement:
    """Place every weight of ``f`` (see the module docstring for the rules)."""
    hp = HParams.from_gguf(f)
    cpu = polydev.registry().device("CPU")
    offload = _offload_devices(devices, cpu)
    offload = _apply_split_mode(offload, split_mode, main_gpu)
    if n_ctx <= 0 or n_batch <= 0:
        raise InvalidArgumentError(f"n_ctx ({n_ctx}) and n_batch ({n_batch}) must be positive")
    type_k, type_v = GGMLType.parse(type_k), GGMLType.parse(type_v)
    kv_cells = [kv_size(n_ctx)] * hp.n_layer
    kv_bytes = [_kv_layer_bytes(hp, il, kv_cells[il], type_k, type_v) for il in range(hp.n_layer)]
    roles = _roles(check_tensors(f, hp), hp.n_layer)
    infos = _model_tensors(f)
    rules = parse_overrides(override_tensor)
    if cpu_moe:
        rules.append((re.compile(CPU_MOE_PATTERN), "CPU"))
    compute = _compute_estimate(hp, n_ctx, n_batch)

    if device_map == "auto" or (max_memory is not None and device_map is None):
        layer_devices = _fit(hp, infos, roles, offload, cpu, max_memory, kv_bytes, compute,
                             no_kv_offload)
    elif device_map is not None:
        layer_devices, map_rules = _explicit_map(device_map, hp, offload, cpu)
        rules += map_rules
    else:
        layer_devices = _llama_cpp_layers(hp.n_layer, n_gpu_layers, offload, cpu, tensor_split)

    rules = [(pattern, _map_target(target, offload, cpu)) for pattern, target in rules]
    chooser = _BufferChooser(hp, cpu)
    tensors: dict[str, TensorPlacement] = {}
    for name, info in infos.items():
        layer, op = roles[name]
        device = cpu if layer is None else layer_devices[layer]
        tensors[name] = chooser.place(name, info, layer, op, device, rules)
    kv_devices = [cpu if no_kv_offload else layer_devices[il] for il in range(hp.n_layer)]
    usage = _usage(cpu, offload, layer_devices, kv_devices, kv_bytes, tensors, compute)
    settings = dict(devices=[d.name for d in offload], n_gpu_layers=n_gpu_layers,
                    split_mode=split_mode, tensor_split=list(tensor_split or []),
                    main_gpu=main_gpu, override_tensor=[f"{p.pattern}={_name(t)}"
                                                        for p, t in rules],
                    no_kv_offload=no_kv_offload, n_ctx=n_ctx, n_batch=n_batch,
                    type_k=str(type_k), type_v=str(type_v),
                    device_map=device_map if isinstance(device_map, str) else (
                        None if device_map is None else {str(k): _name(v)
                                                         for k, v in device_map.items()}),
                    max_memory=None if max_memory is None else {
                        str(k): parse_size(v, f"max_memory[{k!r}]")
                        for k, v in max_memory.items()})
    return Placement(hp, cpu, offload, layer_devices, kv_devices, kv_cells, tensors, usage,
                     settings)


def _name(target: Any) -> str:
    return target.name if isinstance(target, Device) else str(target)


def _offload_devices(devices: Sequence[str | Device] | None, cpu: Device) -> list[Device]:
    if devices is None:
        every = polydev.devices()
        gpus = [d for d in every if d.type == DeviceType.GPU]
        return gpus or [d for d in every if d.type == DeviceType.IGPU]
    if isinstance(devices, (str, Device)):
        devices = [devices]
    out: list[Device] = []
    for d in devices:
        dev = polydev.device(d)
        if dev is not cpu and dev not in out:
            out.append(dev)
    return out


def _apply_split_mode(offload: list[Device], split_mode: str, main_gpu: int) -> list[Device]:
    if split_mode == "layer":
        return offload
    if split_mode == "row":
        raise UnsupportedError("split_mode 'row' (rows of each matrix over several devices) "
                               "is not supported; use 'layer' or 'none'")
    if split_mode != "none":
        raise InvalidArgumentError(f"split_mode must be 'none', 'layer' or 'row', got "
                                   f"{split_mode!r}")
    if not offload:
        return offload
    if not 0 <= main_gpu < len(offload):
        raise InvalidArgumentError(f"main_gpu {main_gpu} is out of range: there are "
                                   f"{len(offload)} offload devices "
                                   f"({', '.join(d.name for d in offload)})")
    return [offload[main_gpu]]


def _llama_cpp_layers(n_layer: int, n_gpu_layers: int, offload: list[Device], cpu: Device,
                      tensor_split: Sequence[float] | None) -> list[Device]:
    """llama.cpp's layer-to-device rule; entry ``n_layer`` is the output layer."""
    if n_gpu_layers < -1:
        raise InvalidArgumentError(f"n_gpu_layers must be -1 (all) or more, got {n_gpu_layers}")
    ngl = n_layer + 1 if n_gpu_layers == -1 else n_gpu_layers
    splits = _split_points(offload, tensor_split, cpu)
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


def _split_points(offload: list[Device], tensor_split: Sequence[float] | None,
                  cpu: Device) -> np.ndarray:
    """Cumulative, normalised split proportions (llama.cpp computes them in float32)."""
    if not offload:
        return []
    if tensor_split is not None and len(tensor_split) > len(offload):
        raise InvalidArgumentError(f"tensor_split has {len(tensor_split)} entries for "
                                   f"{len(offload)} devices")
    props = list(tensor_split or []) + [0.0] * (len(offload) - len(tensor_split or []))
    if any(not math.isfinite(p) or p < 0 for p in props):
        raise InvalidArgumentError(f"tensor_split entries must be finite and >= 0: {props}")
    if not any(props):
        props = [float(d.memory()[0] or cpu.memory()[0]) for d in offload]
    cum = np.cumsum(np.asarray(props, dtype=np.float32), dtype=np.float32)
    return cum / cum[-1]


def _explicit_map(device_map: Mapping, hp: HParams, offload: list[Device],
                  cpu: Device) -> tuple[list[Device], list[tuple[re.Pattern, Any]]]:
    """accelerate-style dict: layers it names go to their device, the rest to the CPU;
    string keys that are not layer ranges are tensor-name patterns (rules)."""
    layers: list[Device] = [cpu] * (hp.n_layer + 1)
    rules = []
    for key, target in device_map.items():
        device = _map_target(target, offload, cpu)
        span = _layer_span(key, hp.n_layer)
        if span is None:
            rules += parse_overrides([(str(key), device)])
            continue
        for il in span:
            layers[il] = device
    return layers, rules


def _map_target(target: Any, offload: list[Device], cpu: Device) -> Device:
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


def _layer_span(key: Any, n_layer: int) -> range | None:
    """The layers a device_map key names (``n_layer`` = the output layer), or None for a
    tensor-name pattern."""
    if isinstance(key, bool):
        raise InvalidArgumentError(f"device_map key {key!r} is not a layer or a pattern")
    if isinstance(key, int):
        span = range(key, key + 1)
    elif isinstance(key, range):
        span = key
    elif key == "output":
        return range(n_layer, n_layer + 1)
    elif key == "input":
        raise InvalidArgumentError("the input layer (token embedding) always stays on the CPU")
    else:
        m = re.fullmatch(r"(?:blk\.)?(\d+)(?:-(\d+))?", str(key))
        if m is None:
            return None
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        span = range(lo, hi + 1)
    if not span or span.start < 0 or span.stop > n_layer + 1:
        raise InvalidArgumentError(f"device_map key {key!r} names layers outside 0..{n_layer} "
                                   f"(the model has {n_layer} layers; {n_layer} is the output)")
    return span


def _fit(hp: HParams, infos: Mapping[str, GGUFTensorInfo],
         roles: Mapping[str, tuple[int | None, str]], offload: list[Device], cpu: Device,
         max_memory: Mapping | None, kv_bytes: list[int], compute: int,
         no_kv_offload: bool) -> list[Device]:
    """accelerate's sequential fit: layers (then the output layer) fill the devices in
    priority order, each device keeping room for its KV cache and compute buffers."""
    budgets = _budgets(offload, cpu, max_memory)
    layer_bytes = [0] * (hp.n_layer + 1)
    input_bytes = 0
    for name, info in infos.items():
        layer, _ = roles[name]
        if layer is None:
            input_bytes += info.nbytes
        else:
            layer_bytes[layer] += info.nbytes
    order = [d for d in offload if d.name in budgets] + [cpu]
    left = {d.name: budgets[d.name] - compute for d in order}
    left[cpu.name] -= input_bytes
    out, k = [], 0
    for il in range(hp.n_layer + 1):
        kv = kv_bytes[il] if il < hp.n_layer else 0
        while True:
            device = order[k]
            need = layer_bytes[il] + (0 if (no_kv_offload and device is not cpu) else kv)
            if need <= left[device.name] or device is cpu and cpu.name not in (max_memory or {}):
                left[device.name] -= need
                out.append(device)
                break
            if device is cpu:
                raise AllocationError(
                    f"the model does not fit in max_memory: layer {il} needs {need:,} bytes "
                    f"and the CPU has {max(left[cpu.name], 0):,} left")
            k += 1
    if no_kv_offload:
        left[cpu.name] -= sum(kv_bytes)
    return out


def _budgets(offload: list[Device], cpu: Device, max_memory: Mapping | None) -> dict[str, int]:
    if max_memory is None:
        return {d.name: d.memory()[0] for d in [*offload, cpu]}
    out: dict[str, int] = {}
    for key, value in max_memory.items():
        device = _map_target(key, offload, cpu)
        out[device.name] = parse_size(value, f"max_memory[{key!r}]")
    out.setdefault(cpu.name, cpu.memory()[0])
    return out


# --- per tensor ---------------------------------------------------------------------------------

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


class _BufferChooser:
    """select_weight_buft: the first buffer type in the layer's list whose device runs the
    tensor's op; answers are cached per (device, buffer type, op, type, ne)."""

    def __init__(self, hp: HParams, cpu: Device) -> None:
        self.hp = hp
        self.cpu = cpu
        self._answers: dict[tuple, bool] = {}

    def place(self, name: str, info: GGUFTensorInfo, layer: int | None, op: str,
              device: Device, rules: list[tuple[re.Pattern, Any]]) -> TensorPlacement:
        def result(dev: Device, buft: BufferType, cause: str) -> TensorPlacement:
            return TensorPlacement(name, info.name, info.type, info.ne, info.nbytes, layer, op,
                                   dev, buft, cause)

        for pattern, target in rules:
            if pattern.search(name):
                return result(target, target.buffer_type, f"override {pattern.pattern}")
        where = "input layer" if layer is None else (
            "output layer" if layer == self.hp.n_layer else f"layer {layer}")
        candidates = [device] if device is self.cpu else [device, self.cpu]
        for dev in candidates:
            buft = dev.buffer_type
            if self.supported(dev, buft, info, op):
                cause = where if dev is device else (
                    f"{where}: {device.name} cannot run {op} on {info.type}")
                return result(dev, buft, cause)
        raise UnsupportedError(f"no device can hold {name} ({info.type}, used in {op}): "
                               f"{', '.join(d.name for d in candidates)} cannot run it")

    def supported(self, dev: Device, buft: BufferType, info: GGUFTensorInfo, op: str) -> bool:
        key = (id(dev), id(buft), op, info.type, info.ne)
        if key not in self._answers:
            self._answers[key] = dev.supports_buft(buft) and self._runs(dev, buft, info, op)
        return self._answers[key]

    def _runs(self, dev: Device, buft: BufferType, info: GGUFTensorInfo, op: str) -> bool:
        ctx = Context("probe")
        w = ctx.new_tensor(info.type, info.ne or (1,), name=info.name)
        dummy = buft.alloc_buffer(0)        # lets supports_op see where the weight lives
        w.buffer = dummy
        try:
            node = _probe_op(ctx, w, op, self.hp)
        except PolydevError:
            return dev is self.cpu           # an op the weight cannot feed: CPU holds it
        try:
            return dev.supports_op(node)
        finally:
            dummy.close()


def _probe_op(ctx: Context, w, op: str, hp: HParams):
    """The op llama.cpp builds to ask a device about a weight (weight_buft_supported)."""
    n = _PROBE_TOKENS
    f32, i32 = GGMLType.F32, GGMLType.I32
    if op == "GET_ROWS":
        return ops.get_rows(ctx, w, ctx.new_tensor(i32, [n]))
    if op == "MUL_MAT":
        return ops.mul_mat(ctx, w, ctx.new_tensor(f32, [w.ne[0], n, w.ne[2], w.ne[3]]))
    if op == "MUL_MAT_ID":
        used = max(hp.n_expert_used, 1)
        return ops.mul_mat_id(ctx, w, ctx.new_tensor(f32, [w.ne[0], used, n]),
                              ctx.new_tensor(i32, [used, n]))
    if op in ("ADD", "MUL"):
        a = ctx.new_tensor(f32, list(w.ne))
        return ops.add(ctx, a, w) if op == "ADD" else ops.mul(ctx, a, w)
    if op == "FLASH_ATTN_EXT":                       # attention sinks, one per head
        head, f16 = hp.n_embd_head_k, GGMLType.F16
        out = ops.flash_attn_ext(ctx, ctx.new_tensor(f32, [head, n, hp.n_head]),
                                 ctx.new_tensor(f16, [head, 256, hp.n_head_kv[0]]),
                                 ctx.new_tensor(f16, [hp.n_embd_head_v, 256, hp.n_head_kv[0]]),
                                 None, 1.0)
        ops.flash_attn_ext_add_sinks(out, w)
        return out
    if op == "ROPE":
        a = ctx.new_tensor(f32, [hp.n_embd_head_v, hp.n_head, n])
        return ops.rope_ext(ctx, a, ctx.new_tensor(i32, [n]), w, hp.n_embd_head_v)
    raise AssertionError(op)


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
