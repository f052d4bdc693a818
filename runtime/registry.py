"""The process-wide registry of backends and their devices.

Backends are found through the entry-point group ``polydev.backends``: each entry point names a
function that returns a ``Reg`` (the CPU backend is registered this way too). ``POLYDEV_BACKENDS``
("cpu,cuda") loads only the entry points it names, so a CPU-only run never initialises an
OpenCL driver (PoCL and its LLVM held 97 MiB of a gemma-3-270m run's peak RSS), and neither
does a device asked for by name while nothing has asked for every device: only the entry point
its name begins with is loaded ("cpu" for "CPU"). Registration is
deduplicated by reg name. Devices are listed accelerators first and CPU devices last, as ggml
registers its backends. Names are looked up case-insensitively, and torch-style names work:
"cpu", "cuda:1", "opencl:0".
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
import time
from importlib import metadata
from typing import Callable

from .device import Backend, Device, DeviceType, Reg
from .env import env_text
from .errors import ConfigError, DeviceNotFoundError, InvalidArgumentError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "polydev.backends"


def _is_cpu_reg(reg: Reg) -> bool:
    return bool(reg.devices) and all(d.type == DeviceType.CPU for d in reg.devices)


def _is_the_cpu_backend(device: Device) -> bool:
    """The host CPU backend's own device (reg "CPU"), as opposed to CPU-type devices of other
    backends, such as an OpenCL driver running on the CPU."""
    return device.reg is not None and device.reg.name.upper() == "CPU"


class Registry:
    """Regs and devices, loaded from entry points on first use."""

    def __init__(self) -> None:
        self._regs: list[Reg] = []
        self._extra_devices: list[Device] = []
        self._load_errors: dict[str, str] = {}
        self._loaded = False                    # every selected entry point
        self._loaded_eps: set[str] = set()      # the entry points loaded (by lowercase name)
        self._entry_points: list[metadata.EntryPoint] | None = None    # the selected ones
        # each entry point's reg by name -> its entry point's place: regs list in that order
        # whichever was asked for first
        self._rank: dict[str, int] = {}
        self._lock = threading.RLock()

    # --- registration -----------------------------------------------------------------------

    def load(self) -> None:
        """Discover backends through the entry-point group (once)."""
        with self._lock:
            if self._loaded:
                return
            selected = self._selected_entry_points()
            self._loaded = True
            for rank, ep in enumerate(selected):
                if ep.name.lower() not in self._loaded_eps:
                    self._load_entry_point(ep, rank)

    def _selected_entry_points(self) -> list[metadata.EntryPoint]:
        if self._entry_points is None:       # kept once POLYDEV_BACKENDS has been read well
            self._entry_points = _selected(metadata.entry_points(group=ENTRY_POINT_GROUP))
        return self._entry_points

    def _load_entry_point(self, ep: metadata.EntryPoint, rank: int) -> None:
        self._loaded_eps.add(ep.name.lower())
        start = time.perf_counter()
        try:
            result = ep.load()()
        except Exception as e:   # a broken backend must not break the others
            self._load_errors[ep.name] = f"{type(e).__name__}: {e}"
            log.warning("backend %r (%s) failed to load: %s", ep.name, ep.value, e)
            return
        for reg in result if isinstance(result, (list, tuple)) else [result]:
            if reg is not None:
                self._rank.setdefault(self.register(reg).name.lower(), rank)
                _log_reg(reg, ep, time.perf_counter() - start)

    def register(self, reg: Reg) -> Reg:
        """Add a reg and its devices; a reg with an already registered name is ignored."""
        with self._lock:
            for known in self._regs:
                if known is reg or known.name.lower() == reg.name.lower():
                    return known
            self._regs.append(reg)
            return reg

    def register_device(self, device: Device) -> None:
        """Add one extra device (deduplicated)."""
        with self._lock:
            if device not in self._extra_devices and device not in self.devices:
                self._extra_devices.append(device)

    def unregister(self, reg: Reg) -> None:
        with self._lock:
            self._regs = [r for r in self._regs if r is not reg]
            if not any(r.name.lower() == reg.name.lower() for r in self._regs):
                self._rank.pop(reg.name.lower(), None)

    # --- queries ----------------------------------------------------------------------------

    @property
    def regs(self) -> list[Reg]:
        """Every reg, accelerator backends first, then other CPU-type backends, the CPU
        backend last."""
        self.load()
        unranked = math.inf                  # regs registered by hand: after, in their order
        return sorted(self._regs, key=lambda r: (_is_cpu_reg(r), r.name.upper() == "CPU",
                                                 self._rank.get(r.name.lower(), unranked)))

    @property
    def devices(self) -> list[Device]:
        """Every device: non-CPU devices first (in reg order), then CPU-type devices of other
        backends, the CPU backend's device last."""
        devs = [d for r in self.regs for d in r.devices] + self._extra_devices
        return sorted(devs, key=lambda d: (d.type == DeviceType.CPU, _is_the_cpu_backend(d)))

    @property
    def load_errors(self) -> dict[str, str]:
        """Entry points that failed to load, with the reason."""
        self.load()
        return dict(self._load_errors)

    def reg_by_name(self, name: str) -> Reg:
        for r in self.regs:
            if r.name.lower() == name.lower():
                return r
        raise DeviceNotFoundError(f"no backend named {name!r}; registered backends: "
                                  f"{', '.join(r.name for r in self.regs) or 'none'}")

    def device(self, name: "str | Device") -> Device:
        """A device by name: "CUDA0", "cuda:0", "cuda" (the first), "CPU", "cpu"; any case."""
        if isinstance(name, Device):
            return name
        if not isinstance(name, str):
            raise InvalidArgumentError(f"a device is named by a string such as \"CPU\" or "
                                       f"\"cuda:0\", or given as a Device; got {name!r}")
        key = name.strip().lower()
        alone = self._device_from_its_backend_alone(key)
        if alone is not None:
            return alone
        devs = self.devices
        for d in devs:
            if d.name.lower() == key:
                return d
        for r in self.regs:
            found = _named_device(r, key)
            if found is not None:
                return found
        known = ", ".join(d.name for d in devs) or "none"
        raise DeviceNotFoundError(f"unknown device {name!r}; known devices: {known}"
                                  f"{self._why_not(key)}")

    def _device_from_its_backend_alone(self, key: str) -> Device | None:
        """The device ``key`` (lowercase) names, loading only the entry point its name begins
        with ("cpu" for "CPU" or "cpu:0", "opencl" for "OpenCL1") while the others are not
        loaded yet: a program that asks for the CPU alone (``devices=[]``, ``--device
        none``) never starts another backend's driver (PoCL and its LLVM held 97 MiB of a
        CPU-only gemma-3-270m run). None where no entry point has that name, or its backend
        has no such device: the caller then looks through every backend."""
        if self._loaded:
            return None
        backend = re.sub(r"\d+$", "", key.partition(":")[0])
        with self._lock:
            if self._loaded:
                return None
            for rank, ep in enumerate(self._selected_entry_points()):
                if ep.name.lower() == backend and backend not in self._loaded_eps:
                    self._load_entry_point(ep, rank)
            return next((d for r in self._regs if r.name.lower() == backend
                         for d in [_named_device(r, key)] if d is not None), None)

    def _why_not(self, key: str) -> str:
        """Why the backend a name points at ("cuda:0", "CUDA1", "cuda") has no devices."""
        reg_name = re.sub(r"(:\d*|\d+)$", "", key)
        for r in self.regs:
            if r.name.lower() == reg_name and not r.devices:
                return f" (backend {r.name} has none: {r.unavailable_reason or 'no reason given'})"
        error = next((e for n, e in self.load_errors.items() if n.lower() == reg_name), None)
        return f" (backend {reg_name} failed to load: {error})" if error else ""

    def device_by_type(self, type_: DeviceType) -> Device | None:
        """The first device of that type, or None; for CPU, the CPU backend's own device
        before CPU-type devices of other backends."""
        devs = [d for d in self.devices if d.type == type_]
        if type_ == DeviceType.CPU:
            devs.sort(key=lambda d: not _is_the_cpu_backend(d))
        return devs[0] if devs else None

    def init_backend(self, name: "str | Device", params: str | None = None) -> Backend:
        """A new backend (stream) on the named device."""
        return self.device(name).init_backend(params)

    def best_device(self) -> Device:
        """The first GPU, else the first integrated GPU, else the CPU (ggml_backend_init_best);
        the CPU backend itself comes before CPU-type devices of other backends."""
        for t in (DeviceType.GPU, DeviceType.IGPU, DeviceType.CPU):
            d = self.device_by_type(t)
            if d is not None:
                return d
        raise DeviceNotFoundError("no devices are registered (is the CPU backend installed?)")

    def init_best_backend(self) -> Backend:
        return self.best_device().init_backend()


def _named_device(reg: Reg, key: str) -> Device | None:
    """``reg``'s device that ``key`` (lowercase) names: by its name ("opencl1"), or torch-style
    by the backend's name and an index ("opencl:1"; "opencl" or "opencl:": the first)."""
    for d in reg.devices:
        if d.name.lower() == key:
            return d
    head, _, index = key.partition(":")
    if head != reg.name.lower() or not reg.devices:
        return None
    if not index:
        return reg.devices[0]
    return reg.devices[int(index)] if index.isdigit() and int(index) < len(reg.devices) else None


def _selected(eps) -> list[metadata.EntryPoint]:
    """The entry points ``POLYDEV_BACKENDS`` names (all when it is unset or "all")."""
    eps = list(eps)
    text = env_text("POLYDEV_BACKENDS")
    if text is None or text.lower() == "all":
        return eps
    wanted = {name.strip().lower() for name in text.split(",") if name.strip()}
    known = {ep.name.lower() for ep in eps}
    if not wanted or wanted - known:
        unknown = ", ".join(sorted(wanted - known)) or "nothing"
        raise ConfigError(f"POLYDEV_BACKENDS={text!r} names {unknown}, which is no installed "
                          f"backend (installed: {', '.join(sorted(known))}, or all)")
    return [ep for ep in eps if ep.name.lower() in wanted]


def _log_reg(reg: Reg, ep: metadata.EntryPoint, seconds: float) -> None:
    if reg.devices:
        log.debug("backend %s (entry point %s, %.0f ms): %s", reg.name, ep.value,
                  seconds * 1e3, ", ".join(f"{d.name} [{d.description}]" for d in reg.devices))
    else:
        log.debug("backend %s (entry point %s, %.0f ms): no devices: %s", reg.name, ep.value,
                  seconds * 1e3, reg.unavailable_reason or "no reason given")


def reg_once(make: Callable[[], Reg]) -> Callable[[], Reg]:
    """A backend's entry-point function from its reg factory: ``make`` runs on the first call
    (devices are enumerated once per process) and every later call returns the same reg."""
    lock = threading.Lock()
    made: list[Reg] = []

    @functools.wraps(make)
    def register() -> Reg:
        with lock:
            if not made:
                made.append(make())
            return made[0]
    return register


_registry = Registry()


def registry() -> Registry:
    """The process-wide registry."""
    return _registry


def devices() -> list[Device]:
    """Every registered device, accelerators first."""
    return _registry.devices


def device(name: "str | Device") -> Device:
    """A registered device by name ("CUDA0", "cuda:0", "cpu"; any case) or itself."""
    return _registry.device(name)


def init_backend(name: "str | Device", params: str | None = None) -> Backend:
    """A new backend (stream) on the named device; ``params`` is free-form."""
    return _registry.init_backend(name, params)


def init_best_backend() -> Backend:
    """A backend on the best device: the first GPU, else an IGPU, else the CPU."""
    return _registry.init_best_backend()


def register(reg: Reg) -> Reg:
    """Register a reg by hand (deduplicated by name); returns the registered one."""
    return _registry.register(reg)
