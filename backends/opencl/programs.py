"""OpenCL programs: sources specialised with -D options, built once per device and cached.

Each program is one ``cl/*.cl`` file after ``cl/common.h``, built for one device with the
options that specialise it (types, the function, work-group sizes taken from the device's
capabilities). The driver's binary of each goes through the runtime's ``compile_cached``
(keyed by source, options, platform, driver and device), so a second process loads it instead
of compiling. Every bound graph node gets a kernel object of its own, so its arguments are set
once and a replay only enqueues. A program that does not build is a ``CompileError`` with the
driver's own lines, raised where a plan binds the node (never in ``supports_op``). What a
driver says about a build that succeeds (its warnings) goes to the debug log, never to the
user's stderr.
"""

from __future__ import annotations

import logging
import threading
import warnings
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from polydev.errors import CompileError
from polydev.kernel_build import compile_cached

from .probe import compiler_message

log = logging.getLogger(__name__)

# warnings.catch_warnings swaps process-wide state: two builds must not interleave theirs
_catching = threading.Lock()


@lru_cache(maxsize=None)
def _source(name: str) -> str:
    folder = resources.files(__package__) / "cl"
    return (folder / "common.h").read_text() + "\n" + (folder / f"{name}.cl").read_text()


class ProgramCache:
    """The built programs of one device, keyed by (source file, options)."""

    def __init__(self, cl: Any, context: Any, device: Any, defaults: Mapping[str, object],
                 identity: Mapping[str, object]) -> None:
        self.cl, self.context, self.device = cl, context, device
        self.defaults = dict(defaults)
        self.identity = dict(identity)        # the platform, driver and device (probe.py)
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
        what = f"OpenCL program {source}.cl on {self.device.name.strip()}"
        text = _source(source)

        def compile(target: Path) -> None:
            try:
                program = self._built(self.cl.Program(self.context, text), flags, what)
            except self.cl.Error as e:      # the driver's build log, in its own words
                raise CompileError(f"{what} did not build: {compiler_message(e)}") from None
            target.write_bytes(program.binaries[0])
        binary = compile_cached("opencl", what, {f"{source}.cl": text}, flags, self.identity,
                                compile, suffix=".bin")
        try:
            return self._built(
                self.cl.Program(self.context, [self.device], [binary.read_bytes()]), flags, what)
        except self.cl.Error as e:          # a cached binary this driver no longer takes
            raise CompileError(f"{what}: the driver refused its cached binary {binary}: "
                               f"{compiler_message(e)}") from None

    def _built(self, program: Any, flags: list[str], what: str) -> Any:
        """``program`` built for this device. pyopencl warns (``CompilerWarning``, with its
        own source line) where a build succeeds with a non-empty log; that log is the
        driver's notes for whoever debugs the kernels, so it goes to the debug log. Other
        warnings raised meanwhile are shown as they would have been."""
        with _catching, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", self.cl.CompilerWarning)
            program = program.build(options=flags, devices=[self.device])
        noted = False
        for w in caught:
            if issubclass(w.category, self.cl.CompilerWarning):
                noted = True
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)
        if noted:
            log.debug("%s built; the driver said:\n%s", what, self._build_log(program))
        return program

    def _build_log(self, program: Any) -> str:
        try:
            return program.get_build_info(self.device, self.cl.program_build_info.LOG).strip()
        except self.cl.Error as e:
            return f"(its build log could not be read: {e})"
