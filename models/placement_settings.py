"""The placement knobs as one record, ``PlacementSettings``: which devices a model's weights and
KV cache go to, and how large the cache and the batches are.

llama.cpp's knobs (``n_gpu_layers``, ``split_mode``, ``tensor_split``, ``main_gpu``,
``override_tensor``, ``cpu_moe``, ``no_kv_offload``) are read by ``placement_llama_cpp``,
accelerate's (``device_map``, ``max_memory``) by ``placement_accelerate``. The record is built
once, from a caller's keywords (``polydev.models.load``) or from the command line
(``polydev.tools.placement_options``), and passed down.

It is checked here, once: a value that is wrong by itself raises ``InvalidArgumentError``
naming its knob. What needs the model or the machine (a layer past the last one, a device
index past the offload devices, a device name nobody registered) is checked when the plan is
made. Values are normalised: sequences become tuples, ``device_map`` and ``max_memory``
tuples of (key, value) pairs, sizes bytes, cache types ``GGMLType``, override rules compiled
patterns; normalising a normalised record changes nothing, so ``dataclasses.replace`` works.

Adding a knob: a field, its line in ``__post_init__`` and in ``as_dict``, its reader in the
policy that uses it, and its option in ``polydev.tools.placement_options``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polydev import GGMLType
from polydev.device import Device
from polydev.errors import InvalidArgumentError, TensorTypeError, UnsupportedError

__all__ = ["PlacementSettings", "PLACEMENT_KNOBS", "KV_TYPES", "parse_size", "parse_overrides",
           "settings_from"]

KV_TYPES = (GGMLType.F16, GGMLType.F32, GGMLType.Q8_0)      # what the KV cache can hold
SPLIT_MODES = ("none", "layer", "row")
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclass(frozen=True)
class PlacementSettings:
    """Where a model goes, as llama.cpp's knobs (or accelerate's) say; llama.cpp's defaults.

    ``devices``: the devices to offload to (names or ``Device``; None: every GPU, else every
    integrated GPU; empty: none). ``n_gpu_layers``: how many of the last layers to offload,
    counting the output layer (-1: all). ``split_mode``: "layer" (layers over the devices) or
    "none" (``main_gpu`` alone; "row" is not supported). ``tensor_split``: each device's share
    of the offloaded layers (empty: by free memory). ``override_tensor``: "regex=device" rules
    (or (regex, device) pairs), first match wins. ``cpu_moe``: experts stay on the CPU.
    ``no_kv_offload``: the KV cache stays on the CPU. ``device_map``: "auto" or a mapping from
    layers ("0-11", 3, ``range``, "output") or tensor-name regexes to devices.
    ``max_memory``: bytes per device (an int or "10GiB"). ``n_ctx``: the tokens the KV cache
    holds; ``n_batch``: the tokens of one ubatch; ``type_k``/``type_v``: the cache's types
    (f16, f32 or q8_0).
    """

    devices: Sequence[str | Device] | None = None
    n_gpu_layers: int = -1
    split_mode: str = "layer"
    tensor_split: Sequence[float] = ()
    main_gpu: int = 0
    override_tensor: Iterable[str | tuple[Any, Any]] = ()
    cpu_moe: bool = False
    no_kv_offload: bool = False
    device_map: Mapping[Any, Any] | Sequence[tuple[Any, Any]] | str | None = None
    max_memory: Mapping[Any, int | str] | Sequence[tuple[Any, int | str]] | None = None
    n_ctx: int = 4096
    n_batch: int = 512
    type_k: GGMLType | str = GGMLType.F16
    type_v: GGMLType | str = GGMLType.F16

    def __post_init__(self) -> None:
        normalised = dict(
            devices=_devices(self.devices),
            n_gpu_layers=_whole("n_gpu_layers", self.n_gpu_layers, -1, "-1 (all) or more"),
            split_mode=_split_mode(self.split_mode),
            tensor_split=_proportions(self.tensor_split),
            main_gpu=_whole("main_gpu", self.main_gpu, 0, "0 or more"),
            override_tensor=tuple(parse_overrides(self.override_tensor)),
            cpu_moe=_flag("cpu_moe", self.cpu_moe),
            no_kv_offload=_flag("no_kv_offload", self.no_kv_offload),
            device_map=_device_map(self.device_map),
            max_memory=_max_memory(self.max_memory),
            n_ctx=_whole("n_ctx", self.n_ctx, 1, "positive"),
            n_batch=_whole("n_batch", self.n_batch, 1, "positive"),
            type_k=_cache_type("type_k", self.type_k),
            type_v=_cache_type("type_v", self.type_v),
        )
        for name, value in normalised.items():
            object.__setattr__(self, name, value)      # frozen: this is the one place it is set

    def with_knobs(self, **knobs: Any) -> PlacementSettings:
        """A copy with ``knobs`` changed; a keyword that is no knob is an error listing them."""
        unknown = [name for name in knobs if name not in PLACEMENT_KNOBS]
        if unknown:
            raise InvalidArgumentError(_unknown_knobs(unknown))
        return dataclasses.replace(self, **knobs) if knobs else self

    def as_dict(self) -> dict[str, Any]:
        """Plain data (what ``polydev info --json`` prints under "settings")."""
        return dict(
            devices=None if self.devices is None else [_name(d) for d in self.devices],
            n_gpu_layers=self.n_gpu_layers, split_mode=self.split_mode,
            tensor_split=list(self.tensor_split), main_gpu=self.main_gpu,
            override_tensor=[f"{p.pattern}={_name(t)}" for p, t in self.override_tensor],
            cpu_moe=self.cpu_moe, no_kv_offload=self.no_kv_offload,
            device_map=(self.device_map if not isinstance(self.device_map, tuple)
                        else {_key_name(k): _name(t) for k, t in self.device_map}),
            max_memory=(None if self.max_memory is None
                        else {_name(k): size for k, size in self.max_memory}),
            n_ctx=self.n_ctx, n_batch=self.n_batch, type_k=str(self.type_k),
            type_v=str(self.type_v))


PLACEMENT_KNOBS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PlacementSettings))


def settings_from(settings: PlacementSettings | None,
                  knobs: Mapping[str, Any]) -> PlacementSettings:
    """The record a caller means: ``settings`` (default: llama.cpp's defaults) with the keyword
    ``knobs`` changed (how ``load`` and ``plan_placement`` take either)."""
    if settings is None:
        settings = PlacementSettings()
    elif not isinstance(settings, PlacementSettings):
        raise InvalidArgumentError(f"settings must be a PlacementSettings, got "
                                   f"{type(settings).__name__}")
    return settings.with_knobs(**knobs)


def _unknown_knobs(unknown: list[str]) -> str:
    guesses = [match for name in unknown
               for match in difflib.get_close_matches(name, PLACEMENT_KNOBS, n=1)]
    hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
    return (f"unknown placement knob{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
            f"{hint}; the knobs are {', '.join(PLACEMENT_KNOBS)}")


# --- each knob ----------------------------------------------------------------------------------

def _whole(knob: str, value: Any, least: int, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{knob} must be a whole number, got {value!r}")
    if value < least:
        raise InvalidArgumentError(f"{knob} must be {meaning}, got {value}")
    return int(value)


def _flag(knob: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{knob} must be True or False, got {value!r}")
    return bool(value)


def _devices(value: Any) -> tuple[str | Device, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, Device)):
        value = [value]
    try:
        out = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"devices must be a list of device names or Devices, got "
                                   f"{value!r}") from None
    for d in out:
        if not isinstance(d, (str, Device)):
            raise InvalidArgumentError(f"devices: {d!r} is neither a device name nor a Device")
    return out


def _split_mode(value: Any) -> str:
    if value == "row":
        raise UnsupportedError("split_mode 'row' (rows of each matrix over several devices) "
                               "is not supported; use 'layer' or 'none'")
    if value not in SPLIT_MODES:
        raise InvalidArgumentError(f"split_mode must be 'none', 'layer' or 'row', got "
                                   f"{value!r}")
    return value


def _proportions(value: Any) -> tuple[float, ...]:
    """``tensor_split``: one share per offload device (missing ones are 0)."""
    if value is None:
        return ()
    if isinstance(value, str):
        raise InvalidArgumentError(f"tensor_split must be a list of numbers such as [3, 1], "
                                   f"got {value!r}")
    try:
        props = tuple(float(p) for p in value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"tensor_split must be a list of numbers such as [3, 1], "
                                   f"got {value!r}") from None
    if any(not math.isfinite(p) or p < 0 for p in props):
        raise InvalidArgumentError(f"tensor_split entries must be finite and >= 0: {list(props)}")
    return props


def _device_map(value: Any) -> tuple[tuple[Any, Any], ...] | str | None:
    """``device_map``: "auto", or (key, device) pairs; a key is a layer (int, ``range``,
    "3", "0-11", "blk.3"), "output", or a tensor-name regex."""
    if value is None or value == "auto":
        return value
    if isinstance(value, str):
        raise InvalidArgumentError(f"device_map must be 'auto' or a dict from layers to "
                                   f"devices, got {value!r}")
    pairs = tuple(_pairs("device_map", value))
    for key, target in pairs:
        _check_map_key(key)
        _check_target(f"device_map[{key!r}]", target)
    return pairs


def _check_map_key(key: Any) -> None:
    if isinstance(key, bool) or not isinstance(key, (int, range, str)):
        raise InvalidArgumentError(f"device_map key {key!r} is not a layer or a pattern")
    if key == "input":
        raise InvalidArgumentError("the input layer (token embedding) always stays on the CPU")
    if isinstance(key, str) and layer_range(key) is None and key != "output":
        _compile(key, f"device_map key {key!r}")


def layer_range(key: str) -> tuple[int, int] | None:
    """The first and last layer a device_map key such as "3", "0-11" or "blk.3" names, or
    None for a key that is not a layer range."""
    m = re.fullmatch(r"(?:blk\.)?(\d+)(?:-(\d+))?", key)
    return None if m is None else (int(m.group(1)), int(m.group(2) or m.group(1)))


def _max_memory(value: Any) -> tuple[tuple[Any, int], ...] | None:
    if value is None:
        return None
    out = []
    for key, size in _pairs("max_memory", value):
        _check_target(f"max_memory key {key!r}", key)
        out.append((key, parse_size(size, f"max_memory[{key!r}]")))
    return tuple(out)


def _pairs(knob: str, value: Any) -> Iterable[tuple[Any, Any]]:
    try:
        return dict(value).items()
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{knob} must be a dict, got {value!r}") from None


def _check_target(what: str, target: Any) -> None:
    if isinstance(target, bool) or not isinstance(target, (str, int, Device)):
        raise InvalidArgumentError(f"{what}: {target!r} is not a device (a name such as "
                                   "'CUDA0', an index among the offload devices, or a Device)")


def _cache_type(knob: str, value: Any) -> GGMLType:
    try:
        t = GGMLType.parse(value)
    except (TensorTypeError, TypeError):
        t = None
    if t not in KV_TYPES:
        raise InvalidArgumentError(f"{knob} must be one of {', '.join(str(k) for k in KV_TYPES)}"
                                   f", got {value}")
    return t


# --- parsing ------------------------------------------------------------------------------------

def parse_size(value: int | float | str, what: str = "size") -> int:
    """Bytes from an int or a string such as ``"10GiB"``, ``"500MB"``, ``"1.5 GB"``."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what}: {value!r} is not a size")
    if isinstance(value, (int, float, np.integer)):
        if value < 0 or not math.isfinite(value):
            raise InvalidArgumentError(f"{what}: {value!r} is not a size")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise InvalidArgumentError(f"{what}: {value!r} is not a size (e.g. 2048, '10GiB', "
                                   "'500MB')")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_overrides(rules: str | Iterable[str | tuple[Any, Any]]) -> list[tuple[re.Pattern, Any]]:
    """``["regex=device", ...]`` or ``[(regex, device), ...]`` as compiled rules (``-ot``
    also takes several comma-separated rules in one string)."""
    if isinstance(rules, str):
        rules = [rules]
    if not isinstance(rules, Iterable):
        raise InvalidArgumentError(f"override_tensor must be a list of 'regex=device' rules, "
                                   f"got {rules!r}")
    out = []
    for rule in rules:
        for pair in _rule_pairs(rule):
            if len(pair) != 2 or not str(pair[0]):
                raise InvalidArgumentError(f"override {rule!r} is not 'regex=device'")
            pattern, target = pair
            _check_target(f"override {rule!r}", target)
            out.append((_compile(pattern, f"override {rule!r}"), target))
    return out


def _rule_pairs(rule: Any) -> list[tuple]:
    if isinstance(rule, str):
        return [tuple(r.rsplit("=", 1)) for r in rule.split(",") if r.strip()]
    try:
        return [tuple(rule)]
    except TypeError:
        raise InvalidArgumentError(f"override {rule!r} is not 'regex=device'") from None


def _compile(pattern: str | re.Pattern, what: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise InvalidArgumentError(f"{what}: bad regex ({e})") from None
    except TypeError:
        raise InvalidArgumentError(f"{what}: {pattern!r} is not a regex") from None


def _name(target: Any) -> str:
    return target.name if isinstance(target, Device) else str(target)


def _key_name(key: Any) -> str:
    return f"{key.start}-{key.stop - 1}" if isinstance(key, range) else str(key)
