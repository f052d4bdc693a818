"""OpenCL programs: sources specialised with -D options, built once per device and cached.

Each program is one ``cl/*.cl`` file after ``cl/common.h``, built for one device with the
options that specialise it (types, the function, work-group sizes taken from the device's
capabilities). pyopencl keeps the binaries in its on-disk cache, so a second process skips the
compiler. Every bound graph node gets a kernel object of its own, so its arguments are set once
and a replay only enqueues.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from polydev.errors import UnsupportedError

from .probe import compiler_message


@lru_cache(maxsize=None)
def _source(name: str) -> str:
    folder = resources.files(__package__) / "cl"
    return (folder / "common.h").read_text() + "\n" + (folder / f"{name}.cl").read_text()


class ProgramCache:
    """The built programs of one device, keyed by (source file, options)."""

    def __init__(self, cl: Any, context: Any, device: Any, defaults: Mapping[str, object]) -> None:
        self.cl, self.context, self.device = cl, context, device
        self.defaults = dict(defaults)
        self._programs: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def kernel(self, source: str, name: str, **defines: object) -> Any:
        """A new kernel object ``name`` of ``source`` built with ``defines`` (-D NAME=value)."""
        options = {**self.defaults, **defines}
        key = (source, tuple(sorted((k, str(v)) for k, v in options.items())))
        with self._lock:
            program = self._programs.get(key)
            if program is None:
                program = self._programs[key] = self._build(source, options)
        return self.cl.Kernel(program, name)

    def _build(self, source: str, options: Mapping[str, object]) -> Any:
        flags = [f"-D{k}" if v is True else f"-D{k}={v}" for k, v in options.items()]
        try:
            return self.cl.Program(self.context, _source(source)).build(
                options=flags, devices=[self.device])
        except self.cl.Error as e:        # a kernel that does not build on this device
            raise UnsupportedError(f"OpenCL program {source}.cl does not build on "
                                   f"{self.device.name}: {compiler_message(e)}") from None
